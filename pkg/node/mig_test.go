package node_test

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/talos-nvidia/nvidia-driver/internal/sim"
	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
	"github.com/talos-nvidia/nvidia-driver/pkg/config"
	"github.com/talos-nvidia/nvidia-driver/pkg/driverroot"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu"
	"github.com/talos-nvidia/nvidia-driver/pkg/mig"
	"github.com/talos-nvidia/nvidia-driver/pkg/nfd"
	"github.com/talos-nvidia/nvidia-driver/pkg/node"
	"github.com/talos-nvidia/nvidia-driver/pkg/nvmljobs"
)

// migNode is one simulated GPU node and its throwaway host root, started as often as a test
// needs (a service restart, a reboot), with CDI on. It records, for every mutating NVML call,
// whether the readiness file was there at that moment.
type migNode struct {
	t    *testing.T
	gpus *sim.Node
	host string
	file string
	// env is added to the service's environment at each run.
	env []string
	// switches, when set, are the board's NVSwitches in the host's sysfs and procfs.
	switches *sim.NVSwitches

	mu          sync.Mutex
	mutating    []int // GPU index of each mutating call
	readyAtCall []bool
}

func newMIGNode(t *testing.T, gpus *sim.Node, migFile string) *migNode {
	t.Helper()
	testutil.RequireRoot(t)

	m := &migNode{t: t, gpus: gpus, host: t.TempDir(), file: filepath.Join(t.TempDir(), "mig.yaml")}
	// nvcdi finds the driver's libraries by the version NVML reports: the subroot's.
	gpus.DriverVersion = driverroot.Check(testutil.Subroot(t)).DriverVersion
	require.NoError(t, os.WriteFile(m.file, []byte(migFile), 0o644))
	t.Cleanup(func() { unix.Unmount(filepath.Join(m.host, "run/nvidia/driver"), unix.MNT_DETACH) }) //nolint:errcheck

	gpus.OnMutating(func(_ string, gpu int) {
		_, err := os.Stat(m.readyFile())
		m.mu.Lock()
		m.mutating = append(m.mutating, gpu)
		m.readyAtCall = append(m.readyAtCall, err == nil)
		m.mu.Unlock()
	})

	return m
}

func (m *migNode) readyFile() string {
	return filepath.Join(m.host, "run/nvidia/validations", driverroot.ReadyFile)
}

// calls returns how many mutating calls each GPU got since the last look, and whether the
// readiness file was absent at every one of them.
func (m *migNode) calls() (map[int]int, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()

	per := map[int]int{}
	withdrawn := true

	for i, g := range m.mutating {
		per[g]++
		withdrawn = withdrawn && !m.readyAtCall[i]
	}

	m.mutating, m.readyAtCall = nil, nil

	return per, withdrawn
}

// run starts the service's runner with a layout and returns its status once ready or failed.
// CDI is generated only while no GPU has MIG instances: nvcdi reads MIG capability minors
// from the machine's own /proc/driver/nvidia-caps, which this host lacks (the demo mounts a
// simulated one in its private mount namespace).
func (m *migNode) run(layout string, cdi bool) (node.Status, string) {
	m.t.Helper()

	r, logs := m.runner(layout, cdi)

	// Held a while longer: a retry loop would show as more calls and more log lines.
	return runUntilSettled(m.t, r, logs, 20*time.Second, 100*time.Millisecond)
}

// runner makes the service's runner for a layout on this node, and the buffer it logs to.
func (m *migNode) runner(layout string, cdi bool) (*node.Runner, *testutil.SyncBuffer) {
	t := m.t
	t.Helper()

	cfg, err := config.Load(append([]string{
		"NVIDIA_DRIVER_HOST_ROOT=" + m.host, "NVIDIA_DRIVER_SUBROOT=" + testutil.Subroot(t),
		"NVIDIA_DRIVER_PERSISTENCED=false", "NVIDIA_DRIVER_MIG_CONFIG=" + m.file,
		"NVIDIA_DRIVER_MIG_LAYOUT=" + layout, "NVIDIA_DRIVER_CONFIG=" + writeVersionOnly(t),
		"NVIDIA_DRIVER_CDI=" + map[bool]string{true: "true", false: "false"}[cdi],
	}, m.env...))
	require.NoError(t, err)

	writeProc := func() error {
		if ret := m.gpus.Init(); ret != nvml.SUCCESS {
			return ret
		}
		defer m.gpus.Shutdown() //nolint:errcheck

		if err := sim.WriteProcFS(m.host, m.gpus); err != nil {
			return err
		}

		if m.switches == nil {
			return nil
		}

		return sim.WriteNVSwitchFS(m.host, *m.switches)
	}
	require.NoError(t, writeProc())

	logs := &testutil.SyncBuffer{}

	log := slog.New(slog.NewTextHandler(logs, nil))
	jobs := &nvmljobs.Local{Log: log, NVML: m.gpus, Resetter: m.gpus, AfterMIGChange: writeProc}

	return node.New(log, cfg, jobs, node.WithBackoff(node.Backoff{Initial: 10 * time.Millisecond, Max: 20 * time.Millisecond})), logs
}

