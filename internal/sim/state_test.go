package sim_test

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/internal/sim"
)

// TestStateRoundTrip: a node loaded from a saved state is the node that was saved, MIG
// instances, modes, resets and fabric included.
func TestStateRoundTrip(t *testing.T) {
	m, err := sim.LookupModel("h100-80gb")
	require.NoError(t, err)

	n := sim.New(m, 2)
	n.SetFabric(sim.Fabric{Manager: func() bool { return true }})
	require.Equal(t, nvml.SUCCESS, n.Init())

	d, _ := n.DeviceGetHandleByIndex(1)
	_, ret := d.SetMigMode(nvml.DEVICE_MIG_ENABLE)
	require.Equal(t, nvml.SUCCESS, ret)

	d, _ = n.DeviceGetHandleByIndex(1)
	p, _ := d.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_2_SLICE)
	gi, ret := d.CreateGpuInstanceWithPlacement(&p, &nvml.GpuInstancePlacement{Start: 2, Size: 2})
	require.Equal(t, nvml.SUCCESS, ret)

	cp, _ := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	_, ret = gi.CreateComputeInstanceWithPlacement(&cp, &nvml.ComputeInstancePlacement{Start: 1, Size: 1})
	require.Equal(t, nvml.SUCCESS, ret)

	data, err := n.MarshalState()
	require.NoError(t, err)

	back, err := sim.UnmarshalState(data)
	require.NoError(t, err)

	for i := range 2 {
		assert.Equal(t, n.State(i), back.State(i), "GPU %d", i)
		assert.Equal(t, n.Generation(i), back.Generation(i), "GPU %d", i)
	}

	assert.Equal(t, n.SaveState(), back.SaveState())

	require.Equal(t, nvml.SUCCESS, back.Init())
	bd, _ := back.DeviceGetHandleByIndex(0)
	fi, ret := bd.GetGpuFabricInfo()
	require.Equal(t, nvml.SUCCESS, ret)
	assert.Equal(t, uint8(nvml.GPU_FABRIC_STATE_COMPLETED), fi.State)

	_, err = sim.UnmarshalState([]byte(`{"gpus":[{"model":"no-such-gpu"}]}`))
	assert.ErrorContains(t, err, "GPU 0")
}
