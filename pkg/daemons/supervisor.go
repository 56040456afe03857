// Package daemons supervises NVIDIA's daemons: nvidia-persistenced, which always
// daemonizes, and nv-fabricmanager on NVSwitch systems, run in the foreground. It starts
// one from the subroot, knows when it is ready (its UNIX socket accepts a connection) and
// when it dies (a pidfd on the process, found through the lock on its pid file for a
// daemon that forked away), restarts it with capped backoff, gives up on failures no
// restart can fix, and stops it with SIGTERM, a grace period and SIGKILL.
//
// Pids mean nothing across PID namespaces (each Talos extension service has its
// own), so a pid file is judged by its lockf lock only: a locked pid file whose
// holder we did not start belongs to someone else and is never touched.
package daemons

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/talos-nvidia/nvidia-driver/pkg/atomicfile"
	"github.com/talos-nvidia/nvidia-driver/pkg/driverroot"
	"github.com/talos-nvidia/nvidia-driver/pkg/poll"
)

// State is where a supervised daemon is in its life.
type State string

// The states of a supervised daemon.
const (
	StateStarting   State = "starting"
	StateReady      State = "ready"
	StateRestarting State = "restarting" // died or failed to start; waiting to start again
	StateSuspended  State = "suspended"  // stopped on request (Suspend) until resumed
	StateFailed     State = "failed"     // gave up: never became ready, or a foreign daemon holds its files
	StateStopped    State = "stopped"    // stopped cleanly at the end of Run
)

// Status is a snapshot of a supervised daemon.
type Status struct {
	Name  string
	State State
	// Restarts counts restarts after deaths of a daemon that had been ready.
	Restarts int
	// StartFailures counts failed starts in a row.
	StartFailures int
	// EverReady: the daemon was ready at least once in this Run.
	EverReady bool
	// PID is the daemon's pid in our PID namespace while it runs, else 0.
	PID       int
	LastError string
	Since     time.Time
}

// Options tune the supervisor. Zero values take the defaults shown.
type Options struct {
	// StartTimeout bounds one start, from exec to a socket that answers (60 s:
	// persistence mode on eight GPUs takes seconds).
	StartTimeout time.Duration
	// MaxStartFailures: failed starts in a row, before the daemon was ever
	// ready, after which Run gives up with StateFailed (3). Once the daemon has
	// been ready, failures are retried for ever.
	MaxStartFailures int
	// Backoff bounds the wait before a restart; the wait doubles on every quick
	// failure (200 ms, 30 s).
	Backoff poll.Backoff
	// StableAfter: a daemon that dies after being up this long is restarted
	// after RestartDelay only, and the backoff starts again (30 s).
	StableAfter time.Duration
	// RestartDelay is the least wait before a daemon that died is started
	// again (500 ms). A stop can reach the daemon a moment before the
	// service's own SIGTERM ends ctx (Talos's task.Kill WithKillAll signals the
	// container's init alone with runc 1.2 and later, as Talos v1.13 ships, but
	// every process with runc 1.1, and a user's kill may too); within this wait
	// the stop is seen, and nothing is restarted.
	RestartDelay time.Duration
	// StopGrace is how long a daemon gets between SIGTERM and SIGKILL (5 s, so
	// that SIGKILL and clean-up fit in Talos's 10 s stop budget).
	StopGrace time.Duration
	// PollInterval is how often readiness is probed while starting (10 ms).
	PollInterval time.Duration
	// NoRestartAfterReady, if set, says why a daemon that dies after it was ready must not
	// be started again (NVIDIA documents that nv-fabricmanager on HGX H100 and later needs
	// the GPUs reset before it starts again): Run then ends with a *NotRestartedError.
	// Failed starts before the daemon was ready are still retried.
	NoRestartAfterReady string
}

func (o Options) withDefaults() Options {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.StartTimeout, 60*time.Second)
	def(&o.Backoff.Initial, 200*time.Millisecond)
	def(&o.Backoff.Max, 30*time.Second)
	def(&o.StableAfter, 30*time.Second)
	def(&o.RestartDelay, 500*time.Millisecond)
	def(&o.StopGrace, 5*time.Second)
	def(&o.PollInterval, 10*time.Millisecond)
	if o.MaxStartFailures <= 0 {
		o.MaxStartFailures = 3
	}
	return o
}

// ErrNotRunning is returned by Suspend when Run is not running.
var ErrNotRunning = errors.New("supervisor is not running")

