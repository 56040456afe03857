package node_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
	"github.com/talos-nvidia/nvidia-driver/pkg/config"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu/sim"
	"github.com/talos-nvidia/nvidia-driver/pkg/node"
	"github.com/talos-nvidia/nvidia-driver/pkg/nvmljobs"
)

// fakeFabricManager builds the fake daemon, which acts as nv-fabricmanager when given -c.
func fakeFabricManager(t *testing.T) string {
	t.Helper()

	bin := filepath.Join(t.TempDir(), "nv-fabricmanager")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/talos-nvidia/nvidia-driver/pkg/daemons/internal/fakedaemon")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "build the fake daemon: %s", out)

	return bin
}

// board is a simulated HGX H200 board for the runner: eight GPUs, the NVSwitch files of sim.NVSwitches
// under a throwaway host root, a subroot (the Debian-built one with an overlay) whose
// nv-fabricmanager is the fake daemon, and NVML that reports the GPUs registered once a
// fabric manager's API answers.
type board struct {
	host, subroot, args, control string
	apiPort                      int
	gpus                         *sim.Node
}

type boardOptions struct {
	switches   sim.NVSwitches
	mode       string // the fake fabric manager's FAKEDAEMON_MODE
	noBinary   bool   // the subroot ships no nv-fabricmanager
	foreignAPI bool   // a foreign fabric manager answers on the API TCP port
	registered bool   // the GPUs are registered with the fabric before the service starts
	// registerAfter is how long the GPUs take to register once a fabric manager runs (300 ms).
	registerAfter time.Duration
}

func newBoard(t *testing.T, o boardOptions) *board {
	t.Helper()
	testutil.RequireRoot(t)

	dir, err := os.MkdirTemp("", "hgx") // short: UNIX socket paths live under it
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) }) //nolint:errcheck

	b := &board{host: filepath.Join(dir, "h"), args: filepath.Join(dir, "args"), control: filepath.Join(dir, "mode")}
	require.NoError(t, os.MkdirAll(b.host, 0o755))
	require.NoError(t, os.WriteFile(b.control, []byte(o.mode), 0o644))

	// The foreign fabric manager's API port, or one nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	b.apiPort = l.Addr().(*net.TCPAddr).Port
	if o.foreignAPI {
		t.Cleanup(func() { l.Close() }) //nolint:errcheck

		go func() {
			for c, err := l.Accept(); err == nil; c, err = l.Accept() {
				c.Close() //nolint:errcheck
			}
		}()
	} else {
		require.NoError(t, l.Close())
	}

	b.subroot = overlaySubroot(t, dir, o.noBinary, b.apiPort)

	b.gpus = sim.New(testutil.Model(t, "h200"), 8)
	if o.registerAfter == 0 {
		o.registerAfter = 300 * time.Millisecond
	}

	b.gpus.SetFabric(sim.Fabric{RegisterAfter: o.registerAfter, Manager: func() bool {
		if o.foreignAPI || o.registered {
			return true // a foreign fabric manager does, or did, the job
		}

		c, err := net.Dial("unix", filepath.Join(b.host, "var/run/nvidia-fabricmanager/socket"))
		if err == nil {
			c.Close() //nolint:errcheck
		}

		return err == nil
	}})

	require.Equal(t, nvml.SUCCESS, b.gpus.Init())
	if o.registered {
		b.gpus.SetFabric(sim.Fabric{Manager: func() bool { return true }})
		_, err := gpu.Fabric(b.gpus)
		require.NoError(t, err)
	}
	require.NoError(t, sim.WriteProcFS(b.host, b.gpus))
	require.Equal(t, nvml.SUCCESS, b.gpus.Shutdown())
	if o.switches.Count > 0 {
		require.NoError(t, sim.WriteNVSwitchFS(b.host, o.switches))
	}

	t.Setenv("FAKEDAEMON_CONTROL", b.control)
	t.Setenv("FAKEDAEMON_ARGS", b.args)
	t.Setenv("FAKEDAEMON_DEV", filepath.Join(b.host, "dev"))

	return b
}

