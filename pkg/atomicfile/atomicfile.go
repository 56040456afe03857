// Package atomicfile writes files so that a reader sees the old content or the new, never a
// part: the data goes to a temporary file in the same directory, is synced, and is renamed
// over the target.
//
// A writer killed before the rename (SIGKILL: Talos's stop after 10 s, or the OOM killer)
// leaves its temporary file, ".<name>.tmp-<16 hex digits>". Every Write of a file removes
// those of the same file that no live writer holds (Sweep): a writer holds a lock on its
// temporary file (flock) from its creation to the rename, and the kernel drops the lock of a
// killed one.
package atomicfile

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Write replaces path with data and mode. It creates missing parent directories (0755).
// It reports whether the file changed: a file that already holds data is left untouched,
// so watchers of the file see no event.
//
// The directory that holds path must not be a symbolic link (see MkdirNoFollow): the
// temporary file is created and renamed relative to that directory, opened with
// O_NOFOLLOW. Errors name path, never the random temporary name, so that the same failure
// reads the same at every retry and is reported once.
//
// It first removes the temporary files of path that killed writers left (Sweep), best effort:
// a file that cannot be removed does not fail the write.
func Write(path string, data []byte, mode os.FileMode) (changed bool, err error) {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		if st, err := os.Lstat(path); err == nil && st.Mode().IsRegular() && st.Mode().Perm() == mode.Perm() {
			Sweep(path) //nolint:errcheck // best effort; the file is as asked

			return false, nil
		}
	}

	dir, base := filepath.Dir(path), filepath.Base(path)

	d, err := openDir(dir)
	if err != nil {
		return false, err
	}
	defer d.Close() //nolint:errcheck

	sweepIn(d, base) //nolint:errcheck // best effort: what stays is removed at the next write

	dfd := int(d.Fd())

	tmp, name, err := createTemp(dfd, dir, base)
	if err != nil {
		return false, fmt.Errorf("creating a temporary file for %s: %w", path, err)
	}

	// Whatever happens below, no temporary file is left behind.
	defer func() {
		if err != nil {
			tmp.Close()                 //nolint:errcheck // the write error is what matters
			unix.Unlinkat(dfd, name, 0) //nolint:errcheck
		}
	}()

	if _, err = tmp.Write(data); err != nil {
		return false, fmt.Errorf("writing %s: %w", path, bare(err))
	}

	if err = tmp.Chmod(mode); err != nil {
		return false, fmt.Errorf("setting mode of %s: %w", path, bare(err))
	}

	if err = tmp.Sync(); err != nil {
		return false, fmt.Errorf("syncing %s: %w", path, bare(err))
	}

	// Renamed while still open, so that the lock that tells Sweep the file is in use is
	// held until it has its final name.
	if err = unix.Renameat(dfd, name, dfd, base); err != nil {
		return false, fmt.Errorf("replacing %s: %w", path, err)
	}

	// The data is synced: a close error could lose nothing, and the file is in place.
	tmp.Close() //nolint:errcheck

	// Make the rename itself durable where the directory is on persistent storage (the NFD
	// features directory on Talos lives on /var); on tmpfs this costs nothing.
	d.Sync() //nolint:errcheck // best effort: the data itself is synced

	return true, nil
}

// tempPrefix starts the names of base's temporary files; tempSuffixLen hex digits follow.
func tempPrefix(base string) string { return "." + base + ".tmp-" }

const tempSuffixLen = 16

// createTemp creates a temporary file for base in the directory dfd (dir) and locks it, so
// that Sweep leaves it alone. A file that Sweep locked between the creation and the lock is
// Sweep's to remove: createTemp takes another name (only writers of the same file that sweep
// at the same moment make that happen; the tries are many so that even eight of them in a
// loop, TestSweepSparesConcurrentWriters, always get through).
func createTemp(dfd int, dir, base string) (*os.File, string, error) {
	for range 64 {
		var suffix [tempSuffixLen / 2]byte
		if _, err := rand.Read(suffix[:]); err != nil {
			return nil, "", fmt.Errorf("choosing a name: %w", err)
		}

		name := tempPrefix(base) + hex.EncodeToString(suffix[:])

		fd, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return nil, "", err // the caller names the file
		}

		err = unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil && sameFile(fd, dfd, name) {
			return os.NewFile(uintptr(fd), filepath.Join(dir, name)), name, nil
		}

		unix.Close(fd) //nolint:errcheck

		if err != nil && !errors.Is(err, unix.EWOULDBLOCK) {
			unix.Unlinkat(dfd, name, 0) //nolint:errcheck

			return nil, "", fmt.Errorf("locking: %w", err)
		}
		// A sweep holds the file, or took it and let it go before the lock: it is the
		// sweep's, gone or going.
	}

	return nil, "", errors.New("every new temporary file was taken by a sweep")
}