// Supervisor runs one daemon described by a Spec.
type Supervisor struct {
	log  *slog.Logger
	spec Spec
	opts Options

	mu      sync.Mutex
	st      Status
	changed chan struct{} // closed and replaced on every status change
	runErr  error

	ready     chan struct{}
	readyOnce sync.Once
	running   atomic.Bool
	done      chan struct{}
	suspendCh chan suspendReq
}

type suspendReq struct {
	ack    chan error
	resume chan struct{}
}

// New returns a supervisor for spec; Run starts it.
func New(logger *slog.Logger, spec Spec, opts Options) *Supervisor {
	return &Supervisor{
		log:       logger.With("daemon", spec.Name),
		spec:      spec,
		opts:      opts.withDefaults(),
		st:        Status{Name: spec.Name, State: StateStarting, Since: time.Now()},
		changed:   make(chan struct{}),
		ready:     make(chan struct{}),
		done:      make(chan struct{}),
		suspendCh: make(chan suspendReq),
	}
}

// Ready is closed the first time the daemon is ready.
func (s *Supervisor) Ready() <-chan struct{} { return s.ready }

// Done is closed when Run has returned.
func (s *Supervisor) Done() <-chan struct{} { return s.done }

// Changed returns a channel that is closed at the next change of the status.
func (s *Supervisor) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// Status returns a snapshot.
func (s *Supervisor) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st
}

// WaitReady waits until the daemon is ready now (not merely once), Run has
// ended (its error, or ErrNotRunning), or ctx is done.
func (s *Supervisor) WaitReady(ctx context.Context) error {
	for {
		s.mu.Lock()
		st, ch, runErr := s.st, s.changed, s.runErr
		s.mu.Unlock()
		if st.State == StateReady {
			return nil
		}
		select {
		case <-s.done:
			if runErr != nil {
				return runErr
			}
			s.mu.Lock()
			runErr = s.runErr
			s.mu.Unlock()
			if runErr != nil {
				return runErr
			}
			return fmt.Errorf("%s: %w (state %s)", s.spec.Name, ErrNotRunning, st.State)
		case <-ctx.Done():
			return fmt.Errorf("%s: waiting for readiness (state %s, last error %q): %w", s.spec.Name, st.State, st.LastError, ctx.Err())
		case <-ch:
		}
	}
}

// Suspend stops the daemon (SIGTERM, grace, SIGKILL) and keeps it stopped until
// resume is called: the MIG job needs nothing to hold a GPU while it changes
// its mode. ctx bounds the wait for the supervisor to take the request; once
// taken, the stop itself is bounded by StopGrace.
func (s *Supervisor) Suspend(ctx context.Context) (resume func(), err error) {
	req := suspendReq{ack: make(chan error, 1), resume: make(chan struct{})}
	select {
	case s.suspendCh <- req:
	case <-s.done:
		return nil, fmt.Errorf("suspend %s: %w", s.spec.Name, ErrNotRunning)
	case <-ctx.Done():
		return nil, fmt.Errorf("suspend %s: %w", s.spec.Name, ctx.Err())
	}
	if err := <-req.ack; err != nil {
		return nil, err
	}
	var once sync.Once
	return func() { once.Do(func() { close(req.resume) }) }, nil
}

func (s *Supervisor) setState(state State, pid int, lastErr error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.State, s.st.PID, s.st.Since = state, pid, time.Now()
	if lastErr != nil {
		s.st.LastError = lastErr.Error()
	}
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *Supervisor) update(f func(*Status)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(&s.st)
}

