package harness

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/moby/sys/mountinfo"
	"github.com/siderolabs/talos/pkg/machinery/extensions/services"
	"golang.org/x/sys/unix"

	"github.com/talos-nvidia/nvidia-driver/pkg/extension"
)

// Options says what to run and what to wait for.
type Options struct {
	// Extension is an assembled extension directory (manifest.yaml and rootfs/).
	Extension string
	// Config is the ExtensionServiceConfig: files by mount path, and environment.
	ConfigFiles map[string]string
	Environment []string
	// Until lists the service phases (status.json) to wait for before stopping it; the wait
	// also ends when the service exits by itself.
	Until []string
	// Wait bounds the wait for Until; Hold is how long to watch the service after it, to see
	// that it does not exit or repeat itself.
	Wait, Hold time.Duration
	// Work is a scratch directory (a tmpfs is mounted on it).
	Work string
	// Runc is the runc binary.
	Runc string
	// Log receives progress lines.
	Log io.Writer
	// AfterReady, when set, is a shell command run on the host side while the service is
	// ready (e.g. hack/e2e-workload.sh: a CUDA container through the service's CDI spec).
	AfterReady string
}

// Result is what the host side saw.
type Result struct {
	Service          string         `json:"service"`
	Phase            string         `json:"phase"`
	Message          string         `json:"message"`
	Status           map[string]any `json:"status,omitempty"`
	DependsMet       []string       `json:"dependsMet,omitempty"`
	DependsUnmet     []string       `json:"dependsUnmet,omitempty"`
	ExitedByItself   bool           `json:"exitedByItself"`
	ExitCode         int            `json:"exitCode"`
	StopMillis       int64          `json:"stopMillis"`
	DriverRoot       MountState     `json:"driverRoot"`
	DriverRootAfter  MountState     `json:"driverRootAfterStop"`
	DevEntries       []string       `json:"devEntries,omitempty"`
	CDISpec          bool           `json:"cdiSpec"`
	ReadyFile        bool           `json:"readyFile"`
	WaitingLogLines  int            `json:"waitingLogLines"`
	Log              string         `json:"log"`
	StartMillis      int64          `json:"startMillis"`
	SeccompSyscalls  int            `json:"seccompSyscalls"`
	CapabilityCount  int            `json:"capabilities"`
	RootfsPropagates string         `json:"rootfsPropagation"`
	AfterReadyExit   *int           `json:"afterReadyExit,omitempty"`
}

// MountState is a mount seen from the host side.
type MountState struct {
	Mounted  bool `json:"mounted"`
	ReadOnly bool `json:"readOnly"`
}

const (
	runcID      = "ext-nvidia-driver"
	statusPath  = "/run/nvidia-driver/status.json"
	driverMount = "/run/nvidia/driver"
	// stopGrace is Talos's: SIGTERM, then SIGKILL after 10 s.
	stopGrace = 10 * time.Second
)

