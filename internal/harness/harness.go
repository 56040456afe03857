package harness

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/talos-nvidia/nvidia-driver/internal/extension"
)

// Options says what to run and what to wait for.
type Options struct {
	// Extension is an assembled extension directory (manifest.yaml and rootfs/).
	Extension string
	// Document is the service's ExtensionServiceConfig; nil: the node has none.
	Document *Document
	// DocumentAfter, when positive, boots the node without the document and adds it this
	// long after the service was started (a document applied to a running node).
	DocumentAfter time.Duration
	// Until lists the service phases (status.json) to wait for before stopping it.
	Until []string
	// Wait bounds the wait for Until; Hold is how long to watch the service after it, to see
	// that it does not exit or repeat itself.
	Wait, Hold time.Duration
	// Then is what happens once the service reached Until and was watched for Hold:
	// "" stops it; ThenRestart stops and starts it (`talosctl service ext-nvidia-driver
	// restart`); ThenChange applies ThenDocument as a change of the document; ThenRemove
	// deletes the document. The last three report the next run in Result.Second, then stop.
	Then         string
	ThenDocument *Document
	// Overrides bind local files over node paths once the extension is laid, e.g. the fake
	// daemon over the subroot's nvidia-persistenced where no GPU driver can run the real one.
	Overrides map[string]string
	// Work is a scratch directory (a tmpfs is mounted on it).
	Work string
	// Runc is the runc binary.
	Runc string
	// Log receives progress lines.
	Log io.Writer
	// AfterReady, when set, is a shell command run on the host side while the service is
	// ready (e.g. hack/gpu-host/e2e-workload.sh: a CUDA container through the service's CDI spec).
	AfterReady string
	// Changes, with AfterReady, runs AfterReady in the background and meanwhile changes the
	// document this many times (its NVIDIA_DRIVER_LOG_LEVEL toggled between debug and info),
	// each change a restart by Talos, waiting for Until after each; then AfterReady's end.
	Changes int
	// ChangeEvery is the wait before each change: the workload gets going before the first.
	ChangeEvery time.Duration

	// AfterPhases are the phases in which AfterReady runs; empty: ready alone. (A simulated
	// NVSwitch board without a fabric manager is degraded, and serves its GPUs.)
	AfterPhases []string
	// BeforeBoot, when set, is a shell command run on the node once the extension is laid and
	// before the service starts, as a node loads its kernel modules before extension
	// services start (e.g. hack/sim-node/sim-node.sh: a simulated GPU node's driver state and
	// /proc files). Its failure is the harness's.
	BeforeBoot string
	// CreateContainerHook, when set, is an OCI createContainer hook (program, then its
	// arguments) added to the service's container, which Talos never adds: a simulated node's
	// stand-in for the kernel's /proc/driver entries, which no process can add to a procfs
	// (hack/sim-node/simnvml/prochook).
	CreateContainerHook []string

	callerDir string // the caller's working directory, for AfterReady and BeforeBoot
}

// Result is what the host side saw.
type Result struct {
	Service          string         `json:"service"`
	Phase            string         `json:"phase"`
	Message          string         `json:"message"`
	Status           map[string]any `json:"status,omitempty"`
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
	// ChangePhases is the phase reached after each of Options.Changes, and DriverRootMounts
	// the mounts at the driver root after the last (1: reused, never stacked).
	ChangePhases     []string `json:"changePhases,omitempty"`
	DriverRootMounts int      `json:"driverRootMounts,omitempty"`

	// Up says whether Talos would count the service Up, as the boot's StartAllServices waits
	// for: a container of it was started (an extension service has no health check).
	// Failed is Talos's message where the run ended in state Failed.
	Up     bool   `json:"up"`
	Failed string `json:"failed,omitempty"`

	// HostRoot is the service's host root (NVIDIA_DRIVER_HOST_ROOT of the document, "/"
	// by default): the paths above are looked up under it.
	HostRoot string `json:"hostRoot"`
	// Starts counts the containers Talos started; Exits holds the codes of those that
	// exited by themselves (each one restarted after 5 s: restart: always).
	Starts int   `json:"starts"`
	Exits  []int `json:"exits,omitempty"`
	// Events is what Talos's side did, in order.
	Events []string `json:"talosEvents,omitempty"`
	// PeerGroups: the shared:N peer group of /, of /usr/local/glibc and of the driver root,
	// as the host sees them ("" where not shared or not mounted).
	PeerGroups map[string]string `json:"peerGroups,omitempty"`
	// SocketDir and SocketDirAfterStop: mounts at the persistenced socket directory under
	// the driver root, seen from the host, while ready and after the stop.
	SocketDir          int `json:"socketDirMounts"`
	SocketDirAfterStop int `json:"socketDirMountsAfterStop"`
	// ContainerRun lists /run as the running service sees it.
	ContainerRun []string `json:"containerRun,omitempty"`
	// Second is the run after Then.
	Second *Rerun `json:"second,omitempty"`
}