// Run supervises the daemon until ctx is done, then stops it and removes its
// state. It returns nil on a clean stop, and an error when it gave up (the
// daemon never became ready, or a foreign daemon holds its pid file).
//
// Run makes the process a child subreaper so that the daemon, orphaned by its
// starter, is reparented to us and its exit status can be collected.
func (s *Supervisor) Run(ctx context.Context) (err error) {
	if !s.running.CompareAndSwap(false, true) {
		return fmt.Errorf("%s: Run called twice", s.spec.Name)
	}
	defer func() {
		s.mu.Lock()
		s.runErr = err
		s.mu.Unlock()
		close(s.done)
	}()
	if err := s.spec.Validate(); err != nil {
		s.setState(StateFailed, 0, err)
		return err
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		s.log.Warn("cannot become child subreaper; exit statuses will be unknown", "error", err)
	}

	createdRunDir, err := s.makeRunDir()
	if err != nil {
		s.setState(StateFailed, 0, err)
		return err
	}
	mirrored := s.makeMirror()
	defer s.finalCleanup(createdRunDir, mirrored)

	backoff := time.Duration(0)
	everReady := false
	for {
		if err := s.preflight(); err != nil {
			s.setState(StateFailed, 0, err)
			s.log.Error("not starting", "error", err)
			return err
		}
		s.setState(StateStarting, 0, nil)
		begin := time.Now()
		p, err := s.start(ctx)
		if ctx.Err() != nil {
			if p != nil {
				s.stopProc(p)
			}
			s.cleanStale()
			s.setState(StateStopped, 0, nil)
			s.log.Info("stopped while starting")
			return nil
		}
		if err != nil {
			s.cleanStale()
			var foreign *ForeignDaemonError
			if errors.As(err, &foreign) {
				s.setState(StateFailed, 0, err)
				s.log.Error("not starting", "error", err)
				return err
			}
			if s.spec.NoRetry != nil {
				if reason := s.spec.NoRetry(err.Error()); reason != "" {
					err = &CannotRunError{Name: s.spec.Name, Reason: reason, Err: err}
					s.setState(StateFailed, 0, err)
					s.log.Error("giving up", "error", err)
					return err
				}
			}
			var failures int
			s.update(func(st *Status) { st.StartFailures++; failures = st.StartFailures })
			if !everReady && failures >= s.opts.MaxStartFailures {
				err = fmt.Errorf("%s never became ready: giving up after %d failed starts: %w", s.spec.Name, failures, err)
				s.setState(StateFailed, 0, err)
				s.log.Error("giving up", "error", err)
				return err
			}
			backoff = s.opts.Backoff.Next(backoff)
			s.setState(StateRestarting, 0, err)
			s.log.Warn("start failed; retrying", "error", err, "failures", failures, "backoff", backoff)
			if stop := s.pause(ctx, backoff); stop {
				s.setState(StateStopped, 0, nil)
				return nil
			}
			continue
		}

		everReady = true
		s.update(func(st *Status) { st.StartFailures, st.EverReady = 0, true })
		s.setState(StateReady, p.pid, nil)
		s.readyOnce.Do(func() { close(s.ready) })
		s.log.Info("ready", "pid", p.pid, "took", time.Since(begin).Round(time.Millisecond))

		select {
		case <-p.exit:
			how := p.exitDescription()
			p.close()
			up := time.Since(p.started)
			s.cleanStale()
			if up >= s.opts.StableAfter {
				backoff = 0
			} else {
				backoff = s.opts.Backoff.Next(backoff)
			}
			derr := fmt.Errorf("%s (pid %d) died after %s: %s", s.spec.Name, p.pid, up.Round(time.Millisecond), how)
			s.setState(StateRestarting, 0, derr)
			// A stop of the whole container: the death was part of it, not a crash.
			if stop := s.pause(ctx, s.opts.RestartDelay); stop {
				s.setState(StateStopped, 0, nil)
				s.log.Info("daemon stopped together with the service", "how", how)
				return nil
			}
			// A daemon that was ready a moment can still die of what no restart fixes.
			if s.spec.NoRetry != nil {
				if reason := s.spec.NoRetry(derr.Error()); reason != "" {
					err := &CannotRunError{Name: s.spec.Name, Reason: reason, Err: derr}
					s.setState(StateFailed, 0, err)
					s.log.Error("giving up", "error", err)
					return err
				}
			}
			if s.opts.NoRestartAfterReady != "" {
				err := &NotRestartedError{Name: s.spec.Name, Reason: s.opts.NoRestartAfterReady, Err: derr}
				s.setState(StateFailed, 0, err)
				s.log.Error("not restarting", "error", err)
				return err
			}
			s.update(func(st *Status) { st.Restarts++ })
			s.log.Warn("daemon died; restarting", "error", derr, "backoff", backoff)
			if stop := s.pause(ctx, max(backoff-s.opts.RestartDelay, 0)); stop {
				s.setState(StateStopped, 0, nil)
				return nil
			}
		case <-ctx.Done():
			s.stopProc(p)
			s.cleanStale()
			s.setState(StateStopped, 0, nil)
			s.log.Info("stopped")
			return nil
		case req := <-s.suspendCh:
			s.stopProc(p)
			s.cleanStale()
			backoff = 0
			if stop := s.suspended(ctx, req); stop {
				s.setState(StateStopped, 0, nil)
				return nil
			}
		}
	}
}