// Run lays the extension over the host paths, runs its service under runc as Talos would,
// waits, stops it with SIGTERM, and reports. It must run as root in a private mount
// namespace (see cmd hack/harness): it mounts over /usr/local, /usr/bin, /run and /dev.
func Run(o Options) (Result, error) {
	var res Result

	if err := requirePrivateNamespace(); err != nil {
		return res, err
	}

	if err := os.MkdirAll(o.Work, 0o755); err != nil {
		return res, err
	}

	if err := unix.Mount("tmpfs", o.Work, "tmpfs", 0, "mode=0755"); err != nil {
		return res, fmt.Errorf("mounting a scratch tmpfs on %s: %w", o.Work, err)
	}

	rootfs := filepath.Join(o.Extension, "rootfs")
	if err := layExtension(o.Work, rootfs); err != nil {
		return res, err
	}

	specPath := filepath.Join("/", extension.ServiceSpecPath, extension.ServiceName+".yaml")

	svc, err := extension.LoadServiceSpec(specPath)
	if err != nil {
		return res, err
	}

	res.Service = "ext-" + svc.Name
	res.DependsMet, res.DependsUnmet = dependencies(svc)

	cfg, err := writeServiceConfig(o.Work, svc.Name, o.ConfigFiles, o.Environment)
	if err != nil {
		return res, err
	}

	// Talos's extension runner: missing mount sources are created 0700.
	for _, m := range svc.Container.Mounts {
		if _, err := os.Stat(m.Source); errors.Is(err, os.ErrNotExist) {
			if err := os.MkdirAll(m.Source, 0o700); err != nil {
				return res, err
			}
		}
	}

	// Talos's PreFunc: an overlay over the service's rootfs, so that runc can make its mount
	// points in a rootfs that is read-only.
	ctrRoot := filepath.Join("/", extension.ContainersPath, svc.Name)
	if err := overlay(filepath.Join(o.Work, "ctr"), ctrRoot, []string{ctrRoot}, true); err != nil {
		return res, err
	}

	spec, err := Spec(svc, cfg, "/nvidia-driver-harness/"+svc.Name)
	if err != nil {
		return res, err
	}

	// Talos sets -600; lowering a score needs CAP_SYS_RESOURCE, which a build container may
	// lack. The harness's own process (it dies with the run) tells whether it is allowed.
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte("-600"), 0o644); err != nil {
		fmt.Fprintf(o.Log, "harness: cannot lower the OOM score here (%v): runs without Talos's oomScoreAdj -600\n", err)

		spec.Process.OOMScoreAdj = nil
	}

	res.CapabilityCount = len(spec.Process.Capabilities.Bounding)
	res.RootfsPropagates = spec.Linux.RootfsPropagation

	if spec.Linux.Seccomp != nil {
		for _, sc := range spec.Linux.Seccomp.Syscalls {
			res.SeccompSyscalls += len(sc.Names)
		}
	}

	bundle := filepath.Join(o.Work, "bundle")
	if err := os.MkdirAll(bundle, 0o755); err != nil {
		return res, err
	}

	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return res, err
	}

	if err := os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o644); err != nil {
		return res, err
	}

	logPath := filepath.Join(o.Work, "service.log")

	logFile, err := os.Create(logPath)
	if err != nil {
		return res, err
	}
	defer logFile.Close() //nolint:errcheck

	runcRoot := filepath.Join(o.Work, "runc")
	cmd := exec.Command(o.Runc, "--root", runcRoot, "run", "--bundle", bundle, runcID)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, logFile, logFile

	fmt.Fprintf(o.Log, "harness: starting %s with runc (rootfs %s, propagation %q, %d capabilities, seccomp %d syscalls)\n",
		res.Service, ctrRoot, res.RootfsPropagates, res.CapabilityCount, res.SeccompSyscalls)

	start := time.Now()

	if err := cmd.Start(); err != nil {
		return res, fmt.Errorf("starting runc: %w", err)
	}

	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	var waitErr error

	done := false
	deadline := time.Now().Add(o.Wait)

	for !done && time.Now().Before(deadline) {
		if st, err := readJSON(statusPath); err == nil {
			if res.StartMillis == 0 {
				res.StartMillis = time.Since(start).Milliseconds()
			}

			res.Status = st
			res.Phase, _ = st["phase"].(string)     //nolint:errcheck // absent is ""
			res.Message, _ = st["message"].(string) //nolint:errcheck

			if contains(o.Until, res.Phase) {
				break
			}
		}

		select {
		case waitErr = <-exited:
			done = true
		case <-time.After(20 * time.Millisecond):
		}
	}

	if !done {
		// Watch it a while: a crash loop would exit here (Talos would restart it).
		select {
		case waitErr = <-exited:
			done = true
		case <-time.After(o.Hold):
		}
	}

	if st, err := readJSON(statusPath); err == nil {
		res.Status = st
		res.Phase, _ = st["phase"].(string)     //nolint:errcheck
		res.Message, _ = st["message"].(string) //nolint:errcheck
	}

	if o.AfterReady != "" && !done && res.Phase == "ready" {
		cmd := exec.Command("bash", "-c", o.AfterReady)
		cmd.Stdout, cmd.Stderr = o.Log, o.Log

		code := 0
		if err := cmd.Run(); err != nil {
			code = -1

			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			}
		}

		res.AfterReadyExit = &code
	}

	res.DriverRoot = mountState(driverMount)
	res.DevEntries = dirNames("/dev")
	res.CDISpec = exists("/run/cdi/nvidia.yaml")
	res.ReadyFile = exists("/run/nvidia/validations/nvidia-driver.ready")

	if done {
		res.ExitedByItself = true
	} else {
		stopStart := time.Now()

		if out, err := exec.Command(o.Runc, "--root", runcRoot, "kill", "--all", runcID, "TERM").CombinedOutput(); err != nil {
			fmt.Fprintf(o.Log, "harness: runc kill TERM: %v: %s\n", err, out)
		}

		select {
		case waitErr = <-exited:
		case <-time.After(stopGrace):
			fmt.Fprintln(o.Log, "harness: no exit within 10 s of SIGTERM: SIGKILL, as Talos would")
			exec.Command(o.Runc, "--root", runcRoot, "kill", "--all", runcID, "KILL").Run() //nolint:errcheck

			waitErr = <-exited
		}

		res.StopMillis = time.Since(stopStart).Milliseconds()
	}

	var ee *exec.ExitError
	if errors.As(waitErr, &ee) {
		res.ExitCode = ee.ExitCode()
	} else if waitErr != nil {
		return res, waitErr
	}

	exec.Command(o.Runc, "--root", runcRoot, "delete", "--force", runcID).Run() //nolint:errcheck // gone already when run returned

	res.DriverRootAfter = mountState(driverMount)

	logData, _ := os.ReadFile(logPath) //nolint:errcheck
	res.Log = string(logData)
	res.WaitingLogLines = strings.Count(res.Log, "phase=waiting")

	return res, nil
}

