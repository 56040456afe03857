package cdi_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/talos-nvidia/nvidia-driver/internal/sim"
	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
	"github.com/talos-nvidia/nvidia-driver/pkg/atomicfile"
	"github.com/talos-nvidia/nvidia-driver/pkg/cdi"
	"github.com/talos-nvidia/nvidia-driver/pkg/devnodes"
	"github.com/talos-nvidia/nvidia-driver/pkg/driverroot"
	"github.com/talos-nvidia/nvidia-driver/pkg/mig"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// simulatedNode returns simulated NVML and a host root whose /dev holds the simulated GPUs'
// device nodes, made by the device-node job from the simulated /proc.
func simulatedNode(t testing.TB, spec string) (nvml.Interface, string) {
	t.Helper()
	testutil.RequireRoot(t)

	lib, err := sim.FromSpec(spec)
	require.NoError(t, err)

	// nvcdi finds the libraries by the driver version NVML reports.
	lib.DriverVersion = driverroot.Check(testutil.Subroot(t)).DriverVersion

	host := t.TempDir()

	require.Equal(t, nvml.SUCCESS, lib.Init())
	require.NoError(t, sim.WriteProcFS(host, lib))
	require.Equal(t, nvml.SUCCESS, lib.Shutdown())

	_, err = devnodes.Sync(quiet, host)
	require.NoError(t, err)

	return lib, host
}

func options(t *testing.T, host string) cdi.Options {
	o := cdi.DefaultOptions(testutil.Subroot(t))
	o.DevRoot = host

	return o
}

// TestGoldenSpec: the spec for two simulated H200s, the second split with an all-balanced
// MIG layout, with the persistenced socket present, matches the golden file (paths
// normalized). nvcdi reads MIG minors from the host's /proc/driver/nvidia-caps, so the
// generation runs in a private mount namespace with the simulated file there.
func TestGoldenSpec(t *testing.T) {
	testutil.RequireRoot(t)

	cmd := exec.Command("unshare", "--mount", "--propagation", "private", os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envRole+"=golden", "CDI_TEST_SUBROOT="+testutil.Subroot(t), "CDI_TEST_TMP="+t.TempDir())
	cmd.Stderr = os.Stderr

	out, err := cmd.Output()
	require.NoError(t, err)

	golden := filepath.Join("testdata", "h200x2-mig.yaml")
	if os.Getenv("UPDATE_GOLDEN") != "" {
		require.NoError(t, os.WriteFile(golden, out, 0o644))
	}

	want, err := os.ReadFile(golden)
	require.NoError(t, err)
	assert.Equal(t, string(want), string(out), "run with UPDATE_GOLDEN=1 to accept a change")

	// What the golden file must show, whatever else changes in it.
	for _, name := range []string{"name: \"0\"", "name: \"1:0\"", "name: all", "name: GPU-5a1a0000-0000-4000-8000-000000000000", "name: MIG-"} {
		assert.Contains(t, string(out), name)
	}

	assert.Contains(t, string(out), "containerPath: /run/nvidia-persistenced/socket")
	assert.Contains(t, string(out), "path: /dev/nvidia-caps/nvidia-cap")
	assert.Contains(t, string(out), "/usr/bin/nvidia-cdi-hook")
}

const envRole = "CDI_TEST_ROLE"

func TestMain(m *testing.M) {
	if os.Getenv(envRole) == "golden" {
		out, err := goldenSpec(os.Getenv("CDI_TEST_SUBROOT"), os.Getenv("CDI_TEST_TMP"))
		if err != nil {
			fmt.Fprintln(os.Stderr, "golden role:", err)
			os.Exit(1)
		}

		os.Stdout.Write(out) //nolint:errcheck
		os.Exit(0)
	}

	os.Exit(m.Run())
}

