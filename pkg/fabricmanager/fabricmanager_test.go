package fabricmanager_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/talos-nvidia/nvidia-driver/internal/sim"
	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
	"github.com/talos-nvidia/nvidia-driver/pkg/devnodes"
	"github.com/talos-nvidia/nvidia-driver/pkg/fabricmanager"
	"github.com/talos-nvidia/nvidia-driver/pkg/nvmljobs"
)

var hgx = sim.NVSwitches{Count: 4}

// makeNodes makes the board's device nodes, as ext-nvidia-driver does.
func makeNodes(t *testing.T, b *testutil.HGX) {
	t.Helper()

	_, err := devnodes.Sync(slog.New(slog.DiscardHandler), b.Host)
	require.NoError(t, err)
}

// writtenConfig is the fabricmanager.cfg the service wrote for nv-fabricmanager.
func writtenConfig(t *testing.T, b *testutil.HGX) string {
	t.Helper()

	data, err := os.ReadFile(filepath.Join(b.Host, fabricmanager.RunDir, "fabricmanager.cfg"))
	require.NoError(t, err)

	return string(data)
}

// readStatus is the status file as another service reads it.
func readStatus(t *testing.T, b *testutil.HGX) fabricmanager.Observation {
	t.Helper()

	o := fabricmanager.Observe(b.Host)
	require.NoError(t, o.Err)

	return o
}

// killFabricManager kills the running fake fabric manager with SIGKILL.
func killFabricManager(t *testing.T, b *testutil.HGX) {
	t.Helper()

	pid := b.FabricManagerPID(t)
	require.NotZero(t, pid)
	require.NoError(t, unix.Kill(pid, unix.SIGKILL))
}

// TestNoNVSwitchIdles: a board without NVSwitches (the service runs on every node) is said
// once, in the status file, and the service idles: up, holding its lock, starting nothing.
func TestNoNVSwitchIdles(t *testing.T) {
	b := testutil.NewHGX(t, testutil.HGXOptions{Mode: "ok"})
	fm := b.RunFabricManager(t)

	st := fm.WaitState(t, fabricmanager.StateNoNVSwitch)
	assert.Contains(t, st.Message, "no NVSwitch on this board")

	o := readStatus(t, b)
	assert.True(t, o.Alive, "the service holds its lock while it runs")
	assert.Equal(t, fabricmanager.StateNoNVSwitch, o.Status.State)

	time.Sleep(200 * time.Millisecond)
	assert.Zero(t, b.Starts(t))
	assert.Equal(t, fabricmanager.StateNoNVSwitch, fm.Svc.Status().State)

	fm.Stop()

	o = readStatus(t, b)
	assert.False(t, o.Alive, "the lock goes with the service")
	assert.Equal(t, fabricmanager.StateStopped, o.Status.State)
	assert.Contains(t, o.Explain(), "the ext-nvidia-fabricmanager service is not running")
}

// TestWaitsForWhatItNeeds: without the nvidia module the service waits for it (it never exits
// and stalls nothing); then for the NVSwitch device nodes that ext-nvidia-driver makes; then
// it starts the fabric manager. Each wait is reported once.
func TestWaitsForWhatItNeeds(t *testing.T) {
	b := testutil.NewHGX(t, testutil.HGXOptions{Switches: hgx, Mode: "ok"})
	version := filepath.Join(b.Host, "proc/driver/nvidia/version")
	require.NoError(t, os.Rename(version, version+".away"))

	fm := b.RunFabricManager(t)
	st := fm.WaitState(t, fabricmanager.StateWaiting)
	assert.Contains(t, st.Message, "waiting for the nvidia kernel module")

	time.Sleep(100 * time.Millisecond)
	assert.Equal(t, fabricmanager.StateWaiting, fm.Svc.Status().State)
	require.NoError(t, os.Rename(version+".away", version))

	require.Eventually(t, func() bool {
		return fm.Svc.Status().State == fabricmanager.StateWaiting && fm.Svc.Status().Message != st.Message
	}, 5*time.Second, 5*time.Millisecond)
	assert.Contains(t, fm.Svc.Status().Message, "waiting for the NVSwitch device nodes (ext-nvidia-driver makes them): missing /dev/nvidiactl, /dev/nvidia-nvswitchctl")
	assert.Zero(t, b.Starts(t))

	makeNodes(t, b)
	st = fm.WaitState(t, fabricmanager.StateRunning)
	assert.Equal(t, 1, b.Starts(t))
	assert.Contains(t, st.Message, "HGX H100 and later: not started again if it dies")
	assert.Equal(t, 1, strings.Count(fm.Logs.String(), "waiting for the nvidia kernel module"), "one line per wait")
}

