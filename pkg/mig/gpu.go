package mig

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/talos-nvidia/nvidia-driver/pkg/gpu"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu/models"
)

// GIProfileInfo is one GPU-instance profile a GPU offers.
type GIProfileInfo struct {
	Index      int
	Name       string
	Info       nvml.GpuInstanceProfileInfo
	Placements []nvml.GpuInstancePlacement
}

// GPU is what the planner needs to know about one GPU: the GPU as every job sees it (pkg/gpu),
// and its MIG profiles.
type GPU struct {
	gpu.GPU
	// Profiles are the GPU-instance profiles, by NVML index: asked of NVML on a node, from
	// the model's data file offline.
	Profiles []GIProfileInfo
	// ComputeProfiles maps a GPU instance's slice count to the compute-instance profiles it
	// offers. NVML answers this only for a GPU instance that exists, so the planner takes it
	// from the model's data file (or, for a model without one, from the MIG user guide's
	// rule); the applier then places compute instances where NVML says they can go.
	ComputeProfiles map[uint32][]models.CIProfile
}

// MigCapable says whether the GPU has MIG profiles.
func (g *GPU) MigCapable() bool { return g.GPU.MigCapable() && len(g.Profiles) > 0 }

func (g *GPU) label() string { return fmt.Sprintf("GPU %d (%s)", g.Index, g.Name) }

func (g *GPU) profileByName(name string) (GIProfileInfo, bool) {
	for _, p := range g.Profiles {
		if p.Name == name {
			return p, true
		}
	}

	return GIProfileInfo{}, false
}

func (g *GPU) profileByID(id uint32) (GIProfileInfo, bool) {
	for _, p := range g.Profiles {
		if p.Info.Id == id {
			return p, true
		}
	}

	return GIProfileInfo{}, false
}

func (g *GPU) profileByIndex(idx int) (GIProfileInfo, bool) {
	for _, p := range g.Profiles {
		if p.Index == idx {
			return p, true
		}
	}

	return GIProfileInfo{}, false
}

// ProfileNames lists the GPU-instance profiles of the GPU, sorted.
func (g *GPU) ProfileNames() []string {
	names := make([]string, 0, len(g.Profiles))
	for _, p := range g.Profiles {
		names = append(names, p.Name)
	}

	sort.Strings(names)

	return names
}

// ReadGPUs reads every GPU of the node and, through NVML, its MIG profiles and placements.
// NVML must be initialized.
func ReadGPUs(lib nvml.Interface) ([]*GPU, error) {
	list, err := gpu.List(lib)
	if err != nil {
		return nil, err
	}

	gpus := make([]*GPU, 0, len(list))
	known := models.All()

	for _, base := range list {
		dev, ret := lib.DeviceGetHandleByIndex(base.Index)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("gpu %d: get handle: %w", base.Index, ret)
		}

		g, err := readProfiles(base, dev, known)
		if err != nil {
			return nil, err
		}

		gpus = append(gpus, g)
	}

	return gpus, nil
}

// readProfiles asks NVML for the GPU-instance profiles and their possible placements.
func readProfiles(base gpu.GPU, dev nvml.Device, known map[uint32]models.Model) (*GPU, error) {
	g := &GPU{GPU: base}
	if !base.MigCapable() {
		return g, nil
	}

	// nvml.h, nvmlDeviceGetGpuInstanceProfileInfo: "enumerate all MIG profiles ... starting
	// from 0, until the API returns NVML_ERROR_INVALID_ARGUMENT"; unsupported ones say so.
	for idx := 0; idx < nvml.GPU_INSTANCE_PROFILE_COUNT; idx++ {
		info, ret := dev.GetGpuInstanceProfileInfo(idx)
		if errors.Is(ret, nvml.ERROR_INVALID_ARGUMENT) {
			break
		}

		if errors.Is(ret, nvml.ERROR_NOT_SUPPORTED) {
			continue
		}

		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("gpu %d: get GPU instance profile %d: %w", g.Index, idx, ret)
		}

		pls, ret := dev.GetGpuInstancePossiblePlacements(&info)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("gpu %d: get placements of GPU instance profile %d: %w", g.Index, idx, ret)
		}

		name, err := giProfileName(idx, info, g.MemoryBytes)
		if err != nil {
			return nil, fmt.Errorf("gpu %d: %w", g.Index, err)
		}

		g.Profiles = append(g.Profiles, GIProfileInfo{Index: idx, Name: name, Info: info, Placements: pls})
	}

	g.ComputeProfiles = computeProfiles(g, known)

	return g, nil
}

// computeProfiles are the compute profiles of a GPU's model data where the model is known
// (by PCI id), else the MIG user guide's rule.
func computeProfiles(g *GPU, known map[uint32]models.Model) map[uint32][]models.CIProfile {
	if m, ok := known[g.PciDeviceID]; ok {
		return m.ComputeProfiles
	}

	out := map[uint32][]models.CIProfile{}

	for _, p := range g.Profiles {
		out[p.Info.SliceCount] = ruleCIProfiles(p.Info.SliceCount)
	}

	return out
}

// FromModel returns the GPU with index i of a node of GPUs of one model, as the planner sees
// it, from the model's data file alone (offline `mig plan`).
func FromModel(m models.Model, i int) *GPU {
	g := &GPU{
		GPU: gpu.GPU{
			Index: i, UUID: fmt.Sprintf("GPU-%s-%d", m.Key, i), Name: m.Name, Minor: i,
			MemoryMiB: m.MemoryBytes >> 20, MemoryBytes: m.MemoryBytes, PciDeviceID: m.PciDeviceID, MIG: "disabled",
		},
		ComputeProfiles: m.ComputeProfiles,
	}

	for _, p := range m.Profiles {
		g.Profiles = append(g.Profiles, GIProfileInfo{Index: p.Index, Name: p.Name, Info: p.Info, Placements: p.Placements})
	}

	sort.Slice(g.Profiles, func(a, b int) bool { return g.Profiles[a].Index < g.Profiles[b].Index })

	return g
}

