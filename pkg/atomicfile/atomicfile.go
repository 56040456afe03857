// Package atomicfile writes files so that a reader sees the old content or the new, never a
// part: the data goes to a temporary file in the same directory, is synced, and is renamed
// over the target.
package atomicfile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// Write replaces path with data and mode. It creates missing parent directories (0755).
// It reports whether the file changed: a file that already holds data is left untouched,
// so watchers of the file see no event.
func Write(path string, data []byte, mode os.FileMode) (changed bool, err error) {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		if st, err := os.Stat(path); err == nil && st.Mode().Perm() == mode.Perm() {
			return false, nil
		}
	}

	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, fmt.Errorf("creating directory for %s: %w", path, err)
	}

	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return false, fmt.Errorf("creating temporary file for %s: %w", path, err)
	}

	// Whatever happens below, no temporary file is left behind.
	defer func() {
		if err != nil {
			tmp.Close()           //nolint:errcheck // the write error is what matters
			os.Remove(tmp.Name()) //nolint:errcheck
		}
	}()

	if _, err = tmp.Write(data); err != nil {
		return false, fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}

	if err = tmp.Chmod(mode); err != nil {
		return false, fmt.Errorf("setting mode of %s: %w", tmp.Name(), err)
	}

	if err = tmp.Sync(); err != nil {
		return false, fmt.Errorf("syncing %s: %w", tmp.Name(), err)
	}

	if err = tmp.Close(); err != nil {
		return false, fmt.Errorf("closing %s: %w", tmp.Name(), err)
	}

	if err = os.Rename(tmp.Name(), path); err != nil {
		return false, fmt.Errorf("replacing %s: %w", path, err)
	}

	// Make the rename itself durable where the directory is on persistent storage (the NFD
	// features directory on Talos lives on /var); on tmpfs this costs nothing.
	if d, err := os.Open(dir); err == nil {
		d.Sync()  //nolint:errcheck // best effort: the data itself is synced
		d.Close() //nolint:errcheck
	}

	return true, nil
}

// Remove deletes path; a path that does not exist is not an error.
func Remove(path string) error {
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
