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

// TestEveryModelLoads: each data file parses strictly, says where its numbers come from, and
// has compute profiles for every GPU-instance size it lists.
func TestEveryModelLoads(t *testing.T) {
	require.Equal(t, []string{"a100-40gb", "a100-80gb", "a30", "h100-80gb", "h200"}, models.Keys())

	for _, key := range models.Keys() {
		m, err := models.Lookup(key)
		require.NoError(t, err, key)
		assert.NotEmpty(t, m.Source, key)
		assert.NotEmpty(t, m.Profiles, key)

		for _, p := range m.Profiles {
			assert.NotEmpty(t, m.ComputeProfiles[p.Info.SliceCount], "%s: %s", key, p.Name)
		}

		byID, ok := models.ByPCIID(m.PciDeviceID)
		require.True(t, ok)
		assert.Equal(t, key, byID.Key)
	}

	_, err := models.Lookup("t4")
	require.EqualError(t, err, `unknown GPU model "t4" (known: a100-40gb, a100-80gb, a30, h100-80gb, h200)`)
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

	fixture := read(filepath.Join(testutil.RepoRoot(t), "pkg/gpu/sim/testdata/h200-mig.json"))
	assert.Equal(t, fixture, read("data/h200.json"))
}