// cdiDevices lists the devices of the node's CDI spec, as containerd's CDI library reads it.
func (m *migNode) cdiDevices() []string {
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(filepath.Join(m.host, "run/cdi")), cdiapi.WithAutoRefresh(false))
	require.NoError(m.t, err)
	require.Empty(m.t, cache.GetErrors())

	return cache.ListDevices()
}

func (m *migNode) uuid(i int) string {
	require.Equal(m.t, nvml.SUCCESS, m.gpus.Init())
	defer m.gpus.Shutdown() //nolint:errcheck

	d, ret := m.gpus.DeviceGetHandleByIndex(i)
	require.Equal(m.t, nvml.SUCCESS, ret)

	u, ret := d.GetUUID()
	require.Equal(m.t, nvml.SUCCESS, ret)

	return u
}

const busyLayouts = `version: v1
mig-configs:
  first-two:
    - devices: [0, 1]
      mig-enabled: true
      mig-devices: {"3g.71gb": 2}
`

// TestBusyNodeLayoutChangeIsPendingWithHoldersNamed: the device plugin and the DCGM exporter
// hold every GPU open through NVML (no compute process). A layout that enables MIG on GPUs 0
// and 1 ends pending with both holders named, once (no retry): NVML keeps the new mode
// pending (activationStatus IN_USE) and the current one stays. GPUs 2 and 3 get no call and
// stay served (device nodes, CDI devices); the node is ready. The readiness file of the
// previous run is gone before the first mutating call. Then either way out finishes it: a
// restart once the holders are paused, or a reboot (with no further mode change).
func TestBusyNodeLayoutChangeIsPendingWithHoldersNamed(t *testing.T) {
	for _, finish := range []string{"pause and restart", "reboot"} {
		t.Run(finish, func(t *testing.T) {
			gpus := sim.New(testutil.Model(t, "h200"), 4)
			gpus.Hold(sim.Holder{PID: 4100, Name: "nvidia-device-plugin", GPUs: []int{0, 1, 2, 3}})
			gpus.Hold(sim.Holder{PID: 4200, Name: "dcgm-exporter", GPUs: []int{0, 1, 2, 3}})

			m := newMIGNode(t, gpus, busyLayouts)

			// The readiness file of the previous run, which the DaemonSets' init containers would see.
			require.NoError(t, driverroot.MarkReady(filepath.Dir(m.readyFile()), []byte("{}\n")))

			st, logs := m.run("first-two", true)

			require.Equal(t, node.PhaseReady, st.Phase, logs)
			require.Len(t, st.MIG, 4)

			for i := range 2 {
				res := st.MIG[i]
				assert.Equal(t, mig.ResultPending, res.Result, res.Message)
				assert.Equal(t, []gpu.Holder{{PID: 4100, Name: "nvidia-device-plugin"}, {PID: 4200, Name: "dcgm-exporter"}}, res.Holders)
				assert.Contains(t, res.Message, "held open by nvidia-device-plugin (pid 4100), dcgm-exporter (pid 4200)")
				assert.Contains(t, res.Message, "at the next boot, before workloads start")
				assert.Equal(t, nvml.DEVICE_MIG_DISABLE, gpus.State(i).MigMode, "the current mode stays")
				assert.Equal(t, nvml.DEVICE_MIG_ENABLE, gpus.State(i).PendingMigMode, "NVML keeps the new one pending")
			}

			for i := 2; i < 4; i++ {
				assert.Equal(t, mig.ResultSuccess, st.MIG[i].Result)
				assert.Contains(t, st.MIG[i].Message, "not selected")
			}

			assert.Contains(t, st.Message, `MIG layout "first-two": pending (GPU 0 pending: held open by nvidia-device-plugin (pid 4100), dcgm-exporter (pid 4200); GPU 1 pending`)

			per, withdrawn := m.calls()
			assert.Equal(t, map[int]int{0: 1, 1: 1}, per, "one SetMigMode each, nothing for GPUs 2 and 3")
			assert.Equal(t, 2, gpus.Calls(sim.MSetMigMode))
			assert.True(t, withdrawn, "the readiness file was gone before the first mutating call")
			assert.Equal(t, 1, strings.Count(logs, `msg="mig layout" gpu=0`), "tried once, not retried:\n%s", logs)

			assert.FileExists(t, m.readyFile(), "the node is ready")
			assert.FileExists(t, filepath.Join(m.host, "dev/nvidia3"))
			assert.Subset(t, m.cdiDevices(), []string{"nvidia.com/gpu=2", "nvidia.com/gpu=3", "nvidia.com/gpu=" + m.uuid(3), "nvidia.com/gpu=all"})

			gpus.ResetCounters()

			if finish == "reboot" {
				gpus.Reboot() // the holders' pods start later, after the readiness file
			} else {
				// The user paused both DaemonSets (docs/mig.md, section 5); the service restarts.
				gpus.Release(4100)
				gpus.Release(4200)
			}

			st, logs = m.run("first-two", false)

			require.Equal(t, node.PhaseReady, st.Phase, logs)

			for i := range 2 {
				assert.Equal(t, mig.ResultSuccess, st.MIG[i].Result, st.MIG[i].Message)
				assert.Len(t, gpus.State(i).Instances, 2)
			}

			// 2 GPU and 2 compute instances per GPU; a mode change only without the reboot.
			want := 4
			if finish != "reboot" {
				want++
			}

			per, withdrawn = m.calls()
			assert.Equal(t, map[int]int{0: want, 1: want}, per, "nothing for GPUs 2 and 3")
			assert.True(t, withdrawn, "the readiness file was gone before the first mutating call")
			assert.FileExists(t, m.readyFile(), "and is back once the node is ready")
			assert.FileExists(t, filepath.Join(m.host, "dev/nvidia3"))
			assert.Contains(t, m.cdiDevices(), "nvidia.com/gpu=3", "the spec of the earlier run stays until the next one replaces it")
		})
	}
}

