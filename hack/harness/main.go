// Command harness runs the assembled extension's service the way Talos runs it (see
// internal/harness), with Debian's runc, in a private mount namespace, and prints what the
// host side saw. It changes nothing on the machine.
//
//	go run ./hack/harness [-extension DIR] [-env K=V ...] [-config MOUNTPATH=FILE ...]
//	                      [-until waiting,ready,failed] [-wait 60s] [-hold 3s] [-json]
//
// On a GPU host, build the payload from the host's driver first:
//
//	hack/build-subroot.sh host _out/subroot-host && \
//	go run ./hack/extension -name nvidia-driver-dev-host -payload _out/subroot-host && \
//	go run ./hack/harness -extension _out/extensions/nvidia-driver-dev-host \
//	    -env NVIDIA_DRIVER_PERSISTENCE_MODE=false -until ready,failed
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/talos-nvidia/nvidia-driver/internal/harness"
)

const envInside = "NVIDIA_DRIVER_HARNESS_INSIDE"

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("harness", flag.ContinueOnError)
	fs.SetOutput(stderr)

	var env, configs list

	ext := fs.String("extension", "_out/extensions/nvidia-driver-dev-debian", "assembled extension directory (make extension)")
	fs.Var(&env, "env", "ExtensionServiceConfig environment entry K=V (repeatable)")
	fs.Var(&configs, "config", "ExtensionServiceConfig file MOUNTPATH=LOCALFILE (repeatable)")
	until := fs.String("until", "waiting,ready,failed", "service phases to wait for before SIGTERM")
	wait := fs.Duration("wait", 60*time.Second, "longest wait for -until")
	hold := fs.Duration("hold", 3*time.Second, "watch the service this long after -until before stopping it")
	afterReady := fs.String("after-ready", "", "shell command to run while the service is ready (e.g. hack/e2e-workload.sh)")
	runc := fs.String("runc", "runc", "runc binary")
	asJSON := fs.Bool("json", false, "print the result as JSON")

	if err := fs.Parse(args); err != nil {
		return 2
	}

	if os.Getenv(envInside) == "" {
		return reexec(args, stderr)
	}

	files := map[string]string{}

	for _, c := range configs {
		mountPath, local, ok := strings.Cut(c, "=")
		if !ok {
			fmt.Fprintf(stderr, "harness: -config %q: want MOUNTPATH=LOCALFILE\n", c)

			return 2
		}

		data, err := os.ReadFile(local)
		if err != nil {
			fmt.Fprintln(stderr, "harness:", err)

			return 2
		}

		files[mountPath] = string(data)
	}

	runcPath, err := exec.LookPath(*runc)
	if err != nil {
		fmt.Fprintln(stderr, "harness: runc not found (hack/install-test-deps.sh installs it):", err)

		return 2
	}

	res, err := harness.Run(harness.Options{
		Extension: *ext, ConfigFiles: files, Environment: env, Until: strings.Split(*until, ","),
		Wait: *wait, Hold: *hold, AfterReady: *afterReady, Work: os.Getenv(envInside), Runc: runcPath, Log: stderr,
	})
	if err != nil {
		fmt.Fprintln(stderr, "harness:", err)

		return 1
	}

	if *asJSON {
		if err := json.NewEncoder(stdout).Encode(res); err != nil {
			return 1
		}

		return 0
	}

	printSummary(stdout, res)

	return 0
}

// reexec runs this program again in a private mount namespace, with a scratch directory.
func reexec(args []string, stderr io.Writer) int {
	work, err := os.MkdirTemp("", "nvidia-driver-harness-")
	if err != nil {
		fmt.Fprintln(stderr, "harness:", err)

		return 1
	}
	defer os.RemoveAll(work) //nolint:errcheck // empty once the namespace is gone

	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(stderr, "harness:", err)

		return 1
	}

	cmd := exec.Command("unshare", append([]string{"--mount", "--propagation", "private", self}, args...)...)
	cmd.Env = append(os.Environ(), envInside+"="+work)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, stderr

	if err := cmd.Run(); err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}

		fmt.Fprintln(stderr, "harness:", err)

		return 1
	}

	return 0
}

func printSummary(w io.Writer, r harness.Result) {
	yes := func(b bool) string {
		if b {
			return "yes"
		}

		return "no"
	}

	fmt.Fprintf(w, "service            %s (rootfs propagation %q, %d capabilities, seccomp: containerd's default profile)\n", r.Service, r.RootfsPropagates, r.CapabilityCount)
	fmt.Fprintf(w, "depends met        %s\n", strings.Join(r.DependsMet, ", "))
	if len(r.DependsUnmet) > 0 {
		fmt.Fprintf(w, "depends unmet      %s (Talos would wait; the harness started it anyway)\n", strings.Join(r.DependsUnmet, ", "))
	}
	fmt.Fprintf(w, "phase              %s: %s\n", r.Phase, r.Message)
	fmt.Fprintf(w, "status after       %d ms\n", r.StartMillis)
	fmt.Fprintf(w, "driver root        mounted %s, read-only %s; after stop: mounted %s, read-only %s\n",
		yes(r.DriverRoot.Mounted), yes(r.DriverRoot.ReadOnly), yes(r.DriverRootAfter.Mounted), yes(r.DriverRootAfter.ReadOnly))
	fmt.Fprintf(w, "/dev               %s\n", strings.Join(r.DevEntries, " "))
	fmt.Fprintf(w, "CDI spec           %s; readiness file %s\n", yes(r.CDISpec), yes(r.ReadyFile))
	if r.AfterReadyExit != nil {
		fmt.Fprintf(w, "after ready        command exit code %d\n", *r.AfterReadyExit)
	}
	if r.ExitedByItself {
		fmt.Fprintf(w, "exit               by itself, code %d (Talos restarts it: restart always)\n", r.ExitCode)
	} else {
		fmt.Fprintf(w, "stop               SIGTERM -> exit %d in %d ms\n", r.ExitCode, r.StopMillis)
	}
	fmt.Fprintf(w, "log (%d waiting line(s)):\n%s", r.WaitingLogLines, r.Log)
}