// Rerun is what the host saw of the service started again.
type Rerun struct {
	Phase      string `json:"phase"`
	Message    string `json:"message"`
	SocketDir  int    `json:"socketDirMounts"`
	StopMillis int64  `json:"stopMillis"`
	ExitCode   int    `json:"exitCode"`
	Log        string `json:"log"` // its part of the log
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
	subrootPath = "/usr/local/glibc"
	socketDir   = "run/nvidia-persistenced" // under the driver root
)

// Run lays the extension over the host paths of a node modelled on Talos, runs its service
// under runc as Talos would (talos.go), waits, stops it as Talos does, and reports. It must
// run as root in a private mount namespace (see cmd hack/harness), where it makes / shared as
// on Talos and mounts over /usr/local, /usr/bin, /run and /dev.
func Run(o Options) (Result, error) {
	var res Result

	if err := requirePrivateNamespace(); err != nil {
		return res, err
	}

	// The Talos-shaped root makes / the working directory (machined's): paths given relative
	// to the caller's are made absolute first, and -after-ready runs in the caller's.
	if err := absolute(&o); err != nil {
		return res, err
	}

	if err := os.MkdirAll(o.Work, 0o755); err != nil {
		return res, err
	}

	if err := unix.Mount("tmpfs", o.Work, "tmpfs", 0, "mode=0755"); err != nil {
		return res, fmt.Errorf("mounting a scratch tmpfs on %s: %w", o.Work, err)
	}

	if err := talosRoot(o.Work); err != nil {
		return res, err
	}

	// Talos mounts its root shared (internal/app/init/main.go: the root overlay with
	// mount.WithShared()); the namespace is private, so nothing propagates off this machine.
	if err := unix.Mount("", "/", "", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return res, fmt.Errorf("making / shared: %w", err)
	}

	rootfs := filepath.Join(o.Extension, "rootfs")
	if err := layExtension(o.Work, rootfs); err != nil {
		return res, err
	}

	if err := override(o.Overrides); err != nil {
		return res, err
	}

	specPath := filepath.Join("/", extension.ServiceSpecPath, extension.ServiceName+".yaml")

	svc, err := extension.LoadServiceSpec(specPath)
	if err != nil {
		return res, err
	}

	res.Service = "ext-" + svc.Name
	res.HostRoot = hostRoot(o.Document)

	// Talos's PreFunc: an overlay over the service's rootfs, so that runc can make its mount
	// points in a rootfs that is read-only.
	ctrRoot := filepath.Join("/", extension.ContainersPath, svc.Name)
	if err := overlay(filepath.Join(o.Work, "ctr"), ctrRoot, []string{ctrRoot}, true); err != nil {
		return res, err
	}

	// Talos's cgroup is /system/extensions/<name>. One per run here: `runc kill --all`
	// signals every process in the container's cgroup, so two runs at once must not share it.
	cgroup := "/nvidia-driver-harness/" + svc.Name + "-" + filepath.Base(o.Work)

	spec, err := Spec(svc, ServiceConfig{}, cgroup)
	if err != nil {
		return res, err
	}

	res.CapabilityCount = len(spec.Process.Capabilities.Bounding)
	res.RootfsPropagates = spec.Linux.RootfsPropagation

	if spec.Linux.Seccomp != nil {
		for _, sc := range spec.Linux.Seccomp.Syscalls {
			res.SeccompSyscalls += len(sc.Names)
		}
	}

	logPath := filepath.Join(o.Work, "service.log")

	logFile, err := os.Create(logPath)
	if err != nil {
		return res, err
	}
	defer logFile.Close() //nolint:errcheck

	node := &talosNode{svc: svc, runc: o.Runc, work: o.Work, log: o.Log, logFile: logFile, cfgGroup: cgroup, hook: o.CreateContainerHook}

	fmt.Fprintf(o.Log, "harness: starting %s with runc (rootfs %s, propagation %q, %d capabilities, seccomp %d syscalls)\n",
		res.Service, ctrRoot, res.RootfsPropagates, res.CapabilityCount, res.SeccompSyscalls)

	start := time.Now()

	bootDoc := o.Document
	if o.DocumentAfter > 0 {
		bootDoc = nil
	}

	if o.BeforeBoot != "" {
		cmd := exec.Command("bash", "-c", o.BeforeBoot)
		cmd.Stdout, cmd.Stderr, cmd.Dir = o.Log, o.Log, o.callerDir
		cmd.Env = append(os.Environ(), "HARNESS_HOST_ROOT="+HostRootDir(o.Work))

		if err := cmd.Run(); err != nil {
			return res, fmt.Errorf("the -before-boot command %q: %w", o.BeforeBoot, err)
		}
	}

	if err := node.boot(bootDoc); err != nil {
		return res, err
	}

	if o.DocumentAfter > 0 && o.Document != nil {
		time.Sleep(o.DocumentAfter)

		if err := node.setDocument(o.Document); err != nil {
			return res, err
		}
	}

	h := hostView{root: res.HostRoot}

	res.Phase, res.Message, res.Status = h.waitFor(o.Until, o.Wait, node.runnerFailed)
	if res.Phase != "" && res.StartMillis == 0 {
		res.StartMillis = time.Since(start).Milliseconds()
	}

	// Watch it a while: a crash loop would show here as more starts.
	time.Sleep(o.Hold)

	if st, err := readJSON(h.path(statusPath)); err == nil {
		res.Status = st
		res.Phase, _ = st["phase"].(string)     //nolint:errcheck
		res.Message, _ = st["message"].(string) //nolint:errcheck
	}

	res.ContainerRun = node.containerRun()

	afterPhases := o.AfterPhases
	if len(afterPhases) == 0 {
		afterPhases = []string{"ready"}
	}

	if o.AfterReady != "" && slices.Contains(afterPhases, res.Phase) {
		code, phases, err := afterReady(node, h, o)
		if err != nil {
			return res, err
		}

		res.AfterReadyExit, res.ChangePhases = &code, phases
		res.DriverRootMounts = mountCount(h.path(driverMount))
	}

	res.DriverRoot = mountState(h.path(driverMount))
	res.DevEntries = dirNames(h.path("/dev"))
	res.CDISpec = exists(h.path("/run/cdi/nvidia.yaml"))
	res.ReadyFile = exists(h.path("/run/nvidia/validations/nvidia-driver.ready"))
	res.SocketDir = mountCount(filepath.Join(h.path(driverMount), socketDir))
	res.PeerGroups = map[string]string{
		"/": peerGroup("/"), subrootPath: peerGroup(subrootPath), h.path(driverMount): peerGroup(h.path(driverMount)),
	}

	firstLog, err := then(node, o)
	if err != nil {
		return res, err
	}

	if r := node.lastStopped(); r != nil {
		res.StopMillis, res.ExitCode = r.stopMillis, r.exitCode
	}

	res.DriverRootAfter = mountState(h.path(driverMount))
	res.SocketDirAfterStop = mountCount(filepath.Join(h.path(driverMount), socketDir))

	if o.Then != "" {
		second := &Rerun{}
		if o.Then != ThenRemove {
			second.Phase, second.Message, _ = h.waitFor(o.Until, o.Wait, node.runnerFailed)
		}

		second.SocketDir = mountCount(filepath.Join(h.path(driverMount), socketDir))

		if r := node.stop(); r != nil {
			second.StopMillis, second.ExitCode = r.stopMillis, r.exitCode
		}

		all, _ := os.ReadFile(logPath) //nolint:errcheck
		second.Log = strings.TrimPrefix(string(all), firstLog)
		res.Second = second
	}

	node.mu.Lock()
	res.Starts, res.Exits, res.Events = node.starts, node.exits, node.events
	res.Up, res.Failed = !node.upAt.IsZero(), node.failed
	node.mu.Unlock()

	res.ExitedByItself = len(res.Exits) > 0
	if res.ExitedByItself && res.StopMillis == 0 {
		res.ExitCode = res.Exits[len(res.Exits)-1]
	}

	res.Log = firstLog
	res.WaitingLogLines = strings.Count(res.Log, "phase=waiting")

	return res, nil
}