// pause waits d, serving suspend requests; it reports whether ctx ended.
func (s *Supervisor) pause(ctx context.Context, d time.Duration) (stop bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return false
	case <-ctx.Done():
		return true
	case req := <-s.suspendCh:
		return s.suspended(ctx, req)
	}
}

// suspended acknowledges a suspend request (the daemon is already down) and
// waits for resume; it reports whether ctx ended.
func (s *Supervisor) suspended(ctx context.Context, req suspendReq) (stop bool) {
	s.setState(StateSuspended, 0, nil)
	s.log.Info("suspended")
	req.ack <- nil
	select {
	case <-req.resume:
		s.log.Info("resuming")
		return false
	case <-ctx.Done():
		return true
	}
}

func (s *Supervisor) makeRunDir() (created bool, err error) {
	_, statErr := os.Lstat(s.spec.RunDir)
	if err := MakeRunDir(s.spec.RunDir); err != nil {
		return false, fmt.Errorf("%s: %w", s.spec.Name, err)
	}
	return statErr != nil, nil
}

// makeMirror makes the socket visible in MirrorDir. A failure is logged, not
// fatal: the daemon still does its job; only containers miss its socket.
func (s *Supervisor) makeMirror() bool {
	if s.spec.MirrorDir == "" {
		return false
	}
	if _, err := driverroot.MirrorRunDir(s.log, s.spec.RunDir, s.spec.MirrorDir); err != nil {
		s.log.Warn("socket will not be visible in the driver root", "error", err)
		return false
	}
	return true
}

// MakeRunDir makes a daemon's run directory on the host, if missing, without following a
// symbolic link on its path (atomicfile.OpenDirNoSymlinks): a link planted there would have
// the daemon, as root, write its pid file and socket where it points. The error names the link.
func MakeRunDir(dir string) error {
	d, err := atomicfile.OpenDirNoSymlinks(dir, true, 0o755)
	if err != nil {
		return err
	}
	return d.Close()
}

// finalCleanup removes a run dir that Run created and nothing mirrors. The
// mirror itself stays, and with it the run dir it shows: the CDI specs of
// running and new containers mount the socket through it, and the next Run
// reuses it.
func (s *Supervisor) finalCleanup(createdRunDir, mirrored bool) {
	if createdRunDir && !mirrored {
		// Only if empty: whatever else is there is not ours to delete.
		_ = os.Remove(s.spec.RunDir)
	}
}

// preflight checks the pid file before a start: a lock held by anyone means a
// live daemon we do not own (ours are stopped or dead before we get here);
// an unlocked pid file is stale and is removed along with the socket.
func (s *Supervisor) preflight() error {
	st, err := probePIDFile(s.spec.PIDFile)
	if err != nil {
		return err
	}
	if st.locked {
		return &ForeignDaemonError{Name: s.spec.Name, PIDFile: s.spec.PIDFile, PID: st.holder}
	}
	if !st.exists && socketAnswers(s.spec.Socket) {
		return &ForeignDaemonError{Name: s.spec.Name, Evidence: fmt.Sprintf("socket %s answers and no daemon of ours runs", s.spec.Socket)}
	}
	if s.spec.Foreign != nil {
		if err := s.spec.Foreign(); err != nil {
			return err
		}
	}
	s.cleanStale()
	return nil
}

// cleanStale removes the pid file and socket if no live process holds the pid file's lock.
func (s *Supervisor) cleanStale() {
	st, err := probePIDFile(s.spec.PIDFile)
	if err != nil {
		s.log.Warn("cannot check pid file", "error", err)
		return
	}
	if st.locked {
		return
	}
	if st.exists {
		s.log.Info("removing stale pid file", "path", s.spec.PIDFile)
	}
	for _, p := range []string{s.spec.PIDFile, s.spec.Socket} {
		if p == "" || (p == s.spec.Socket && s.spec.KeepSocket) {
			continue
		}
		if err := removeIfExists(p); err != nil {
			s.log.Warn("cannot remove stale state", "error", err)
		}
	}
	if s.spec.KeepSocket && s.spec.Socket != "" {
		if err := keepSocket(s.spec.Socket); err != nil {
			s.log.Warn("cannot keep the socket's path", "error", err)
		}
	}
}

// keepSocket makes sure a socket is at path: the stale one where there is one, else a new one
// that no process listens on (a connection is refused, as to a daemon that is down).
func keepSocket(path string) error {
	st, err := os.Lstat(path)
	switch {
	case err == nil && st.Mode().Type() == os.ModeSocket:
		return nil
	case err == nil:
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("replacing %s, not a socket: %w", path, err)
		}
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("keeping the socket %s: %w", path, err)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return fmt.Errorf("keeping the socket %s: %w", path, err)
	}
	l.SetUnlinkOnClose(false)
	return l.Close()
}

