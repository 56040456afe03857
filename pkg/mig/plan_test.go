package mig_test

import (
	"context"
	"os"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/internal/sim"
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

// TestBuiltinBalancedIsNVIDIAs: the built-in all-balanced gives every known model what
// NVIDIA's published all-balanced gives it (the GPU Operator's default file, one entry per
// device id): 2 × 1g, 1 × 2g, 1 × 3g on 7-slice GPUs, 2 × 1g, 1 × 2g on 4-slice ones (A30).
// A node of mixed slice counts takes it whole.
func TestBuiltinBalancedIsNVIDIAs(t *testing.T) {
	data, err := os.ReadFile("testdata/gpu-operator-default-mig-config.yaml")
	require.NoError(t, err)
	nvidia, err := mig.Parse(data)
	require.NoError(t, err)

	var node []*mig.GPU

	for i, key := range models.Keys() {
		m, err := models.Lookup(key)
		require.NoError(t, err)

		theirs, err := mig.PlanLayout(nvidia, mig.LayoutAllBalanced, []*mig.GPU{mig.FromModel(m, 0)})
		require.NoError(t, err, key)
		require.True(t, theirs.GPUs[0].Selected, "%s: NVIDIA's file has an all-balanced entry for it", key)

		ours, err := mig.PlanLayout(mig.Builtin(), mig.LayoutAllBalanced, []*mig.GPU{mig.FromModel(m, 0)})
		require.NoError(t, err, key)
		assert.Equal(t, theirs.GPUs[0].Target.String(), ours.GPUs[0].Target.String(), key)

		node = append(node, mig.FromModel(m, i))
	}

	a30, err := models.Lookup("a30")
	require.NoError(t, err)

	plan, err := mig.PlanLayout(mig.Builtin(), mig.LayoutAllBalanced, []*mig.GPU{mig.FromModel(a30, 0)})
	require.NoError(t, err)
	assert.Equal(t, "MIG on: 2g.12gb@0[2g.12gb] 1g.6gb@2[1g.6gb] 1g.6gb@3[1g.6gb]", plan.GPUs[0].Target.String())

	plan, err = mig.PlanLayout(mig.Builtin(), mig.LayoutAllBalanced, node)
	require.NoError(t, err, "a node of every model")
	assert.Equal(t, len(node), plan.Selected())
}
