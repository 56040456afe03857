package daemons

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// proc is a daemon process watched through a pidfd, which names the process
// itself (not a pid that may be reused) and becomes readable when it exits.
type proc struct {
	pid     int
	pidfd   int
	started time.Time

	// output holds the last output of a foreground daemon, outputDone is closed when its
	// pipe reached EOF; both nil for a daemon that forked away from its starter.
	output     *tailBuffer
	outputDone chan struct{}

	exit      chan struct{} // closed when the process has exited
	quit      chan struct{} // closed by close() to end the watcher
	watcher   chan struct{} // closed when the watcher has returned
	closeOnce sync.Once
}

func openProc(pid int) (*proc, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	p := &proc{pid: pid, pidfd: fd, started: time.Now(), exit: make(chan struct{}), quit: make(chan struct{}), watcher: make(chan struct{})}
	go p.watch()
	return p, nil
}

func (p *proc) watch() {
	defer close(p.watcher)
	fds := []unix.PollFd{{Fd: int32(p.pidfd), Events: unix.POLLIN}}
	for {
		select {
		case <-p.quit:
			return
		default:
		}
		// The timeout only bounds how long close() waits; an exit wakes poll at once.
		n, err := unix.Poll(fds, 100)
		if err != nil && !errors.Is(err, unix.EINTR) {
			close(p.exit) // cannot watch: treat as gone, the lock check will tell the truth
			return
		}
		if n > 0 {
			close(p.exit)
			return
		}
	}
}

func (p *proc) exited() bool {
	select {
	case <-p.exit:
		return true
	default:
		return false
	}
}

func (p *proc) signal(sig unix.Signal) error {
	if err := unix.PidfdSendSignal(p.pidfd, sig, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("signal %v to pid %d: %w", sig, p.pid, err)
	}
	return nil
}

func (p *proc) waitExit(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.exit:
		return true
	case <-t.C:
		return false
	}
}

// reap collects the exit status when we are the daemon's parent (its starter
// exited and we are a child subreaper, or PID 1 of the service's namespace) and
// describes how it ended.
func (p *proc) reap() string {
	var ws unix.WaitStatus
	wpid, err := unix.Wait4(p.pid, &ws, unix.WNOHANG, nil)
	switch {
	case err != nil || wpid != p.pid:
		return "exited (status unknown: not our child)"
	case ws.Signaled():
		return fmt.Sprintf("killed by signal %v", ws.Signal())
	default:
		return fmt.Sprintf("exited with status %d", ws.ExitStatus())
	}
}

// exitDescription reaps an exited daemon and says how it ended, with the last of its output
// when it ran in the foreground (read to the end, or for at most half a second: something it
// forked may hold the pipe).
func (p *proc) exitDescription() string {
	how := p.reap()
	if p.output == nil {
		return how
	}
	p.drainOutput()
	return how + p.output.suffix()
}

// drainOutput waits until an exited foreground daemon's output is read.
func (p *proc) drainOutput() {
	if p.outputDone == nil {
		return
	}
	select {
	case <-p.outputDone:
	case <-time.After(500 * time.Millisecond):
	}
}

func (p *proc) close() {
	p.closeOnce.Do(func() {
		close(p.quit)
		// Wait for the watcher to leave poll before the fd number can be reused.
		<-p.watcher
		_ = unix.Close(p.pidfd)
	})
}
