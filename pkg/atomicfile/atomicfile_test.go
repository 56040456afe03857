package atomicfile_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
	"github.com/talos-nvidia/nvidia-driver/pkg/atomicfile"
)

func TestWriteReplacesAndReportsChange(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a/b/file")

	changed, err := atomicfile.Write(path, []byte("one"), 0o644)
	require.NoError(t, err)
	assert.True(t, changed)

	changed, err = atomicfile.Write(path, []byte("one"), 0o644)
	require.NoError(t, err)
	assert.False(t, changed, "same content and mode: untouched")

	changed, err = atomicfile.Write(path, []byte("two"), 0o600)
	require.NoError(t, err)
	assert.True(t, changed)

	data, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "two", string(data))

	st, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())

	entries, err := os.ReadDir(filepath.Dir(path))
	require.NoError(t, err)
	assert.Len(t, entries, 1, "no temporary file left")
}

// TestSymlinkedDirectoryIsRefused: a link planted in place of the directory (or of a parent
// the call must create) is not followed; nothing appears where it points.
func TestSymlinkedDirectoryIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		dir  string // relative to the test's root; the link is made there
		file string // relative to dir
	}{
		{"the directory itself", "validations", "ready"},
		{"a directory to create below it", "cdi", "sub/nvidia.yaml"},
		{"a dangling link", "dangling", "ready"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			target := filepath.Join(root, "elsewhere")
			if tc.name != "a dangling link" {
				require.NoError(t, os.Mkdir(target, 0o755))
			}

			link := filepath.Join(root, tc.dir)
			require.NoError(t, os.Symlink(target, link))

			path := filepath.Join(link, tc.file)
			_, err := atomicfile.Write(path, []byte("x"), 0o644)
			require.Error(t, err)

			if tc.file == "ready" {
				assert.Contains(t, err.Error(), "refusing to write into "+link+": it is a symbolic link")
			}

			assert.NoFileExists(t, filepath.Join(target, tc.file))

			if entries, err := os.ReadDir(target); err == nil {
				assert.Empty(t, entries, "nothing written where the link points")
			}

			err = atomicfile.MkdirNoFollow(link)
			require.Error(t, err)
			assert.Contains(t, err.Error(), link)
		})
	}
}

func TestRemoveRefusesSymlinkedDirectory(t *testing.T) {
	root := t.TempDir()
	target := filepath.Join(root, "elsewhere")
	require.NoError(t, os.Mkdir(target, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(target, "ready"), nil, 0o644))
	require.NoError(t, os.Symlink(target, filepath.Join(root, "validations")))

	err := atomicfile.Remove(filepath.Join(root, "validations", "ready"))
	require.Error(t, err)
	assert.FileExists(t, filepath.Join(target, "ready"))
}

// TestRepeatedFailureReadsTheSame: on a full file system every try fails the same way, and
// the error says so in the same words (it names the target, not the random temporary
// file), so a caller that reports each distinct error once reports it once.
func TestRepeatedFailureReadsTheSame(t *testing.T) {
	testutil.RequireRoot(t)

	dir := t.TempDir()
	require.NoError(t, unix.Mount("tmpfs", dir, "tmpfs", 0, "size=8k"))
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) }) //nolint:errcheck

	path := filepath.Join(dir, "nvidia.yaml")
	big := []byte(strings.Repeat("x", 1<<20))

	var msgs []string

	for range 3 {
		_, err := atomicfile.Write(path, big, 0o644)
		require.Error(t, err)
		require.ErrorIs(t, err, unix.ENOSPC)
		msgs = append(msgs, err.Error())
	}

	assert.Equal(t, msgs[0], msgs[1])
	assert.Equal(t, msgs[0], msgs[2])
	assert.Contains(t, msgs[0], path)

	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries, "no temporary file left")
}
