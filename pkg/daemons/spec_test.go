package daemons_test

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/pkg/daemons"
	"github.com/talos-nvidia/nvidia-driver/pkg/driverroot"
)

var update = flag.Bool("update", false, "rewrite golden files")

func TestPersistencedArgs(t *testing.T) {
	root := fakeSubroot(t)
	lib := filepath.Join(root, "usr/lib64")
	head := []string{"--library-path", lib, filepath.Join(root, "usr/bin/nvidia-persistenced"), "--nvidia-cfg-path", lib}
	for _, tc := range []struct {
		name string
		edit func(*daemons.PersistencedOptions)
		tail []string
	}{
		{"defaults", func(*daemons.PersistencedOptions) {}, []string{"--persistence-mode", "--no-uvm-persistence-mode"}},
		{"no persistence mode", func(o *daemons.PersistencedOptions) { o.PersistenceMode = false },
			[]string{"--no-persistence-mode", "--no-uvm-persistence-mode"}},
		{"uvm and verbose", func(o *daemons.PersistencedOptions) { o.UVMPersistenceMode, o.Verbose = true, true },
			[]string{"--persistence-mode", "--uvm-persistence-mode", "--verbose"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := daemons.DefaultPersistencedOptions(root)
			tc.edit(&o)
			s, err := daemons.Persistenced(o)
			require.NoError(t, err)
			assert.Equal(t, filepath.Join(root, driverroot.LoaderPath), s.Path)
			assert.Equal(t, append(append([]string{}, head...), tc.tail...), s.Args)
			assert.Equal(t, "/run/nvidia-persistenced", s.RunDir)
			assert.Equal(t, "/run/nvidia-persistenced/nvidia-persistenced.pid", s.PIDFile)
			assert.Equal(t, "/run/nvidia-persistenced/socket", s.Socket)
		})
	}
}

func TestFabricManagerConfig(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{filepath.Dir(driverroot.LoaderPath), "usr/bin", "usr/share/nvidia/nvswitch"} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, d), 0o755))
	}
	for _, f := range []string{driverroot.LoaderPath, "usr/bin/nv-fabricmanager"} {
		require.NoError(t, os.WriteFile(filepath.Join(root, f), nil, 0o755))
	}
	in, err := os.ReadFile("testdata/fabricmanager.cfg")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(root, "usr/share/nvidia/nvswitch/fabricmanager.cfg"), in, 0o644))
	runDir := t.TempDir()

	s, err := daemons.FabricManager(daemons.FabricManagerOptions{DriverRoot: root, RunDir: runDir})
	require.NoError(t, err)
	assert.Equal(t, []string{"--library-path", filepath.Join(root, "usr/lib64"),
		filepath.Join(root, "usr/bin/nv-fabricmanager"), "-c", filepath.Join(runDir, "fabricmanager.cfg")}, s.Args)
	assert.Equal(t, filepath.Join(runDir, "socket"), s.Socket)
	assert.True(t, s.Foreground, "run in the foreground, as siderolabs' extension runs it")
	assert.Empty(t, s.PIDFile)
	require.NoError(t, s.Prepare())
	got, err := os.ReadFile(filepath.Join(runDir, "fabricmanager.cfg"))
	require.NoError(t, err)
	// Paths differ per run: compare with them replaced.
	norm := func(b []byte) string {
		return string(replaceAll(replaceAll(b, root, "@ROOT@"), runDir, "@RUN@"))
	}
	if *update {
		require.NoError(t, os.WriteFile("testdata/fabricmanager.cfg.golden", []byte(norm(got)), 0o644))
	}
	want, err := os.ReadFile("testdata/fabricmanager.cfg.golden")
	require.NoError(t, err)
	assert.Equal(t, string(want), norm(got))

	_, err = daemons.FabricManager(daemons.FabricManagerOptions{DriverRoot: t.TempDir()})
	assert.ErrorContains(t, err, "lacks usr/bin/nv-fabricmanager")
}

func replaceAll(b []byte, old, new string) []byte {
	return []byte(strings.ReplaceAll(string(b), old, new))
}

// TestRewriteConfigLines: lines of any length, 64 KiB and more included (bufio.Scanner's
// limit, which used to drop the rest of the file), are kept; keys are set where they stand,
// missing ones appended; a last line without a newline counts.
func TestRewriteConfigLines(t *testing.T) {
	long := "# " + strings.Repeat("x", 200<<10)

	for _, tc := range []struct {
		name, in, want string
	}{
		{"a comment of 200 KiB before the keys", long + "\nDAEMONIZE=1\nLOG_LEVEL=4\n", long + "\nDAEMONIZE=0\nLOG_LEVEL=4\n"},
		{"a value of exactly 64 KiB", "TOPOLOGY=" + strings.Repeat("y", 64<<10) + "\nDAEMONIZE=1\n", "TOPOLOGY=" + strings.Repeat("y", 64<<10) + "\nDAEMONIZE=0\n"},
		{"no newline at the end", "LOG_LEVEL=4\nDAEMONIZE=1", "LOG_LEVEL=4\nDAEMONIZE=0\n"},
		{"a key to append", long + "\n", long + "\nDAEMONIZE=0\n"},
		{"empty lines kept", "A=1\n\n\nDAEMONIZE=1\n", "A=1\n\n\nDAEMONIZE=0\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := string(daemons.RewriteConfig([]byte(tc.in), map[string]string{"DAEMONIZE": "0"}))
			assert.Equal(t, len(tc.want), len(got))
			assert.True(t, tc.want == got, "rewritten config differs")
		})
	}
}

// TestFabricManagerKeepCUDAJobs: on boards where a fabric manager may be started again the
// config says ABORT_CUDA_JOBS_ON_FM_EXIT=0, replacing NVIDIA's 1 where it stands.
func TestFabricManagerKeepCUDAJobs(t *testing.T) {
	root := t.TempDir()
	for _, f := range []string{driverroot.LoaderPath, "usr/bin/nv-fabricmanager", daemons.FabricManagerConfig} {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(root, f)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, f), []byte("ABORT_CUDA_JOBS_ON_FM_EXIT=1\nDAEMONIZE=1\n"), 0o755))
	}

	for _, keep := range []bool{false, true} {
		runDir := t.TempDir()
		s, err := daemons.FabricManager(daemons.FabricManagerOptions{DriverRoot: root, RunDir: runDir, KeepCUDAJobsOnExit: keep})
		require.NoError(t, err)
		require.NoError(t, s.Prepare())
		got, err := os.ReadFile(filepath.Join(runDir, "fabricmanager.cfg"))
		require.NoError(t, err)

		want := "ABORT_CUDA_JOBS_ON_FM_EXIT=1\n"
		if keep {
			want = "ABORT_CUDA_JOBS_ON_FM_EXIT=0\n"
		}

		assert.True(t, strings.HasPrefix(string(got), want), "keep %v: %s", keep, got)
	}
}
