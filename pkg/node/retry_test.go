package node_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/internal/sim"
	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
	"github.com/talos-nvidia/nvidia-driver/pkg/mig"
	"github.com/talos-nvidia/nvidia-driver/pkg/nfd"
	"github.com/talos-nvidia/nvidia-driver/pkg/node"
)

// waitFor polls cond every 5 ms until it holds, or fails the test after within.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()

	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			t.Fatalf("after %s: %s", within, what)
		}

		time.Sleep(5 * time.Millisecond)
	}

	return time.Since(start)
}

// heldNode is a service running on GPUs that the operands hold, with the pause on and a try
// every 50 ms.
type heldNode struct {
	gpus *sim.Node
	m    *migNode
	r    *node.Runner
	logs *testutil.SyncBuffer
	// labels reads the NFD feature file; operands sets how many NVML clients hold each GPU.
	labels   func() string
	operands func(n int)
}

// startHeld starts the service with layout on count H200s, each held by the device plugin
// and the DCGM exporter (NVML clients, not processes); it is stopped at the test's end.
func startHeld(t *testing.T, count int, layout string, cdi bool) heldNode {
	t.Helper()

	gpus := sim.New(testutil.Model(t, "h200"), count)
	h := heldNode{gpus: gpus, m: newMIGNode(t, gpus, busyLayouts)}
	h.operands = func(n int) {
		for i := range count {
			gpus.SetClients(i, n)
		}
	}
	h.operands(2)

	h.m.env = []string{"NVIDIA_DRIVER_NFD_FEATURES_DIR=/etc/nfd", "NVIDIA_DRIVER_MIG_RETRY_INTERVAL=50ms", "NVIDIA_DRIVER_MIG_RETRY=30s"}
	features := filepath.Join(h.m.host, "etc/nfd", nfd.DefaultName)
	h.labels = func() string { b, _ := os.ReadFile(features); return string(b) }
	h.r, h.logs = h.m.runner(layout, cdi)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- h.r.Run(ctx) }()

	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})

	return h
}