const a100Layouts = `version: v1
mig-configs:
  first-three:
    - devices: [0, 1, 2]
      mig-enabled: true
      mig-devices: {"3g.40gb": 2}
`

// TestNVSwitchA100BoardIsResetAsAWhole: on an HGX A100 whose switches sysfs shows, the
// service sets the three GPUs' modes, resets the whole board once (all four GPUs, as
// mig-parted does) and creates the instances: success with no reboot, no reset of one GPU,
// and GPU 3, which the layout leaves alone and which had no instances, no call.
func TestNVSwitchA100BoardIsResetAsAWhole(t *testing.T) {
	gpus := sim.New(testutil.Model(t, "a100-80gb"), 4)
	gpus.SetBoard(sim.Board{NoPerGPUReset: true})

	m := newMIGNode(t, gpus, a100Layouts)
	m.switches = &sim.NVSwitches{Count: 6, DeviceID: 0x1af1}
	m.env = append(m.env, "NVIDIA_DRIVER_FABRIC_WAIT=1s")

	st, logs := m.run("first-three", false)

	// Degraded by the fabric alone: no ext-nvidia-fabricmanager runs in this test.
	require.Equal(t, node.PhaseDegraded, st.Phase, logs)
	assert.Contains(t, st.Message, `MIG layout "first-three": success; NVLink fabric degraded: no fabric manager runs`)

	for i := range 3 {
		assert.Equal(t, mig.ResultSuccess, st.MIG[i].Result, st.MIG[i].Message)
		assert.Contains(t, st.MIG[i].Message, "after the reset of all 4 GPUs of the board")
		assert.Len(t, gpus.State(i).Instances, 2)
	}

	assert.Contains(t, logs, "reset all GPUs of the NVSwitch board at once")
	assert.Equal(t, 3, gpus.Calls(sim.MSetMigMode))
	assert.Equal(t, 1, gpus.Calls(sim.MResetGPUs))
	assert.Zero(t, gpus.Calls(sim.MResetGPU))

	per, withdrawn := m.calls()
	assert.Zero(t, per[3])
	assert.True(t, withdrawn, "the readiness file was withdrawn before the first change")
}

