package daemons

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// What mirror did.
const (
	mirrorMounted  = "mounted"
	mirrorReused   = "reused"   // an earlier run's mirror already showed src
	mirrorReplaced = "replaced" // an earlier mirror showed something else (a removed run dir)
)

// Mirror bind-mounts src onto dst, as a Spec's MirrorDir is, and says what it did
// ("mounted", "reused", "replaced"): for a run directory that another service's daemon
// fills (nv-fabricmanager runs in ext-nvidia-fabricmanager, its sockets are named under
// the driver root that ext-nvidia-driver mounts).
func Mirror(src, dst string) (string, error) { return mirror(src, dst) }

// mirror bind-mounts src onto dst (an existing directory, typically inside the
// read-only driver root) unless dst already shows src. A bind mount onto a
// directory of a read-only mount is allowed; it reaches the host and the
// containers that mount the driver root when dst's parent mount is shared
// (the driver root is mounted with shared propagation). The mirror is never
// unmounted: containers' CDI specs point at the socket through it.
func mirror(src, dst string) (string, error) {
	src, err := filepath.EvalSymlinks(src)
	if err != nil {
		return "", fmt.Errorf("mirror %s: %w", dst, err)
	}
	same, err := sameDir(src, dst)
	if err != nil {
		return "", fmt.Errorf("mirror %s onto %s: %w", src, dst, err)
	}
	if same {
		return mirrorReused, nil
	}
	result := mirrorMounted
	if mounted, err := mountinfo.Mounted(dst); err != nil {
		return "", fmt.Errorf("mirror %s onto %s: %w", src, dst, err)
	} else if mounted {
		// Never stack: detach what an earlier run left, then bind.
		if err := unix.Unmount(dst, unix.MNT_DETACH); err != nil {
			return "", fmt.Errorf("detach the earlier mirror at %s: %w", dst, err)
		}
		result = mirrorReplaced
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		return "", fmt.Errorf("bind-mount %s onto %s: %w", src, dst, err)
	}
	return result, nil
}

func sameDir(a, b string) (bool, error) {
	var sa, sb unix.Stat_t
	if err := unix.Stat(a, &sa); err != nil {
		return false, &os.PathError{Op: "stat", Path: a, Err: err}
	}
	if err := unix.Stat(b, &sb); err != nil {
		return false, &os.PathError{Op: "stat", Path: b, Err: err}
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino, nil
}