// absolute makes the paths of o absolute and records the caller's working directory.
func absolute(o *Options) error {
	cwd, err := os.Getwd()
	if err != nil {
		return err
	}

	o.callerDir = cwd

	for _, p := range []*string{&o.Extension, &o.Work, &o.Runc} {
		if *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(cwd, *p)
		}
	}

	for target, local := range o.Overrides {
		if !filepath.IsAbs(local) {
			o.Overrides[target] = filepath.Join(cwd, local)
		}
	}

	return nil
}

// afterReady runs o.AfterReady; with o.Changes, in the background while the document is
// changed that many times. Meanwhile it applies the changes the command asks for itself
// (serveRequests). It returns the command's exit code and the phase after each change.
func afterReady(node *talosNode, h hostView, o Options) (int, []string, error) {
	requests := filepath.Join(o.Work, "document-requests")
	if err := os.MkdirAll(requests, 0o755); err != nil {
		return 0, nil, err
	}

	cmd := exec.Command("bash", "-c", o.AfterReady)
	cmd.Stdout, cmd.Stderr = o.Log, o.Log
	cmd.Env = append(os.Environ(), "HARNESS_HOST_ROOT="+HostRootDir(o.Work), EnvDocumentRequests+"="+requests,
		EnvServiceLog+"="+node.logFile.Name())
	cmd.Dir = o.callerDir

	if err := cmd.Start(); err != nil {
		return 0, nil, fmt.Errorf("starting %q: %w", o.AfterReady, err)
	}

	stop, served := make(chan struct{}), make(chan struct{})

	go func() {
		defer close(served)

		serveRequests(node, requests, stop, o.Log)
	}()

	defer func() {
		close(stop)
		<-served
	}()

	var phases []string

	for i := range o.Changes {
		time.Sleep(o.ChangeEvery)

		doc := withLogLevel(o.Document, []string{"debug", "info"}[i%2])
		since := time.Now()

		if err := node.setDocument(doc); err != nil {
			return 0, nil, err
		}

		phase, msg, _ := h.waitForSince(o.Until, o.Wait, since, node.runnerFailed)
		fmt.Fprintf(o.Log, "harness: change %d of the document: phase %q (%s)\n", i+1, phase, msg)
		phases = append(phases, phase)
	}

	return exitCode(cmd.Wait()), phases, nil
}

