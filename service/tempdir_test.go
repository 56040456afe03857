package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTempDirNotMadeThroughALink: with a link at the host's /run/nvidia-driver (issue 32: the
// CDI library's temporary directory was made, and its renderings written, where it pointed),
// TMPDIR is refused with an error naming the link, and nothing is made where it points.
func TestTempDirNotMadeThroughALink(t *testing.T) {
	root := t.TempDir()
	elsewhere := filepath.Join(root, "elsewhere")
	require.NoError(t, os.MkdirAll(elsewhere, 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(root, "run"), 0o755))
	require.NoError(t, os.Symlink(elsewhere, filepath.Join(root, "run/nvidia-driver")))

	err := prepareTempDir(filepath.Join(root, "run/nvidia-driver/tmp"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), filepath.Join(root, "run/nvidia-driver")+" is a symbolic link, not a directory (to \""+elsewhere+"\")")

	entries, err := os.ReadDir(elsewhere)
	require.NoError(t, err)
	assert.Empty(t, entries, "made where the link points")

	// Without the link, TMPDIR is made, and a killed run's renderings go.
	require.NoError(t, os.Remove(filepath.Join(root, "run/nvidia-driver")))
	stale := filepath.Join(root, "run/nvidia-driver/tmp/spec.123.tmp")
	require.NoError(t, os.MkdirAll(filepath.Dir(stale), 0o700))
	require.NoError(t, os.WriteFile(stale, nil, 0o600))

	require.NoError(t, prepareTempDir(filepath.Dir(stale)))
	assert.NoFileExists(t, stale)
}
