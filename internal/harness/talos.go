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
	"sync"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/siderolabs/talos/pkg/machinery/extensions/services"

	"github.com/talos-nvidia/nvidia-driver/pkg/document"
)

// This file models what Talos v1.13 does with an extension service, from its source
// (siderolabs/talos v1.13.9, internal/app/machined):
//
//   - pkg/controllers/runtime/extension_service.go (ExtensionServiceController): at boot it
//     loads every service and starts it; when the spec version of a service's
//     ExtensionServiceConfig status changes it stops and starts the service, except for
//     version "1" while the service is running; when the document goes away it restarts it.
//   - pkg/controllers/runtime/extension_service_config_files.go: the document's files are
//     written 0644 under constants.ExtensionServiceUserConfigPath/<name>/ (this directory is
//     created for every document and removed with it); the status's spec version is the
//     document's resource version, "1" when it is created and one more on every change.
//   - pkg/system/service_runner.go (Run): the service waits, in state Waiting, for the services
//     it depends on to be Up and for its Condition; then Runner is built, and an error there
//     ends the run in state Failed ("Failed to create runner: ...", system.go), never retried.
//   - pkg/system/services/extension.go: DependsOn is containerd plus each `service` entry;
//     Condition waits for each `path` ("file %q to exist", pkg/conditions/files.go) and
//     `configuration` entry; Runner creates missing mount sources with os.MkdirAll(source,
//     0700) from machined's working directory, `/`, which is read-only (root.go), adds the
//     document's files (read-only binds) and environment, and wraps the container runner in
//     the restart policy: a process that exits is started again with the same mounts and
//     environment.
//   - pkg/system/runner/restart/restart.go: `restart: always` is Forever: a container that
//     exits, with any code, is started again after RestartInterval, 5 s (untilSuccess: only
//     after a non-zero code; never: not at all).
//   - pkg/system/runner/containerd/containerd.go: stop is task.Kill(SIGTERM, WithKillAll), then
//     SIGKILL after the graceful shutdown timeout, 10 s (pkg/system/runner/runner.go). runc
//     1.2 and later (Talos v1.13 ships 1.4.x, v1.14 1.5.x: siderolabs/pkgs) ignore --all for a container
//     with its own PID namespace: SIGTERM reaches the container's init alone, and the kernel
//     kills the rest when it exits. The harness runs the runc it is given: the tests give it
//     runc 1.5.1 (hack/k8s-node/build.sh).
//   - pkg/runtime/v1alpha1/v1alpha1_sequencer_tasks.go (StartAllServices): the boot waits for
//     every loaded service to be Up (for a service without a health check: Running) for up to
//     constants.BootTimeout, 70 min; Result.Up says whether this one got there.
//
// Of the other services only cri is modelled, as Up from the start: a service that depends
// on it starts once its volumes are mounted (/etc/kubernetes writable, root.go); one that
// does not may start before (the harness takes that case, the one that fails).

const (
	// restartInterval is restart.go's default RestartInterval.
	restartInterval = 5 * time.Second
	// stopGrace is runner.go's GracefulShutdownTimeout: SIGTERM, then SIGKILL.
	stopGrace = 10 * time.Second
	// conditionInterval is service_runner.go's WaitConditionCheckInterval.
	conditionInterval = time.Second
)

// Document is an ExtensionServiceConfig: files by mount path, and environment.
type Document struct {
	Files       map[string]string
	Environment []string
}

// talosNode is the Talos side of one extension service on a node.
type talosNode struct {
	svc      services.Spec
	runc     string
	work     string
	log      io.Writer
	logFile  *os.File // the service's output, every container run appended
	cfgGroup string   // cgroup path of the container
	hook     []string // Options.CreateContainerHook

	mu      sync.Mutex
	doc     *Document
	version int    // the document's resource version; 0: no document
	cached  string // the controller's configStatusCache entry for the service
	current *serviceRun
	stopped *serviceRun // the last run stopped
	onStop  func()      // called once the next stop is done
	starts  int
	exits   []int // exit codes of containers that exited by themselves
	events  []string
	upAt    time.Time // when the first container started: the service was Up
	failed  string    // the Failed state's message: the runner could not be built
	criOnce sync.Once
	criErr  error
}