func goldenSpec(subroot, tmp string) ([]byte, error) {
	host := filepath.Join(tmp, "host")

	lib, err := sim.FromSpec("h200:2")
	if err != nil {
		return nil, err
	}

	lib.DriverVersion = driverroot.Check(subroot).DriverVersion

	// This namespace's /proc/driver: a tmpfs that points nvidia-caps at the simulated one.
	if err := unix.Mount("tmpfs", "/proc/driver", "tmpfs", 0, ""); err != nil {
		return nil, fmt.Errorf("mounting over /proc/driver: %w", err)
	}

	if err := os.Symlink(filepath.Join(host, "proc/driver/nvidia-caps"), "/proc/driver/nvidia-caps"); err != nil {
		return nil, err
	}

	cfg := mig.Builtin()
	cfg.Layouts["second-balanced"] = []mig.Entry{{Layout: "second-balanced", Devices: []int{1}, MigEnabled: true, MigDevices: map[string]int{"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}}}

	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, ret
	}

	applier := &mig.Applier{NVML: lib, Persistenced: mig.NoPersistenced{}, Logger: quiet}
	if _, err := applier.Apply(context.Background(), cfg, "second-balanced"); err != nil {
		return nil, err
	}

	if err := sim.WriteProcFS(host, lib); err != nil {
		return nil, err
	}

	lib.Shutdown() //nolint:errcheck

	if _, err := devnodes.Sync(quiet, host); err != nil {
		return nil, err
	}

	// The driver root as the service makes it: the subroot with the persistenced socket
	// bind-mounted into it.
	root := filepath.Join(tmp, "driver")
	if out, err := exec.Command("cp", "-a", subroot, root).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("copying the subroot: %w: %s", err, out)
	}

	l, err := net.Listen("unix", filepath.Join(root, "run/nvidia-persistenced/socket"))
	if err != nil {
		return nil, err
	}
	defer l.Close() //nolint:errcheck

	o := cdi.DefaultOptions(root)
	o.DevRoot = host

	s, err := cdi.Generate(quiet, lib, o)
	if err != nil {
		return nil, err
	}

	data, err := cdi.Render(s)
	if err != nil {
		return nil, err
	}

	return []byte(strings.ReplaceAll(strings.ReplaceAll(string(data), root, "/run/nvidia/driver"), host, "")), nil
}

func TestSpecFromSimulatedNode(t *testing.T) {
	lib, host := simulatedNode(t, "h200:2")
	o := options(t, host)

	s, err := cdi.Generate(quiet, lib, o)
	require.NoError(t, err)

	data, err := cdi.Render(s)
	require.NoError(t, err)

	// The CDI library, as containerd uses it, loads it without errors.
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "nvidia.yaml"), data, 0o644))

	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	require.NoError(t, err)
	assert.Empty(t, cache.GetErrors())

	uuids := simulatedUUIDs(t, lib)
	assert.ElementsMatch(t, []string{
		"nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=all",
		"nvidia.com/gpu=" + uuids[0], "nvidia.com/gpu=" + uuids[1],
	}, cache.ListDevices())
}

func simulatedUUIDs(t *testing.T, lib nvml.Interface) []string {
	t.Helper()
	require.Equal(t, nvml.SUCCESS, lib.Init())
	defer lib.Shutdown() //nolint:errcheck

	n, ret := lib.DeviceGetCount()
	require.Equal(t, nvml.SUCCESS, ret)

	var out []string

	for i := range n {
		d, ret := lib.DeviceGetHandleByIndex(i)
		require.Equal(t, nvml.SUCCESS, ret)
		u, ret := d.GetUUID()
		require.Equal(t, nvml.SUCCESS, ret)
		out = append(out, u)
	}

	return out
}

// TestAtomicRewrite: a reader polling the spec while it is rewritten 1000 times never sees
// a partial or empty document.
func TestAtomicRewrite(t *testing.T) {
	lib, host := simulatedNode(t, "h200:2")
	o := options(t, host)
	path := filepath.Join(t.TempDir(), "cdi", "nvidia.yaml")

	_, err := cdi.Write(quiet, lib, o, path)
	require.NoError(t, err)

	first, err := os.ReadFile(path)
	require.NoError(t, err)

	o.Vendor = "example.com"
	_, err = cdi.Write(quiet, lib, o, path)
	require.NoError(t, err)
	second, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NotEqual(t, first, second)

	var (
		stop    atomic.Bool
		reads   atomic.Int64
		bad     atomic.Int64
		wg      sync.WaitGroup
		badText atomic.Value
	)

	wg.Add(1)

	go func() {
		defer wg.Done()

		for !stop.Load() {
			data, err := os.ReadFile(path)
			reads.Add(1)

			if err != nil || (string(data) != string(first) && string(data) != string(second)) {
				bad.Add(1)
				badText.Store(string(data))
			}
		}
	}()

	for i := range 1000 {
		content := first
		if i%2 == 1 {
			content = second
		}

		_, err := atomicfile.Write(path, content, 0o644)
		require.NoError(t, err)
	}

	stop.Store(true)
	wg.Wait()

	assert.Zero(t, bad.Load(), "partial spec seen: %v", badText.Load())
	t.Logf("%d reads during 1000 rewrites", reads.Load())
}