// overlaySubroot mounts the Debian-built subroot with nv-fabricmanager (the fake) and
// NVIDIA's fabricmanager.cfg (shortened, its API on apiPort) added, the way the fabric
// manager archive adds them.
func overlaySubroot(t *testing.T, dir string, noBinary bool, apiPort int) string {
	t.Helper()

	upper, work, merged := filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "subroot")
	for _, d := range []string{upper + "/usr/bin", upper + "/usr/share/nvidia/nvswitch", work, merged} {
		require.NoError(t, os.MkdirAll(d, 0o755))
	}

	if !noBinary {
		data, err := os.ReadFile(fakeFabricManager(t))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(upper, "usr/bin/nv-fabricmanager"), data, 0o755))
	}

	cfg := fmt.Sprintf("LOG_LEVEL=4\nLOG_FILE_NAME=/var/log/fabricmanager.log\nDAEMONIZE=1\nBIND_INTERFACE_IP=127.0.0.1\n"+
		"STARTING_TCP_PORT=16000\nUNIX_SOCKET_PATH=\nFABRIC_MODE=0\nSTATE_FILE_NAME=/var/tmp/fabricmanager.state\n"+
		"FM_CMD_BIND_INTERFACE=127.0.0.1\nFM_CMD_PORT_NUMBER=%d\nFM_CMD_UNIX_SOCKET_PATH=\n", apiPort)
	require.NoError(t, os.WriteFile(filepath.Join(upper, "usr/share/nvidia/nvswitch/fabricmanager.cfg"), []byte(cfg), 0o644))

	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", testutil.Subroot(t), upper, work)
	require.NoError(t, unix.Mount("overlay", merged, "overlay", 0, opts))
	t.Cleanup(func() { unix.Unmount(merged, unix.MNT_DETACH) }) //nolint:errcheck

	return merged
}

// starts counts the fabric manager's starts.
func (b *board) starts(t *testing.T) int {
	t.Helper()

	data, err := os.ReadFile(b.args)
	if os.IsNotExist(err) {
		return 0
	}

	require.NoError(t, err)

	return strings.Count(string(data), "\n")
}

// fabricManagerPID finds our fake fabric manager among the processes, 0 if none runs.
func (b *board) fabricManagerPID(t *testing.T) int {
	t.Helper()

	cfg := filepath.Join(b.host, "var/run/nvidia-fabricmanager/fabricmanager.cfg")
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	require.NoError(t, err)

	for _, p := range procs {
		data, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(data), cfg) {
			var pid int
			if _, err := fmt.Sscanf(p, "/proc/%d/cmdline", &pid); err == nil {
				return pid
			}
		}
	}

	return 0
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

	target := filepath.Join(b.host, "run/nvidia/driver")
	t.Cleanup(func() { unix.Unmount(target, unix.MNT_DETACH) }) //nolint:errcheck

	cfg, err := config.Load(append([]string{
		"NVIDIA_DRIVER_HOST_ROOT=" + b.host, "NVIDIA_DRIVER_SUBROOT=" + b.subroot,
		"NVIDIA_DRIVER_PERSISTENCED=false", "NVIDIA_DRIVER_CDI=false", "NVIDIA_DRIVER_CONFIG=" + writeVersionOnly(t),
		"NVIDIA_DRIVER_FABRIC_WAIT=5s",
	}, env...))
	require.NoError(t, err)

	run := &running{logs: &testutil.SyncBuffer{}}
	log := slog.New(slog.NewTextHandler(run.logs, nil))
	run.r = node.New(log, cfg, &nvmljobs.Local{Log: log, NVML: b.gpus, Resetter: b.gpus}, node.WithBackoff(node.Backoff{Initial: 20 * time.Millisecond, Max: 50 * time.Millisecond}))

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
// nodes, starts nv-fabricmanager from the subroot with the config it writes, reports ready
// only after NVML says every GPU registered with the fabric, and restarts the fabric manager
// when it dies.
func TestFabricManagerOnNVSwitchBoard(t *testing.T) {
	b := newBoard(t, boardOptions{switches: sim.NVSwitches{Count: 4}, mode: "ok"})
	run := b.run(t)
	st := run.r.Status()

	require.Equal(t, node.PhaseReady, st.Phase, "%v\n%s", run.phases, run.logs)
	assert.Contains(t, st.Message, "NVLink fabric: 8 GPU(s) registered with the NVLink fabric by nv-fabricmanager")
	require.NotNil(t, st.Fabric)
	assert.Equal(t, node.FabricRegistered, st.Fabric.State)
	assert.Equal(t, "ready", st.Fabric.Manager)
	assert.Len(t, st.Fabric.Board.Driver, 4)
	require.Len(t, st.Fabric.GPUs, 8)

	for _, g := range st.Fabric.GPUs {
		assert.Equal(t, gpu.FabricCompleted, g.State)
	}

	// Ready came only after a wait for the registration, while the fabric manager ran.
	waited := false

	for _, p := range run.phases {
		waited = waited || strings.HasPrefix(p, "waiting: waiting for the NVLink fabric: fabric registration: GPU 0,1,2,3,4,5,6,7 in-progress")
	}

	assert.True(t, waited, "phases: %v", run.phases)
	// report() writes the status before it logs.
	for i := 0; i < 100 && !strings.Contains(run.logs.String(), "node ready"); i++ {
		time.Sleep(5 * time.Millisecond)
	}

	assert.Less(t, strings.Index(run.logs.String(), "msg=ready daemon=nv-fabricmanager"), strings.Index(run.logs.String(), "node ready"))

	// What the fabric manager needs is in place: its nodes (the fake checks them too) and
	// its socket, mirrored into the driver root where CDI specs mount it from.
	assert.FileExists(t, filepath.Join(b.host, "dev/nvidia-nvswitchctl"))
	assert.FileExists(t, filepath.Join(b.host, "run/nvidia/driver/run/nvidia-fabricmanager/socket"))

	cfg, err := os.ReadFile(filepath.Join(b.host, "var/run/nvidia-fabricmanager/fabricmanager.cfg"))
	require.NoError(t, err)
	assert.Contains(t, string(cfg), "\nDAEMONIZE=0\n")

	// Supervised: killed, it is started again.
	first := b.fabricManagerPID(t)
	require.NotZero(t, first)
	require.NoError(t, unix.Kill(first, unix.SIGKILL))

	deadline := time.Now().Add(10 * time.Second)
	for pid := first; pid == first || pid == 0; pid = b.fabricManagerPID(t) {
		require.True(t, time.Now().Before(deadline), "no new fabric manager\n%s", run.logs)
		time.Sleep(10 * time.Millisecond)
	}

	// The new process shows in /proc a moment before the fake has recorded its start.
	assert.Eventually(t, func() bool { return b.starts(t) == 2 }, 5*time.Second, 10*time.Millisecond, "two starts of the fabric manager")
	assert.Equal(t, 2, b.starts(t))
	assert.Contains(t, run.logs.String(), "daemon died; restarting")

	// The status follows the supervision: restarting, then ready again.
	for run.r.Status().Fabric.Manager != "ready" {
		require.True(t, time.Now().Before(deadline), "status says %q", run.r.Status().Fabric.Manager)
		time.Sleep(10 * time.Millisecond)
	}

	run.stop()
	assert.Zero(t, b.fabricManagerPID(t), "stopped with the service")
}