func socketAnswers(path string) bool {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// start runs the start command and waits until the daemon it leaves behind is
// ready. On failure or cancellation it kills what it started.
func (s *Supervisor) start(ctx context.Context) (*proc, error) {
	if s.spec.Prepare != nil {
		if err := s.spec.Prepare(); err != nil {
			return nil, fmt.Errorf("%s: prepare: %w", s.spec.Name, err)
		}
	}
	if s.spec.Foreground {
		return s.startForeground(ctx)
	}
	out := &tailBuffer{max: 2048}
	cmd := exec.Command(s.spec.Path, s.spec.Args...)
	cmd.Env = s.spec.environ()
	cmd.Stdout, cmd.Stderr = out, out
	// Its own process group, so that a stuck starter can be killed with
	// everything it forked that did not leave the group (the daemon does, by setsid).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// A daemon that keeps our output pipe open must not hold up Wait.
	cmd.WaitDelay = 500 * time.Millisecond
	s.log.Debug("starting", "cmd", cmd.String())
	start := cmd.Start
	if s.confined() {
		start = func() error { return s.startConfined(cmd) }
	}
	if err := start(); err != nil {
		return nil, fmt.Errorf("%s: start: %w", s.spec.Name, err)
	}
	starterDone := make(chan error, 1)
	go func() { starterDone <- cmd.Wait() }()
	deadline := time.NewTimer(s.opts.StartTimeout)
	defer deadline.Stop()

	killStarter := func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-starterDone
		s.killOwnDaemon()
	}
	select {
	case err := <-starterDone:
		if err != nil && !errors.Is(err, exec.ErrWaitDelay) {
			s.killOwnDaemon()
			return nil, fmt.Errorf("%s: start command failed: %w%s", s.spec.Name, err, out.suffix())
		}
	case <-ctx.Done():
		killStarter()
		return nil, ctx.Err()
	case <-deadline.C:
		killStarter()
		return nil, fmt.Errorf("%s: not ready within %s: its start command did not return%s", s.spec.Name, s.opts.StartTimeout, out.suffix())
	}

	// The starter exited 0: find the daemon by its pid file lock, then wait for its socket.
	tick := time.NewTicker(s.opts.PollInterval)
	defer tick.Stop()
	var p *proc
	fail := func(err error) (*proc, error) {
		if p != nil {
			s.stopProc(p)
		}
		return nil, err
	}
	for {
		if p == nil {
			var err error
			if p, err = s.findDaemon(); err != nil {
				return fail(err)
			}
		} else if p.exited() {
			how := p.reap()
			p.close()
			p = nil
			return fail(fmt.Errorf("%s: daemon died before it was ready: %s%s", s.spec.Name, how, out.suffix()))
		}
		if p != nil && socketAnswers(s.spec.Socket) {
			return p, nil
		}
		select {
		case <-ctx.Done():
			return fail(ctx.Err())
		case <-deadline.C:
			state := "no live daemon holds its pid file"
			if p != nil {
				state = fmt.Sprintf("daemon pid %d runs but socket %s does not answer", p.pid, s.spec.Socket)
			}
			return fail(fmt.Errorf("%s: not ready within %s: %s%s", s.spec.Name, s.opts.StartTimeout, state, out.suffix()))
		case <-tick.C:
		}
	}
}

