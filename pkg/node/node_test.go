package node_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/talos-nvidia/nvidia-driver/internal/sim"
	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
	"github.com/talos-nvidia/nvidia-driver/pkg/config"
	"github.com/talos-nvidia/nvidia-driver/pkg/devnodes"
	"github.com/talos-nvidia/nvidia-driver/pkg/mig"
	"github.com/talos-nvidia/nvidia-driver/pkg/node"
	"github.com/talos-nvidia/nvidia-driver/pkg/nvmljobs"
)

// start runs a runner on simulated GPUs under a throwaway host root until it reports one of
// the phases, and returns its status and log. CDI and persistenced are off: these tests are
// about the order and the MIG job.
func start(t *testing.T, gpus *sim.Node, migFile string, env ...string) (node.Status, string) {
	t.Helper()

	st, logs, _ := startWith(t, gpus, migFile, nil, env...)

	return st, logs
}

// startWith is start with the runner's jobs made by jobs from the in-process ones (nil: those
// themselves); it also returns the host root.
func startWith(t *testing.T, gpus *sim.Node, migFile string, jobs func(*nvmljobs.Local) nvmljobs.Jobs, env ...string) (node.Status, string, string) {
	t.Helper()
	testutil.RequireRoot(t)

	host := t.TempDir()
	target := filepath.Join(host, "run/nvidia/driver")
	t.Cleanup(func() { unix.Unmount(target, unix.MNT_DETACH) }) //nolint:errcheck

	cfgFile := filepath.Join(t.TempDir(), "mig.yaml")
	require.NoError(t, os.WriteFile(cfgFile, []byte(migFile), 0o644))

	cfg, err := config.Load(append([]string{
		"NVIDIA_DRIVER_HOST_ROOT=" + host, "NVIDIA_DRIVER_SUBROOT=" + testutil.Subroot(t),
		"NVIDIA_DRIVER_PERSISTENCED=false", "NVIDIA_DRIVER_CDI=false", "NVIDIA_DRIVER_MIG_CONFIG=" + cfgFile,
		"NVIDIA_DRIVER_CONFIG=" + writeVersionOnly(t),
	}, env...))
	require.NoError(t, err)

	writeProc := func() error {
		if ret := gpus.Init(); ret != nvml.SUCCESS {
			return ret
		}
		defer gpus.Shutdown() //nolint:errcheck

		return sim.WriteProcFS(host, gpus)
	}
	require.NoError(t, writeProc())

	var logs strings.Builder

	log := slog.New(slog.NewTextHandler(&logs, nil))
	local := &nvmljobs.Local{Log: log, NVML: gpus, Resetter: gpus, AfterMIGChange: writeProc}

	var run nvmljobs.Jobs = local
	if jobs != nil {
		run = jobs(local)
	}

	r := node.New(log, cfg, run, node.WithBackoff(node.Backoff{Initial: 10 * time.Millisecond, Max: 20 * time.Millisecond}))
	st, out := runUntilSettled(t, r, &logs, 10*time.Second, 0)

	return st, out, host
}

// runUntilSettled runs r until it is ready, degraded or failed (at most within), holds it for hold more
// (a retry loop would show as more calls and log lines), stops it and returns its status and
// log.
func runUntilSettled(t *testing.T, r *node.Runner, logs fmt.Stringer, within, hold time.Duration) (node.Status, string) {
	t.Helper()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- r.Run(ctx) }()

	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if p := r.Status().Phase; p == node.PhaseReady || p == node.PhaseDegraded || p == node.PhaseFailed {
			break
		}
	}

	time.Sleep(hold)

	st := r.Status()

	cancel()
	require.NoError(t, <-done)

	return st, logs.String()
}

func writeVersionOnly(t *testing.T) string {
	p := filepath.Join(t.TempDir(), "config.yaml")
	require.NoError(t, os.WriteFile(p, []byte("version: v1alpha1\n"), 0o644))

	return p
}

const h100Layout = `version: v1
mig-configs:
  split:
    - devices: all
      mig-enabled: true
      mig-devices: {"3g.40gb": 1, "4g.40gb": 1}
  too-big:
    - devices: all
      mig-enabled: true
      mig-devices: {"7g.80gb": 2}
`