// TestPendingLayoutPausesOperandsAndFinishes is the service's side of the pause cycle: the
// device plugin and the DCGM exporter hold the H200s through NVML, where the service cannot
// see them, so the layout ends pending. The service asks for their pause in the NFD feature
// file; once they have let go (their pods gone) the next try applies the layout, the
// readiness file and CDI spec show the MIG devices, and the pause is lifted with
// mig.config.state=success. Each step's time is logged.
func TestPendingLayoutPausesOperandsAndFinishes(t *testing.T) {
	h := startHeld(t, 4, "first-two", false)
	gpus, m, r, logs, labels, operands := h.gpus, h.m, h.r, h.logs, h.labels, h.operands

	start := time.Now()

	paused := waitFor(t, 20*time.Second, "no pause asked for", func() bool {
		return strings.Contains(labels(), "nvidia.com/gpu.deploy.device-plugin=paused-for-mig-change")
	})
	assert.Contains(t, labels(), "nvidia.com/gpu.deploy.dcgm-exporter=paused-for-mig-change")
	assert.Contains(t, labels(), "nvidia.com/mig.config.state=pending")

	st := r.Status()
	require.Equal(t, mig.ResultPending, st.MIG[0].Result, logs.String())
	assert.Contains(t, st.MIG[0].Message, "something outside the service holds it")

	// The operands are still there: tries go on and the pause stays.
	waitFor(t, 20*time.Second, "not tried again", func() bool {
		return strings.Count(logs.String(), `msg="mig layout" gpu=0`) >= 3
	})
	assert.Contains(t, labels(), "paused-for-mig-change")
	assert.Equal(t, nvml.DEVICE_MIG_DISABLE, gpus.State(0).MigMode, "nothing changed while held")

	// NFD labelled the node and the DaemonSets' pods left: they let go of the GPUs.
	left := time.Now()
	operands(0)

	var readyAtLift []byte

	waitFor(t, 20*time.Second, "the pause was never lifted", func() bool {
		l := labels()
		if strings.Contains(l, "paused-for-mig-change") || !strings.Contains(l, "nvidia.com/mig.config.state=success") {
			return false
		}

		readyAtLift, _ = os.ReadFile(m.readyFile())

		return true
	})

	st = r.Status()
	for i := range 2 {
		assert.Equal(t, mig.ResultSuccess, st.MIG[i].Result, st.MIG[i].Message)
		assert.Len(t, gpus.State(i).Instances, 2)
		assert.Equal(t, nvml.DEVICE_MIG_ENABLE, gpus.State(i).MigMode)
	}

	// Written before the pause was lifted: the pods that come back read the new devices.
	assert.Contains(t, string(readyAtLift), `"name": "NVIDIA H200 MIG 3g.71gb"`)
	assert.Equal(t, node.PhaseReady, st.Phase, st.Message)
	assert.Contains(t, logs.String(), "mig layout applied once the GPUs were free")
	assert.Contains(t, logs.String(), "the operands' pause is lifted")

	t.Logf("pause asked %s after the start; layout applied and pause lifted %s after the operands let go (retry interval 50 ms); whole cycle %s",
		paused.Round(time.Millisecond), time.Since(left).Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}

// TestPendingLayoutWithoutPauseIsNotRetriedBlind: with migPause off and holders the service
// cannot name, nothing would make them go: no retry, and the log says what to do.
func TestPendingLayoutWithoutPauseIsNotRetriedBlind(t *testing.T) {
	gpus := sim.New(testutil.Model(t, "h200"), 4)
	for i := range 4 {
		gpus.SetClients(i, 1)
	}

	m := newMIGNode(t, gpus, busyLayouts)
	m.env = []string{"NVIDIA_DRIVER_NFD_FEATURES_DIR=/etc/nfd", "NVIDIA_DRIVER_MIG_PAUSE=false", "NVIDIA_DRIVER_MIG_RETRY_INTERVAL=10ms"}

	st, logs := m.run("first-two", false)

	require.Equal(t, mig.ResultPending, st.MIG[0].Result)
	assert.Equal(t, 1, strings.Count(logs, `msg="mig layout" gpu=0`), logs)
	assert.Contains(t, logs, "not retried: without the operands' pause")

	b, err := os.ReadFile(filepath.Join(m.host, "etc/nfd", nfd.DefaultName))
	require.NoError(t, err)
	assert.NotContains(t, string(b), "paused-for-mig-change")
}

// TestLayoutWithNoDeviceToServeLiftsThePause: all-enabled (MIG mode on, no instances) on
// H200s held by the operands. Once they let go, the layout is applied; nvcdi then finds no
// device for the CDI spec. The pause exists only while the layout changes: it is lifted all
// the same, and the status says what is wrong (no device to serve), degraded, instead of
// waiting for a spec that nothing but a new layout can give. The spec of the GPUs as they
// were is removed: it named whole GPUs that are now in MIG mode.
func TestLayoutWithNoDeviceToServeLiftsThePause(t *testing.T) {
	h := startHeld(t, 2, "all-enabled", true)
	gpus, m, r, logs, labels, operands := h.gpus, h.m, h.r, h.logs, h.labels, h.operands

	waitFor(t, 20*time.Second, "no pause asked for", func() bool {
		return strings.Contains(labels(), "nvidia.com/gpu.deploy.device-plugin=paused-for-mig-change")
	})
	assert.Subset(t, m.cdiDevices(), []string{"nvidia.com/gpu=0", "nvidia.com/gpu=1"}, "the GPUs are served as they are meanwhile")

	operands(0)

	waitFor(t, 20*time.Second, "the pause was never lifted\n"+logs.String(), func() bool {
		l := labels()
		return !strings.Contains(l, "paused-for-mig-change") && strings.Contains(l, "nvidia.com/mig.config.state=success")
	})

	for i := range 2 {
		assert.Equal(t, nvml.DEVICE_MIG_ENABLE, gpus.State(i).MigMode)
		assert.Empty(t, gpus.State(i).Instances)
	}

	waitFor(t, 5*time.Second, "the node never said it has no device to serve", func() bool {
		return r.Status().Phase == node.PhaseDegraded
	})

	st := r.Status()
	assert.Contains(t, st.Message, "no device to serve: GPU 0,1 in MIG mode without MIG instances", st.Message)
	assert.Empty(t, st.CDISpec)
	assert.Empty(t, m.cdiDevices(), "the spec of the whole GPUs is gone")
	assert.FileExists(t, m.readyFile(), "the operands come back and find the GPUs as they are")
	assert.Contains(t, logs.String(), "the operands' pause is lifted")
}

// TestLayoutWithNoDeviceToServeAtBringUp: the same layout on idle GPUs is applied at
// bring-up, and the node comes up degraded, saying why, instead of waiting for a CDI spec.
func TestLayoutWithNoDeviceToServeAtBringUp(t *testing.T) {
	gpus := sim.New(testutil.Model(t, "h200"), 2)
	m := newMIGNode(t, gpus, busyLayouts)
	m.env = []string{"NVIDIA_DRIVER_NFD_FEATURES_DIR=/etc/nfd"}

	st, logs := m.run("all-enabled", true)

	require.Equal(t, node.PhaseDegraded, st.Phase, logs)
	assert.Contains(t, st.Message, "no device to serve: GPU 0,1 in MIG mode without MIG instances")
	assert.FileExists(t, m.readyFile())

	b, err := os.ReadFile(filepath.Join(m.host, "etc/nfd", nfd.DefaultName))
	require.NoError(t, err)
	assert.Contains(t, string(b), "nvidia.com/mig.config.state=success")
}
