// Command nvidia-driver is the Talos extension service that prepares a GPU node: it mounts
// the NVIDIA driver root, creates device nodes, supervises nvidia-persistenced, applies the
// MIG layout and writes the CDI spec. Its offline commands (check-root, mig plan) run on a
// workstation too.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	// A SIGTERM before runService handles it exits 0 (the package says why).
	"github.com/talos-nvidia/nvidia-driver/pkg/atomicfile"
	"github.com/talos-nvidia/nvidia-driver/pkg/cdi"
	"github.com/talos-nvidia/nvidia-driver/pkg/config"
	"github.com/talos-nvidia/nvidia-driver/pkg/document"
	"github.com/talos-nvidia/nvidia-driver/pkg/driverroot"
	"github.com/talos-nvidia/nvidia-driver/pkg/memory"
	migcli "github.com/talos-nvidia/nvidia-driver/pkg/mig/cli"
	"github.com/talos-nvidia/nvidia-driver/pkg/node"
	"github.com/talos-nvidia/nvidia-driver/pkg/nvmljobs"
	_ "github.com/talos-nvidia/nvidia-driver/pkg/stopsignal"
)

// version is set by the build (-X main.version=...).
var version = "dev"

const usage = `nvidia-driver: prepares a Talos node's NVIDIA GPUs.

Usage:
  nvidia-driver [run]            bring the node up and hold it (the extension service)
  nvidia-driver fabric-manager   run nv-fabricmanager on NVSwitch boards (the
                                 ext-nvidia-fabricmanager service); idle elsewhere
  nvidia-driver check-root [DIR] check a glibc subroot (default: the configured one)
  nvidia-driver cdi generate [--output FILE] [flags]
                                 generate the node's CDI spec (--help for the flags)
  nvidia-driver mig plan --gpu MODEL [--gpus N] [--config FILE] --select NAME [-o json]
                                 plan a MIG layout offline on simulated GPUs
  nvidia-driver nvml-job         run one NVML job for the service (internal: a JSON request
                                 on stdin, the answer on stdout)
  nvidia-driver version          print the version
  nvidia-driver help             this text

Configuration (environment, or the same keys in %s with "version: %s"):
%s`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	cmd := "run"
	if len(args) > 0 {
		cmd, args = args[0], args[1:]
	}

	switch cmd {
	case "run":
		return runService(stderr)
	case fabricManagerCommand:
		return runFabricManager(stderr)
	case "check-root":
		return checkRoot(args, stdout, stderr)
	case "cdi":
		if len(args) == 0 || args[0] != "generate" {
			fmt.Fprintln(stderr, "usage: nvidia-driver cdi generate [--output FILE] [flags]")

			return 2
		}

		return cdiGenerate(args[1:], stdout, stderr)
	case "mig":
		if len(args) == 0 || args[0] != "plan" {
			fmt.Fprintln(stderr, "usage: nvidia-driver mig plan --gpu MODEL [--gpus N] [--config FILE] --select NAME [-o json]")

			return 2
		}

		return migcli.RunPlanCLI(args[1:], stdout, stderr)
	case nvmlJobCommand:
		return nvmlJob(stderr)
	case "version", "--version":
		fmt.Fprintln(stdout, version)

		return 0
	case "help", "-h", "--help":
		fmt.Fprintf(stdout, usage, config.DefaultConfigFile, config.Version, config.Describe())

		return 0
	default:
		fmt.Fprintf(stderr, "nvidia-driver: unknown command %q\n\n", cmd)
		fmt.Fprintf(stderr, usage, config.DefaultConfigFile, config.Version, config.Describe())

		return 2
	}
}

func checkRoot(args []string, stdout, stderr io.Writer) int {
	var dir string

	switch len(args) {
	case 0:
		cfg, err := config.Load(os.Environ())
		if err != nil {
			fmt.Fprintln(stderr, err)

			return 2
		}

		dir = cfg.Subroot
	case 1:
		dir = args[0]
	default:
		fmt.Fprintln(stderr, "usage: nvidia-driver check-root [DIR]")

		return 2
	}

	report := driverroot.Check(dir)
	if err := report.WriteText(stdout); err != nil {
		fmt.Fprintln(stderr, err)

		return 1
	}

	if !report.OK() {
		return 1
	}

	return 0
}