func TestRewriteOnlyWhenChanged(t *testing.T) {
	lib, host := simulatedNode(t, "h200:1")
	o := options(t, host)
	path := filepath.Join(t.TempDir(), "nvidia.yaml")

	changed, err := cdi.Write(quiet, lib, o, path)
	require.NoError(t, err)
	assert.True(t, changed)

	st1, err := os.Stat(path)
	require.NoError(t, err)

	changed, err = cdi.Write(quiet, lib, o, path)
	require.NoError(t, err)
	assert.False(t, changed)

	st2, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, st1.ModTime(), st2.ModTime())
	assert.Equal(t, os.FileMode(0o644), st2.Mode().Perm())
}

// BenchmarkGenerate measures spec generation in-process on two simulated H200s and the
// Debian-built subroot (NVML calls are the simulator's, so this is nvcdi's own cost).
func BenchmarkGenerate(b *testing.B) {
	lib, host := simulatedNode(b, "h200:2")
	o := cdi.DefaultOptions(testutil.Subroot(b))
	o.DevRoot = host

	for b.Loop() {
		s, err := cdi.Generate(quiet, lib, o)
		if err != nil {
			b.Fatal(err)
		}

		if _, err := cdi.Render(s); err != nil {
			b.Fatal(err)
		}
	}
}

// TestFailedRenderLeavesNoTemporaryFile: with TMPDIR full (a tmpfs of one page), the CDI
// library's write of the spec fails; nothing of it stays there (issue 32: a full /run left a
// partial spec.<n>.tmp per retry), and every retry fails with the same message.
func TestFailedRenderLeavesNoTemporaryFile(t *testing.T) {
	lib, host := simulatedNode(t, "h200:2")

	s, err := cdi.Generate(quiet, lib, options(t, host))
	require.NoError(t, err)

	tmp := t.TempDir()
	require.NoError(t, unix.Mount("tmpfs", tmp, "tmpfs", 0, "size=4k"))
	t.Cleanup(func() { unix.Unmount(tmp, unix.MNT_DETACH) }) //nolint:errcheck
	t.Setenv("TMPDIR", tmp)

	var msgs []string

	for range 3 {
		_, err := cdi.Render(s)
		require.ErrorIs(t, err, unix.ENOSPC)

		msgs = append(msgs, err.Error())

		entries, err := os.ReadDir(tmp)
		require.NoError(t, err)
		assert.Empty(t, entries, "left in TMPDIR")
	}

	assert.Equal(t, msgs[0], msgs[2], "a retry reads the same")
	assert.Contains(t, msgs[0], "rendering the CDI spec in "+tmp+": write: no space left on device")
}

// TestSweepTemp: what renderings of a killed service left in TMPDIR goes at start; other files
// stay.
func TestSweepTemp(t *testing.T) {
	dir := t.TempDir()

	require.NoError(t, os.MkdirAll(filepath.Join(dir, "nvcdi-render-123/x"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "nvcdi-render-123/spec.456.tmp"), []byte("partial"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "nvcdi-spec-789.yaml"), nil, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "spec.111.tmp"), []byte("partial"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "other"), nil, 0o600))

	require.NoError(t, cdi.SweepTemp(dir))

	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1)
	assert.Equal(t, "other", entries[0].Name())
}

// TestRenderRefusesALinkOnTMPDIR: with a link on TMPDIR's path (the host's /run/nvidia-driver,
// issue 32), rendering is refused naming the link and nothing is written where it points;
// once the link is gone, the next rendering makes TMPDIR and succeeds, without a restart.
func TestRenderRefusesALinkOnTMPDIR(t *testing.T) {
	lib, host := simulatedNode(t, "h200:2")

	s, err := cdi.Generate(quiet, lib, options(t, host))
	require.NoError(t, err)

	root := t.TempDir()
	elsewhere := filepath.Join(root, "elsewhere")
	require.NoError(t, os.Mkdir(elsewhere, 0o755))
	link := filepath.Join(root, "nvidia-driver")
	require.NoError(t, os.Symlink(elsewhere, link))
	t.Setenv("TMPDIR", filepath.Join(link, "tmp"))

	_, err = cdi.Render(s)
	require.ErrorContains(t, err, link+" is a symbolic link")

	entries, err := os.ReadDir(elsewhere)
	require.NoError(t, err)
	assert.Empty(t, entries, "written where the link points")

	require.NoError(t, os.Remove(link))

	data, err := cdi.Render(s)
	require.NoError(t, err)
	assert.Contains(t, string(data), "nvidia.com/gpu")
}
