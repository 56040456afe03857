package mig

import (
	"fmt"
	"math"
	"regexp"
	"strconv"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/talos-nvidia/nvidia-driver/pkg/gpu/models"
)

// Profile is a parsed MIG profile name: [<c>c.]<g>g.<gb>gb[attribute].
type Profile struct {
	C, G, GB int
	Attr     string // "", "+me", "+me.all", "+gfx", "-me"
}

var profileRE = regexp.MustCompile(`^(?:([0-9]+)c\.)?([0-9]+)g\.([0-9]+)gb(\+me|\+me\.all|\+gfx|-me)?$`)

// ParseProfile parses a profile name such as 3g.40gb, 1c.3g.40gb or 1g.10gb+me.
func ParseProfile(s string) (Profile, error) {
	m := profileRE.FindStringSubmatch(s)
	if m == nil {
		return Profile{}, fmt.Errorf("invalid profile %q: want <g>g.<gb>gb or <c>c.<g>g.<gb>gb, optionally followed by +me, +me.all, +gfx or -me", s)
	}

	g, _ := strconv.Atoi(m[2])
	gb, _ := strconv.Atoi(m[3])
	c := g

	if m[1] != "" {
		c, _ = strconv.Atoi(m[1])
	}

	switch {
	case g < 1 || g > 8:
		return Profile{}, fmt.Errorf("invalid profile %q: %d GPU slices (want 1 to 8)", s, g)
	case c < 1 || c > g:
		return Profile{}, fmt.Errorf("invalid profile %q: %d compute slices (want 1 to %d)", s, c, g)
	case m[1] != "" && c == g:
		return Profile{}, fmt.Errorf("invalid profile %q: a compute instance of the whole GPU instance is written %dg.%dgb%s", s, g, gb, m[4])
	case gb < 1:
		return Profile{}, fmt.Errorf("invalid profile %q: memory must be at least 1gb", s)
	}

	return Profile{C: c, G: g, GB: gb, Attr: m[4]}, nil
}

// GIName is the name of the GPU-instance profile (no compute part).
func (p Profile) GIName() string { return fmt.Sprintf("%dg.%dgb%s", p.G, p.GB, p.Attr) }

func (p Profile) String() string {
	if p.C == p.G {
		return p.GIName()
	}

	return fmt.Sprintf("%dc.%s", p.C, p.GIName())
}

// ciName names a compute instance of c slices in a GI profile name.
func ciName(giName string, giSlices, c uint32) string {
	if c == giSlices {
		return giName
	}

	return fmt.Sprintf("%dc.%s", c, giName)
}

// giProfileName names a GPU-instance profile the way nvidia-smi and
// go-nvlib do: memory as a fraction of the GPU rounded up to eighths, times
// the GPU's memory in whole GB, plus the attribute of the profile index.
func giProfileName(index int, info nvml.GpuInstanceProfileInfo, deviceMemoryBytes uint64) string {
	const gib = 1024 * 1024 * 1024

	frac := float64(info.MemorySizeMB*1024*1024) / float64(deviceMemoryBytes)
	frac = math.Ceil(frac*8) / 8
	gb := uint64(math.Round(frac * float64((deviceMemoryBytes+gib-1)/gib)))

	return fmt.Sprintf("%dg.%dgb%s", info.SliceCount, gb, profileAttr(index))
}

func profileAttr(index int) string {
	switch index {
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1:
		return "+me"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME, nvml.GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME:
		return "+me.all"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_GFX, nvml.GPU_INSTANCE_PROFILE_2_SLICE_GFX,
		nvml.GPU_INSTANCE_PROFILE_4_SLICE_GFX, nvml.GPU_INSTANCE_PROFILE_3_SLICE_GFX:
		return "+gfx"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME, nvml.GPU_INSTANCE_PROFILE_2_SLICE_NO_ME:
		return "-me"
	}

	return ""
}

// ruleCIProfiles are the compute profiles of a GPU instance of g slices for a GPU model
// without a data file: the sizes the NVIDIA MIG user guide lists per GPU-instance size
// ("Supported MIG Profiles"), instance k of a c-slice profile at k*c, except that the 3-slice
// profile of a 7-slice GPU instance sits at 0 or 4 like GPU instances do. The applier still
// places compute instances where NVML says they can go.
func ruleCIProfiles(g uint32) []models.CIProfile {
	sizes := map[uint32][]uint32{1: {1}, 2: {1, 2}, 3: {1, 2, 3}, 4: {1, 2, 4}, 6: {1, 2, 3, 6}, 7: {1, 2, 3, 4, 7}, 8: {1, 2, 4, 8}}[g]

	out := make([]models.CIProfile, 0, len(sizes))

	for _, c := range sizes {
		var starts []uint32

		if g == 7 && c == 3 {
			starts = []uint32{0, 4}
		} else {
			for k := uint32(0); (k+1)*c <= g; k++ {
				starts = append(starts, k*c)
			}
		}

		out = append(out, models.CIProfile{Index: ciProfileIndex(c), SliceCount: c, InstanceCount: uint32(len(starts)), Starts: starts})
	}

	return out
}

// ciProfileIndex is the NVML index of the shared-engine compute profile of c slices.
func ciProfileIndex(c uint32) int {
	switch c {
	case 1:
		return nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE
	case 2:
		return nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE
	case 3:
		return nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE
	case 4:
		return nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE
	case 6:
		return nvml.COMPUTE_INSTANCE_PROFILE_6_SLICE
	case 7:
		return nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE
	case 8:
		return nvml.COMPUTE_INSTANCE_PROFILE_8_SLICE
	}

	return -1
}

// ciOffer returns the compute profile of c slices that a GPU instance of profile gp offers.
func (g *GPU) ciOffer(gp GIProfileInfo, c uint32) (models.CIProfile, bool) {
	for _, p := range g.ComputeProfiles[gp.Info.SliceCount] {
		if p.SliceCount == c {
			return p, true
		}
	}

	return models.CIProfile{}, false
}