// layExtension puts the extension's files where a Talos node has them, as read-only
// overlays whose upper layer is the extension (Talos merges extensions the same way), over
// /usr/local and /usr/bin; /run and /dev become throwaway tmpfs mounts (/run shared, as on
// a node, so that the service's mounts reach it).
func layExtension(work, rootfs string) error {
	for _, dir := range []string{"usr/local", "usr/bin"} {
		src := filepath.Join(rootfs, dir)
		if _, err := os.Stat(src); err != nil {
			continue
		}

		target := "/" + dir
		if err := overlay(filepath.Join(work, strings.ReplaceAll(dir, "/", "-")), target, []string{src, target}, false); err != nil {
			return err
		}
	}

	if err := unix.Mount("tmpfs", "/run", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		return fmt.Errorf("mounting a throwaway /run: %w", err)
	}

	if err := unix.Mount("", "/run", "", unix.MS_SHARED, ""); err != nil {
		return fmt.Errorf("making /run shared: %w", err)
	}

	return throwawayDev(work)
}

// throwawayDev replaces /dev with a tmpfs holding the basic nodes (bind-mounted from the
// real /dev), so that device nodes the service creates never reach the machine's /dev.
func throwawayDev(work string) error {
	real := filepath.Join(work, "real-dev")
	if err := os.MkdirAll(real, 0o755); err != nil {
		return err
	}

	if err := unix.Mount("/dev", real, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("keeping a handle on /dev: %w", err)
	}
	defer unix.Unmount(real, unix.MNT_DETACH) //nolint:errcheck // a scratch mount

	if err := unix.Mount("tmpfs", "/dev", "tmpfs", unix.MS_NOSUID, "mode=0755"); err != nil {
		return fmt.Errorf("mounting a throwaway /dev: %w", err)
	}

	for _, n := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		p := filepath.Join("/dev", n)
		if err := os.WriteFile(p, nil, 0o666); err != nil {
			return err
		}

		if err := unix.Mount(filepath.Join(real, n), p, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding /dev/%s: %w", n, err)
		}
	}

	for _, d := range []string{"pts", "shm"} {
		if err := os.MkdirAll(filepath.Join("/dev", d), 0o755); err != nil {
			return err
		}
	}

	return nil
}

// overlay mounts an overlay at target with lowers (first on top); writable adds a tmpfs
// upper layer under scratch.
func overlay(scratch, target string, lowers []string, writable bool) error {
	opts := "lowerdir=" + strings.Join(lowers, ":")

	if writable {
		up, wk := filepath.Join(scratch, "upper"), filepath.Join(scratch, "work")
		for _, d := range []string{up, wk} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}

		opts += ",upperdir=" + up + ",workdir=" + wk
	}

	flags := uintptr(0)
	if !writable {
		flags = unix.MS_RDONLY
	}

	if err := unix.Mount("overlay", target, "overlay", flags, opts); err != nil {
		return fmt.Errorf("overlay on %s (%s): %w", target, opts, err)
	}

	return nil
}

// writeServiceConfig does what Talos's ExtensionServiceConfigFilesController does: each file
// is written 0644 under <work>/system/overlays/extensions/<service>/.
func writeServiceConfig(work, service string, files map[string]string, env []string) (ServiceConfig, error) {
	cfg := ServiceConfig{Environment: env}
	base := filepath.Join(work, "system/overlays/extensions")

	for mountPath, content := range files {
		p := ConfigFileName(base, service, mountPath)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return cfg, err
		}

		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return cfg, err
		}

		cfg.Files = append(cfg.Files, ConfigFile{Source: p, MountPath: mountPath})
	}

	return cfg, nil
}

// dependencies says which of the service's path dependencies hold on this host. Talos
// would keep the service waiting on an unmet one; the harness reports it and runs the
// service anyway, to exercise its own wait.
func dependencies(svc services.Spec) (met, unmet []string) {
	for _, d := range svc.Depends {
		if d.Path == "" {
			continue
		}

		if exists(d.Path) {
			met = append(met, d.Path)
		} else {
			unmet = append(unmet, d.Path)
		}
	}

	return met, unmet
}

func requirePrivateNamespace() error {
	if os.Geteuid() != 0 {
		return errors.New("the harness needs root")
	}

	infos, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter("/"))
	if err != nil {
		return err
	}

	for _, i := range infos {
		if strings.Contains(i.Optional, "shared:") {
			return errors.New("/ is shared: run the harness in a private mount namespace (unshare --mount --propagation private)")
		}
	}

	return nil
}

func mountState(path string) MountState {
	infos, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(path))
	if err != nil || len(infos) == 0 {
		return MountState{}
	}

	last := infos[len(infos)-1]

	return MountState{Mounted: true, ReadOnly: strings.HasPrefix(last.Options, "ro")}
}

func readJSON(path string) (map[string]any, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}

	var m map[string]any

	return m, json.Unmarshal(data, &m)
}

func exists(p string) bool {
	_, err := os.Stat(p)

	return err == nil
}

func dirNames(dir string) []string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}

	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}

	return names
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}

	return false
}