// TestMIGFailureIsRetriedAndConverges: a GPU instance creation fails once; the GPU is rolled
// back, the runner waits and tries again, and the node comes up with the layout.
func TestMIGFailureIsRetriedAndConverges(t *testing.T) {
	gpus := sim.New(testutil.Model(t, "h100-80gb"), 2)
	gpus.InjectFault(sim.Fault{Method: sim.MCreateGpuInstanceWithPlacement, GPU: 1, Nth: 1, Times: 1, Ret: nvml.ERROR_INSUFFICIENT_RESOURCES})

	st, logs := start(t, gpus, h100Layout, "NVIDIA_DRIVER_MIG_LAYOUT=split")

	require.Equal(t, node.PhaseReady, st.Phase, logs)
	assert.Contains(t, st.Message, `MIG layout "split": success`)
	assert.Contains(t, logs, "waiting for MIG layout", "the failed try is reported")
	require.Len(t, st.MIG, 2)

	for _, res := range st.MIG {
		assert.Equal(t, mig.ResultSuccess, res.Result)
	}

	assert.Greater(t, st.DeviceNodes, 4, "MIG capability nodes were created after the change")
}

// TestMIGLayoutThatDoesNotFitFailsAtOnce: planning fails before anything changes, and
// trying again cannot help: the runner reports it once, changes no GPU and serves the GPUs
// as they are.
func TestMIGLayoutThatDoesNotFitFailsAtOnce(t *testing.T) {
	gpus := sim.New(testutil.Model(t, "h100-80gb"), 1)

	st, logs := start(t, gpus, h100Layout, "NVIDIA_DRIVER_MIG_LAYOUT=too-big")

	require.Equal(t, node.PhaseDegraded, st.Phase, logs)
	assert.Contains(t, st.Message, `MIG layout "too-big"`)
	assert.NotContains(t, logs, "waiting for MIG layout")
	assert.Zero(t, gpus.MutatingCalls(), "no GPU was touched")
}

// diesAfterChange stands for the nvml-job child of a MIG change that dies once it changed the
// GPUs and the driver updated /proc, before it made the new device nodes (a crash in
// libnvidia-ml, an OOM kill): the service heard "changing" and then got no answer, as
// nvmljobs.Child reports it. The change itself is the in-process job's, on the simulated GPUs.
type diesAfterChange struct {
	*nvmljobs.Local
	deaths int
}

func (d *diesAfterChange) ApplyMIG(ctx context.Context, req nvmljobs.MIGRequest, changing func()) (nvmljobs.MIGResult, error) {
	if d.deaths == 0 {
		return d.Local.ApplyMIG(ctx, req, changing)
	}

	d.deaths--

	errDied := errors.New("died")
	dying := *d.Local
	dying.AfterMIGChange = func() error {
		if err := d.Local.AfterMIGChange(); err != nil {
			return err
		}

		return errDied
	}

	if _, err := dying.ApplyMIG(ctx, req, changing); err != nil {
		return nvmljobs.MIGResult{}, err
	}

	return nvmljobs.MIGResult{}, errors.New("NVML job apply-mig: the child process gave no answer: signal: killed")
}

// TestMIGJobThatDiedAfterTheChangeLeavesNoDeviceNodeMissing: the job dies after the GPU
// changed; the next try finds the GPU in the layout and changes nothing, so no job makes the
// MIG instances' device nodes: the service makes them itself, and counts them in the status.
func TestMIGJobThatDiedAfterTheChangeLeavesNoDeviceNodeMissing(t *testing.T) {
	gpus := sim.New(testutil.Model(t, "h100-80gb"), 1)

	st, logs, host := startWith(t, gpus, h100Layout, func(l *nvmljobs.Local) nvmljobs.Jobs {
		return &diesAfterChange{Local: l, deaths: 1}
	}, "NVIDIA_DRIVER_MIG_LAYOUT=split")

	require.Equal(t, node.PhaseReady, st.Phase, logs)
	assert.Contains(t, logs, "the child process gave no answer", "the dead job is reported")
	require.Len(t, st.MIG, 1)
	assert.Contains(t, st.MIG[0].Message, "already in layout", "the second try changed nothing")

	now, err := devnodes.Sync(slog.New(slog.DiscardHandler), host)
	require.NoError(t, err)
	assert.Empty(t, now.Created, "device nodes the driver offers were missing after bring-up")
	assert.Equal(t, len(now.Nodes), st.DeviceNodes, "the status counts the device nodes there are")
}