func runService(stderr io.Writer) int {
	// First of all: a SIGTERM from here on stops the service cleanly.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	env, simulated := takeSimulation(os.Environ())

	cfg, err := config.Load(env)
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	log.Info("starting", "version", version, "subroot", cfg.Subroot, "hostRoot", cfg.HostRoot)

	ctx = watchForFirstDocument(ctx, log, cfg)

	for _, msg := range cfg.Ignored {
		log.Warn(msg)
	}

	if len(cfg.FromDocument) > 0 {
		log.Warn("the nvidia-driver ExtensionServiceConfig came after Talos made this container: its files are read from "+document.BaseDir+
			"; its environment entries, if any, take effect at the next `talosctl service ext-nvidia-driver restart`",
			"files", cfg.FromDocument)
	}

	if err != nil {
		return waitOnInvalidConfig(ctx, log, cfg, err)
	}
	logSettings(log, cfg)

	if err := prepareTempDir(os.Getenv("TMPDIR")); err != nil {
		log.Warn("no temporary directory: the CDI spec cannot be rendered", "error", err)
	}

	serveFn := func(ctx context.Context, log *slog.Logger, cfg config.Config) error {
		return serve(ctx, log, cfg, stderr)
	}
	if simulated != "" {
		serveFn = func(ctx context.Context, log *slog.Logger, cfg config.Config) error {
			return serveSimulated(ctx, log, cfg, simulated)
		}
	}

	if err := serveFn(ctx, log, cfg); err != nil {
		if errors.Is(err, context.Canceled) {
			log.Info("stopped")

			return 0
		}

		log.Error("stopped with an error", "error", err)

		return 1
	}

	log.Info("stopped")

	return 0
}

// documentPoll is how often a service started without its document looks for one: a stat.
const documentPoll = 2 * time.Second

// watchForFirstDocument returns a context that ends when the node gets an nvidia-driver document that this process started without. Talos does
// not restart a running service for its first document (handleRestart: spec version "1"),
// so the service stops and exits 0, and `restart: always` starts it again in 5 s, when it
// reads the document's files from Talos's directory (package document). Later changes of the
// document, and its removal, Talos restarts the service for itself.
func watchForFirstDocument(ctx context.Context, log *slog.Logger, cfg config.Config) context.Context {
	root := cfg.HostRoot
	if root == "" {
		root = "/"
	}

	docs := document.For(root, config.ServiceName)
	if present, err := docs.Present(); present || err != nil {
		return ctx
	}

	log.Info("watching for a first nvidia-driver ExtensionServiceConfig", "dir", string(docs))

	ctx, cancel := context.WithCancel(ctx)

	go func() {
		if docs.WaitForArrival(ctx, documentPoll) == nil {
			log.Info("an nvidia-driver ExtensionServiceConfig arrived: stopping, so that Talos starts the service again with it (restart: always)")
			cancel()
		}
	}()

	return ctx
}

// prepareTempDir creates the service's TMPDIR, dir (the extension's YAML points it into the
// service's own /run directory), refusing a symbolic link on its path (a link at the host's
// /run/nvidia-driver would have the CDI library write its renderings where it points), and
// removes what a killed predecessor left there: the CDI spec's renderings (cdi.SweepTemp).
func prepareTempDir(dir string) error {
	if dir == "" {
		return nil
	}

	d, err := atomicfile.OpenDirNoSymlinks(dir, true, 0o700)
	if err != nil {
		return fmt.Errorf("creating TMPDIR: %w", err)
	}

	d.Close() //nolint:errcheck // an O_PATH descriptor: nothing to flush

	return cdi.SweepTemp(dir)
}

// waitOnInvalidConfig reports a configuration that did not load, once, in the log and the
// status file, and waits for SIGTERM without touching the node. Exiting would be a crash loop:
// Talos restarts a `restart: always` service that exits, whatever its code, and only a new
// ExtensionServiceConfig (which restarts the service) can change the configuration.
func waitOnInvalidConfig(ctx context.Context, log *slog.Logger, cfg config.Config, err error) int {
	log.Error("not starting: the configuration is invalid; nothing was changed, waiting for a corrected ExtensionServiceConfig", "error", err, "phase", node.PhaseFailed)

	if cfg.HostRoot == "" {
		log.Warn("no status file written: the host root is not known")
	} else if werr := node.ReportInvalidConfig(cfg.StatusFile(), cfg.Subroot, err); werr != nil {
		log.Error("cannot write the status file", "error", werr)
	}

	// From here on the service only waits: give back what the load used.
	if rel, rerr := memory.Release(); rerr != nil {
		log.Warn("cannot release the load's memory", "error", rerr)
	} else {
		log.Debug("released the load's memory", "rssKiB", rel.AfterKiB, "rssBeforeKiB", rel.BeforeKiB)
	}

	<-ctx.Done()
	log.Info("stopped")

	return 0
}

// logSettings says which settings the node's configuration changed, and from where, so that
// `talosctl logs ext-nvidia-driver` shows what an ExtensionServiceConfig did.
func logSettings(log *slog.Logger, cfg config.Config) {
	keys := make([]string, 0, len(cfg.Source))
	for k, src := range cfg.Source {
		if src != "default" {
			keys = append(keys, k)
		}
	}

	slices.Sort(keys)

	for _, k := range keys {
		log.Info("setting", "key", k, "from", cfg.Source[k])
	}
}

// nvmlJobCommand runs one NVML job in a child process of the service (see pkg/nvmljobs).
const nvmlJobCommand = "nvml-job"

// nvmlJob is the child's side of an NVML job (nvmljobs.ServeProcess).
func nvmlJob(stderr io.Writer) int {
	if err := nvmljobs.ServeProcess(nvmljobs.OnSubroot); err != nil {
		fmt.Fprintln(stderr, "nvml-job:", err)

		return 1
	}

	return 0
}