// serviceRun is one Start of the service: its condition, then the restart loop.
type serviceRun struct {
	stop chan struct{}
	done chan struct{}

	stopMillis int64
	exitCode   int
}

func (n *talosNode) event(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)

	n.mu.Lock()
	n.events = append(n.events, msg)
	n.mu.Unlock()

	fmt.Fprintln(n.log, "talos:", msg)
}

// boot is the controller's first pass: a document present at boot is in its cache already
// (no restart for it), and the service is started.
func (n *talosNode) boot(doc *Document) error {
	if doc != nil {
		if err := n.writeDocument(doc); err != nil {
			return err
		}

		n.mu.Lock()
		n.doc, n.version, n.cached = doc, 1, "1"
		n.mu.Unlock()
	}

	n.start()

	return nil
}

// setDocument adds or changes the ExtensionServiceConfig and runs the controller's loop.
func (n *talosNode) setDocument(doc *Document) error {
	if err := n.writeDocument(doc); err != nil {
		return err
	}

	n.mu.Lock()
	n.doc = doc
	n.version++
	v := fmt.Sprint(n.version)
	changed := n.cached != v
	n.cached = v
	n.mu.Unlock()

	n.event("ExtensionServiceConfig for %s at version %s", n.svc.Name, v)

	if changed {
		n.handleRestart(v)
	}

	return nil
}

// documentWith is the current document with the environment entries env set (withEnv).
func (n *talosNode) documentWith(env []string) *Document {
	n.mu.Lock()
	defer n.mu.Unlock()

	return withEnv(n.doc, env)
}

// removeDocument deletes the ExtensionServiceConfig: the controller restarts the service.
func (n *talosNode) removeDocument() {
	n.mu.Lock()
	n.doc, n.version, n.cached = nil, 0, ""
	n.mu.Unlock()

	if err := n.deleteDocument(); err != nil {
		n.event("removing the document's directory: %v", err)
	}

	n.event("ExtensionServiceConfig for %s removed", n.svc.Name)
	n.handleRestart("nan")
}

// handleRestart is ExtensionServiceController.handleRestart.
func (n *talosNode) handleRestart(version string) {
	n.mu.Lock()
	running := n.current != nil
	n.mu.Unlock()

	if running && version == "1" {
		n.event("service running and config at version 1: no restart (it is assumed to wait for its configuration)")

		return
	}

	n.event("extension service config changed, restarting")

	if running {
		n.stop()
	}

	n.start()
}

// start is the service runner's Start: wait for the condition, then run the container
// under the restart policy until stopped.
func (n *talosNode) start() {
	r := &serviceRun{stop: make(chan struct{}), done: make(chan struct{})}

	n.mu.Lock()
	n.current = r
	n.mu.Unlock()

	go n.serve(r)
}

// stop stops the current run (the service runner's Stop) and waits for it.
func (n *talosNode) stop() *serviceRun {
	n.mu.Lock()
	r := n.current
	n.current = nil
	n.mu.Unlock()

	if r == nil {
		return nil
	}

	close(r.stop)
	<-r.done

	n.mu.Lock()
	n.stopped = r
	f := n.onStop
	n.onStop = nil
	n.mu.Unlock()

	if f != nil {
		f()
	}

	return r
}

// runnerFailed reports whether the service's run ended in state Failed.
func (n *talosNode) runnerFailed() bool {
	n.mu.Lock()
	defer n.mu.Unlock()

	return n.failed != ""
}

func (n *talosNode) lastStopped() *serviceRun {
	n.mu.Lock()
	defer n.mu.Unlock()

	return n.stopped
}