// EnvDocumentRequests names, in the -after-ready command's environment, the directory where
// it asks for a change of the document at a time of its choosing (a user's `talosctl patch`
// in the middle of a test): a file NAME.env of K=V lines, renamed into place, sets those
// environment entries in the current document (the others stay), which Talos applies as a
// change (the service restarts); once applied, the file is renamed NAME.applied.
const EnvDocumentRequests = "HARNESS_DOCUMENT_REQUESTS"

// EnvServiceLog names, in the -after-ready command's environment, the file that holds the
// service's output, every run of its container appended (`talosctl logs ext-nvidia-driver`).
const EnvServiceLog = "HARNESS_SERVICE_LOG"

// serveRequests applies the document change requests in dir (EnvDocumentRequests), in name
// order, until stop.
func serveRequests(node *talosNode, dir string, stop <-chan struct{}, log io.Writer) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()

	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}

		names, _ := filepath.Glob(filepath.Join(dir, "*.env")) //nolint:errcheck // a constant pattern
		sort.Strings(names)

		for _, name := range names {
			env, err := requestedEnv(name)
			if err == nil {
				err = node.setDocument(node.documentWith(env))
			}

			if err != nil {
				fmt.Fprintf(log, "harness: document request %s: %v\n", filepath.Base(name), err)
			} else {
				fmt.Fprintf(log, "harness: document request %s applied: %s\n", filepath.Base(name), strings.Join(env, " "))
			}

			if err := os.Rename(name, strings.TrimSuffix(name, ".env")+".applied"); err != nil {
				fmt.Fprintf(log, "harness: document request %s: %v\n", filepath.Base(name), err)
			}
		}
	}
}

