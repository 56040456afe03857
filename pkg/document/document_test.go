package document_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
