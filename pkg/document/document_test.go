package document_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/talos-nvidia/nvidia-driver/pkg/document"
)

func TestFileNameIsTalos(t *testing.T) {
	// services/extension.go: strings.ReplaceAll(strings.TrimPrefix(mountPath, "/"), "/", "-").
	for mountPath, want := range map[string]string{
		"/etc/nvidia-driver/config.yaml": "etc-nvidia-driver-config.yaml",
		"/etc/nvidia-driver/mig.yaml":    "etc-nvidia-driver-mig.yaml",
		"relative/x":                     "relative-x",
	} {
		assert.Equal(t, want, document.FileName(mountPath), mountPath)
	}
}

func TestResolve(t *testing.T) {
	host := t.TempDir()
	docs := document.For(host, "nvidia-driver")

	mounted := filepath.Join(t.TempDir(), "config.yaml")
	require.NoError(t, os.WriteFile(mounted, []byte("x"), 0o644))

	p, from := docs.Resolve(mounted)
	assert.Equal(t, mounted, p, "a mounted file is read where it is mounted")
	assert.False(t, from)

	p, from = docs.Resolve("/etc/nvidia-driver/config.yaml")
	assert.Equal(t, "/etc/nvidia-driver/config.yaml", p, "neither: the path the user wrote, for the error")
	assert.False(t, from)

	require.NoError(t, os.MkdirAll(string(docs), 0o755))
	copyPath := filepath.Join(string(docs), "etc-nvidia-driver-config.yaml")
	require.NoError(t, os.WriteFile(copyPath, []byte("x"), 0o644))

	p, from = docs.Resolve("/etc/nvidia-driver/config.yaml")
	assert.Equal(t, copyPath, p, "not mounted: Talos's copy")
	assert.True(t, from)
}

func TestWaitForArrival(t *testing.T) {
	docs := document.For(t.TempDir(), "nvidia-driver")

	present, err := docs.Present()
	require.NoError(t, err)
	assert.False(t, present)

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, docs.WaitForArrival(ctx, 5*time.Millisecond), context.DeadlineExceeded, "no document: waits until ctx ends")

	require.NoError(t, os.MkdirAll(string(docs), 0o755)) // a document with environment entries only
	require.NoError(t, docs.WaitForArrival(context.Background(), 5*time.Millisecond))

	present, err = docs.Present()
	require.NoError(t, err)
	assert.True(t, present)
}

// TestReadFileLimits: ReadFile refuses a file over MaxFileSize and a FIFO (without waiting for
// a writer), and reads a file of the limit.
func TestReadFileLimits(t *testing.T) {
	dir := t.TempDir()

	at := filepath.Join(dir, "at")
	require.NoError(t, os.WriteFile(at, make([]byte, document.MaxFileSize), 0o644))

	data, err := document.ReadFile(at)
	require.NoError(t, err)
	assert.Len(t, data, document.MaxFileSize)

	over := filepath.Join(dir, "over")
	require.NoError(t, os.WriteFile(over, make([]byte, document.MaxFileSize+1), 0o644))

	_, err = document.ReadFile(over)
	require.ErrorIs(t, err, document.ErrTooLarge)
	assert.Contains(t, err.Error(), over)

	fifo := filepath.Join(dir, "fifo")
	require.NoError(t, unix.Mkfifo(fifo, 0o644))

	_, err = document.ReadFile(fifo)
	require.ErrorContains(t, err, "not a regular file")

	_, err = document.ReadFile(filepath.Join(dir, "absent"))
	require.ErrorIs(t, err, os.ErrNotExist)
}
