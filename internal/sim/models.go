package sim

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/talos-nvidia/nvidia-driver/pkg/gpu/models"
)

// ModelSpec describes one simulated GPU model: the data file of pkg/gpu/models, the same
// one the offline planner reads.
type ModelSpec = models.Model

// GIProfile is one GPU-instance profile of a model.
type GIProfile = models.GIProfile

// Models lists the keys of the simulated models, sorted.
func Models() []string { return models.Keys() }

// LookupModel returns the spec of a model by key.
func LookupModel(key string) (ModelSpec, error) { return models.Lookup(key) }

func profileByID(m *ModelSpec, id uint32) (GIProfile, bool) {
	for _, p := range m.Profiles {
		if p.Info.Id == id {
			return p, true
		}
	}

	return GIProfile{}, false
}

// ciProfile returns the compute profile of NVML index idx that a GPU instance of giSlices
// offers.
func ciProfile(m *ModelSpec, giSlices uint32, idx int) (models.CIProfile, bool) {
	for _, c := range m.ComputeProfiles[giSlices] {
		if c.Index == idx {
			return c, true
		}
	}

	return models.CIProfile{}, false
}

// ciProfileBySize returns the compute profile of size slices in a GPU instance of giSlices.
func ciProfileBySize(m *ModelSpec, giSlices, size uint32) (models.CIProfile, bool) {
	for _, c := range m.ComputeProfiles[giSlices] {
		if c.SliceCount == size {
			return c, true
		}
	}

	return models.CIProfile{}, false
}

// ciProfileIDForSize is the profile id NVML reports for a compute instance of size slices.
func ciProfileIDForSize(m *ModelSpec, giSlices, size uint32) uint32 {
	if c, ok := ciProfileBySize(m, giSlices, size); ok {
		return uint32(c.Index)
	}

	return uint32(nvml.COMPUTE_INSTANCE_PROFILE_COUNT)
}

const mib = 1024 * 1024