// TestHopperFabricManagerIsNotRestarted: on an HGX H100/H200 board a fabric manager that dies
// is not started again (NVIDIA requires the GPU reset procedure): the status says so and what
// to do, and the service stays up. The config keeps NVIDIA's ABORT_CUDA_JOBS_ON_FM_EXIT.
func TestHopperFabricManagerIsNotRestarted(t *testing.T) {
	b := testutil.NewHGX(t, testutil.HGXOptions{Switches: hgx, Mode: "ok"})
	makeNodes(t, b)
	fm := b.RunFabricManager(t)
	fm.WaitState(t, fabricmanager.StateRunning)

	cfg := writtenConfig(t, b)
	assert.Contains(t, cfg, "\nDAEMONIZE=0\n")
	assert.Contains(t, cfg, "\nABORT_CUDA_JOBS_ON_FM_EXIT=1\n")
	assert.True(t, readStatus(t, b).Running())

	killFabricManager(t, b)
	st := fm.WaitState(t, fabricmanager.StateNotRunning)
	assert.Contains(t, st.Message, "not started again")
	assert.Contains(t, st.Action, "nvidia-smi -r")
	assert.Contains(t, st.Action, "talosctl service ext-nvidia-fabricmanager restart")

	time.Sleep(700 * time.Millisecond) // past the supervisor's restart delay
	assert.Equal(t, 1, b.Starts(t))
	assert.Zero(t, b.FabricManagerPID(t))

	o := readStatus(t, b)
	assert.True(t, o.Alive)
	assert.False(t, o.Running())
	assert.Contains(t, o.Explain(), "to fix: stop every CUDA application")
}

// TestHopperRestartOfTheServiceStartsNoFabricManager: the GPUs registered by the fabric
// manager of an earlier run of the service stay registered; a new run (Talos restarted the
// service) starts none, since that needs a GPU reset first, and says so.
func TestHopperRestartOfTheServiceStartsNoFabricManager(t *testing.T) {
	b := testutil.NewHGX(t, testutil.HGXOptions{Switches: hgx, Mode: "ok", RegisterAfter: 10 * time.Millisecond})
	makeNodes(t, b)

	first := b.RunFabricManager(t)
	first.WaitState(t, fabricmanager.StateRunning)
	jobs := &nvmljobs.Local{Log: slog.New(slog.DiscardHandler), NVML: b.GPUs}
	require.Eventually(t, func() bool {
		states, err := jobs.FabricStates(context.Background())
		if err != nil || len(states) != 8 {
			return false
		}

		for _, s := range states {
			if !s.Registered() {
				return false
			}
		}

		return true
	}, 5*time.Second, 10*time.Millisecond)
	first.Stop()
	assert.Zero(t, b.FabricManagerPID(t), "the fabric manager stops with its service")

	second := b.RunFabricManager(t)
	st := second.WaitState(t, fabricmanager.StateNotRunning)
	assert.Contains(t, st.Message, "the 8 GPU(s) are registered with the NVLink fabric already")
	assert.Contains(t, st.Action, "reset the GPUs")
	time.Sleep(200 * time.Millisecond)
	assert.Equal(t, 1, b.Starts(t))
}

