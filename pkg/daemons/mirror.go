package daemons

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// mirror bind-mounts src onto dst (an existing directory, typically inside the
// read-only driver root) unless dst already shows src. A bind mount onto a
// directory of a read-only mount is allowed; it reaches the host and the
// containers that mount the driver root when dst's parent mount is shared
// (the driver root is mounted with shared propagation).
func mirror(src, dst string) (mounted bool, err error) {
	src, err = filepath.EvalSymlinks(src)
	if err != nil {
		return false, fmt.Errorf("mirror %s: %w", dst, err)
	}
	same, err := sameDir(src, dst)
	if err != nil {
		return false, fmt.Errorf("mirror %s onto %s: %w", src, dst, err)
	}
	if same {
		return false, nil
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		return false, fmt.Errorf("bind-mount %s onto %s: %w", src, dst, err)
	}
	return true, nil
}

// unmirror undoes mirror, only if dst still shows src.
func unmirror(src, dst string) error {
	src, err := filepath.EvalSymlinks(src)
	if err != nil {
		return fmt.Errorf("unmirror %s: %w", dst, err)
	}
	if same, err := sameDir(src, dst); err != nil || !same {
		return err
	}
	if err := unix.Unmount(dst, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("unmount %s: %w", dst, err)
	}
	return nil
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
