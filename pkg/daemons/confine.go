package daemons

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/talos-nvidia/nvidia-driver/pkg/atomicfile"
	"github.com/talos-nvidia/nvidia-driver/pkg/driverroot"
)

// confined says whether the daemon needs a mount namespace of its own: its compiled-in
// run directory (Spec.DaemonRunDir) is not RunDir, as under a throwaway host root with
// simulated GPUs. On a node the two are one directory, and the daemon starts as it is.
func (s *Supervisor) confined() bool {
	if s.spec.DaemonRunDir == "" {
		return false
	}

	a, errA := os.Stat(s.spec.DaemonRunDir)
	b, errB := os.Stat(s.spec.RunDir)

	return errA != nil || errB != nil || !os.SameFile(a, b)
}

// startConfined starts cmd in a mount namespace of its own in which the daemon's
// compiled-in run directory shows RunDir: nothing is made outside RunDir (issue 50: with
// simulated GPUs, /var/run/nvidia-persistenced used to be made on the machine's /run). The
// namespace is made on a thread of its own (unshare is per thread; Go starts no other
// thread from a locked one), which cmd's fork inherits: the directory's parent gets a tmpfs
// there, with the directory on it and RunDir bound onto that.
func (s *Supervisor) startConfined(cmd *exec.Cmd) error {
	errc := make(chan error, 1)

	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine

		errc <- s.confine(cmd)
	}()

	return <-errc
}

func (s *Supervisor) confine(cmd *exec.Cmd) error {
	parent, err := filepath.EvalSymlinks(filepath.Dir(s.spec.DaemonRunDir)) // /var/run: /run
	if err != nil {
		return fmt.Errorf("%s: the daemon's run directory: %w", s.spec.Name, err)
	}

	if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS); err != nil {
		return fmt.Errorf("%s: a mount namespace for the daemon: %w", s.spec.Name, err)
	}

	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("%s: making the daemon's mounts private: %w", s.spec.Name, err)
	}

	// Opened before the tmpfs, which may hide it.
	src, err := atomicfile.OpenDirNoSymlinks(s.spec.RunDir, false, 0)
	if err != nil {
		return fmt.Errorf("%s: %w", s.spec.Name, err)
	}
	defer src.Close() //nolint:errcheck

	if err := unix.Mount("tmpfs", parent, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		return fmt.Errorf("%s: a tmpfs at %s for the daemon: %w", s.spec.Name, parent, err)
	}

	dst, err := atomicfile.OpenDirNoSymlinks(filepath.Join(parent, filepath.Base(s.spec.DaemonRunDir)), true, 0o755)
	if err != nil {
		return fmt.Errorf("%s: %w", s.spec.Name, err)
	}
	defer dst.Close() //nolint:errcheck

	if err := driverroot.Bind(src, dst); err != nil {
		return fmt.Errorf("%s: %w", s.spec.Name, err)
	}

	return cmd.Start()
}
