package models_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu/models"
)

var known = []string{
	"a100-40gb", "a100-80gb", "a100-pcie-40gb", "a100-pcie-80gb", "a30", "a800-40gb", "a800-80gb", "b200", "b300",
	"gb200", "gb300", "gh200", "gh200-144gb", "h100-80gb", "h100-96gb", "h100-nvl", "h100-pcie", "h20", "h200",
	"h200-nvl", "h800", "rtx-pro-6000",
}

// TestEveryModelLoads: each data file parses strictly, says where its numbers come from, and
// has compute profiles for every GPU-instance size it lists; no device id belongs to two files.
func TestEveryModelLoads(t *testing.T) {
	require.Equal(t, known, models.Keys())

	owner := map[uint32]string{}

	for _, key := range models.Keys() {
		m, err := models.Lookup(key)
		require.NoError(t, err, key)
		assert.NotEmpty(t, m.Source, key)
		assert.NotEmpty(t, m.Profiles, key)

		for _, p := range m.Profiles {
			assert.NotEmpty(t, m.ComputeProfiles[p.Info.SliceCount], "%s: %s", key, p.Name)
		}

		for _, id := range append([]uint32{m.PciDeviceID}, m.AlsoPciDeviceIDs...) {
			require.Empty(t, owner[id], "%s: device id %#x is %s's too", key, id, owner[id])
			owner[id] = key

			byID, ok := models.ByPCIID(id)
			require.True(t, ok)
			assert.Equal(t, key, byID.Key)
		}

		slices := m.ComputeSlices()
		assert.Contains(t, []uint32{4, 7}, slices, key)
	}

	_, err := models.Lookup("t4")
	require.ErrorContains(t, err, `unknown GPU model "t4" (known: a100-40gb, a100-80gb, a100-pcie-40gb,`)
}

// TestUnverifiedIsSaid: a file whose numbers are not all from a source says which are not;
// the models read from hardware or wholly from the guide's tables say nothing.
func TestUnverifiedIsSaid(t *testing.T) {
	for _, key := range models.Keys() {
		m, err := models.Lookup(key)
		require.NoError(t, err)

		switch key {
		case "a100-40gb", "a100-80gb", "h100-80gb", "h200":
			assert.Empty(t, m.Unverified, key)
		default:
			assert.NotEmpty(t, m.Unverified, key)
		}
	}
}

// TestH200IsTheFixture: the H200 file's GPU-instance profiles are the measured fixture's, unchanged.
func TestH200IsTheFixture(t *testing.T) {
	read := func(p string) []map[string]any {
		data, err := os.ReadFile(p)
		require.NoError(t, err)

		var f struct {
			Profiles []map[string]any `json:"gpuInstanceProfiles"`
		}

		require.NoError(t, json.Unmarshal(data, &f))

		return f.Profiles
	}

	fixture := read(filepath.Join(testutil.RepoRoot(t), "internal/sim/testdata/h200-mig.json"))
	assert.Equal(t, fixture, read("data/h200.json"))
}