// TestA100FabricManagerIsRestarted: on an HGX A100 board (NVSwitch gen 2) the config has
// ABORT_CUDA_JOBS_ON_FM_EXIT=0, so an exit spares the CUDA jobs, and a fabric manager that dies
// is started again.
func TestA100FabricManagerIsRestarted(t *testing.T) {
	b := testutil.NewHGX(t, testutil.HGXOptions{Switches: hgx, PreHopper: true, Mode: "ok"})
	makeNodes(t, b)
	fm := b.RunFabricManager(t)
	st := fm.WaitState(t, fabricmanager.StateRunning)
	assert.Equal(t, "ampere", st.Board.Arch)
	assert.Contains(t, st.Message, "ABORT_CUDA_JOBS_ON_FM_EXIT=0")
	assert.Contains(t, writtenConfig(t, b), "\nABORT_CUDA_JOBS_ON_FM_EXIT=0\n")

	killFabricManager(t, b)
	require.Eventually(t, func() bool {
		st := fm.Svc.Status()
		return st.State == fabricmanager.StateRunning && st.Restarts == 1
	}, 10*time.Second, 5*time.Millisecond, "%s", fm.Logs)
	assert.Eventually(t, func() bool { return b.Starts(t) == 2 }, 5*time.Second, 10*time.Millisecond)
}

// TestFabricManagerCannotRun: where no fabric manager of ours can do its job the status says
// why, once, and the service idles: nothing is started again and again.
func TestFabricManagerCannotRun(t *testing.T) {
	for _, tc := range []struct {
		name   string
		opts   testutil.HGXOptions
		state  string
		want   string
		action string
		starts int
	}{
		{"GPUs passed through to a VM: NV_WARN_NOTHING_TO_DO", testutil.HGXOptions{Switches: hgx, Mode: "nothing-to-do"},
			fabricmanager.StateNotRunning, "NV_WARN_NOTHING_TO_DO", "", 1},
		{"switches the nvidia-nvswitch driver does not manage", testutil.HGXOptions{Switches: sim.NVSwitches{Count: 4, Unmanaged: true}, Mode: "ok"},
			fabricmanager.StateNotRunning, "the nvidia-nvswitch driver initialized none of them", "", 0},
		{"no nv-fabricmanager in the subroot", testutil.HGXOptions{Switches: hgx, NoBinary: true},
			fabricmanager.StateNotRunning, "does not carry the fabric manager", "fabric manager archive", 0},
		{"a foreign fabric manager runs", testutil.HGXOptions{Switches: hgx, Mode: "ok", ForeignAPI: true},
			fabricmanager.StateForeign, "leaving it alone", "", 0},
		{"a fabric manager that never gets ready", testutil.HGXOptions{Switches: hgx, Mode: "fail"},
			fabricmanager.StateNotRunning, "giving up after 3 failed starts", "talosctl logs ext-nvidia-fabricmanager", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := testutil.NewHGX(t, tc.opts)
			makeNodes(t, b)
			fm := b.RunFabricManager(t)

			st := fm.WaitState(t, tc.state)
			t.Logf("status: %s: %s", st.State, st.Message)
			assert.Contains(t, st.Message, tc.want)
			assert.Contains(t, st.Action, tc.action)

			time.Sleep(500 * time.Millisecond)
			assert.Equal(t, tc.starts, b.Starts(t))
			assert.Equal(t, tc.state, fm.Svc.Status().State)
			assert.True(t, readStatus(t, b).Alive, "the service is still up")
		})
	}
}

// TestStopStopsTheFabricManager: SIGTERM to the service (Talos stops the container's init only,
// runc 1.4) stops its fabric manager within the grace, and the status says stopped.
func TestStopStopsTheFabricManager(t *testing.T) {
	b := testutil.NewHGX(t, testutil.HGXOptions{Switches: hgx, Mode: "ok"})
	makeNodes(t, b)
	fm := b.RunFabricManager(t)
	fm.WaitState(t, fabricmanager.StateRunning)
	require.NotZero(t, b.FabricManagerPID(t))

	begin := time.Now()
	fm.Stop()
	assert.Less(t, time.Since(begin), 6*time.Second)
	assert.Zero(t, b.FabricManagerPID(t))
	assert.Equal(t, fabricmanager.StateStopped, readStatus(t, b).Status.State)
}
