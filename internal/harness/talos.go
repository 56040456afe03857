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

	"github.com/siderolabs/talos/pkg/machinery/extensions/services"
)

// This file models what Talos v1.13 does with an extension service, from its source
// (siderolabs/talos, internal/app/machined):
//
//   - pkg/controllers/runtime/extension_service.go (ExtensionServiceController): at boot it
//     loads every service and starts it; when the spec version of a service's
//     ExtensionServiceConfig status changes it stops and starts the service, except for
//     version "1" while the service is running; when the document goes away it restarts it.
//   - pkg/controllers/runtime/extension_service_config_files.go: the document's files are
//     written 0644 on the host; the status's spec version is the document's resource
//     version, "1" when it is created and one more on every change.
//   - pkg/system/services/extension.go: Condition waits for each `depends` entry
//     (configuration: for the document; service_runner.go checks it every second); Runner,
//     called once the condition holds, creates
//     missing mount sources 0700, adds the document's files (read-only binds) and
//     environment, and wraps the container runner in the restart policy.
//   - pkg/system/runner/restart/restart.go: `restart: always` is Forever: a container that
//     exits, with any code, is started again after RestartInterval, 5 s (untilSuccess: only
//     after a non-zero code; never: not at all).
//   - pkg/system/runner/containerd/containerd.go: stop is task.Kill(SIGTERM, WithKillAll),
//     a signal to every process of the container at once, then SIGKILL after the graceful
//     shutdown timeout, 10 s (pkg/system/runner/runner.go).
//
// What the harness does not model: a `path` dependency is reported, not waited on (the
// service's own wait is what the tests look at), and nothing else runs on the node.

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

// removeDocument deletes the ExtensionServiceConfig: the controller restarts the service.
func (n *talosNode) removeDocument() {
	n.mu.Lock()
	n.doc, n.version, n.cached = nil, 0, ""
	n.mu.Unlock()

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

func (n *talosNode) lastStopped() *serviceRun {
	n.mu.Lock()
	defer n.mu.Unlock()

	return n.stopped
}

func (n *talosNode) serve(r *serviceRun) {
	defer close(r.done)

	if !n.waitCondition(r) {
		return
	}

	for {
		exited, code, err := n.runContainer(r)
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

// waitCondition waits for the `configuration` dependency, if the service has one. It
// reports whether to go on (false: stopped while waiting).
func (n *talosNode) waitCondition(r *serviceRun) bool {
	if !dependsOnConfiguration(n.svc) {
		return true
	}

	for said := false; ; said = true {
		n.mu.Lock()
		ok := n.doc != nil
		n.mu.Unlock()

		if ok {
			return true
		}

		if !said {
			n.event("Waiting for extension service config")
		}

		select {
		case <-r.stop:
			return false
		case <-time.After(conditionInterval):
		}
	}
}

// runContainer creates the container from the document as it is now (Runner is built
// after the condition holds) and runs it until it exits or r is stopped.
func (n *talosNode) runContainer(r *serviceRun) (exited bool, code int, err error) {
	n.mu.Lock()
	doc := n.doc
	n.mu.Unlock()

	// services/extension.go Runner: missing mount sources are created 0700.
	for _, m := range n.svc.Container.Mounts {
		if _, err := os.Stat(m.Source); errors.Is(err, os.ErrNotExist) {
			if err := os.MkdirAll(m.Source, 0o700); err != nil {
				return false, 0, err
			}
		}
	}

	spec, err := Spec(n.svc, serviceConfig(n.configBase(), n.svc.Name, doc), n.cfgGroup)
	if err != nil {
		return false, 0, err
	}

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

	// containerd.go: SIGTERM to every process of the container, SIGKILL after the grace.
	start := time.Now()

	n.event("sending SIGTERM to every process of %s", runcID)

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

func (n *talosNode) configBase() string {
	return filepath.Join(n.work, "system/overlays/extensions")
}

// writeDocument does what ExtensionServiceConfigFilesController does: each file is written
// 0644 under <base>/<service>/.
func (n *talosNode) writeDocument(doc *Document) error {
	for mountPath, content := range doc.Files {
		p := ConfigFileName(n.configBase(), n.svc.Name, mountPath)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}

		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return err
		}
	}

	return nil
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

func dependsOnConfiguration(svc services.Spec) bool {
	for _, d := range svc.Depends {
		if d.Configuration {
			return true
		}
	}

	return false
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
