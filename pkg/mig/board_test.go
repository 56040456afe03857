package mig_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/internal/sim"
	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
	"github.com/talos-nvidia/nvidia-driver/pkg/mig"
)

// boardLayouts: GPUs 0 to 2 into MIG; GPU 3, already in MIG with one instance, left alone.
const boardLayouts = `version: v1
mig-configs:
  first-three:
    - devices: [0, 1, 2]
      mig-enabled: true
      mig-devices: {"3g.40gb": 2}
`

// boardRig is an HGX A100 of 4 GPUs (no reset of one GPU) whose GPU 3 is in MIG with one
// 7g.80gb instance, and an applier that knows the board resets only as a whole.
func boardRig(t *testing.T) *rig {
	r := newRig(t, "a100-80gb", 4)

	r.pd.hold(0) // as if suspended, for the reset that enables MIG on GPU 3
	dev := testutil.EnableMIG(t, r.node, 3)
	info, ret := dev.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_7_SLICE)
	require.Equal(t, nvml.SUCCESS, ret)
	gi, ret := dev.CreateGpuInstance(&info)
	require.Equal(t, nvml.SUCCESS, ret)
	ci, ret := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	require.Equal(t, nvml.SUCCESS, ret)
	_, ret = gi.CreateComputeInstance(&ci)
	require.Equal(t, nvml.SUCCESS, ret)

	r.pd.hold(1)
	r.node.SetBoard(sim.Board{NoPerGPUReset: true})
	r.node.ResetCounters()
	r.applier.WholeBoard = true

	return r
}

func boardConfig(t *testing.T) *mig.Config {
	cfg, err := mig.Parse([]byte(boardLayouts))
	require.NoError(t, err)

	return cfg
}

// TestNVSwitchBoardResetsOnceForAll: on an NVSwitch A100 board the modes of the three GPUs
// are set first and the board is reset once, all four GPUs together, as mig-parted does; the
// three get their instances, GPU 3 its instance back, and nothing is reset GPU by GPU.
func TestNVSwitchBoardResetsOnceForAll(t *testing.T) {
	r := boardRig(t)

	statuses, err := r.applier.Apply(context.Background(), boardConfig(t), "first-three")
	require.NoError(t, err)

	for i := range 3 {
		assert.Equal(t, mig.ResultSuccess, statuses[i].Result, statuses[i].Message)
		assert.Contains(t, statuses[i].Message, "after the reset of all 4 GPUs of the board")

		st, _ := r.state(t, i)
		assert.Equal(t, "MIG on: 3g.40gb@0[3g.40gb] 3g.40gb@4[3g.40gb]", st.String())
	}

	assert.Equal(t, mig.ResultSuccess, statuses[3].Result)
	assert.True(t, statuses[3].Changed, "its instance is a new one: its MIG device changed")
	assert.Contains(t, statuses[3].Message, "its instances were made again after the board's reset")

	st, _ := r.state(t, 3)
	assert.Equal(t, "MIG on: 7g.80gb@0[7g.80gb]", st.String())

	assert.Equal(t, 3, r.node.Calls(sim.MSetMigMode))
	assert.Equal(t, 1, r.node.Calls(sim.MResetGPUs))
	assert.Zero(t, r.node.Calls(sim.MResetGPU))
	assert.Equal(t, []int{0, 1, 2, 3}, r.changes[0])
	assert.Equal(t, 1, r.node.Clients(0), "persistenced resumed")

	// Applied: a restart changes nothing.
	r.node.ResetCounters()
	_, err = r.applier.Apply(context.Background(), boardConfig(t), "first-three")
	require.NoError(t, err)
	assert.Zero(t, r.node.MutatingCalls())
}

// TestNVSwitchBoardResetWaitsForEveryGPU: a holder on GPU 3, which the layout does not
// select, keeps the whole board from being reset: the three GPUs stay pending, naming it,
// with the pending mode kept; GPU 3 is not touched. Once the holder is gone the next apply
// finishes with the one reset.
func TestNVSwitchBoardResetWaitsForEveryGPU(t *testing.T) {
	r := boardRig(t)

	r.node.Hold(sim.Holder{PID: 4200, Name: "dcgm-exporter", GPUs: []int{3}})
	host := t.TempDir()
	require.NoError(t, sim.WriteProcFS(host, r.node))
	r.applier.ProcRoot = filepath.Join(host, "proc")

	statuses, err := r.applier.Apply(context.Background(), boardConfig(t), "first-three")
	require.NoError(t, err)

	for i := range 3 {
		assert.Equal(t, mig.ResultPending, statuses[i].Result, statuses[i].Message)
		assert.Contains(t, statuses[i].Message, "the board's GPUs reset only together, and gpu 3 by dcgm-exporter (pid 4200)")
		assert.Equal(t, "dcgm-exporter", statuses[i].Holders[0].Name)

		cur, pending := r.state(t, i)
		assert.False(t, cur.MigEnabled)
		assert.Equal(t, nvml.DEVICE_MIG_ENABLE, pending)
	}

	assert.Zero(t, r.node.Calls(sim.MResetGPUs))
	assert.Equal(t, "MIG on: 7g.80gb@0[7g.80gb]", func() string { st, _ := r.state(t, 3); return st.String() }())

	r.node.Release(4200)
	require.NoError(t, sim.WriteProcFS(host, r.node))

	statuses, err = r.applier.Apply(context.Background(), boardConfig(t), "first-three")
	require.NoError(t, err)

	for i := range 3 {
		assert.Equal(t, mig.ResultSuccess, statuses[i].Result, statuses[i].Message)
	}

	assert.Equal(t, 1, r.node.Calls(sim.MResetGPUs))
}

// TestNVSwitchBoardWithoutResetEndsPendingReboot: where the kernel offers no reset of a GPU
// (mig-parted's assert_gpu_reset_available), or the reset fails, the modes stay pending
// until a reboot, and GPU 3 keeps its instance.
func TestNVSwitchBoardWithoutResetEndsPendingReboot(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		set        func(r *rig)
	}{
		{"no sysfs reset", "the kernel offers no reset of GPU 0000:07:00.0", func(r *rig) {
			r.applier.NoReset = "the kernel offers no reset of GPU 0000:07:00.0 (no sysfs reset)"
		}},
		{"reset fails", "resetting the board's GPUs failed", func(r *rig) {
			r.node.InjectFault(sim.Fault{Method: sim.MResetGPUs, GPU: -1, Times: 1, Ret: nvml.ERROR_UNKNOWN})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := boardRig(t)
			tc.set(r)

			statuses, err := r.applier.Apply(context.Background(), boardConfig(t), "first-three")
			require.NoError(t, err)

			for i := range 3 {
				assert.Equal(t, mig.ResultPendingReboot, statuses[i].Result, statuses[i].Message)
				assert.Contains(t, statuses[i].Message, tc.want)
				assert.Contains(t, statuses[i].Message, "reboot to finish")
			}

			st, _ := r.state(t, 3)
			assert.Equal(t, "MIG on: 7g.80gb@0[7g.80gb]", st.String())
			assert.Equal(t, mig.ResultSuccess, statuses[3].Result)
			assert.False(t, statuses[3].Changed)
		})
	}
}
