package mig

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// GIProfileInfo is one GPU-instance profile a GPU offers.
type GIProfileInfo struct {
	Index      int
	Name       string
	Info       nvml.GpuInstanceProfileInfo
	Placements []nvml.GpuInstancePlacement
}

// GPU is what the planner needs to know about one GPU.
type GPU struct {
	Index       int
	UUID        string
	Name        string
	PciDeviceID uint32
	MigCapable  bool
	Profiles    []GIProfileInfo // by NVML index
}

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

// ReadGPU reads a GPU's identity and MIG profile table through NVML.
func ReadGPU(dev nvml.Device) (*GPU, error) {
	g := &GPU{}

	var ret nvml.Return

	if g.Index, ret = dev.GetIndex(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("get index: %w", ret)
	}

	if g.UUID, ret = dev.GetUUID(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("gpu %d: get uuid: %w", g.Index, ret)
	}

	if g.Name, ret = dev.GetName(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("gpu %d: get name: %w", g.Index, ret)
	}

	pci, ret := dev.GetPciInfo()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("gpu %d: get pci info: %w", g.Index, ret)
	}

	g.PciDeviceID = pci.PciDeviceId

	_, _, ret = dev.GetMigMode()
	switch {
	case errors.Is(ret, nvml.ERROR_NOT_SUPPORTED):
		return g, nil
	case ret != nvml.SUCCESS:
		return nil, fmt.Errorf("gpu %d: get MIG mode: %w", g.Index, ret)
	}

	g.MigCapable = true

	mem, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("gpu %d: get memory info: %w", g.Index, ret)
	}

	for idx := 0; idx < nvml.GPU_INSTANCE_PROFILE_COUNT; idx++ {
		info, ret := dev.GetGpuInstanceProfileInfo(idx)
		if errors.Is(ret, nvml.ERROR_NOT_SUPPORTED) || errors.Is(ret, nvml.ERROR_INVALID_ARGUMENT) {
			continue
		}

		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("gpu %d: get GPU instance profile %d: %w", g.Index, idx, ret)
		}

		pls, ret := dev.GetGpuInstancePossiblePlacements(&info)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("gpu %d: get placements of GPU instance profile %d: %w", g.Index, idx, ret)
		}

		g.Profiles = append(g.Profiles, GIProfileInfo{
			Index: idx, Name: giProfileName(idx, info, mem.Total), Info: info, Placements: pls,
		})
	}

	return g, nil
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

			for _, c := range ciSizes(p.Info.SliceCount) {
				ciInfo, ret := gi.GetComputeInstanceProfileInfo(ciProfileIndex(c), nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
				if errors.Is(ret, nvml.ERROR_NOT_SUPPORTED) {
					continue
				}

				if ret != nvml.SUCCESS {
					return State{}, 0, fmt.Errorf("gpu %d: compute profile %dc of %s: %w", g.Index, c, p.Name, ret)
				}

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
						Profile: ciName(p.Name, p.Info.SliceCount, c), Slices: c, Placement: cinfo.Placement,
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
