package mig_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/pkg/gpu"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu/models"
	"github.com/talos-nvidia/nvidia-driver/pkg/mig"
)

// TestGPUsWithoutMIG: as in mig-parted's ApplyMigMode (cmd/nvidia-mig-parted/apply/mode.go),
// `devices: all` passes over a GPU without MIG, and naming one by index for MIG is an error.
func TestGPUsWithoutMIG(t *testing.T) {
	h200, err := models.Lookup("h200")
	require.NoError(t, err)

	node := func() []*mig.GPU {
		return []*mig.GPU{
			mig.FromModel(h200, 0),
			{GPU: gpu.GPU{Index: 1, UUID: "GPU-l40s", Name: "NVIDIA L40S", PciDeviceID: 0x26B910DE}},
		}
	}

	cfg, err := mig.Parse([]byte(`version: v1
mig-configs:
  all-3g:
    - devices: all
      mig-enabled: true
      mig-devices: {"3g.71gb": 2}
  by-index:
    - devices: [0, 1]
      mig-enabled: true
      mig-devices: {"3g.71gb": 2}
`))
	require.NoError(t, err)

	plan, err := mig.PlanLayout(cfg, "all-3g", node())
	require.NoError(t, err)
	require.Len(t, plan.GPUs, 2)
	assert.True(t, plan.GPUs[0].Selected)
	assert.Equal(t, "MIG on: 3g.71gb@0[3g.71gb] 3g.71gb@4[3g.71gb]", plan.GPUs[0].Target.String())
	assert.False(t, plan.GPUs[1].Selected, "the L40S is left as it is")

	_, err = mig.PlanLayout(cfg, "by-index", node())
	require.EqualError(t, err, `layout "by-index" does not fit: layout "by-index", entry 0: GPU 1 (NVIDIA L40S): this GPU does not support MIG`)

	for _, builtin := range []string{mig.LayoutAll1g, mig.LayoutAllBalanced, mig.LayoutAllMax, mig.LayoutAllEnabled} {
		plan, err := mig.PlanLayout(cfg.WithBuiltins(), builtin, node())
		require.NoError(t, err, builtin)
		assert.True(t, plan.GPUs[0].Selected, builtin)
		assert.False(t, plan.GPUs[1].Selected, builtin)
	}
}