// startForeground starts a daemon that stays in the foreground, as our child, and waits
// until its socket answers. Its output goes to the log and, the last of it, into errors.
func (s *Supervisor) startForeground(ctx context.Context) (*proc, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("%s: output pipe: %w", s.spec.Name, err)
	}
	cmd := exec.Command(s.spec.Path, s.spec.Args...)
	cmd.Env = s.spec.environ()
	cmd.Stdout, cmd.Stderr = w, w
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	s.log.Debug("starting", "cmd", cmd.String())
	err = cmd.Start()
	_ = w.Close()
	if err != nil {
		_ = r.Close()
		return nil, fmt.Errorf("%s: start: %w", s.spec.Name, err)
	}
	pid := cmd.Process.Pid
	// The pidfd watches it and proc.reap collects its status: os.Process must not.
	_ = cmd.Process.Release()
	p, err := openProc(pid)
	if err != nil {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		var ws unix.WaitStatus
		_, _ = unix.Wait4(pid, &ws, 0, nil)
		_ = r.Close()
		return nil, fmt.Errorf("%s: watch pid %d: %w", s.spec.Name, pid, err)
	}
	p.output, p.outputDone = &tailBuffer{max: 2048}, make(chan struct{})
	go s.logOutput(r, p)

	deadline := time.NewTimer(s.opts.StartTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(s.opts.PollInterval)
	defer tick.Stop()
	for {
		if p.exited() {
			how := p.exitDescription()
			p.close()
			return nil, fmt.Errorf("%s: exited before it was ready: %s", s.spec.Name, how)
		}
		if socketAnswers(s.spec.Socket) {
			return p, nil
		}
		select {
		case <-ctx.Done():
			s.stopProc(p)
			return nil, ctx.Err()
		case <-deadline.C:
			s.stopProc(p)
			return nil, fmt.Errorf("%s: not ready within %s: pid %d runs but socket %s does not answer%s",
				s.spec.Name, s.opts.StartTimeout, pid, s.spec.Socket, p.output.suffix())
		case <-p.exit:
		case <-tick.C:
		}
	}
}

// logOutput copies a foreground daemon's output, line by line, into the log and p.output,
// until the daemon closes it. A line longer than the buffer comes in pieces: stopping at it
// would close the pipe, and the daemon's next write would kill it with SIGPIPE.
func (s *Supervisor) logOutput(r *os.File, p *proc) {
	defer close(p.outputDone)
	defer r.Close()
	br := bufio.NewReaderSize(r, 4096)
	for {
		chunk, _, err := br.ReadLine()
		if len(chunk) > 0 {
			line := string(chunk)
			_, _ = p.output.Write([]byte(line + "\n"))
			s.log.Info("daemon output", "line", line)
		}
		if err != nil {
			return
		}
	}
}

// findDaemon returns the daemon holding the pid file lock, or nil if none does yet.
func (s *Supervisor) findDaemon() (*proc, error) {
	st, err := probePIDFile(s.spec.PIDFile)
	if err != nil || !st.locked {
		return nil, err
	}
	if st.holder == 0 {
		return nil, &ForeignDaemonError{Name: s.spec.Name, PIDFile: s.spec.PIDFile}
	}
	p, err := openProc(st.holder)
	if err != nil {
		return nil, nil // it just exited; the next probe tells
	}
	// Pids are reused: make sure the pidfd names the process that holds the lock.
	if again, err := probePIDFile(s.spec.PIDFile); err != nil || !again.locked || again.holder != st.holder {
		p.close()
		return nil, err
	}
	return p, nil
}

// killOwnDaemon kills a daemon that our aborted start left holding the pid file.
// It is ours: the preflight found the lock free before we started. A daemon
// that forks but has not taken the lock yet when its starter is killed can
// escape this; we look again for a short while.
func (s *Supervisor) killOwnDaemon() {
	for range 5 {
		if p, err := s.findDaemon(); err == nil && p != nil {
			s.log.Warn("killing daemon left by a failed start", "pid", p.pid)
			_ = p.signal(unix.SIGKILL)
			p.waitExit(2 * time.Second)
			p.reap()
			p.close()
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stopProc stops a daemon: SIGTERM, StopGrace, then SIGKILL.
func (s *Supervisor) stopProc(p *proc) {
	defer p.close()
	start := time.Now()
	if err := p.signal(unix.SIGTERM); err != nil {
		s.log.Warn("cannot signal daemon", "error", err)
	}
	if !p.waitExit(s.opts.StopGrace) {
		s.log.Warn("daemon ignored SIGTERM; killing it", "pid", p.pid, "grace", s.opts.StopGrace)
		_ = p.signal(unix.SIGKILL)
		if !p.waitExit(2 * time.Second) {
			s.log.Error("daemon survived SIGKILL", "pid", p.pid)
		}
	}
	how := p.reap()
	p.drainOutput()
	s.log.Info("daemon stopped", "pid", p.pid, "how", how, "took", time.Since(start).Round(time.Millisecond))
}

// tailBuffer keeps the last max bytes written: the starter's output, for errors.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = t.buf[len(t.buf)-t.max:]
	}
	return len(p), nil
}

func (t *tailBuffer) suffix() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := strings.TrimSpace(string(bytes.ToValidUTF8(t.buf, nil)))
	if s == "" {
		return ""
	}
	return ": output: " + strings.ReplaceAll(s, "\n", " | ")
}
