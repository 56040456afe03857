package mig

import (
	"fmt"
	"strings"

	nvdev "github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/talos-nvidia/nvidia-driver/pkg/gpu/models"
)

// nvlib is go-nvlib's device library, for its MIG profile names and grammar: mig-parted and
// the device plugin use them, so the names here are theirs. Neither needs NVML.
var nvlib = nvdev.New(nil)

// Profile is a parsed MIG profile name: [<c>c.]<g>g.<gb>gb[attribute].
type Profile struct {
	C, G, GB int
	Attr     string // "", "+me", "+me.all", "+gfx", "-me"
}

// profileForm says what a profile name looks like: go-nvlib's grammar, narrowed to the
// attributes NVML's profiles have.
const profileForm = "want <g>g.<gb>gb or <c>c.<g>g.<gb>gb, optionally followed by +me, +me.all, +gfx or -me"

var nvmlAttrs = map[string]bool{"": true, "+me": true, "+me.all": true, "+gfx": true, "-me": true}

// ParseProfile parses a profile name such as 3g.40gb, 1c.3g.40gb or 1g.10gb+me. It takes
// only what go-nvlib's AssertValidMigProfileFormat (mig-parted's check of a file) takes, and
// of that only the profiles a GPU can have: mig-parted would fail on the others when it
// applies them, or, for a compute part as large as its GPU instance, never see them applied.
func ParseProfile(s string) (Profile, error) {
	var p Profile

	// go-nvlib's form, [<c>c.]<g>g.<gb>gb then + or - and attributes, with NVML's attributes.
	name := s
	if i := strings.IndexAny(s, "+-"); i >= 0 {
		name, p.Attr = s[:i], s[i:]
	}

	if nvlib.AssertValidMigProfileFormat(s) != nil || !nvmlAttrs[p.Attr] {
		return Profile{}, fmt.Errorf("invalid profile %q: %s", s, profileForm)
	}

	withC := strings.Count(name, ".") == 2

	format, fields := "%dg.%dgb", []any{&p.G, &p.GB}
	if withC {
		format, fields = "%dc.%dg.%dgb", []any{&p.C, &p.G, &p.GB}
	}

	if _, err := fmt.Sscanf(name, format, fields...); err != nil { // not for a name go-nvlib takes
		return Profile{}, fmt.Errorf("invalid profile %q: %w", s, err)
	}

	if !withC {
		p.C = p.G
	}

	switch {
	case p.G < 1 || p.G > 8:
		return Profile{}, fmt.Errorf("invalid profile %q: %d GPU slices (want 1 to 8)", s, p.G)
	case p.C < 1 || p.C > p.G:
		return Profile{}, fmt.Errorf("invalid profile %q: %d compute slices (want 1 to %d)", s, p.C, p.G)
	case withC && p.C == p.G:
		return Profile{}, fmt.Errorf("invalid profile %q: a compute instance of the whole GPU instance is written %s", s, p.GIName())
	case p.GB < 1:
		return Profile{}, fmt.Errorf("invalid profile %q: memory must be at least 1gb", s)
	}

	return p, nil
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

// giProfileName is go-nvlib's name of a GPU-instance profile (the device plugin's and
// mig-parted's): the profile with its full-size compute instance.
func giProfileName(index int, info nvml.GpuInstanceProfileInfo, deviceMemoryBytes uint64) (string, error) {
	suffix := ""
	if index == nvml.GPU_INSTANCE_PROFILE_3_SLICE_GFX { // past go-nvlib v0.12.0's list
		index, suffix = nvml.GPU_INSTANCE_PROFILE_3_SLICE, "+gfx"
	}

	p, err := nvlib.NewMigProfile(index, ciProfileIndex(info.SliceCount), nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, info.MemorySizeMB, deviceMemoryBytes)
	if err != nil {
		return "", fmt.Errorf("GPU instance profile %d: %w", index, err)
	}

	return p.String() + suffix, nil
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
