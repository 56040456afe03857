// Package atomicfile writes files so that a reader sees the old content or the new, never a
// part: the data goes to a temporary file in the same directory, is synced, and is renamed
// over the target.
package atomicfile

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

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
func Write(path string, data []byte, mode os.FileMode) (changed bool, err error) {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		if st, err := os.Lstat(path); err == nil && st.Mode().IsRegular() && st.Mode().Perm() == mode.Perm() {
			return false, nil
		}
	}

	dir, base := filepath.Dir(path), filepath.Base(path)

	d, err := openDir(dir)
	if err != nil {
		return false, err
	}
	defer d.Close() //nolint:errcheck

	dfd := int(d.Fd())

	var suffix [8]byte
	if _, err := rand.Read(suffix[:]); err != nil {
		return false, fmt.Errorf("writing %s: %w", path, err)
	}

	name := "." + base + ".tmp-" + hex.EncodeToString(suffix[:])

	fd, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return false, fmt.Errorf("creating a temporary file for %s: %w", path, err)
	}

	tmp := os.NewFile(uintptr(fd), filepath.Join(dir, name))

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

	if err = tmp.Close(); err != nil {
		return false, fmt.Errorf("closing %s: %w", path, bare(err))
	}

	if err = unix.Renameat(dfd, name, dfd, base); err != nil {
		return false, fmt.Errorf("replacing %s: %w", path, err)
	}

	// Make the rename itself durable where the directory is on persistent storage (the NFD
	// features directory on Talos lives on /var); on tmpfs this costs nothing.
	d.Sync() //nolint:errcheck // best effort: the data itself is synced

	return true, nil
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

// JSONFile keeps a value and writes it whole, as indented JSON, atomically, on every
// change: a status file that readers poll.
type JSONFile[T any] struct {
	mu   sync.Mutex
	path string
	cur  T
}

// NewJSONFile returns a file at path holding initial; nothing is written until Update.
func NewJSONFile[T any](path string, initial T) *JSONFile[T] {
	return &JSONFile[T]{path: path, cur: initial}
}

// Update changes the value with f and writes it; the value changes even when the write fails.
func (j *JSONFile[T]) Update(f func(*T)) (T, error) {
	j.mu.Lock()
	defer j.mu.Unlock()

	f(&j.cur)

	data, err := json.MarshalIndent(j.cur, "", "  ")
	if err != nil {
		return j.cur, fmt.Errorf("encoding %s: %w", j.path, err)
	}

	if _, err := Write(j.path, append(data, '\n'), 0o644); err != nil {
		return j.cur, fmt.Errorf("writing status: %w", err)
	}

	return j.cur, nil
}

// Get returns the value.
func (j *JSONFile[T]) Get() T {
	j.mu.Lock()
	defer j.mu.Unlock()

	return j.cur
}