// Sweep removes the temporary files of path (".<name>.tmp-<16 hex digits>" in its directory)
// that no writer holds: those a killed writer left. Write calls it; a directory that does not
// exist has nothing to sweep. It reports how many it removed.
func Sweep(path string) (int, error) {
	dir := filepath.Dir(path)

	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)

	switch {
	case errors.Is(err, unix.ENOENT):
		return 0, nil
	case errors.Is(err, unix.ELOOP):
		return 0, symlinkError(dir)
	case err != nil:
		return 0, fmt.Errorf("opening directory %s: %w", dir, err)
	}

	d := os.NewFile(uintptr(fd), dir)
	defer d.Close() //nolint:errcheck

	return sweepIn(d, filepath.Base(path))
}

// sweepIn is Sweep in the open directory d.
func sweepIn(d *os.File, base string) (int, error) {
	names, err := d.Readdirnames(-1)
	if err != nil {
		return 0, fmt.Errorf("listing %s: %w", d.Name(), err)
	}

	var (
		removed int
		errs    []error
	)

	for _, name := range names {
		suffix, ok := strings.CutPrefix(name, tempPrefix(base))
		if !ok || len(suffix) != tempSuffixLen || strings.Trim(suffix, "0123456789abcdef") != "" {
			continue
		}

		gone, err := removeUnheld(int(d.Fd()), name)
		if err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", filepath.Join(d.Name(), name), err))
		}

		if gone {
			removed++
		}
	}

	return removed, errors.Join(errs...)
}

// removeUnheld removes the regular file name in dfd unless a writer holds its lock.
func removeUnheld(dfd int, name string) (bool, error) {
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) {
		return false, nil // renamed or removed meanwhile, or not a file of ours
	}

	if err != nil {
		return false, err // the caller names the file
	}
	defer unix.Close(fd) //nolint:errcheck

	var held unix.Stat_t
	if err := unix.Fstat(fd, &held); err != nil || held.Mode&unix.S_IFMT != unix.S_IFREG {
		return false, err // nil for what is not a regular file: not ours
	}

	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return false, nil // a live writer's
		}

		return false, err
	}

	// Still the file that was locked under that name (names are random and never reused).
	if !sameFile(fd, dfd, name) {
		return false, nil
	}

	if err := unix.Unlinkat(dfd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return false, err
	}

	return true, nil
}

// sameFile reports whether name in dfd is the file open as fd.
func sameFile(fd, dfd int, name string) bool {
	var open, named unix.Stat_t

	if unix.Fstat(fd, &open) != nil || unix.Fstatat(dfd, name, &named, unix.AT_SYMLINK_NOFOLLOW) != nil {
		return false
	}

	return open.Ino == named.Ino && open.Dev == named.Dev
}

// bare drops the *fs.PathError around an error of the temporary file, whose random name
// would make every retry's error read differently.
func bare(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}

	return err
}

// MkdirNoFollow creates dir and its missing parents (0755) and refuses a dir that is a
// symbolic link, or a link where it has to create one: a link planted in place of a
// directory the service writes (the readiness files, the NFD features, /dev/char, /run/cdi)
// would make it write wherever the link points, as root. Parents that exist already and
// need nothing created in them (/run, /dev, /etc/kubernetes) are the host's own and are
// taken as they are.
func MkdirNoFollow(dir string) error {
	d, err := openDir(dir)
	if err != nil {
		return err
	}

	return d.Close()
}

// openDir is MkdirNoFollow that returns the directory, opened without following a link.
func openDir(dir string) (*os.File, error) {
	// From dir up to the first directory that exists: those below it are to be created.
	var missing []string

	for p := dir; ; {
		st, err := os.Lstat(p)
		if err == nil {
			if st.Mode().Type() == fs.ModeSymlink {
				return nil, symlinkError(p)
			}

			break
		}

		if !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("creating directory %s: %w", dir, err)
		}

		missing = append(missing, p)

		parent := filepath.Dir(p)
		if parent == p {
			break
		}

		p = parent
	}

	for i := len(missing) - 1; i >= 0; i-- {
		if err := os.Mkdir(missing[i], 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("creating directory %s: %w", dir, err)
		}
	}

	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)

	switch {
	case errors.Is(err, unix.ELOOP):
		return nil, symlinkError(dir)
	case errors.Is(err, unix.ENOTDIR):
		return nil, fmt.Errorf("%s is not a directory", dir)
	case err != nil:
		return nil, fmt.Errorf("opening directory %s: %w", dir, err)
	}

	return os.NewFile(uintptr(fd), dir), nil
}

func symlinkError(dir string) error {
	target, _ := os.Readlink(dir) //nolint:errcheck // only for the message

	return fmt.Errorf("refusing to write into %s: it is a symbolic link (to %q), not a directory; remove it", dir, target)
}

// Remove deletes path; a path that does not exist is not an error. A path whose directory
// is a symbolic link is refused, as Write refuses it.
func Remove(path string) error {
	if st, err := os.Lstat(filepath.Dir(path)); err == nil && st.Mode().Type() == fs.ModeSymlink {
		return symlinkError(filepath.Dir(path))
	}

	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", path, err)
	}

	return nil
}
