package mig_test

import (
	"context"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/pkg/gpu/models"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu/sim"
	"github.com/talos-nvidia/nvidia-driver/pkg/mig"
)

// TestPlannerAndSimulatorShareOneSource fails if the offline planner's view of a model (its
// data file) and what the simulated NVML answers for the same model ever differ: GPU-instance
// profiles, names and placements (read through mig.ReadGPUs, as on a node), and, for a GPU
// instance of every profile, the compute profiles and their placements NVML offers.
func TestPlannerAndSimulatorShareOneSource(t *testing.T) {
	for _, key := range models.Keys() {
		t.Run(key, func(t *testing.T) {
			m, err := models.Lookup(key)
			require.NoError(t, err)

			offline := mig.FromModel(m, 0)

			node := sim.New(m, 1)
			require.Equal(t, nvml.SUCCESS, node.Init())

			online, err := mig.ReadGPUs(node)
			require.NoError(t, err)
			require.Len(t, online, 1)
			// Names included: online they are computed from NVML's memory sizes as nvidia-smi
			// does, offline they are the data file's.
			assert.Equal(t, offline.Profiles, online[0].Profiles, "GPU-instance profiles")
			assert.Equal(t, offline.PciDeviceID, online[0].PciDeviceID)
			assert.Equal(t, offline.MemoryBytes, online[0].MemoryBytes)

			dev, _ := node.DeviceGetHandleByIndex(0)
			activation, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE)
			require.Equal(t, nvml.SUCCESS, ret)
			if activation == nvml.ERROR_RESET_REQUIRED {
				require.NoError(t, node.ResetGPU(context.Background(), 0))
			}

			dev, _ = node.DeviceGetHandleByIndex(0)

			for _, p := range offline.Profiles {
				info := p.Info
				gi, ret := dev.CreateGpuInstanceWithPlacement(&info, &p.Placements[0])
				require.Equal(t, nvml.SUCCESS, ret, p.Name)

				var got []models.CIProfile

				for idx := 0; idx < nvml.COMPUTE_INSTANCE_PROFILE_COUNT; idx++ {
					ci, ret := gi.GetComputeInstanceProfileInfo(idx, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
					if ret == nvml.ERROR_NOT_SUPPORTED {
						continue
					}

					require.Equal(t, nvml.SUCCESS, ret)
					pls, ret := gi.GetComputeInstancePossiblePlacements(&ci)
					require.Equal(t, nvml.SUCCESS, ret)

					c := models.CIProfile{Index: idx, SliceCount: ci.SliceCount, InstanceCount: ci.InstanceCount}
					for _, pl := range pls {
						require.Equal(t, ci.SliceCount, pl.Size)
						c.Starts = append(c.Starts, pl.Start)
					}

					got = append(got, c)
				}

				assert.Equal(t, offline.ComputeProfiles[p.Info.SliceCount], got, "compute profiles of %s", p.Name)
				require.Equal(t, nvml.SUCCESS, gi.Destroy())
			}
		})
	}
}
