package node_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/talos-nvidia/nvidia-driver/internal/sim"
	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
	"github.com/talos-nvidia/nvidia-driver/pkg/mig"
	"github.com/talos-nvidia/nvidia-driver/pkg/node"
)

// pluginName stands for nvidia-device-plugin in driver-watch's pidof: a name of its own, so
// that deploy's test of the same script, run at the same time, cannot signal this one's.
const pluginName = "dp-under-watch"

// driverWatch is deploy/'s driver-watch container script, as the DaemonSet runs it, with its
// paths moved under the test's host root and seen directory, its poll shortened, and the
// plugin's process name replaced by pluginName.
func driverWatch(t *testing.T, host, seen string) string {
	t.Helper()

	data, err := os.ReadFile("../../deploy/device-plugin/patch-readiness.yaml")
	require.NoError(t, err)

	var ops []struct {
		Value struct {
			Name    string   `yaml:"name"`
			Command []string `yaml:"command"`
		} `yaml:"value"`
	}
	require.NoError(t, yaml.Unmarshal(data, &ops))

	for _, op := range ops {
		if op.Value.Name == "driver-watch" {
			require.Len(t, op.Value.Command, 3)

			return strings.NewReplacer(
				"/run/nvidia/validations", filepath.Join(host, "run/nvidia/validations"),
				"/seen", seen,
				"sleep 5", "sleep 0.1",
				"pidof nvidia-device-plugin", "pidof "+pluginName,
			).Replace(op.Value.Command[2])
		}
	}

	t.Fatal("no driver-watch container in deploy/device-plugin/patch-readiness.yaml")

	return ""
}

// startProcess starts a command in its own process group, ended at cleanup; the returned
// channel gets its exit.
func startProcess(t *testing.T, cmd *exec.Cmd) <-chan error {
	t.Helper()

	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, cmd.Start())

	done := make(chan error, 1)

	go func() { done <- cmd.Wait() }()

	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })

	return done
}

// watchPlugin starts a stand-in device plugin and deploy/'s driver-watch beside it, as the
// plugin's pod runs them once wait-for-driver has kept first, the readiness file it started
// on; the channel gets the plugin's exit, the buffer has driver-watch's output.
func watchPlugin(t *testing.T, host string, first []byte) (<-chan error, *testutil.SyncBuffer) {
	t.Helper()

	for _, prog := range []string{"pidof", "cmp", "sleep"} {
		_, err := exec.LookPath(prog)
		require.NoError(t, err, "%s: the plugin image's busybox has it; install it here", prog)
	}

	seen := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(seen, "nvidia-driver.ready"), first, 0o644))

	sleepBin, err := exec.LookPath("sleep")
	require.NoError(t, err)
	data, err := os.ReadFile(sleepBin)
	require.NoError(t, err)

	plugin := filepath.Join(t.TempDir(), pluginName)
	require.NoError(t, os.WriteFile(plugin, data, 0o755))

	testutil.DefaultSIGHUP(t)
	pluginDone := startProcess(t, exec.Command(plugin, "600"))

	watchOut := &testutil.SyncBuffer{}

	watch := exec.Command("/bin/sh", "-c", driverWatch(t, host, seen))
	watch.Stdout, watch.Stderr = watchOut, watchOut
	startProcess(t, watch)

	return pluginDone, watchOut
}

// requireRestarted waits for driver-watch's SIGHUP to end the stand-in plugin.
func requireRestarted(t *testing.T, pluginDone <-chan error, watchOut fmt.Stringer) {
	t.Helper()

	select {
	case err := <-pluginDone:
		var exitErr *exec.ExitError
		require.ErrorAs(t, err, &exitErr)
		ws, _ := exitErr.Sys().(syscall.WaitStatus)
		require.True(t, ws.Signaled(), "the plugin ended without a signal: %v", err)
		assert.Equal(t, syscall.SIGHUP, ws.Signal())
	case <-time.After(10 * time.Second):
		t.Fatalf("driver-watch did not signal the plugin after the readiness file changed\n%s", watchOut)
	}
}

// requireNotRestarted checks that the stand-in plugin still runs after ten of driver-watch's
// polls.
func requireNotRestarted(t *testing.T, pluginDone <-chan error, watchOut fmt.Stringer) {
	t.Helper()

	select {
	case err := <-pluginDone:
		t.Fatalf("plugin signalled though no device changed: %v\n%s", err, watchOut)
	case <-time.After(time.Second):
	}
}