// requestedEnv reads a request's K=V lines (blank lines and # comments left out).
func requestedEnv(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}

	var env []string

	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}

		if k, _, ok := strings.Cut(line, "="); !ok || k == "" {
			return nil, fmt.Errorf("%s:%d: %q is not K=V", path, i+1, line)
		}

		env = append(env, line)
	}

	return env, nil
}

// withLogLevel is doc with NVIDIA_DRIVER_LOG_LEVEL set to level.
func withLogLevel(doc *Document, level string) *Document {
	return withEnv(doc, []string{"NVIDIA_DRIVER_LOG_LEVEL=" + level})
}

// withEnv is a copy of doc (an empty document where doc is nil) with the environment entries
// env set, each replacing the entry of its name.
func withEnv(doc *Document, env []string) *Document {
	out := &Document{Files: map[string]string{}}
	set := map[string]bool{}

	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		set[k] = true
	}

	if doc != nil {
		maps.Copy(out.Files, doc.Files)

		for _, kv := range doc.Environment {
			if k, _, _ := strings.Cut(kv, "="); !set[k] {
				out.Environment = append(out.Environment, kv)
			}
		}
	}

	out.Environment = append(out.Environment, env...)

	return out
}

// What Options.Then can do.
const (
	ThenRestart = "restart"
	ThenChange  = "change"
	ThenRemove  = "remove"
)

// then stops the service as Options.Then says, and starts it again where it says so. It
// returns the log up to the stop; after it, the node's last stopped run is the first.
func then(node *talosNode, o Options) (firstLog string, err error) {
	log := func() string {
		data, _ := os.ReadFile(node.logFile.Name()) //nolint:errcheck // scratch

		return string(data)
	}

	switch o.Then {
	case "":
		node.stop()

		return log(), nil
	case ThenRestart:
		node.stop()
		firstLog = log()
		node.start()

		return firstLog, nil
	case ThenChange, ThenRemove:
		// The controller stops the service itself; the log up to its restart is the first
		// run's: the new container appends after it.
		node.onStop = func() { firstLog = log() }

		if o.Then == ThenRemove {
			node.removeDocument()
		} else if err := node.setDocument(o.ThenDocument); err != nil {
			return "", err
		}

		return firstLog, nil
	default:
		return "", fmt.Errorf("then %q: want %s, %s or %s", o.Then, ThenRestart, ThenChange, ThenRemove)
	}
}

// hostView looks at the node under the service's host root.
type hostView struct{ root string }

func (h hostView) path(p string) string { return filepath.Join(h.root, p) }

