package nfd_test

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/pkg/nfd"
)

// nfdLabels reads a features.d directory the way NFD's local source does: every
// non-hidden regular file, "#" lines skipped, "name=value" or "name" (= "true").
func nfdLabels(t *testing.T, dir string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	labels := map[string]string{}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") || !e.Type().IsRegular() {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		require.NoError(t, err)
		for _, line := range strings.Split(string(data), "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				v = "true"
			}
			labels[k] = v
		}
	}
	return labels
}

func TestWriteContent(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "features.d") // created by Write
	labels := nfd.WithMPSCapable(nfd.MIGLabels("all-balanced", "success", "NVIDIA H200"), false)
	require.NoError(t, nfd.Write(dir, labels))

	data, err := os.ReadFile(filepath.Join(dir, nfd.DefaultName))
	require.NoError(t, err)
	assert.Equal(t, "# Written by the nvidia-driver extension service (ext-nvidia-driver); replaced whole on every change.\n"+
		"nvidia.com/gpu.product=NVIDIA-H200\n"+
		"nvidia.com/mig.config=all-balanced\n"+
		"nvidia.com/mig.config.state=success\n"+
		"nvidia.com/mps.capable=false\n", string(data))
	assert.Equal(t, map[string]string{
		"nvidia.com/gpu.product":      "NVIDIA-H200",
		"nvidia.com/mig.config":       "all-balanced",
		"nvidia.com/mig.config.state": "success",
		"nvidia.com/mps.capable":      "false",
	}, nfdLabels(t, dir))

	st, err := os.Stat(filepath.Join(dir, nfd.DefaultName))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o644), st.Mode().Perm())
}

// Talos creates a missing mount source 0700; NFD's worker runs as an unprivileged user and
// must still list and search the directory. Modes that already allow it stay as they are.
func TestWriteOpensDirectoryToWorker(t *testing.T) {
	for _, tc := range []struct {
		name      string
		mode, got os.FileMode
	}{
		{"as Talos makes it", 0o700, 0o755},
		{"group only", 0o750, 0o755},
		{"NFD's default", 0o755, 0o755},
		{"group writable", 0o775, 0o775},
		{"world writable", 0o777, 0o777},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "features.d")
			require.NoError(t, os.Mkdir(dir, tc.mode))
			require.NoError(t, os.Chmod(dir, tc.mode)) // past the umask

			require.NoError(t, nfd.Write(dir, nfd.MIGLabels("", "", "NVIDIA H200")))

			st, err := os.Stat(dir)
			require.NoError(t, err)
			assert.Equal(t, tc.got, st.Mode().Perm())
		})
	}
}

func TestStaleLabelsRemoved(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, nfd.Write(dir, nfd.MIGLabels("all-1g.18gb", "pending-reboot", "NVIDIA H200")))
	// MIG switched off: no layout, no state. The old MIG labels must disappear.
	require.NoError(t, nfd.Write(dir, nfd.MIGLabels("", "", "NVIDIA H200")))
	assert.Equal(t, map[string]string{"nvidia.com/gpu.product": "NVIDIA-H200"}, nfdLabels(t, dir))

	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "no temp files left behind")

	w, err := nfd.NewWriter(dir, nfd.DefaultName)
	require.NoError(t, err)
	require.NoError(t, w.Remove())
	require.NoError(t, w.Remove(), "removing a missing file is fine")
	assert.Empty(t, nfdLabels(t, dir))
}

func TestInvalidLabelsLeaveFileAsItWas(t *testing.T) {
	dir := t.TempDir()
	w, err := nfd.NewWriter(dir, "gpu")
	require.NoError(t, err)
	require.NoError(t, w.Write(map[string]string{"nvidia.com/mig.config": "all-disabled"}))
	before, err := os.ReadFile(w.Path())
	require.NoError(t, err)

	err = w.Write(map[string]string{
		"nvidia.com/mig.config":  "has space",
		"Bad_Prefix.com/x":       "ok",
		"nvidia.com/":            "v",
		"nvidia.com/gpu.product": strings.Repeat("a", 64),
		"fine":                   "",
	})
	require.Error(t, err)
	for _, want := range []string{`"nvidia.com/mig.config"`, `"Bad_Prefix.com/x"`, `"nvidia.com/"`, `"nvidia.com/gpu.product"`, w.Path()} {
		assert.Contains(t, err.Error(), want)
	}
	assert.NotContains(t, err.Error(), `"fine"`)

	after, err := os.ReadFile(w.Path())
	require.NoError(t, err)
	assert.Equal(t, string(before), string(after))
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 1)
}

func TestNewWriterRejectsNames(t *testing.T) {
	for _, tc := range []struct{ dir, name string }{
		{"", "x"}, {"/d", ""}, {"/d", ".hidden"}, {"/d", "a/b"},
	} {
		_, err := nfd.NewWriter(tc.dir, tc.name)
		assert.Error(t, err, "dir %q name %q", tc.dir, tc.name)
	}
}

// A reader never sees a partly written file: every read is one of the complete
// versions (NFD's worker reads whenever the directory changes).
func TestAtomicReplace(t *testing.T) {
	dir := t.TempDir()
	w, err := nfd.NewWriter(dir, nfd.DefaultName)
	require.NoError(t, err)

	sets := []map[string]string{
		nfd.MIGLabels("all-balanced", "success", "NVIDIA H200"),
		{"nvidia.com/mig.config": "all-1g.18gb", "nvidia.com/mig.config.state": "failed", "x.example.com/pad": strings.Repeat("p", 63)},
	}
	valid := map[string]bool{}
	for _, s := range sets {
		c, err := nfd.Render(s)
		require.NoError(t, err)
		valid[string(c)] = true
	}
	require.NoError(t, w.Write(sets[0]))

	var stop atomic.Bool
	var reads, bad atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			data, err := os.ReadFile(w.Path())
			if err != nil || !valid[string(data)] {
				bad.Add(1)
			}
			reads.Add(1)
		}
	}()
	for i := range 500 {
		require.NoError(t, w.Write(sets[i%2]))
	}
	stop.Store(true)
	wg.Wait()
	assert.Zero(t, bad.Load(), "partial or missing file seen in %d reads", reads.Load())
	assert.Positive(t, reads.Load())
}

func TestSanitizeValue(t *testing.T) {
	for in, want := range map[string]string{
		"NVIDIA H200":               "NVIDIA-H200",
		" NVIDIA H100 80GB HBM3 ":   "NVIDIA-H100-80GB-HBM3",
		"all-balanced":              "all-balanced",
		"pending-reboot":            "pending-reboot",
		"(weird)/name!":             "weird-name",
		"":                          "",
		strings.Repeat("ab", 40):    strings.Repeat("ab", 31) + "a",
		"NVIDIA A100-SXM4-40GB (x)": "NVIDIA-A100-SXM4-40GB-x",
	} {
		got := nfd.SanitizeValue(in)
		assert.Equal(t, want, got, "input %q", in)
		if got != "" {
			_, err := nfd.Render(map[string]string{"k": got})
			assert.NoError(t, err, "sanitized %q must be a valid label value", got)
		}
	}
}