func (n *talosNode) serve(r *serviceRun) {
	defer close(r.done)

	if !n.waitDependencies(r) || !n.waitCondition(r) {
		return
	}

	// services/extension.go Runner: built once per start; the restart policy runs the same
	// container (mounts and environment) again after each exit.
	spec, err := n.runner()
	if err != nil {
		// service_runner.go Run and system.go: the run ends in state Failed.
		msg := "Failed to create runner: " + err.Error()

		n.mu.Lock()
		n.failed = msg
		n.mu.Unlock()

		n.event("%s", msg)

		return
	}

	for {
		exited, code, err := n.runContainer(r, spec)
		if err != nil {
			n.event("container: %v", err)

			return
		}

		if !exited {
			return // stopped
		}

		n.mu.Lock()
		n.exits = append(n.exits, code)
		n.mu.Unlock()

		// restart.go: never is Once, untilSuccess ends on exit code 0, always is Forever.
		if n.svc.Restart == services.RestartNever || (n.svc.Restart == services.RestartUntilSuccess && code == 0) {
			n.event("task exited with code %d; not restarted (restart: %s)", code, n.svc.Restart)

			return
		}

		n.event("task exited with code %d; restarting in %s (restart: %s)", code, restartInterval, n.svc.Restart)

		select {
		case <-r.stop:
			return
		case <-time.After(restartInterval):
		}
	}
}

// waitDependencies waits for the services the service depends on (DependsOn). cri is Up
// from the start, its volumes mounted; any other would hold the service Waiting for good.
// It reports whether to go on (false: stopped while waiting).
func (n *talosNode) waitDependencies(r *serviceRun) bool {
	for _, d := range n.svc.Depends {
		if d.Service == "" {
			continue
		}

		if d.Service == "cri" {
			n.criOnce.Do(func() { n.criErr = criOverlays() })

			if n.criErr == nil {
				continue
			}

			n.event("cri: %v", n.criErr)
		}

		n.event("Waiting for service %q to be %q", d.Service, "up")
		<-r.stop

		return false
	}

	return true
}

// waitCondition waits for the `configuration` and `path` dependencies, as Condition does,
// checking every second (service_runner.go WaitConditionCheckInterval). It reports whether
// to go on (false: stopped while waiting).
func (n *talosNode) waitCondition(r *serviceRun) bool {
	for said := ""; ; {
		var waiting []string

		for _, d := range n.svc.Depends {
			switch {
			case d.Configuration:
				n.mu.Lock()
				ok := n.doc != nil
				n.mu.Unlock()

				if !ok {
					waiting = append(waiting, "extension service config")
				}
			case d.Path != "":
				if !exists(d.Path) {
					waiting = append(waiting, fmt.Sprintf("file %q to exist", d.Path))
				}
			}
		}

		if len(waiting) == 0 {
			return true
		}

		if msg := "Waiting for " + strings.Join(waiting, ", "); msg != said {
			n.event("%s", msg)
			said = msg
		}

		select {
		case <-r.stop:
			return false
		case <-time.After(conditionInterval):
		}
	}
}

// runner is services/extension.go Runner: missing mount sources are created 0700 (from
// machined's working directory, /), and the container's spec is made from the document as
// it is now.
func (n *talosNode) runner() (*specs.Spec, error) {
	n.mu.Lock()
	doc := n.doc
	n.mu.Unlock()

	for _, m := range n.svc.Container.Mounts {
		if _, err := os.Stat(m.Source); errors.Is(err, os.ErrNotExist) {
			if err := os.MkdirAll(m.Source, 0o700); err != nil {
				return nil, err
			}
		}
	}

	spec, err := Spec(n.svc, serviceConfig(n.configBase(), n.svc.Name, doc), n.cfgGroup)
	if err != nil || len(n.hook) == 0 {
		return spec, err
	}

	if spec.Hooks == nil {
		spec.Hooks = &specs.Hooks{}
	}

	spec.Hooks.CreateContainer = append(spec.Hooks.CreateContainer, specs.Hook{Path: n.hook[0], Args: n.hook})

	return spec, nil
}

