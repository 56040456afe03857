package mig

// GPU and compute instances: destroyed, created at planned placements, restored.

import (
	"fmt"
	"sort"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// restoreInstances puts back the instances of prev where the GPU is still in MIG mode without
// them (a mode change that stayed pending after they were destroyed). It says whether it
// created any.
func (a *Applier) restoreInstances(g *GPU, prev State) (bool, error) {
	if !prev.MigEnabled || len(prev.Instances) == 0 {
		return false, nil
	}

	dev, err := a.device(g)
	if err != nil {
		return false, err
	}

	now, _, err := ReadState(dev, g)
	if err != nil {
		return false, err
	}

	if !now.MigEnabled || now.signature() == prev.signature() {
		return false, nil
	}

	if len(now.Instances) > 0 {
		if err := a.destroyAll(dev, g); err != nil {
			return false, err
		}
	}

	return true, a.create(dev, g, prev)
}

func (a *Applier) destroyAll(dev nvml.Device, g *GPU) error {
	for _, p := range g.Profiles {
		info := p.Info

		gis, ret := dev.GetGpuInstances(&info)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("gpu %d: list GPU instances of %s: %w", g.Index, p.Name, ret)
		}

		for _, gi := range gis {
			cps, err := computeProfilesOf(gi)
			if err != nil {
				return fmt.Errorf("gpu %d: %s: %w", g.Index, p.Name, err)
			}

			for _, ciInfo := range cps {
				cis, ret := gi.GetComputeInstances(&ciInfo)
				if ret != nvml.SUCCESS {
					return fmt.Errorf("gpu %d: list compute instances of %s: %w", g.Index, p.Name, ret)
				}

				for _, ci := range cis {
					if ret := ci.Destroy(); ret != nvml.SUCCESS {
						return fmt.Errorf("gpu %d: destroy compute instance of %s: %w", g.Index, p.Name, ret)
					}
				}
			}

			if ret := gi.Destroy(); ret != nvml.SUCCESS {
				return fmt.Errorf("gpu %d: destroy GPU instance %s: %w", g.Index, p.Name, ret)
			}
		}
	}

	return nil
}

// create makes the target's GPU instances at their planned placements, then asks NVML, for
// each new GPU instance, which compute profiles it offers and where they can go, and places
// the compute instances there.
func (a *Applier) create(dev nvml.Device, g *GPU, target State) error {
	for _, in := range target.Instances {
		p, ok := g.profileByIndex(in.ProfileIndex)
		if !ok {
			return fmt.Errorf("gpu %d: no profile %s", g.Index, in.Profile)
		}

		info := p.Info
		pl := in.Placement

		gi, ret := dev.CreateGpuInstanceWithPlacement(&info, &pl)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("gpu %d: create GPU instance %s at %d: %w", g.Index, in.Profile, pl.Start, ret)
		}

		if err := createComputeInstances(gi, g, in); err != nil {
			return err
		}
	}

	return nil
}

func createComputeInstances(gi nvml.GpuInstance, g *GPU, in Instance) error {
	offered, err := computeProfilesOf(gi)
	if err != nil {
		return fmt.Errorf("gpu %d: %s: %w", g.Index, in.Profile, err)
	}

	bySize := map[uint32]nvml.ComputeInstanceProfileInfo{}
	starts := map[uint32][]uint32{}

	for _, c := range offered {
		if _, dup := bySize[c.SliceCount]; dup {
			continue // the first (lowest index) profile of a size is the plain one
		}

		pls, ret := gi.GetComputeInstancePossiblePlacements(&c)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("gpu %d: placements of compute profile %dc in %s: %w", g.Index, c.SliceCount, in.Profile, ret)
		}

		bySize[c.SliceCount] = c

		for _, pl := range pls {
			starts[c.SliceCount] = append(starts[c.SliceCount], pl.Start)
		}
	}

	sizes := make([]uint32, 0, len(in.ComputeInstances))
	for _, c := range in.ComputeInstances {
		if _, ok := bySize[c.Slices]; !ok {
			return fmt.Errorf("gpu %d: %s offers no compute profile %s", g.Index, in.Profile, c.Profile)
		}

		sizes = append(sizes, c.Slices)
	}

	sort.Slice(sizes, func(i, j int) bool { return sizes[i] > sizes[j] })

	slices := uint32(0)
	if p, ok := g.profileByIndex(in.ProfileIndex); ok {
		slices = p.Info.SliceCount
	}

	placements, ok := placeCIs(slices, func(c uint32) []uint32 { return starts[c] }, sizes)
	if !ok {
		return fmt.Errorf("gpu %d: compute instances %v do not fit where NVML places them in %s", g.Index, sizes, in.Profile)
	}

	for i, c := range sizes {
		ciInfo := bySize[c]
		cpl := placements[i]

		if _, ret := gi.CreateComputeInstanceWithPlacement(&ciInfo, &cpl); ret != nvml.SUCCESS {
			return fmt.Errorf("gpu %d: create compute instance %dc in %s at %d: %w", g.Index, c, in.Profile, cpl.Start, ret)
		}
	}

	return nil
}
