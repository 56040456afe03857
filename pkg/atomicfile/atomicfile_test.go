package atomicfile_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
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

// TestWriteSweepsKilledWritersTemporaryFiles: temporary files that killed writers left (issue
// 32: 25 SIGKILLs left 13 .status.json.tmp-* and 2 .nvidia.yaml.tmp-*) are removed by the
// next Write of the same file, a changing one or not; one a live writer holds (its lock), those
// of other files and other names are left alone.
func TestWriteSweepsKilledWritersTemporaryFiles(t *testing.T) {
	for _, same := range []bool{false, true} {
		t.Run(map[bool]string{false: "changed", true: "unchanged"}[same], func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "status.json")
			require.NoError(t, os.WriteFile(path, []byte("old"), 0o644))

			stale := []string{".status.json.tmp-0123456789abcdef", ".status.json.tmp-fedcba9876543210"}
			kept := []string{".status.json.tmp-live000000000000", ".other.json.tmp-0123456789abcdef", ".status.json.tmp-short", "status.json.tmp-0123456789abcdef"}

			for _, name := range append(append([]string{}, stale...), kept...) {
				require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte("partial"), 0o600))
			}

			// A live writer's file: held locked, as Write holds its own.
			live := filepath.Join(dir, ".status.json.tmp-00000000000000aa")
			f, err := os.OpenFile(live, os.O_CREATE|os.O_WRONLY, 0o600)
			require.NoError(t, err)
			t.Cleanup(func() { f.Close() })
			require.NoError(t, unix.Flock(int(f.Fd()), unix.LOCK_EX))

			kept = append(kept, filepath.Base(live))

			content := "new"
			if same {
				content = "old"
			}

			_, err = atomicfile.Write(path, []byte(content), 0o644)
			require.NoError(t, err)

			for _, name := range stale {
				assert.NoFileExists(t, filepath.Join(dir, name))
			}

			for _, name := range kept {
				assert.FileExists(t, filepath.Join(dir, name))
			}
		})
	}
}

// TestSweep: Sweep alone removes what killed writers left, reports how many, and has nothing
// to do where the directory does not exist.
func TestSweep(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "nvidia.yaml")

	for _, name := range []string{".nvidia.yaml.tmp-0123456789abcdef", ".nvidia.yaml.tmp-1123456789abcdef"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), nil, 0o600))
	}

	n, err := atomicfile.Sweep(path)
	require.NoError(t, err)
	assert.Equal(t, 2, n)

	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries)

	n, err = atomicfile.Sweep(filepath.Join(dir, "absent", "file"))
	require.NoError(t, err)
	assert.Zero(t, n)
}

// TestSweepSparesConcurrentWriters: writers of the same file sweep while others write; none
// loses its temporary file to another's sweep.
func TestSweepSparesConcurrentWriters(t *testing.T) {
	path := filepath.Join(t.TempDir(), "status.json")

	var wg sync.WaitGroup

	errs := make(chan error, 8)

	for w := range 8 {
		wg.Add(1)

		go func() {
			defer wg.Done()

			for i := range 200 {
				if _, err := atomicfile.Write(path, []byte(fmt.Sprintf("%d-%d", w, i)), 0o644); err != nil {
					errs <- err

					return
				}
			}
		}()
	}

	wg.Wait()
	close(errs)

	for err := range errs {
		t.Error(err)
	}

	entries, err := os.ReadDir(filepath.Dir(path))
	require.NoError(t, err)
	assert.Len(t, entries, 1, "no temporary file left")
}

// TestOpenDirNoSymlinks: a link at any component of the path is refused, naming it; with
// create, nothing is made where it points; a path without links is made and opened.
func TestOpenDirNoSymlinks(t *testing.T) {
	root := t.TempDir()
	elsewhere := filepath.Join(root, "elsewhere")
	require.NoError(t, os.MkdirAll(elsewhere, 0o755))
	require.NoError(t, os.Symlink(elsewhere, filepath.Join(root, "link")))

	_, err := atomicfile.OpenDirNoSymlinks(filepath.Join(root, "link/a/b"), true, 0o755)
	require.ErrorIs(t, err, atomicfile.ErrSymlink)
	assert.Contains(t, err.Error(), filepath.Join(root, "link")+" is a symbolic link")

	_, err = atomicfile.OpenDirNoSymlinks(filepath.Join(root, "link"), false, 0)
	require.ErrorIs(t, err, atomicfile.ErrSymlink)

	entries, err := os.ReadDir(elsewhere)
	require.NoError(t, err)
	assert.Empty(t, entries)

	d, err := atomicfile.OpenDirNoSymlinks(filepath.Join(root, "made/a/b"), true, 0o700)
	require.NoError(t, err)
	require.NoError(t, d.Close())
	assert.DirExists(t, filepath.Join(root, "made/a/b"))

	_, err = atomicfile.OpenDirNoSymlinks(filepath.Join(root, "absent"), false, 0)
	require.ErrorIs(t, err, unix.ENOENT)

	require.NoError(t, os.WriteFile(filepath.Join(root, "file"), nil, 0o644))
	_, err = atomicfile.OpenDirNoSymlinks(filepath.Join(root, "file/x"), true, 0o755)
	require.ErrorContains(t, err, "is not a directory")
}