// TestNVSwitchA100IsPendingRebootAndTheRebootFinishes: on an A100 NVSwitch board whose
// switches sysfs does not show (so the service cannot know to reset the board), a MIG mode
// change stays pending (activationStatus RESET_REQUIRED) and one GPU cannot be reset alone.
// The GPUs end pending-reboot with the pending mode kept, once, and the node is ready; after
// a reboot the service creates the instances with no mode change at all, and a GPU the
// layout does not select gets no call, ever.
func TestNVSwitchA100IsPendingRebootAndTheRebootFinishes(t *testing.T) {
	gpus := sim.New(testutil.Model(t, "a100-80gb"), 4)
	gpus.SetBoard(sim.Board{NoPerGPUReset: true})

	m := newMIGNode(t, gpus, a100Layouts)

	st, logs := m.run("first-three", true)

	require.Equal(t, node.PhaseReady, st.Phase, logs)
	assert.Contains(t, st.Message, `MIG layout "first-three": pending-reboot (GPU 0 pending-reboot: reboot to finish; GPU 1 pending-reboot: reboot to finish; GPU 2 pending-reboot: reboot to finish)`)

	for i := range 3 {
		assert.Equal(t, mig.ResultPendingReboot, st.MIG[i].Result)
		assert.Contains(t, st.MIG[i].Message, "reboot to finish")
		s := gpus.State(i)
		assert.Equal(t, nvml.DEVICE_MIG_DISABLE, s.MigMode)
		assert.Equal(t, nvml.DEVICE_MIG_ENABLE, s.PendingMigMode, "the pending mode is kept: no rollback")
	}

	assert.Contains(t, logs, "reboot to finish")
	assert.Equal(t, 3, gpus.Calls(sim.MSetMigMode), "one mode change per GPU, no retry")
	assert.Equal(t, 3, gpus.Calls(sim.MResetGPU))

	per, _ := m.calls()
	assert.Zero(t, per[3])
	assert.Subset(t, m.cdiDevices(), []string{"nvidia.com/gpu=0", "nvidia.com/gpu=3", "nvidia.com/gpu=all"}, "every GPU still served")

	gpus.Reboot()
	gpus.ResetCounters()

	st, logs = m.run("first-three", false)

	require.Equal(t, node.PhaseReady, st.Phase, logs)
	assert.Contains(t, st.Message, `MIG layout "first-three": success`)

	for i := range 3 {
		assert.Equal(t, mig.ResultSuccess, st.MIG[i].Result, st.MIG[i].Message)
		assert.Len(t, gpus.State(i).Instances, 2)
	}

	assert.Zero(t, gpus.Calls(sim.MSetMigMode), "the mode is already current after the reboot")
	assert.Zero(t, gpus.Calls(sim.MResetGPU))

	per, withdrawn := m.calls()
	assert.Equal(t, map[int]int{0: 4, 1: 4, 2: 4}, per, "2 GPU instances and 2 compute instances each, nothing else")
	assert.True(t, withdrawn)

	// A restart with the same layout touches nothing.
	st, logs = m.run("first-three", false)
	require.Equal(t, node.PhaseReady, st.Phase, logs)

	per, _ = m.calls()
	assert.Empty(t, per)
}