// TestFabricManagerCannotRun: where the fabric manager cannot do its job the node is served
// and degraded, the status says why, and nothing is started again and again. A foreign
// fabric manager is left alone and the node is ready once it has registered the GPUs.
func TestFabricManagerCannotRun(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opts    boardOptions
		phase   string
		want    string
		starts  int
		manager string
		env     []string
	}{
		{"GPUs passed through to a VM: NV_WARN_NOTHING_TO_DO", boardOptions{switches: sim.NVSwitches{Count: 4}, mode: "nothing-to-do"},
			node.PhaseDegraded, "NV_WARN_NOTHING_TO_DO", 1, "failed", nil},
		{"switches the nvidia-nvswitch driver does not manage", boardOptions{switches: sim.NVSwitches{Count: 4, Unmanaged: true}, mode: "ok"},
			node.PhaseDegraded, "the nvidia-nvswitch driver initialized none of them", 0, "", nil},
		{"no nv-fabricmanager in the subroot", boardOptions{switches: sim.NVSwitches{Count: 4}, noBinary: true},
			node.PhaseDegraded, "lacks usr/bin/nv-fabricmanager", 0, "", nil},
		{"a foreign fabric manager runs", boardOptions{switches: sim.NVSwitches{Count: 4}, mode: "ok", foreignAPI: true},
			node.PhaseReady, "leaving it alone", 0, "foreign", nil},
		{"the GPUs were registered before the service started", boardOptions{switches: sim.NVSwitches{Count: 4}, mode: "ok", registered: true},
			node.PhaseReady, "already registered with the NVLink fabric", 0, "", nil},
		{"registered, and the fabric manager turned off", boardOptions{switches: sim.NVSwitches{Count: 4}, mode: "ok", registered: true},
			node.PhaseReady, "already registered with the NVLink fabric", 0, "", []string{"NVIDIA_DRIVER_FABRIC_MANAGER=false"}},
		{"not registered, and the fabric manager turned off", boardOptions{switches: sim.NVSwitches{Count: 4}, mode: "ok"},
			node.PhaseDegraded, "turned off (NVIDIA_DRIVER_FABRIC_MANAGER=false)", 0, "", []string{"NVIDIA_DRIVER_FABRIC_MANAGER=false"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBoard(t, tc.opts)
			run := b.run(t, tc.env...)
			st := run.r.Status()

			require.Equal(t, tc.phase, st.Phase, "%v\n%s", run.phases, run.logs)
			t.Logf("status: %s: %s", st.Phase, st.Message)
			assert.Contains(t, st.Message, tc.want)
			require.NotNil(t, st.Fabric)
			assert.Contains(t, st.Fabric.Message, tc.want)
			assert.Equal(t, tc.manager, st.Fabric.Manager)

			// The GPUs are served: listed, with their device nodes and the readiness file.
			assert.Len(t, st.GPUs, 8)
			assert.FileExists(t, filepath.Join(b.host, "dev/nvidia7"))
			assert.FileExists(t, filepath.Join(b.host, "run/nvidia/validations/.driver-ctr-ready"))

			// No crash loop: a while later nothing more was started and the service still runs.
			time.Sleep(500 * time.Millisecond)
			assert.Equal(t, tc.starts, b.starts(t))
			assert.Equal(t, tc.phase, run.r.Status().Phase)
		})
	}
}