// TestReadinessFollowsTheDevicesAndDriverWatchRestartsThePlugin: the readiness file's bytes
// change with the set of devices, and only then. deploy/'s real driver-watch runs against it
// with a stand-in plugin: a restart of the service that changes nothing leaves the file
// byte-identical and the plugin alone; an edit of the layout under the same name rebuilds
// the instances, changes the file, and driver-watch sends the plugin SIGHUP.
func TestReadinessFollowsTheDevicesAndDriverWatchRestartsThePlugin(t *testing.T) {
	const before = "version: v1\nmig-configs:\n  inference:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"3g.71gb\": 2}\n"

	const after = "version: v1\nmig-configs:\n  inference:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"2g.35gb\": 3}\n"

	m := newMIGNode(t, sim.New(testutil.Model(t, "h200"), 2), before)

	st, logs := m.run("inference", false)
	require.Equal(t, node.PhaseReady, st.Phase, logs)

	m.calls() // the first layout's calls

	first, err := os.ReadFile(m.readyFile())
	require.NoError(t, err)
	assert.Contains(t, string(first), `"migDevices"`)

	pluginDone, watchOut := watchPlugin(t, m.host, first)

	// A restart with nothing to change: the same bytes, no signal.
	st, logs = m.run("inference", false)
	require.Equal(t, node.PhaseReady, st.Phase, logs)
	per, _ := m.calls()
	assert.Empty(t, per, "nothing changed")

	again, err := os.ReadFile(m.readyFile())
	require.NoError(t, err)
	require.Equal(t, string(first), string(again), "a no-op restart rewrites the same bytes")

	requireNotRestarted(t, pluginDone, watchOut)

	// The same layout name, new content: the instances are made again.
	require.NoError(t, os.WriteFile(m.file, []byte(after), 0o644))

	st, logs = m.run("inference", false)
	require.Equal(t, node.PhaseReady, st.Phase, logs)

	edited, err := os.ReadFile(m.readyFile())
	require.NoError(t, err)
	require.NotEqual(t, string(first), string(edited), "the devices changed, so must the file")
	assert.Contains(t, string(edited), "2g.35gb")

	requireRestarted(t, pluginDone, watchOut)
}

// TestReadinessUnchangedByLayoutsThatChangeNoDevice: the readiness file is a function of the
// devices served, so a layout that changes none of them (one that cannot be applied, one
// pending on the operands, one retried under their pause) leaves its bytes as they were and
// deploy/'s driver-watch leaves the plugin alone; the status file says the layout's state.
// Once the operands let go, the applied layout's new devices change the file, and
// driver-watch restarts the plugin.
func TestReadinessUnchangedByLayoutsThatChangeNoDevice(t *testing.T) {
	gpus := sim.New(testutil.Model(t, "h200"), 2)
	operands := func(n int) {
		for i := range 2 {
			gpus.SetClients(i, n) // the device plugin and DCGM exporter, through NVML
		}
	}
	operands(2)

	m := newMIGNode(t, gpus, busyLayouts)
	m.env = []string{"NVIDIA_DRIVER_NFD_FEATURES_DIR=/etc/nfd", "NVIDIA_DRIVER_MIG_PAUSE=false"}

	st, logs := m.run("", false)
	require.Equal(t, node.PhaseReady, st.Phase, logs)

	first, err := os.ReadFile(m.readyFile())
	require.NoError(t, err)

	pluginDone, watchOut := watchPlugin(t, m.host, first)

	// same reads the readiness file every 5 ms for d; it may be missing (withdrawn before a
	// try), but when there it must hold first's bytes.
	same := func(d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			if b, err := os.ReadFile(m.readyFile()); err == nil {
				require.Equal(t, string(first), string(b), "the readiness file changed though no device did")
			}
		}
	}

	for _, tc := range []struct {
		name, layout string
		env          []string
		result       mig.Result // of GPU 0, "" without one
		phase        string
	}{
		{"a layout the file lacks", "frist-two", nil, "", node.PhaseDegraded},
		{"pending on the operands, not retried", "first-two", nil, mig.ResultPending, node.PhaseReady},
		{"pending, retried under the operands' pause", "first-two",
			[]string{"NVIDIA_DRIVER_MIG_PAUSE=true", "NVIDIA_DRIVER_MIG_RETRY_INTERVAL=20ms", "NVIDIA_DRIVER_MIG_RETRY=30s"}, mig.ResultPending, node.PhaseReady},
	} {
		m.env = append([]string{"NVIDIA_DRIVER_NFD_FEATURES_DIR=/etc/nfd", "NVIDIA_DRIVER_MIG_PAUSE=false"}, tc.env...)
		r, logs := m.runner(tc.layout, false)

		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)

		go func() { done <- r.Run(ctx) }()

		waitFor(t, 20*time.Second, tc.name+": never up\n"+logs.String(), func() bool {
			p := r.Status().Phase
			return p == node.PhaseReady || p == node.PhaseDegraded
		})
		st := r.Status()

		same(500 * time.Millisecond) // 25 tries of the retry

		// The status file says the layout's state instead.
		status, err := os.ReadFile(filepath.Join(m.host, "run/nvidia-driver/status.json"))
		require.NoError(t, err)
		assert.Contains(t, string(status), fmt.Sprintf(`MIG layout \"%s\"`, tc.layout), tc.name)

		cancel()
		require.NoError(t, <-done)

		assert.Equal(t, tc.phase, st.Phase, "%s: %s", tc.name, st.Message)

		if tc.result != "" {
			require.NotEmpty(t, st.MIG, tc.name)
			assert.Equal(t, tc.result, st.MIG[0].Result, tc.name)
		}
	}

	requireNotRestarted(t, pluginDone, watchOut)

	// The operands let go: the layout is applied, its MIG devices are new, so is the file.
	operands(0)

	st, logs = m.run("first-two", false)
	require.Equal(t, node.PhaseReady, st.Phase, logs)
	require.Equal(t, mig.ResultSuccess, st.MIG[0].Result, logs)

	applied, err := os.ReadFile(m.readyFile())
	require.NoError(t, err)
	require.NotEqual(t, string(first), string(applied))
	assert.Contains(t, string(applied), "3g.71gb")

	requireRestarted(t, pluginDone, watchOut)
}