// waitFor polls the status file until its phase is one of until, wait passes, or failed
// says that Talos gave up on the service.
func (h hostView) waitFor(until []string, wait time.Duration, failed func() bool) (phase, msg string, st map[string]any) {
	for deadline := time.Now().Add(wait); time.Now().Before(deadline) && !failed(); time.Sleep(20 * time.Millisecond) {
		s, err := readJSON(h.path(statusPath))
		if err != nil {
			continue
		}

		st = s
		phase, _ = s["phase"].(string) //nolint:errcheck // absent is ""
		msg, _ = s["message"].(string) //nolint:errcheck

		if contains(until, phase) {
			return phase, msg, st
		}
	}

	return phase, msg, st
}

// waitForSince is waitFor for a status written after since (the restarted service's, not
// its predecessor's).
func (h hostView) waitForSince(until []string, wait time.Duration, since time.Time, failed func() bool) (phase, msg string, st map[string]any) {
	deadline := time.Now().Add(wait)

	for {
		phase, msg, st = h.waitFor(until, time.Until(deadline), failed)

		updated, _ := st["updated"].(string) //nolint:errcheck // absent: not yet written
		if t, err := time.Parse(time.RFC3339Nano, updated); err == nil && t.After(since) && contains(until, phase) {
			return phase, msg, st
		}

		if !time.Now().Before(deadline) || failed() {
			return phase, msg, st
		}

		time.Sleep(20 * time.Millisecond)
	}
}

// hostRoot is the service's host root: its NVIDIA_DRIVER_HOST_ROOT, or /. A simulated node
// keeps it under /run/nvidia, which the service YAML binds rshared, so the host sees it.
func hostRoot(doc *Document) string {
	if doc != nil {
		for _, kv := range doc.Environment {
			if v, ok := strings.CutPrefix(kv, "NVIDIA_DRIVER_HOST_ROOT="); ok {
				return v
			}
		}
	}

	return "/"
}

// override binds each local file over a node path.
func override(files map[string]string) error {
	for target, local := range files {
		if err := unix.Mount(local, target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding %s over %s: %w", local, target, err)
		}
	}

	return nil
}

func writeBundle(dir string, spec any) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}

	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}

	return os.WriteFile(filepath.Join(dir, "config.json"), data, 0o644)
}

// layExtension puts the extension's files where a Talos node has them, as read-only
// overlays whose upper layer is the extension (Talos merges extensions the same way), over
// /usr/local and /usr/bin; /run and /dev become throwaway tmpfs mounts.
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

	// Talos's /run (internal/pkg/mount/v3/helpers.go, PseudoLate): a tmpfs, nosuid, noexec,
	// relatime, mode 0755; shared, as every mount made under its shared root is.
	if err := unix.Mount("tmpfs", "/run", "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC|unix.MS_RELATIME, "mode=0755"); err != nil {
		return fmt.Errorf("mounting a throwaway /run: %w", err)
	}

	// What else a node keeps there, which the service has no business seeing: containerd's
	// socket directory (Talos's system containerd is under /run/containerd).
	if err := os.MkdirAll("/run/containerd", 0o711); err != nil {
		return err
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

	// With / shared the handle would be a peer of /dev: the tmpfs mounted on /dev would
	// appear on it too, and unmounting it would take the tmpfs off /dev again.
	if err := unix.Mount("", real, "", unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making the handle on /dev private: %w", err)
	}

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

func mountCount(path string) int {
	infos, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(path))
	if err != nil {
		return 0
	}

	return len(infos)
}

// peerGroup is the shared:N of the mount that holds path (the topmost, innermost one).
func peerGroup(path string) string {
	infos, err := mountinfo.GetMounts(nil)
	if err != nil {
		return ""
	}

	var holder *mountinfo.Info

	for _, i := range infos {
		inside := i.Mountpoint == "/" || path == i.Mountpoint || strings.HasPrefix(path, i.Mountpoint+"/")
		if inside && (holder == nil || len(i.Mountpoint) >= len(holder.Mountpoint)) {
			holder = i
		}
	}

	if holder == nil {
		return ""
	}

	for _, f := range strings.Fields(holder.Optional) {
		if strings.HasPrefix(f, "shared:") {
			return f
		}
	}

	return ""
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
