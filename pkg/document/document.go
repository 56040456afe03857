// Package document follows the service's ExtensionServiceConfig document as Talos keeps it on
// the host, so that the service can run before a document exists and still take the first one
// that arrives.
//
// Talos v1.13 (internal/app/machined, read at v1.13.9):
//   - pkg/controllers/runtime/extension_service_config_files.go writes each document's files,
//     0644, under constants.ExtensionServiceUserConfigPath/<name>/ (a file's name is its
//     mountPath without the leading "/" and with "/" replaced by "-"), creates that directory
//     for every document (files or environment only) and removes it with the document.
//   - pkg/system/services/extension.go (Runner) bind-mounts those files at their mountPath
//     and appends the document's environment, once, when the service's runner is built; a
//     process that exits is started again by the same runner (runner/restart), with the same
//     mounts and environment.
//   - pkg/controllers/runtime/extension_service.go (handleRestart) restarts a service for every
//     change of its document but the first: at spec version "1" a running service is assumed
//     to be waiting on `depends: configuration`, and is left alone.
//
// A service without that dependency (it would hold the node's boot for up to 70 minutes where
// no document comes: StartAllServices) must therefore notice a first document itself. It reads
// the files from the host directory when Talos did not mount them, and restarts itself to
// begin again from them; only the document's environment cannot reach it that way.
package document

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// BaseDir is constants.ExtensionServiceUserConfigPath: the service's YAML mounts it read-only
// at the same path (the whole directory, since Talos removes and creates the service's own
// directory under it as the document comes and goes).
const BaseDir = "/system/overlays/extensions"

// MaxFileSize bounds a document file the service reads (its configuration file, the MIG
// layouts file), checked before a byte of it is parsed. The largest real file is a MIG layouts
// file: NVIDIA's GPU Operator v26.7.0 default-mig-parted-config ConfigMap is 13.8 KB, mig-parted
// v0.15.0's config-default.yaml 11.6 KB (both in pkg/mig/testdata/nvidia); a configuration
// file is under 1 KB. 64 KiB leaves four times the largest, and parses in milliseconds, so a
// SIGTERM during the parse is honoured at once: a 10 MB file took 26 s and 800 MB (issue 32).
const MaxFileSize = 64 << 10

// ErrTooLarge is the error of a document file larger than MaxFileSize.
var ErrTooLarge = errors.New("larger than 64 KiB, the limit of a document file")

// ReadFile reads the document file at path, refusing, before it reads them, a file larger
// than MaxFileSize (ErrTooLarge) and one that is not a regular file. Its errors name path; a
// file that does not exist gives an error that is fs.ErrNotExist.
func ReadFile(path string) ([]byte, error) {
	// O_NONBLOCK: a FIFO put at the path must not hold the service in open(2).
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err // a *fs.PathError: it names the file and the operation
	}
	defer f.Close()

	st, err := f.Stat()
	if err != nil {
		return nil, err // a *fs.PathError
	}

	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file (%s)", path, st.Mode().Type())
	}

	if st.Size() > MaxFileSize {
		return nil, fmt.Errorf("%s: %d bytes: %w", path, st.Size(), ErrTooLarge)
	}

	// The file may grow between the stat and the read: read at most one byte past the limit.
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}

	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("%s: more than %d bytes: %w", path, MaxFileSize, ErrTooLarge)
	}

	return data, nil
}

// FileName is the name Talos gives the file of a document's configFiles entry: its mountPath
// without the leading "/", with every "/" replaced by "-" (services/extension.go).
func FileName(mountPath string) string {
	return strings.ReplaceAll(strings.TrimPrefix(mountPath, "/"), "/", "-")
}

// Dir is one service's document directory on the host, as the service sees it.
type Dir string

// For returns the document directory of the service name under the host root.
func For(hostRoot, name string) Dir {
	return Dir(filepath.Join(hostRoot, BaseDir, name))
}

// Present reports whether the node has a document for the service (Talos creates the
// directory for every document, even one with environment entries only).
func (d Dir) Present() (bool, error) {
	st, err := os.Stat(string(d))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}

	if err != nil {
		return false, fmt.Errorf("reading the ExtensionServiceConfig directory: %w", err)
	}

	if !st.IsDir() {
		return false, fmt.Errorf("%s is not a directory", d)
	}

	return true, nil
}

// Resolve returns where to read the document file that Talos mounts at mountPath: mountPath
// itself where it exists, else the document directory's copy of it (fromDocument true), when
// the runner was built before the document came. It returns mountPath, false where neither
// exists, so the caller's error names the path the user wrote.
func (d Dir) Resolve(mountPath string) (path string, fromDocument bool) {
	if _, err := os.Stat(mountPath); err == nil {
		return mountPath, false
	}

	p := filepath.Join(string(d), FileName(mountPath))
	if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
		return p, true
	}

	return mountPath, false
}

// WaitForArrival returns nil once the document directory exists, polling every interval (a
// stat: the service waits with almost nothing), or ctx's error when ctx ends first.
func (d Dir) WaitForArrival(ctx context.Context, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()

	for {
		if ok, err := d.Present(); err == nil && ok {
			return nil
		}

		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
