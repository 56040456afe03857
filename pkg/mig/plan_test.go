package mig_test

import (
	"context"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/pkg/gpu"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu/models"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu/sim"
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

// TestProfileWithoutPlacements: NVML may list a profile with no possible placement. Asking for
// it, in a file's layout or through a built-in one, is a clear error naming the GPU and the
// profile, never a panic; through the applier it is a layout error and no GPU is touched.
func TestProfileWithoutPlacements(t *testing.T) {
	h200, err := models.Lookup("h200")
	require.NoError(t, err)

	for i := range h200.Profiles {
		if h200.Profiles[i].Name == "1g.18gb" {
			h200.Profiles[i].Placements = nil
		}
	}

	cfg, err := mig.Parse([]byte("version: v1\nmig-configs:\n  small:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.18gb\": 2, \"3g.71gb\": 1}\n"))
	require.NoError(t, err)

	const want = `NVML reports no possible placement for profile 1g.18gb (GetGpuInstancePossiblePlacements returned none)`

	for _, layout := range []string{"small", mig.LayoutAll1g, mig.LayoutAllBalanced} {
		_, err := mig.PlanLayout(cfg.WithBuiltins(), layout, []*mig.GPU{mig.FromModel(h200, 0)})
		require.Error(t, err, layout)
		assert.Contains(t, err.Error(), `GPU 0 (NVIDIA H200): `+want, layout)
	}

	node := sim.New(h200, 1)
	applier := &mig.Applier{NVML: node}

	require.Equal(t, nvml.SUCCESS, node.Init())
	defer node.Shutdown() //nolint:errcheck

	_, err = applier.Apply(context.Background(), cfg, "small")

	var layoutErr *mig.LayoutError
	require.ErrorAs(t, err, &layoutErr)
	assert.Contains(t, err.Error(), want)
	assert.Zero(t, node.MutatingCalls())
}
