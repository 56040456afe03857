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

	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu/sim"
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

// TestPendingLayoutPausesOperandsAndFinishes is the service's side of the pause cycle: the
// device plugin and the DCGM exporter hold the H200s through NVML, where the service cannot
// see them, so the layout ends pending. The service asks for their pause in the NFD feature
// file; once they have let go (their pods gone) the next try applies the layout, the
// readiness file and CDI spec show the MIG devices, and the pause is lifted with
// mig.config.state=success. Each step's time is logged.
func TestPendingLayoutPausesOperandsAndFinishes(t *testing.T) {
	gpus := sim.New(testutil.Model(t, "h200"), 4)
	operands := func(n int) {
		for i := range 4 {
			gpus.SetClients(i, n) // the device plugin and DCGM exporter: NVML clients, not processes
		}
	}
	operands(2)

	m := newMIGNode(t, gpus, busyLayouts)
	m.env = []string{"NVIDIA_DRIVER_NFD_FEATURES_DIR=/etc/nfd", "NVIDIA_DRIVER_MIG_RETRY_INTERVAL=50ms", "NVIDIA_DRIVER_MIG_RETRY=30s"}
	features := filepath.Join(m.host, "etc/nfd", nfd.DefaultName)
	labels := func() string { b, _ := os.ReadFile(features); return string(b) }

	r, logs := m.runner("first-two", false)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- r.Run(ctx) }()

	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()

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