// TestDeviceNodeErrorIsRetried: /proc/devices lists no nvidia device yet while the driver's
// version file is there (the module is still loading); the runner reports the wait once and
// comes up when /proc is right, without a restart.
func TestDeviceNodeErrorIsRetried(t *testing.T) {
	testutil.RequireRoot(t)

	gpus := sim.New(testutil.Model(t, "h100-80gb"), 1)
	host := t.TempDir()
	writeSimHost(t, host, gpus)

	devices := filepath.Join(host, "proc/devices")
	good, err := os.ReadFile(devices)
	require.NoError(t, err)
	require.NoError(t, os.Remove(devices))
	require.NoError(t, os.WriteFile(devices, []byte("Character devices:\n  1 mem\n\nBlock devices:\n  8 sd\n"), 0o444))

	logs := &testutil.SyncBuffer{}
	r := simRunner(t, host, testutil.Subroot(t), gpus, logs)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- r.Run(ctx) }()

	defer func() { cancel(); require.NoError(t, <-done) }()

	waitFor := func(what string, cond func(node.Status) bool) node.Status {
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if st := r.Status(); cond(st) {
				return st
			}

			time.Sleep(2 * time.Millisecond)
		}

		t.Fatalf("%s not reached: %+v\n%s", what, r.Status(), logs)

		return node.Status{}
	}

	st := waitFor("the wait for device nodes", func(st node.Status) bool {
		return st.Phase != "" && st.Phase != node.PhaseStarting && (st.Phase != node.PhaseWaiting || strings.Contains(st.Message, "device nodes"))
	})
	require.Equal(t, node.PhaseWaiting, st.Phase, st.Message)
	assert.Contains(t, st.Message, "waiting for the NVIDIA device nodes")
	assert.Contains(t, st.Message, "lists no nvidia character device")

	time.Sleep(100 * time.Millisecond) // some twenty retries
	// Renamed into place: the runner never sees the file missing.
	require.NoError(t, os.WriteFile(devices+".new", good, 0o444))
	require.NoError(t, os.Rename(devices+".new", devices))

	waitFor("ready", func(st node.Status) bool { return st.Phase == node.PhaseReady })
	assert.Equal(t, 1, strings.Count(logs.String(), "waiting for the NVIDIA device nodes"), "the wait is reported once:\n%s", logs)
	assert.FileExists(t, filepath.Join(host, "dev/nvidia0"))
}

// writeSimHost writes under host the /proc and /sys files of a loaded driver with the
// simulated GPUs, and unmounts the driver root the runner makes there at the end.
func writeSimHost(t *testing.T, host string, gpus *sim.Node) {
	t.Helper()

	target := filepath.Join(host, "run/nvidia/driver")
	t.Cleanup(func() {
		unix.Unmount(filepath.Join(target, "dev"), unix.MNT_DETACH) //nolint:errcheck
		unix.Unmount(target, unix.MNT_DETACH)                       //nolint:errcheck
	})

	require.Equal(t, nvml.SUCCESS, gpus.Init())
	require.NoError(t, sim.WriteProcFS(host, gpus))
	require.Equal(t, nvml.SUCCESS, gpus.Shutdown())
}

// simRunner is a runner on the simulated GPUs under host, CDI off, persistenced on only if
// env says so, that polls fast.
func simRunner(t *testing.T, host, subroot string, gpus *sim.Node, logs *testutil.SyncBuffer, opts ...node.Option) *node.Runner {
	t.Helper()

	return simRunnerEnv(t, host, subroot, gpus, logs, nil, opts...)
}

