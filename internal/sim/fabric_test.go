package sim_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/internal/sim"
	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu"
)

// TestFabricRegistration: without a fabric NVML says NOT_SUPPORTED; on an NVSwitch board the
// GPUs are in progress until a fabric manager has run for RegisterAfter, then completed.
func TestFabricRegistration(t *testing.T) {
	n := sim.New(testutil.Model(t, "h200"), 2)
	require.Equal(t, nvml.SUCCESS, n.Init())

	states, err := gpu.Fabric(n)
	require.NoError(t, err)
	assert.Equal(t, []gpu.FabricState{{Index: 0, State: gpu.FabricNotSupported}, {Index: 1, State: gpu.FabricNotSupported}}, states)

	var manager atomic.Bool

	n.SetFabric(sim.Fabric{Manager: manager.Load, RegisterAfter: 50 * time.Millisecond})

	states, err = gpu.Fabric(n)
	require.NoError(t, err)
	assert.Equal(t, gpu.FabricInProgress, states[1].State)

	manager.Store(true)

	states, err = gpu.Fabric(n)
	require.NoError(t, err)
	assert.Equal(t, gpu.FabricInProgress, states[0].State, "registration takes a while")

	time.Sleep(60 * time.Millisecond)

	states, err = gpu.Fabric(n)
	require.NoError(t, err)
	assert.Equal(t, []gpu.FabricState{{Index: 0, State: gpu.FabricCompleted}, {Index: 1, State: gpu.FabricCompleted}}, states)
	assert.True(t, states[0].Registered())

	n.SetFabric(sim.Fabric{Manager: func() bool { return true }, Status: nvml.ERROR_INSUFFICIENT_RESOURCES})

	states, err = gpu.Fabric(n)
	require.NoError(t, err)
	assert.Equal(t, gpu.FabricCompleted, states[0].State)
	assert.False(t, states[0].Registered())
	assert.NotEmpty(t, states[0].Error)

	n.InjectFault(sim.Fault{Method: "Device.GetGpuFabricInfo", GPU: 1, Ret: nvml.ERROR_UNKNOWN})

	_, err = gpu.Fabric(n)
	require.ErrorContains(t, err, "GPU 1: reading its fabric registration")
}