// TestNoNVSwitchNoFabricManager: a node without NVSwitches starts no fabric manager and its
// status has no fabric.
func TestNoNVSwitchNoFabricManager(t *testing.T) {
	b := newBoard(t, boardOptions{mode: "ok"})
	run := b.run(t)
	st := run.r.Status()

	require.Equal(t, node.PhaseReady, st.Phase, "%v\n%s", run.phases, run.logs)
	assert.Nil(t, st.Fabric)
	assert.NotContains(t, st.Message, "fabric")
	assert.Zero(t, b.starts(t))
	assert.NoDirExists(t, filepath.Join(b.host, "var/run/nvidia-fabricmanager"))
	assert.NoFileExists(t, filepath.Join(b.host, "dev/nvidia-nvswitchctl"))
}

// TestFabricCompletesAfterTheWait: a fabric slower than the bounded wait leaves the node
// degraded, saying which GPUs are still registering; the service keeps watching and reports
// the node ready, with its readiness file updated, once they have registered.
func TestFabricCompletesAfterTheWait(t *testing.T) {
	b := newBoard(t, boardOptions{switches: sim.NVSwitches{Count: 4}, mode: "ok", registerAfter: 1500 * time.Millisecond})
	run := b.run(t, "NVIDIA_DRIVER_FABRIC_WAIT=300ms")
	st := run.r.Status()

	require.Equal(t, node.PhaseDegraded, st.Phase, "%v\n%s", run.phases, run.logs)
	assert.Contains(t, st.Message, "GPU 0,1,2,3,4,5,6,7 in-progress after 300ms")

	ready := filepath.Join(b.host, "run/nvidia/validations/nvidia-driver.ready")
	summary, err := os.ReadFile(ready)
	require.NoError(t, err)
	assert.Contains(t, string(summary), `"fabric": "degraded"`)

	deadline := time.Now().Add(10 * time.Second)
	for run.r.Status().Phase != node.PhaseReady {
		require.True(t, time.Now().Before(deadline), "never ready: %s\n%s", run.r.Status().Message, run.logs)
		time.Sleep(10 * time.Millisecond)
	}

	st = run.r.Status()
	assert.Contains(t, st.Message, "NVLink fabric: 8 GPU(s) registered")
	assert.Equal(t, node.FabricRegistered, st.Fabric.State)

	summary, err = os.ReadFile(ready)
	require.NoError(t, err)
	assert.Contains(t, string(summary), `"fabric": "registered"`)
	assert.Equal(t, 1, b.starts(t))
}

// TestFabricManagerThatHangs: a fabric manager that never gets ready holds the node up only
// for the bounded wait; the GPUs are then served, degraded, and the supervisor gives up after
// its few tries instead of restarting it for ever.
func TestFabricManagerThatHangs(t *testing.T) {
	b := newBoard(t, boardOptions{switches: sim.NVSwitches{Count: 4}, mode: "hang"})
	begin := time.Now()
	run := b.run(t, "NVIDIA_DRIVER_FABRIC_WAIT=400ms")
	st := run.r.Status()

	require.Equal(t, node.PhaseDegraded, st.Phase, "%v\n%s", run.phases, run.logs)
	assert.Less(t, time.Since(begin), 5*time.Second)
	assert.Contains(t, st.Message, "waiting for readiness")
	assert.Len(t, st.GPUs, 8)

	deadline := time.Now().Add(10 * time.Second)
	for run.r.Status().Fabric.Manager != "failed" {
		require.True(t, time.Now().Before(deadline), "the supervisor never gave up: %s\n%s", run.r.Status().Fabric.Manager, run.logs)
		time.Sleep(10 * time.Millisecond)
	}

	assert.Equal(t, 3, b.starts(t))
	assert.Contains(t, run.logs.String(), "giving up after 3 failed starts")
	assert.Zero(t, b.fabricManagerPID(t), "no fabric manager left running")
}
