package node_test

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
	"github.com/talos-nvidia/nvidia-driver/pkg/config"
	"github.com/talos-nvidia/nvidia-driver/pkg/fabricmanager"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu"
	"github.com/talos-nvidia/nvidia-driver/pkg/node"
	"github.com/talos-nvidia/nvidia-driver/pkg/nvmljobs"
)

// board is a simulated HGX board (testutil.HGX) for the runner.
type board struct{ *testutil.HGX }

func newBoard(t *testing.T, o testutil.HGXOptions) *board {
	t.Helper()

	return &board{testutil.NewHGX(t, o)}
}

// running is a runner on the board, with the phases and messages it went through.
type running struct {
	r      *node.Runner
	logs   *testutil.SyncBuffer
	phases []string
	stop   func()
}

func (b *board) run(t *testing.T, env ...string) *running {
	t.Helper()

	target := filepath.Join(b.Host, "run/nvidia/driver")
	t.Cleanup(func() { unix.Unmount(target, unix.MNT_DETACH) }) //nolint:errcheck

	cfg, err := config.Load(append([]string{
		"NVIDIA_DRIVER_HOST_ROOT=" + b.Host, "NVIDIA_DRIVER_SUBROOT=" + b.Subroot,
		"NVIDIA_DRIVER_PERSISTENCED=false", "NVIDIA_DRIVER_CDI=false", "NVIDIA_DRIVER_CONFIG=" + writeVersionOnly(t),
		"NVIDIA_DRIVER_FABRIC_WAIT=5s",
	}, env...))
	require.NoError(t, err)

	run := &running{logs: &testutil.SyncBuffer{}}
	log := slog.New(slog.NewTextHandler(run.logs, nil))
	run.r = node.New(log, cfg, &nvmljobs.Local{Log: log, NVML: b.GPUs, Resetter: b.GPUs}, node.WithBackoff(node.Backoff{Initial: 20 * time.Millisecond, Max: 50 * time.Millisecond}))

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- run.r.Run(ctx) }()

	var stopped bool

	run.stop = func() {
		if stopped {
			return
		}

		stopped = true

		cancel()
		require.NoError(t, <-done)
	}
	t.Cleanup(run.stop)

	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		st := run.r.Status()
		if p := st.Phase + ": " + st.Message; len(run.phases) == 0 || run.phases[len(run.phases)-1] != p {
			run.phases = append(run.phases, p)
		}

		if st.Phase == node.PhaseReady || st.Phase == node.PhaseDegraded || st.Phase == node.PhaseFailed {
			return run
		}

		time.Sleep(2 * time.Millisecond)
	}

	t.Fatalf("the node came neither ready nor degraded: %v\n%s", run.phases, run.logs)

	return nil
}

// TestFabricManagerOnNVSwitchBoard: on an HGX board the service makes the switches' device
// nodes, which the ext-nvidia-fabricmanager service waits for, shows that service's socket
// under the driver root, and reports ready only after NVML says every GPU registered with the
// fabric while a fabric manager runs.
func TestFabricManagerOnNVSwitchBoard(t *testing.T) {
	b := newBoard(t, testutil.HGXOptions{Switches: sim.NVSwitches{Count: 4}, Mode: "ok"})
	fm := b.RunFabricManager(t)
	run := b.run(t)
	st := run.r.Status()

	require.Equal(t, node.PhaseReady, st.Phase, "%v\n%s\n%s", run.phases, run.logs, fm.Logs)
	assert.Contains(t, st.Message, "NVLink fabric: 8 GPU(s) registered with the NVLink fabric by nv-fabricmanager")
	require.NotNil(t, st.Fabric)
	assert.Equal(t, node.FabricRegistered, st.Fabric.State)
	assert.Equal(t, fabricmanager.StateRunning, st.Fabric.Manager)
	assert.Len(t, st.Fabric.Board.Driver, 4)
	assert.Equal(t, "hopper", st.Fabric.Board.Arch)
	require.Len(t, st.Fabric.GPUs, 8)

	for _, g := range st.Fabric.GPUs {
		assert.Equal(t, gpu.FabricCompleted, g.State)
	}

	// Ready came only after a wait for the registration.
	waited := false

	for _, p := range run.phases {
		waited = waited || strings.HasPrefix(p, "waiting: waiting for the NVLink fabric: fabric registration: GPU 0,1,2,3,4,5,6,7 in-progress")
	}

	assert.True(t, waited, "phases: %v", run.phases)

	// The fabric manager's socket shows under the driver root, where CDI specs mount it from.
	assert.FileExists(t, filepath.Join(b.Host, "dev/nvidia-nvswitchctl"))
	assert.FileExists(t, filepath.Join(b.Host, "run/nvidia/driver/run/nvidia-fabricmanager/socket"))
	assert.NotContains(t, run.logs.String(), "daemon=nv-fabricmanager", "this service runs no fabric manager")
}