// simRunnerEnv is simRunner with more of the service's environment (env).
func simRunnerEnv(t *testing.T, host, subroot string, gpus *sim.Node, logs *testutil.SyncBuffer, env []string, opts ...node.Option) *node.Runner {
	t.Helper()

	persistenced := "false"
	if len(opts) > 0 {
		persistenced = "true" // the daemon options are given
	}

	cfg, err := config.Load(append([]string{
		"NVIDIA_DRIVER_HOST_ROOT=" + host, "NVIDIA_DRIVER_SUBROOT=" + subroot,
		"NVIDIA_DRIVER_PERSISTENCED=" + persistenced, "NVIDIA_DRIVER_CDI=false", "NVIDIA_DRIVER_CONFIG=" + writeVersionOnly(t),
	}, env...))
	require.NoError(t, err)

	log := slog.New(slog.NewTextHandler(logs, nil))

	return node.New(log, cfg, &nvmljobs.Local{Log: log, NVML: gpus, Resetter: gpus},
		append([]node.Option{node.WithBackoff(node.Backoff{Initial: 5 * time.Millisecond, Max: 10 * time.Millisecond})}, opts...)...)
}

// TestGPUsTheModuleCannotDriveNameTheFlavor: NVML sees no GPU, while the PCI bus has an
// NVIDIA GPU with no driver bound and the module lists none: the loaded flavor refused it.
// The node fails with the flavor to install, instead of waiting without a word.
func TestGPUsTheModuleCannotDriveNameTheFlavor(t *testing.T) {
	for _, tc := range []struct {
		name, version, install string
	}{
		{"proprietary module, Blackwell GPU", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue Sep 23 09:11:00 UTC 2025",
			"open flavor, nvidia-driver-lts-open or nvidia-driver-production-open"},
		{"open module, Volta GPU", "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build",
			"proprietary flavor, nvidia-driver-lts or nvidia-driver-production"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testutil.RequireRoot(t)

			gpus := sim.New(testutil.Model(t, "h100-80gb"), 0)
			host := t.TempDir()
			writeSimHost(t, host, gpus)
			write := func(rel, content string) {
				p := filepath.Join(host, rel)
				require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
				require.NoError(t, os.WriteFile(p, []byte(content+"\n"), 0o644))
			}

			write("proc/driver/nvidia/version", tc.version)
			write("sys/bus/pci/devices/0000:17:00.0/vendor", "0x10de")
			write("sys/bus/pci/devices/0000:17:00.0/device", "0x2901")
			write("sys/bus/pci/devices/0000:17:00.0/class", "0x030200")

			logs := &testutil.SyncBuffer{}
			st, _ := runUntilSettled(t, simRunner(t, host, testutil.Subroot(t), gpus, logs), &strings.Builder{}, 10*time.Second, 0)

			require.Equal(t, node.PhaseFailed, st.Phase, "%s\n%s", st.Message, logs)
			assert.Contains(t, st.Message, "drives none of the 1 NVIDIA GPU(s) on the PCI bus (0000:17:00.0 (10de:2901)")
			assert.Contains(t, st.Message, "Install the extension's "+tc.install)
			assert.Contains(t, st.Message, tc.version)
		})
	}
}

// TestSymlinkInPlaceOfValidationsIsRefused: a link planted in place of the readiness
// directory is not followed: the node waits, retrying the readiness files and naming the
// link, and nothing is written where it points.
func TestSymlinkInPlaceOfValidationsIsRefused(t *testing.T) {
	testutil.RequireRoot(t)

	gpus := sim.New(testutil.Model(t, "h100-80gb"), 1)
	host := t.TempDir()
	writeSimHost(t, host, gpus)

	elsewhere := filepath.Join(host, "etc/elsewhere")
	require.NoError(t, os.MkdirAll(elsewhere, 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(host, "run/nvidia"), 0o755))
	link := filepath.Join(host, "run/nvidia/validations")
	require.NoError(t, os.Symlink(elsewhere, link))

	logs := &testutil.SyncBuffer{}
	n := runNode(t, simRunner(t, host, testutil.Subroot(t), gpus, logs), logs)

	st := n.retrying("the readiness files")
	assert.Contains(t, st.Message, "refusing to write into "+link+": it is a symbolic link")
	time.Sleep(50 * time.Millisecond) // some retries

	entries, err := os.ReadDir(elsewhere)
	require.NoError(t, err)
	assert.Empty(t, entries, "nothing written through the link")
}
