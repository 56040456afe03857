package node_test

import (
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

	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu/sim"
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

// TestReadinessFollowsTheDevicesAndDriverWatchRestartsThePlugin: the readiness file's bytes
// change with the set of devices, and only then. deploy/'s real driver-watch runs against it
// with a stand-in plugin: a restart of the service that changes nothing leaves the file
// byte-identical and the plugin alone; an edit of the layout under the same name rebuilds
// the instances, changes the file, and driver-watch sends the plugin SIGHUP.
func TestReadinessFollowsTheDevicesAndDriverWatchRestartsThePlugin(t *testing.T) {
	for _, prog := range []string{"pidof", "cmp", "sleep"} {
		_, err := exec.LookPath(prog)
		require.NoError(t, err, "%s: the plugin image's busybox has it; install it here", prog)
	}

	const before = "version: v1\nmig-configs:\n  inference:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"3g.71gb\": 2}\n"

	const after = "version: v1\nmig-configs:\n  inference:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"2g.35gb\": 3}\n"

	m := newMIGNode(t, sim.New(testutil.Model(t, "h200"), 2), before)

	st, logs := m.run("inference", false)
	require.Equal(t, node.PhaseReady, st.Phase, logs)

	m.calls() // the first layout's calls

	first, err := os.ReadFile(m.readyFile())
	require.NoError(t, err)
	assert.Contains(t, string(first), `"migDevices"`)

	// What wait-for-driver does before the plugin starts: it keeps the file it started on.
	seen := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(seen, "nvidia-driver.ready"), first, 0o644))

	sleepBin, err := exec.LookPath("sleep")
	require.NoError(t, err)
	data, err := os.ReadFile(sleepBin)
	require.NoError(t, err)

	plugin := filepath.Join(t.TempDir(), pluginName)
	require.NoError(t, os.WriteFile(plugin, data, 0o755))

	pluginDone := startProcess(t, exec.Command(plugin, "600"))

	var watchOut testutil.SyncBuffer

	watch := exec.Command("/bin/sh", "-c", driverWatch(t, m.host, seen))
	watch.Stdout, watch.Stderr = &watchOut, &watchOut
	startProcess(t, watch)

	// A restart with nothing to change: the same bytes, no signal.
	st, logs = m.run("inference", false)
	require.Equal(t, node.PhaseReady, st.Phase, logs)
	per, _ := m.calls()
	assert.Empty(t, per, "nothing changed")

	again, err := os.ReadFile(m.readyFile())
	require.NoError(t, err)
	require.Equal(t, string(first), string(again), "a no-op restart rewrites the same bytes")

	select {
	case err := <-pluginDone:
		t.Fatalf("plugin signalled though nothing changed: %v\n%s", err, watchOut.String())
	case <-time.After(time.Second): // ten of driver-watch's polls
	}

	// The same layout name, new content: the instances are made again.
	require.NoError(t, os.WriteFile(m.file, []byte(after), 0o644))

	st, logs = m.run("inference", false)
	require.Equal(t, node.PhaseReady, st.Phase, logs)

	edited, err := os.ReadFile(m.readyFile())
	require.NoError(t, err)
	require.NotEqual(t, string(first), string(edited), "the devices changed, so must the file")
	assert.Contains(t, string(edited), "2g.35gb")

	select {
	case err := <-pluginDone:
		var exitErr *exec.ExitError
		require.ErrorAs(t, err, &exitErr)
		ws, _ := exitErr.Sys().(syscall.WaitStatus)
		require.True(t, ws.Signaled(), "the plugin ended without a signal: %v", err)
		assert.Equal(t, syscall.SIGHUP, ws.Signal())
	case <-time.After(10 * time.Second):
		t.Fatalf("driver-watch did not signal the plugin after the readiness file changed\n%s", watchOut.String())
	}
}