// TestRestartOfTheServiceKeepsTheFabricManager: a stop and start of the nvidia-driver service
// (every document change) leaves the fabric manager running, and the new run is ready.
func TestRestartOfTheServiceKeepsTheFabricManager(t *testing.T) {
	b := newBoard(t, testutil.HGXOptions{Switches: sim.NVSwitches{Count: 4}, Mode: "ok"})
	fm := b.RunFabricManager(t)

	first := b.run(t)
	require.Equal(t, node.PhaseReady, first.r.Status().Phase, "%v\n%s", first.phases, first.logs)

	pid := b.FabricManagerPID(t)
	require.NotZero(t, pid)
	first.stop()

	for range 3 {
		again := b.run(t)
		require.Equal(t, node.PhaseReady, again.r.Status().Phase, "%v\n%s", again.phases, again.logs)
		again.stop()
	}

	assert.Equal(t, pid, b.FabricManagerPID(t), "the same fabric manager runs")
	assert.Equal(t, 1, b.Starts(t))
	assert.Equal(t, fabricmanager.StateRunning, fm.Svc.Status().State)
}

// TestFabricManagerDiesOnHopper: once up, the node follows the fabric manager's service: when
// the fabric manager dies (and, on HGX H100 and later, is not started again), the node turns
// degraded, with the reason and what to do, in its status; the readiness file, which lists
// the devices, stays as it was.
func TestFabricManagerDiesOnHopper(t *testing.T) {
	b := newBoard(t, testutil.HGXOptions{Switches: sim.NVSwitches{Count: 4}, Mode: "ok"})
	b.RunFabricManager(t)

	run := b.run(t)
	require.Equal(t, node.PhaseReady, run.r.Status().Phase, "%v\n%s", run.phases, run.logs)

	pid := b.FabricManagerPID(t)
	require.NotZero(t, pid)
	require.NoError(t, unix.Kill(pid, unix.SIGKILL))

	require.Eventually(t, func() bool {
		st := run.r.Status()
		return st.Phase == node.PhaseDegraded && st.Fabric.Manager == fabricmanager.StateNotRunning
	}, 10*time.Second, 10*time.Millisecond, "%s", run.logs)

	st := run.r.Status()
	assert.Contains(t, st.Message, "8 GPU(s) registered with the NVLink fabric, but no fabric manager runs (ext-nvidia-fabricmanager not-running)")
	assert.Contains(t, st.Message, "not started again")
	assert.Contains(t, st.Message, "to fix: stop every CUDA application")
	assert.Equal(t, fabricmanager.StateNotRunning, st.Fabric.Manager)

	// The devices are the same: the readiness file says nothing of the fabric.
	summary, err := os.ReadFile(filepath.Join(b.Host, "run/nvidia/validations/nvidia-driver.ready"))
	require.NoError(t, err)
	assert.NotContains(t, string(summary), "fabric")
}

// TestFabricManagerCannotRun: where no fabric manager runs the node is served and degraded,
// and the status says why. A foreign fabric manager counts as one.
func TestFabricManagerCannotRun(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opts    testutil.HGXOptions
		noFM    bool // the ext-nvidia-fabricmanager service does not run
		phase   string
		want    string
		manager string
	}{
		{"GPUs passed through to a VM: NV_WARN_NOTHING_TO_DO", testutil.HGXOptions{Switches: sim.NVSwitches{Count: 4}, Mode: "nothing-to-do"}, false,
			node.PhaseDegraded, "NV_WARN_NOTHING_TO_DO", fabricmanager.StateNotRunning},
		{"switches the nvidia-nvswitch driver does not manage", testutil.HGXOptions{Switches: sim.NVSwitches{Count: 4, Unmanaged: true}, Mode: "ok"}, false,
			node.PhaseDegraded, "the nvidia-nvswitch driver initialized none of them", fabricmanager.StateNotRunning},
		{"no nv-fabricmanager in the subroot", testutil.HGXOptions{Switches: sim.NVSwitches{Count: 4}, NoBinary: true}, false,
			node.PhaseDegraded, "does not carry the fabric manager", fabricmanager.StateNotRunning},
		{"a foreign fabric manager runs", testutil.HGXOptions{Switches: sim.NVSwitches{Count: 4}, Mode: "ok", ForeignAPI: true}, false,
			node.PhaseReady, "registered with the NVLink fabric by a fabric manager that ext-nvidia-fabricmanager did not start", fabricmanager.StateForeign},
		{"registered, and the fabric manager service is not running", testutil.HGXOptions{Switches: sim.NVSwitches{Count: 4}, Mode: "ok", Registered: true}, true,
			node.PhaseDegraded, "the ext-nvidia-fabricmanager service is not running", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBoard(t, tc.opts)
			if !tc.noFM {
				b.RunFabricManager(t)
			}

			run := b.run(t, "NVIDIA_DRIVER_FABRIC_WAIT=1s")
			st := run.r.Status()

			require.Equal(t, tc.phase, st.Phase, "%v\n%s", run.phases, run.logs)
			t.Logf("status: %s: %s", st.Phase, st.Message)
			assert.Contains(t, st.Message, tc.want)
			require.NotNil(t, st.Fabric)
			assert.Contains(t, st.Fabric.Message, tc.want)
			assert.Equal(t, tc.manager, st.Fabric.Manager)

			// The GPUs are served: listed, with their device nodes and the readiness file.
			assert.Len(t, st.GPUs, 8)
			assert.FileExists(t, filepath.Join(b.Host, "dev/nvidia7"))
			assert.FileExists(t, filepath.Join(b.Host, "run/nvidia/validations/.driver-ctr-ready"))
		})
	}
}