// State is a GPU's MIG configuration: its mode and instances.
type State struct {
	MigEnabled bool
	Instances  []Instance
}

// Instance is one GPU instance with its placement and compute instances.
type Instance struct {
	Profile          string                    `json:"profile"`
	ProfileIndex     int                       `json:"-"`
	Placement        nvml.GpuInstancePlacement `json:"-"`
	ComputeInstances []ComputeInstance         `json:"-"`
}

// ComputeInstance is one compute instance inside a GPU instance.
type ComputeInstance struct {
	Profile   string
	Slices    uint32
	Placement nvml.ComputeInstancePlacement
}

// computeProfiles lists the profiles of the instance's compute instances, in order.
func (in Instance) computeProfiles() []string {
	cis := make([]string, 0, len(in.ComputeInstances))
	for _, c := range in.ComputeInstances {
		cis = append(cis, c.Profile)
	}

	return cis
}

// signature describes a state without placements: two states with the same
// signature serve the same devices, so nothing needs to change.
func (s State) signature() string {
	if !s.MigEnabled {
		return "disabled"
	}

	parts := make([]string, 0, len(s.Instances))

	for _, in := range s.Instances {
		cis := in.computeProfiles()
		sort.Strings(cis)
		parts = append(parts, in.Profile+"["+strings.Join(cis, ",")+"]")
	}

	sort.Strings(parts)

	return "enabled:" + strings.Join(parts, ";")
}

// String is a short human form such as "MIG on: 3g.40gb@0[3g.40gb], 4g.40gb@4[...]".
func (s State) String() string {
	if !s.MigEnabled {
		return "MIG off"
	}

	if len(s.Instances) == 0 {
		return "MIG on, no instances"
	}

	parts := make([]string, 0, len(s.Instances))

	for _, in := range s.Instances {
		cis := in.computeProfiles()
		parts = append(parts, fmt.Sprintf("%s@%d[%s]", in.Profile, in.Placement.Start, strings.Join(cis, ",")))
	}

	return "MIG on: " + strings.Join(parts, " ")
}

// ReadState reads the current mode (and pending mode) and instances of a GPU.
func ReadState(dev nvml.Device, g *GPU) (State, int, error) {
	cur, pending, ret := dev.GetMigMode()
	if ret != nvml.SUCCESS {
		return State{}, 0, fmt.Errorf("gpu %d: get MIG mode: %w", g.Index, ret)
	}

	st := State{MigEnabled: cur == nvml.DEVICE_MIG_ENABLE}
	if !st.MigEnabled {
		return st, pending, nil
	}

	for _, p := range g.Profiles {
		info := p.Info

		gis, ret := dev.GetGpuInstances(&info)
		if ret != nvml.SUCCESS {
			return State{}, 0, fmt.Errorf("gpu %d: list GPU instances of %s: %w", g.Index, p.Name, ret)
		}

		for _, gi := range gis {
			giInfo, ret := gi.GetInfo()
			if ret != nvml.SUCCESS {
				return State{}, 0, fmt.Errorf("gpu %d: GPU instance info: %w", g.Index, ret)
			}

			in := Instance{Profile: p.Name, ProfileIndex: p.Index, Placement: giInfo.Placement}

			cps, err := computeProfilesOf(gi)
			if err != nil {
				return State{}, 0, fmt.Errorf("gpu %d: %s: %w", g.Index, p.Name, err)
			}

			for _, ciInfo := range cps {
				cis, ret := gi.GetComputeInstances(&ciInfo)
				if ret != nvml.SUCCESS {
					return State{}, 0, fmt.Errorf("gpu %d: list compute instances of %s: %w", g.Index, p.Name, ret)
				}

				for _, ci := range cis {
					cinfo, ret := ci.GetInfo()
					if ret != nvml.SUCCESS {
						return State{}, 0, fmt.Errorf("gpu %d: compute instance info: %w", g.Index, ret)
					}

					in.ComputeInstances = append(in.ComputeInstances, ComputeInstance{
						Profile: ciName(p.Name, p.Info.SliceCount, ciInfo.SliceCount), Slices: ciInfo.SliceCount, Placement: cinfo.Placement,
					})
				}
			}

			sort.Slice(in.ComputeInstances, func(i, j int) bool {
				return in.ComputeInstances[i].Placement.Start < in.ComputeInstances[j].Placement.Start
			})

			st.Instances = append(st.Instances, in)
		}
	}

	sort.Slice(st.Instances, func(i, j int) bool { return st.Instances[i].Placement.Start < st.Instances[j].Placement.Start })

	return st, pending, nil
}

// computeProfilesOf asks NVML which shared-engine compute profiles a GPU instance offers
// (nvmlGpuInstanceGetComputeInstanceProfileInfo, by index until INVALID_ARGUMENT).
func computeProfilesOf(gi nvml.GpuInstance) ([]nvml.ComputeInstanceProfileInfo, error) {
	var out []nvml.ComputeInstanceProfileInfo

	for idx := 0; idx < nvml.COMPUTE_INSTANCE_PROFILE_COUNT; idx++ {
		info, ret := gi.GetComputeInstanceProfileInfo(idx, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if errors.Is(ret, nvml.ERROR_INVALID_ARGUMENT) {
			break
		}

		if errors.Is(ret, nvml.ERROR_NOT_SUPPORTED) {
			continue
		}

		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("compute profile %d: %w", idx, ret)
		}

		out = append(out, info)
	}

	return out, nil
}
