package mig_test

import (
	"os"
	"sort"
	"strings"
	"testing"

	nvdev "github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/talos-nvidia/nvidia-driver/internal/sim"
	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu/models"
	"github.com/talos-nvidia/nvidia-driver/pkg/mig"
)

// TestPlannerAndSimulatorShareOneSource fails if the offline planner's view of a model (its
// data file) and what the simulated NVML answers for the same model ever differ: GPU-instance
// profiles, names and placements (read through mig.ReadGPUs, as on a node), and, for a GPU
// instance of every profile, the compute profiles and their placements NVML offers.
func TestPlannerAndSimulatorShareOneSource(t *testing.T) {
	forEachModel(t, func(t *testing.T, m models.Model, node *sim.Node) {
		offline := mig.FromModel(m, 0)

		online, err := mig.ReadGPUs(node)
		require.NoError(t, err)
		require.Len(t, online, 1)
		// Names included: online they are computed from NVML's memory sizes as nvidia-smi
		// does, offline they are the data file's.
		assert.Equal(t, offline.Profiles, online[0].Profiles, "GPU-instance profiles")
		assert.Equal(t, offline.PciDeviceID, online[0].PciDeviceID)
		assert.Equal(t, offline.MemoryBytes, online[0].MemoryBytes)

		dev := testutil.EnableMIG(t, node, 0)

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

// forEachModel runs f on a simulated node of one GPU of each model with a data file.
func forEachModel(t *testing.T, f func(t *testing.T, m models.Model, node *sim.Node)) {
	for _, key := range models.Keys() {
		t.Run(key, func(t *testing.T) {
			m, err := models.Lookup(key)
			require.NoError(t, err)

			node := sim.New(m, 1)
			require.Equal(t, nvml.SUCCESS, node.Init())

			f(t, m, node)
		})
	}
}

// TestProfileNamesAsGoNVLibNamesThem runs NVIDIA's own naming code, go-nvlib's
// MigProfileInfo (pkg/nvlib/device/mig_profile.go, what mig-parted and the device plugin
// use), over every model: the names it derives from NVML's answers (the simulated NVML,
// fed by the data files) are the names the planner knows, GPU-instance and compute-instance
// profiles alike. So a layout written the way mig-parted writes it names the same profiles.
func TestProfileNamesAsGoNVLibNamesThem(t *testing.T) {
	forEachModel(t, func(t *testing.T, m models.Model, node *sim.Node) {
		lib := nvdev.New(node, nvdev.WithVerifySymbols(false))

		// go-nvlib's VisitMigProfiles: every GPU-instance profile NVML answers, with the
		// compute-instance sizes it deems possible.
		profiles, err := lib.GetMigProfiles()
		require.NoError(t, err)

		var theirs []string
		for _, p := range profiles {
			theirs = append(theirs, p.String())
		}

		// Ours: each data-file profile, and each compute profile smaller than its GPU
		// instance, named as the planner names them.
		g := mig.FromModel(m, 0)

		var ours []string
		for _, p := range g.Profiles {
			for _, c := range g.ComputeProfiles[p.Info.SliceCount] {
				if c.SliceCount == p.Info.SliceCount {
					ours = append(ours, p.Name)

					continue
				}

				ours = append(ours, mig.Profile{C: int(c.SliceCount), G: int(p.Info.SliceCount), GB: gbOf(t, p.Name), Attr: attrOf(p.Name)}.String())
			}

			// go-nvlib's name for the GPU instance with its full compute instance.
			full := fullCIIndex(t, p.Info.SliceCount)
			mp, err := lib.NewMigProfile(p.Index, full, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, p.Info.MemorySizeMB, m.MemoryBytes)
			require.NoError(t, err)
			assert.Equal(t, p.Name, mp.String(), "profile %d", p.Index)
		}

		sort.Strings(theirs)
		sort.Strings(ours)
		assert.Equal(t, theirs, ours)
	})
}

// TestProfileGrammarAsGoNVLibParsesIt: every profile name in NVIDIA's default layouts and
// the data files, and the malformed ones of our tests, are read alike by go-nvlib's parser
// (the one mig-parted checks mig-devices keys with) and ours. Ours accepts a subset of its
// grammar: only the attributes NVML has (+me, +me.all, +gfx, -me) and no compute part equal to
// the GPU instance, which mig-parted could never report back as applied.
func TestProfileGrammarAsGoNVLibParsesIt(t *testing.T) {
	lib := nvdev.New(nil)

	data, err := os.ReadFile("testdata/gpu-operator-default-mig-config.yaml")
	require.NoError(t, err)

	var doc struct {
		Configs map[string][]struct {
			Devices map[string]int `yaml:"mig-devices"`
		} `yaml:"mig-configs"`
	}
	require.NoError(t, yaml.Unmarshal(data, &doc))

	names := map[string]bool{"1c.3g.40gb": true, "2c.7g.141gb": true, "1c.2g.35gb+me": true}
	for _, entries := range doc.Configs {
		for _, e := range entries {
			for n := range e.Devices {
				names[n] = true
			}
		}
	}

	for _, key := range models.Keys() {
		m, err := models.Lookup(key)
		require.NoError(t, err)

		for _, p := range m.Profiles {
			names[p.Name] = true
		}
	}

	require.Greater(t, len(names), 60)

	for n := range names {
		require.NoError(t, lib.AssertValidMigProfileFormat(n), n)

		ours, err := mig.ParseProfile(n)
		require.NoError(t, err, n)
		assert.Equal(t, n, ours.String(), "ours writes it back unchanged")
	}

	// Malformed for both.
	for _, n := range []string{"", "3g", "3g.40", "g.40gb", "3g.gb", "3g.40gb+", "3g.40gb+me-me", "x1g.5gb", "1g.5gb+me,me", " 1g.5gb"} {
		assert.Error(t, lib.AssertValidMigProfileFormat(n), "go-nvlib: %q", n)

		_, err := mig.ParseProfile(n)
		assert.Error(t, err, "ours: %q", n)
	}
}

func gbOf(t *testing.T, name string) int {
	p, err := mig.ParseProfile(name)
	require.NoError(t, err)

	return p.GB
}

func attrOf(name string) string {
	if i := strings.IndexAny(name, "+-"); i >= 0 {
		return name[i:]
	}

	return ""
}

// fullCIIndex is the NVML compute-instance profile of s slices (nvml.h).
func fullCIIndex(t *testing.T, s uint32) int {
	idx := map[uint32]int{
		1: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 2: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE, 3: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE,
		4: nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE, 6: nvml.COMPUTE_INSTANCE_PROFILE_6_SLICE, 7: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE,
		8: nvml.COMPUTE_INSTANCE_PROFILE_8_SLICE,
	}
	i, ok := idx[s]
	require.True(t, ok, "%d slices", s)

	return i
}