// TestNoNVSwitchNoFabricManager: a node without NVSwitches starts no fabric manager and its
// status has no fabric.
func TestNoNVSwitchNoFabricManager(t *testing.T) {
	b := newBoard(t, testutil.HGXOptions{Mode: "ok"})
	fm := b.RunFabricManager(t)
	run := b.run(t)
	st := run.r.Status()

	require.Equal(t, node.PhaseReady, st.Phase, "%v\n%s", run.phases, run.logs)
	assert.Nil(t, st.Fabric)
	assert.NotContains(t, st.Message, "fabric")
	fm.WaitState(t, fabricmanager.StateNoNVSwitch)
	assert.Zero(t, b.Starts(t))
	assert.NoFileExists(t, filepath.Join(b.Host, "dev/nvidia-nvswitchctl"))
}

// TestFabricCompletesAfterTheWait: a fabric slower than the bounded wait leaves the node
// degraded, saying which GPUs are still registering; the service keeps watching and reports
// the node ready once they have registered, with the readiness file as it was (the same
// devices).
func TestFabricCompletesAfterTheWait(t *testing.T) {
	b := newBoard(t, testutil.HGXOptions{Switches: sim.NVSwitches{Count: 4}, Mode: "ok", RegisterAfter: 1500 * time.Millisecond})
	b.RunFabricManager(t)
	run := b.run(t, "NVIDIA_DRIVER_FABRIC_WAIT=300ms")
	st := run.r.Status()

	require.Equal(t, node.PhaseDegraded, st.Phase, "%v\n%s", run.phases, run.logs)
	assert.Contains(t, st.Message, "GPU 0,1,2,3,4,5,6,7 in-progress after 300ms")

	ready := filepath.Join(b.Host, "run/nvidia/validations/nvidia-driver.ready")
	summary, err := os.ReadFile(ready)
	require.NoError(t, err)

	deadline := time.Now().Add(10 * time.Second)
	for run.r.Status().Phase != node.PhaseReady {
		require.True(t, time.Now().Before(deadline), "never ready: %s\n%s", run.r.Status().Message, run.logs)
		time.Sleep(10 * time.Millisecond)
	}

	st = run.r.Status()
	assert.Contains(t, st.Message, "NVLink fabric: 8 GPU(s) registered")
	assert.Equal(t, node.FabricRegistered, st.Fabric.State)

	// The same devices: the readiness file's bytes are as they were, so the device plugin
	// is not restarted for the fabric.
	again, err := os.ReadFile(ready)
	require.NoError(t, err)
	assert.Equal(t, string(summary), string(again))
	assert.Equal(t, 1, b.Starts(t))
}

// TestLinkAtFabricManagerRunDirIsRetriedUntilReplaced: the fabric manager's run directory on
// the host is a link. Both services refuse it, nothing is made where it points, and each
// waits, its status naming the link, until it is replaced by a directory: then the fabric
// manager runs, its socket shows under the driver root and the node is ready, without a
// restart (issue 50).
func TestLinkAtFabricManagerRunDirIsRetriedUntilReplaced(t *testing.T) {
	b := newBoard(t, testutil.HGXOptions{Switches: sim.NVSwitches{Count: 4}, Mode: "ok"})

	elsewhere := filepath.Join(b.Host, "etc/elsewhere")
	require.NoError(t, os.MkdirAll(elsewhere, 0o755))
	link := filepath.Join(b.Host, fabricmanager.RunDir)
	require.NoError(t, os.MkdirAll(filepath.Dir(link), 0o755))
	require.NoError(t, os.Symlink(elsewhere, link))

	fm := b.RunFabricManager(t)
	st := fm.WaitState(t, fabricmanager.StateWaiting)
	assert.Contains(t, st.Message, link+" is a symbolic link")

	replaced := make(chan struct{})

	go func() {
		defer close(replaced)

		time.Sleep(300 * time.Millisecond) // the node's bring-up meets the link too

		assert.NoError(t, os.Remove(link))
		assert.NoError(t, os.MkdirAll(link, 0o755))
	}()

	run := b.run(t)
	<-replaced

	st2 := run.r.Status()
	require.Equal(t, node.PhaseReady, st2.Phase, "%v\n%s\n%s", run.phases, run.logs, fm.Logs)
	fm.WaitState(t, fabricmanager.StateRunning)

	waited := false
	for _, p := range run.phases {
		waited = waited || strings.HasPrefix(p, "waiting: retrying the fabric manager's run directory: "+link+" is a symbolic link")
	}

	assert.True(t, waited, "phases: %v", run.phases)
	assert.FileExists(t, filepath.Join(b.Host, "run/nvidia/driver/run/nvidia-fabricmanager/socket"))

	entries, err := os.ReadDir(elsewhere)
	require.NoError(t, err)
	assert.Empty(t, entries, "nothing made through the link")
}
