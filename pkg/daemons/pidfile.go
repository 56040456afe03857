package daemons

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// pidFileState is what probing a pid file found.
type pidFileState struct {
	exists bool
	locked bool
	// holder is the lock holder's pid as seen from our PID namespace; 0 when the
	// holder lives in another PID namespace (the kernel cannot name it here).
	holder int
}

// probePIDFile tells a live daemon from a stale pid file by the file's POSIX lock
// (nvidia-persistenced takes it with lockf(F_TLOCK)). F_GETLK only asks: the file
// is opened read-only and nothing is written or locked.
func probePIDFile(path string) (pidFileState, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if errors.Is(err, unix.ENOENT) {
		return pidFileState{}, nil
	}
	if err != nil {
		return pidFileState{}, fmt.Errorf("open pid file %s: %w", path, err)
	}
	defer unix.Close(fd)
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: 0, Len: 0}
	if err := unix.FcntlFlock(uintptr(fd), unix.F_GETLK, &lk); err != nil {
		return pidFileState{}, fmt.Errorf("probe lock of pid file %s: %w", path, err)
	}
	st := pidFileState{exists: true}
	if lk.Type != unix.F_UNLCK {
		st.locked = true
		st.holder = int(lk.Pid)
	}
	return st, nil
}

// LockHeld says whether a live process holds a POSIX lock on path, in any PID namespace;
// a missing file is not held. It only asks (F_GETLK): nothing is locked or written.
func LockHeld(path string) (bool, error) {
	st, err := probePIDFile(path)
	return st.locked, err
}

// readPID reads the pid written in a pid file (meaningful only in the writer's PID namespace).
func readPID(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read pid file: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("pid file %s holds %q, not a pid", path, strings.TrimSpace(string(b)))
	}
	return pid, nil
}

// ForeignDaemonError says that a live daemon we did not start holds the pid file, or does
// the job by other evidence. The supervisor leaves it alone: it neither signals it nor
// removes its files.
type ForeignDaemonError struct {
	Name, PIDFile string
	// PID is the holder as seen from our PID namespace; 0 when it lives outside it.
	PID int
	// Evidence, when there is no pid file to go by, says what showed the daemon.
	Evidence string
}

func (e *ForeignDaemonError) Error() string {
	if e.Evidence != "" {
		return fmt.Sprintf("%s: %s: a daemon this service did not start does the job; leaving it alone", e.Name, e.Evidence)
	}
	where := "in another PID namespace (the host's own daemon or another extension's)"
	if e.PID != 0 {
		where = fmt.Sprintf("pid %d in our PID namespace, not started by this supervisor", e.PID)
	}
	return fmt.Sprintf("%s: pid file %s is locked by a live daemon, %s; leaving it alone", e.Name, e.PIDFile, where)
}

// removeIfExists removes a file, ignoring its absence.
func removeIfExists(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}
