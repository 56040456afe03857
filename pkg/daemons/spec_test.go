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
			assert.Equal(t, filepath.Join(root, "lib64/ld-linux-x86-64.so.2"), s.Path)
			assert.Equal(t, append(append([]string{}, head...), tc.tail...), s.Args)
			assert.Equal(t, "/var/run/nvidia-persistenced", s.RunDir)
			assert.Equal(t, "/var/run/nvidia-persistenced/nvidia-persistenced.pid", s.PIDFile)
			assert.Equal(t, "/var/run/nvidia-persistenced/socket", s.Socket)
		})
	}
}

func TestFabricManagerConfig(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"lib64", "usr/bin", "usr/share/nvidia/nvswitch"} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, d), 0o755))
	}
	for _, f := range []string{"lib64/ld-linux-x86-64.so.2", "usr/bin/nv-fabricmanager"} {
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