// runContainer runs the container of spec until it exits or r is stopped.
func (n *talosNode) runContainer(r *serviceRun, spec *specs.Spec) (exited bool, code int, err error) {
	// Talos sets -600; lowering a score needs CAP_SYS_RESOURCE, which a build container may
	// lack. The harness's own process (it dies with the run) tells whether it is allowed.
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte("-600"), 0o644); err != nil {
		spec.Process.OOMScoreAdj = nil
	}

	bundle := filepath.Join(n.work, "bundle")
	if err := writeBundle(bundle, spec); err != nil {
		return false, 0, err
	}

	runcRoot := filepath.Join(n.work, "runc")
	cmd := exec.Command(n.runc, "--root", runcRoot, "run", "--bundle", bundle, runcID)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, n.logFile, n.logFile

	if err := cmd.Start(); err != nil {
		return false, 0, fmt.Errorf("starting runc: %w", err)
	}

	n.mu.Lock()
	n.starts++
	if n.upAt.IsZero() {
		n.upAt = time.Now()
	}
	n.mu.Unlock()

	n.event("started task %s", runcID)

	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()

	defer exec.Command(n.runc, "--root", runcRoot, "delete", "--force", runcID).Run() //nolint:errcheck // gone already

	select {
	case err := <-waited:
		return true, exitCode(err), nil
	case <-r.stop:
	}

	// containerd.go: SIGTERM with --all (runc 1.4: to the init alone), SIGKILL after the grace.
	start := time.Now()

	n.event("sending SIGTERM to %s (runc kill --all)", runcID)

	if out, err := exec.Command(n.runc, "--root", runcRoot, "kill", "--all", runcID, "TERM").CombinedOutput(); err != nil {
		n.event("runc kill TERM: %v: %s", err, strings.TrimSpace(string(out)))
	}

	var werr error

	select {
	case werr = <-waited:
	case <-time.After(stopGrace):
		n.event("no exit within %s of SIGTERM: sending SIGKILL", stopGrace)
		exec.Command(n.runc, "--root", runcRoot, "kill", "--all", runcID, "KILL").Run() //nolint:errcheck

		werr = <-waited
	}

	r.stopMillis = time.Since(start).Milliseconds()
	r.exitCode = exitCode(werr)

	return false, r.exitCode, nil
}

// containerRun lists /run inside the running container, through its init's root.
func (n *talosNode) containerRun() []string {
	out, err := exec.Command(n.runc, "--root", filepath.Join(n.work, "runc"), "state", runcID).Output()
	if err != nil {
		return nil
	}

	var st struct {
		Pid int `json:"pid"`
	}

	if err := json.Unmarshal(out, &st); err != nil || st.Pid == 0 {
		return nil
	}

	return dirNames(fmt.Sprintf("/proc/%d/root/run", st.Pid))
}

func (n *talosNode) configBase() string { return document.BaseDir }

// writeDocument does what ExtensionServiceConfigFilesController does: the service's
// directory is created for every document, each file is written 0644 in it, and what the
// document no longer has is removed.
func (n *talosNode) writeDocument(doc *Document) error {
	dir := filepath.Join(n.configBase(), n.svc.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}

	keep := map[string]bool{}

	for mountPath, content := range doc.Files {
		p := ConfigFileName(n.configBase(), n.svc.Name, mountPath)
		keep[p] = true

		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return err
		}
	}

	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}

	for _, e := range entries {
		if p := filepath.Join(dir, e.Name()); !keep[p] {
			if err := os.RemoveAll(p); err != nil {
				return err
			}
		}
	}

	return nil
}

// deleteDocument removes the service's directory, as the controller does for a document
// that is gone.
func (n *talosNode) deleteDocument() error {
	return os.RemoveAll(filepath.Join(n.configBase(), n.svc.Name))
}

// serviceConfig is what a document adds to the service's container.
func serviceConfig(base, service string, doc *Document) ServiceConfig {
	var cfg ServiceConfig
	if doc == nil {
		return cfg
	}

	cfg.Environment = doc.Environment

	for mountPath := range doc.Files {
		cfg.Files = append(cfg.Files, ConfigFile{Source: ConfigFileName(base, service, mountPath), MountPath: mountPath})
	}

	return cfg
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}

	if err != nil {
		return -1
	}

	return 0
}
