package atomicfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrSymlink is the error of a path that has a symbolic link where a directory is expected.
var ErrSymlink = errors.New("a symbolic link, not a directory")

// OpenDirNoSymlinks opens the directory path (absolute) without following a symbolic link at
// any of its components, from / down: each is opened relative to the one above it with
// openat2 and RESOLVE_NO_SYMLINKS. With create, the missing directories are made (perm) on the
// way, each in the directory just opened, so that none is made where a link points. A link is
// refused with an error (ErrSymlink) that names it and where it points.
//
// The result is an O_PATH descriptor of the directory found: a mount can be attached to it
// (move_mount with MOVE_MOUNT_T_EMPTY_PATH) without the path being resolved again.
func OpenDirNoSymlinks(path string, create bool, perm os.FileMode) (*os.File, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("opening directory %s: not an absolute path", path)
	}

	fd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening /: %w", err)
	}

	cur := "/"

	for _, name := range strings.Split(strings.TrimPrefix(filepath.Clean(path), "/"), "/") {
		if name == "" {
			continue // path is /
		}

		next, err := openComponent(fd, cur, name, create, perm)
		unix.Close(fd) //nolint:errcheck

		if err != nil {
			return nil, err
		}

		fd, cur = next, filepath.Join(cur, name)
	}

	return os.NewFile(uintptr(fd), cur), nil
}

// openComponent opens the directory name in dfd (the directory dir), making it first if it is
// missing and create is set.
func openComponent(dfd int, dir, name string, create bool, perm os.FileMode) (int, error) {
	how := unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS}
	path := filepath.Join(dir, name)

	fd, err := unix.Openat2(dfd, name, &how)
	if errors.Is(err, unix.ENOENT) && create {
		if err := unix.Mkdirat(dfd, name, uint32(perm.Perm())); err != nil && !errors.Is(err, unix.EEXIST) {
			return -1, fmt.Errorf("creating directory %s: %w", path, err)
		}

		fd, err = unix.Openat2(dfd, name, &how)
	}

	switch {
	case err == nil:
		return fd, nil
	case errors.Is(err, unix.ELOOP):
		target, _ := readlinkat(dfd, name) //nolint:errcheck // only for the message

		return -1, fmt.Errorf("%s is %w (to %q): refused, so that nothing is made where it points; remove it", path, ErrSymlink, target)
	case errors.Is(err, unix.ENOTDIR):
		return -1, fmt.Errorf("%s is not a directory", path)
	case errors.Is(err, unix.ENOSYS):
		return -1, fmt.Errorf("opening %s: the kernel lacks openat2 (Linux 5.6+): %w", path, err)
	default:
		return -1, fmt.Errorf("opening directory %s: %w", path, err)
	}
}

func readlinkat(dfd int, name string) (string, error) {
	buf := make([]byte, unix.PathMax)

	n, err := unix.Readlinkat(dfd, name, buf)
	if err != nil {
		return "", fmt.Errorf("reading link %s: %w", name, err)
	}

	return string(buf[:n]), nil
}