// TestLayoutThatCannotBeAppliedLeavesTheGPUsServed: a typo in the file, a layout name it
// lacks, a profile the GPU does not have and counts that cannot fit never take the GPUs
// away. The node serves them as they are (device nodes, CDI spec, readiness file), its status
// is degraded with the layout's problem, the NFD label says mig.config.state=failed, as the
// GPU Operator's mig-manager leaves a node, and no GPU gets a mutating call.
func TestLayoutThatCannotBeAppliedLeavesTheGPUsServed(t *testing.T) {
	for _, tc := range []struct {
		name, file, layout, problem string
	}{
		{"unknown key", "version: v1\nmig-configs:\n  mine:\n    - devices: all\n      mig-enable: true\n      mig-enabled: false\n", "mine",
			`line 5: layout "mine", entry 0: unknown key "mig-enable"`},
		{"layout missing", busyLayouts, "frist-two", `MIG layout "frist-two": no layout "frist-two" (layouts: all-1g, all-balanced, all-disabled, all-enabled, all-max, first-two)`},
		{"profile typo", "version: v1\nmig-configs:\n  mine:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"3g.70gb\": 2}\n", "mine",
			`GPU 0 (NVIDIA H200) has no profile "3g.70gb"`},
		{"does not fit", "version: v1\nmig-configs:\n  mine:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"4g.71gb\": 2}\n", "mine",
			`4g.71gb requested, the GPU has room for at most 1`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gpus := sim.New(testutil.Model(t, "h200"), 2)
			m := newMIGNode(t, gpus, tc.file)
			m.env = []string{"NVIDIA_DRIVER_NFD_FEATURES_DIR=/etc/nfd"}

			st, logs := m.run(tc.layout, true)

			require.Equal(t, node.PhaseDegraded, st.Phase, logs)
			assert.Contains(t, st.Message, "node degraded: 2 GPU(s)")
			assert.Contains(t, st.Message, fmt.Sprintf("MIG layout %q not applied, the GPUs are served as they are: ", tc.layout))
			assert.Contains(t, st.Message, tc.problem)

			assert.FileExists(t, m.readyFile(), "the GPUs are served")
			assert.FileExists(t, filepath.Join(m.host, "dev/nvidia1"))
			assert.Subset(t, m.cdiDevices(), []string{"nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=all"})

			labels, err := os.ReadFile(filepath.Join(m.host, "etc/nfd", nfd.DefaultName))
			require.NoError(t, err)
			assert.Contains(t, string(labels), nfd.LabelMIGConfigState+"=failed\n")
			assert.Contains(t, string(labels), nfd.LabelMIGConfig+"="+tc.layout+"\n")

			assert.Zero(t, gpus.MutatingCalls(), "no GPU was touched")
		})
	}
}

// TestLinkAtValidationsIsRetriedUntilReplaced: the readiness directory is a link. The MIG
// job, which withdraws the readiness files before its first change, is refused before it
// touches a GPU, and the layout is retried, the status naming the link, for as long as the
// link is there (many more tries than a layout that fails half-way gets); once the link is
// replaced by a directory the layout is applied and the node is ready, without a restart
// (issue 50: it used to come up degraded, the layout failed until a restart).
func TestLinkAtValidationsIsRetriedUntilReplaced(t *testing.T) {
	gpus := sim.New(testutil.Model(t, "h200"), 1)
	m := newMIGNode(t, gpus, `version: v1
mig-configs:
  halves:
    - devices: all
      mig-enabled: true
      mig-devices: {"3g.71gb": 2}
`)

	elsewhere := filepath.Join(m.host, "etc/elsewhere")
	require.NoError(t, os.MkdirAll(elsewhere, 0o755))
	link := filepath.Join(m.host, "run/nvidia/validations")
	require.NoError(t, os.MkdirAll(filepath.Dir(link), 0o755))
	require.NoError(t, os.Symlink(elsewhere, link))

	r, logs := m.runner("halves", false)
	n := runNode(t, r, logs)

	st := n.waitFor("the link named", func(st node.Status) bool {
		return settled(st) || st.Phase == node.PhaseWaiting && strings.Contains(st.Message, link)
	})
	require.Equal(t, node.PhaseWaiting, st.Phase, "%s\n%s", st.Message, logs)

	time.Sleep(300 * time.Millisecond) // some fifteen tries at 10-20 ms

	st = r.Status()
	require.Equal(t, node.PhaseWaiting, st.Phase, "still retried: %s\n%s", st.Message, logs)
	assert.Contains(t, st.Message, link)
	per, _ := m.calls()
	assert.Empty(t, per, "no GPU touched while the link is there")

	require.NoError(t, os.Remove(link))
	require.NoError(t, os.MkdirAll(link, 0o755)) // a retry may have made it first

	st = n.waitFor("ready", settled)
	require.Equal(t, node.PhaseReady, st.Phase, "%s\n%s", st.Message, logs)
	require.Len(t, st.MIG, 1)
	assert.Equal(t, mig.ResultSuccess, st.MIG[0].Result, st.MIG[0].Message)
	assert.Equal(t, nvml.DEVICE_MIG_ENABLE, gpus.State(0).MigMode)
	assert.FileExists(t, m.readyFile())

	entries, err := os.ReadDir(elsewhere)
	require.NoError(t, err)
	assert.Empty(t, entries, "nothing written through the link")
}
