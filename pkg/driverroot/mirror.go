package driverroot

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/talos-nvidia/nvidia-driver/pkg/atomicfile"
)

// MirrorRunDir makes a daemon's run directory on the host, runDir (made if missing), visible
// at dst, an empty directory the subroot ships under the driver root
// (run/nvidia-persistenced, run/nvidia-fabricmanager), where CDI specs name its socket: a
// read-write bind of runDir's own mount, made like the driver root's mounts (placeMount). A
// bind onto a directory of the read-only driver root is allowed, and reaches the host and
// the containers that mount the driver root through its shared mount. It is never unmounted:
// containers' specs point at the socket through it; a right one from an earlier run is
// reused.
//
// Neither runDir nor dst is reached through a symbolic link: runDir is made, and both are
// opened, with atomicfile.OpenDirNoSymlinks, and the error names the link.
func MirrorRunDir(log *slog.Logger, runDir, dst string) (MountResult, error) {
	log = log.With("run_dir", runDir, "at", dst)

	src, err := atomicfile.OpenDirNoSymlinks(runDir, true, 0o755)
	if err != nil {
		return "", err
	}
	defer src.Close() //nolint:errcheck

	return placeMount(log, runDir, dst, placement{
		right:    func(*mountinfo.Info) bool { return true },
		what:     "mirroring " + runDir,
		attach:   func(d *os.File) error { return Bind(src, d) },
		reused:   "run dir mirrored",
		replaced: "replacing an earlier mirror of the run dir",
		wrong:    "expected one bind mount",
		done:     "run dir mirrored",
	})
}

// Bind clones the mount at src, an open directory (not recursive, as mount(2)'s plain
// MS_BIND), and attaches the clone at the open directory dst.
func Bind(src, dst *os.File) error {
	fd, err := unix.OpenTree(int(src.Fd()), "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	if err != nil {
		return fmt.Errorf("cloning %s for a bind mount: %w", src.Name(), err)
	}
	defer unix.Close(fd) //nolint:errcheck

	if err := unix.MoveMount(fd, "", int(dst.Fd()), "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("attaching %s at %s: %w", src.Name(), dst.Name(), err)
	}

	return nil
}
