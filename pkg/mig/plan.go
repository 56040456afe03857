package mig

import (
	"fmt"
	"sort"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Built-in generic layouts: valid on any MIG-capable GPU, computed from its
// own profiles, for users without a file. A file's layout of the same name wins.
const (
	LayoutAllDisabled = "all-disabled"
	LayoutAllEnabled  = "all-enabled"
	LayoutAll1g       = "all-1g"
	LayoutAllBalanced = "all-balanced"
	LayoutAllMax      = "all-max"
)

// BuiltinLayouts lists the generic layouts.
func BuiltinLayouts() []string {
	return []string{LayoutAllDisabled, LayoutAllEnabled, LayoutAll1g, LayoutAllBalanced, LayoutAllMax}
}

func isBuiltin(name string) bool {
	for _, b := range BuiltinLayouts() {
		if b == name {
			return true
		}
	}

	return false
}

// Builtin returns a config holding only the generic layouts.
func Builtin() *Config {
	c := &Config{Layouts: map[string][]Entry{}}
	for _, name := range BuiltinLayouts() {
		e := Entry{Layout: name, AllDevices: true, MigEnabled: name != LayoutAllDisabled, builtin: true}
		if e.MigEnabled && name != LayoutAllEnabled {
			e.Generic = name
		}

		c.Layouts[name] = []Entry{e}
	}

	return c
}

// WithBuiltins returns c plus the generic layouts it does not define itself; Overridden
// names those it does.
func (c *Config) WithBuiltins() *Config {
	out := Builtin()
	if c != nil {
		out.Source = c.Source
		for name, entries := range c.Layouts {
			if isBuiltin(name) && (len(entries) == 0 || !entries[0].builtin) {
				out.Overridden = append(out.Overridden, name)
			}

			out.Layouts[name] = entries
		}
	}

	sort.Strings(out.Overridden)

	return out
}

// Plan is what one layout means for each GPU of a node.
type Plan struct {
	Layout string
	GPUs   []GPUPlan
}

// GPUPlan is the target state of one GPU.
type GPUPlan struct {
	GPU *GPU
	// Selected is false when no entry of the layout selects this GPU: it is left as it is.
	Selected bool
	Target   State
}

// request is one GPU instance to place, with its compute instances.
type request struct {
	profile GIProfileInfo
	cis     []uint32 // compute-instance sizes
}

// PlanLayout plans one layout for the given GPUs. Any GPU that cannot take
// it fails the whole plan, before anything changes; the error names the GPU
// and why.
func PlanLayout(cfg *Config, layout string, gpus []*GPU) (*Plan, error) {
	entries, err := cfg.Select(layout)
	if err != nil {
		return nil, err
	}

	plan := &Plan{Layout: layout}

	// Indices past the node's GPUs are a mistake in the file, not GPUs to skip.
	if err := cfg.outOfRange(entries, len(gpus)); err != nil {
		return nil, err
	}

	var problems []string

	for _, g := range gpus {
		gp, err := planGPU(entries, g)
		if err != nil {
			problems = append(problems, err.Error())

			continue
		}

		plan.GPUs = append(plan.GPUs, gp)
	}

	if len(problems) > 0 {
		return nil, fmt.Errorf("layout %q does not fit: %s", layout, strings.Join(problems, "; "))
	}

	return plan, nil
}

// Selected counts the GPUs the plan selects. A layout whose device filters match no GPU of
// the node selects none: nothing to do, as for mig-parted (its apply walks the GPUs and
// skips each that no entry matches: cmd/nvidia-mig-parted/apply, WalkSelectedMigConfigForEachGPU).
func (p *Plan) Selected() int {
	n := 0

	for _, g := range p.GPUs {
		if g.Selected {
			n++
		}
	}

	return n
}

// describeGPUs names each GPU with its PCI device id, as device-filter writes it.
func describeGPUs(gpus []GPUPlan) string {
	ids := make([]string, 0, len(gpus))
	for _, g := range gpus {
		ids = append(ids, fmt.Sprintf("GPU %d: 0x%08X", g.GPU.Index, g.GPU.PciDeviceID))
	}

	return strings.Join(ids, ", ")
}

// outOfRange is the error of the GPU indices past the node's GPUs, or nil.
func (c *Config) outOfRange(entries []Entry, count int) error {
	problems := invalid(c.Source)

	for _, e := range entries {
		for i, idx := range e.Devices {
			if idx < count {
				continue
			}

			where := ""
			if i < len(e.DeviceLines) {
				where = fmt.Sprintf("line %d: ", e.DeviceLines[i])
			}

			problems.Addf("%s%s, devices[%d]: GPU %d does not exist: the node has %d GPU(s), indices 0 to %d",
				where, e.where(), i, idx, count, count-1)
		}
	}

	return problems.Err()
}

func (e Entry) matches(g *GPU) bool {
	if !e.AllDevices {
		found := false
		for _, i := range e.Devices {
			if i == g.Index {
				found = true
			}
		}

		if !found {
			return false
		}
	}

	if len(e.Filter) == 0 {
		return true
	}

	for _, id := range e.Filter {
		if id == g.PciDeviceID {
			return true
		}
	}

	return false
}

func planGPU(entries []Entry, g *GPU) (GPUPlan, error) {
	var match []Entry

	for _, e := range entries {
		if e.matches(g) {
			match = append(match, e)
		}
	}

	switch len(match) {
	case 0:
		return GPUPlan{GPU: g}, nil
	case 1:
	default:
		return GPUPlan{}, fmt.Errorf("%s is selected by %s and entry %d", g.label(), match[0].where(), match[1].Index)
	}

	e := match[0]
	if !e.MigEnabled {
		return GPUPlan{GPU: g, Selected: true, Target: State{}}, nil
	}

	if !g.MigCapable() {
		// mig-parted skips a GPU without MIG that `devices: all` selects, and refuses one that
		// is named by index (cmd/nvidia-mig-parted/apply/mode.go, ApplyMigMode).
		if e.AllDevices {
			return GPUPlan{GPU: g}, nil
		}

		return GPUPlan{}, fmt.Errorf("%s: %s: this GPU does not support MIG", e.where(), g.label())
	}

	reqs, err := requests(e, g)
	if err != nil {
		return GPUPlan{}, err
	}

	target, err := solve(g, reqs)
	if err != nil {
		return GPUPlan{}, fmt.Errorf("%s: %s: %w", e.where(), g.label(), err)
	}

	return GPUPlan{GPU: g, Selected: true, Target: target}, nil
}

// generic expands a built-in layout into profile counts for this GPU.
func generic(name string, g *GPU) (map[string]int, error) {
	get := func(idx int) (GIProfileInfo, error) {
		p, ok := g.profileByIndex(idx)
		if !ok {
			return p, fmt.Errorf("layout %q: %s has no %d-slice profile", name, g.label(), sliceOfIndex(idx))
		}

		if len(p.Placements) == 0 {
			return p, fmt.Errorf("layout %q: %s", name, noPlacements(p.Name, g, p))
		}

		return p, nil
	}

	switch name {
	case LayoutAll1g:
		p, err := get(nvml.GPU_INSTANCE_PROFILE_1_SLICE)
		if err != nil {
			return nil, err
		}

		// As many as fit: at most the profile's instance count, bounded by placements.
		n := int(p.Info.InstanceCount)
		if len(p.Placements) < n {
			n = len(p.Placements)
		}

		return map[string]int{p.Name: n}, nil
	case LayoutAllBalanced:
		// NVIDIA's published all-balanced (the GPU Operator's default-mig-parted-config): on
		// 7-slice GPUs 2 × 1g, 1 × 2g and 1 × 3g; on 4-slice GPUs (A30, RTX PRO 6000
		// Blackwell) 2 × 1g and 1 × 2g.
		counts := map[int]int{nvml.GPU_INSTANCE_PROFILE_1_SLICE: 2, nvml.GPU_INSTANCE_PROFILE_2_SLICE: 1}

		switch slices := g.slices(); {
		case slices >= 7:
			counts[nvml.GPU_INSTANCE_PROFILE_3_SLICE] = 1
		case slices < 4:
			return nil, fmt.Errorf("layout %q: %s has %d compute slices; all-balanced is defined for GPUs of 4 or more", name, g.label(), slices)
		}

		out := map[string]int{}

		for idx, n := range counts {
			p, err := get(idx)
			if err != nil {
				return nil, err
			}

			out[p.Name] = n
		}

		return out, nil
	case LayoutAllMax:
		// The largest profile without attributes: one full-size instance.
		var best *GIProfileInfo

		for i := range g.Profiles {
			p := &g.Profiles[i]
			if !strings.ContainsAny(p.Name, "+-") && (best == nil || p.Info.SliceCount > best.Info.SliceCount) {
				best = p
			}
		}

		if best == nil {
			return nil, fmt.Errorf("layout %q: %s has no MIG profile", name, g.label())
		}

		return map[string]int{best.Name: 1}, nil
	}

	return nil, fmt.Errorf("unknown generic layout %q", name)
}

// slices is the GPU's number of compute slices: the slice count of its largest profile.
func (g *GPU) slices() uint32 {
	var n uint32

	for _, p := range g.Profiles {
		n = max(n, p.Info.SliceCount)
	}

	return n
}

// noPlacements says that NVML lists a profile without any place to put it
// (nvmlDeviceGetGpuInstancePossiblePlacements returned none).
func noPlacements(name string, g *GPU, gp GIProfileInfo) string {
	return fmt.Sprintf("mig-devices[%q]: %s: NVML reports no possible placement for profile %s (GetGpuInstancePossiblePlacements returned none)",
		name, g.label(), gp.Name)
}

func sliceOfIndex(idx int) int {
	switch idx {
	case nvml.GPU_INSTANCE_PROFILE_2_SLICE:
		return 2
	case nvml.GPU_INSTANCE_PROFILE_3_SLICE:
		return 3
	case nvml.GPU_INSTANCE_PROFILE_7_SLICE:
		return 7
	}

	return 1
}

// requests turns an entry's profile counts into GPU instances to place:
// full profiles get a GPU instance each; compute-instance profiles of one GPU
// instance profile share GPU instances, packed largest first (this is how
// mig-parted reads "1c.3g.40gb: 3": three compute instances in one 3g).
func requests(e Entry, g *GPU) ([]request, error) {
	devices := e.MigDevices

	if e.Generic != "" {
		var err error
		if devices, err = generic(e.Generic, g); err != nil {
			return nil, err
		}
	}

	names := make([]string, 0, len(devices))
	for n := range devices {
		names = append(names, n)
	}

	sort.Strings(names)

	var (
		reqs     []request
		problems []string
		partial  = map[string][]uint32{} // GI profile name -> CI sizes
		order    []string
	)

	for _, name := range names {
		count := devices[name]

		prof, err := ParseProfile(name)
		if err != nil {
			problems = append(problems, fmt.Sprintf("mig-devices[%q]: %v", name, err))

			continue
		}

		gp, ok := g.profileByName(prof.GIName())
		if !ok {
			problems = append(problems, fmt.Sprintf("mig-devices[%q]: %s has no profile %q; it has %s",
				name, g.label(), prof.GIName(), strings.Join(g.ProfileNames(), ", ")))

			continue
		}

		if len(gp.Placements) == 0 {
			problems = append(problems, noPlacements(name, g, gp))

			continue
		}

		if _, okC := g.ciOffer(gp, uint32(prof.C)); !okC {
			var offers []string
			for _, c := range g.ComputeProfiles[gp.Info.SliceCount] {
				offers = append(offers, ciName(gp.Name, gp.Info.SliceCount, c.SliceCount))
			}

			problems = append(problems, fmt.Sprintf("mig-devices[%q]: %s: %s offers no %d-slice compute instance; it offers %s",
				name, g.label(), gp.Name, prof.C, strings.Join(offers, ", ")))

			continue
		}

		if uint32(prof.C) == gp.Info.SliceCount {
			for i := 0; i < count; i++ {
				reqs = append(reqs, request{profile: gp, cis: []uint32{gp.Info.SliceCount}})
			}

			continue
		}

		if _, seen := partial[gp.Name]; !seen {
			order = append(order, gp.Name)
		}

		for i := 0; i < count; i++ {
			partial[gp.Name] = append(partial[gp.Name], uint32(prof.C))
		}
	}

	if len(problems) > 0 {
		return nil, fmt.Errorf("%s: %s", e.where(), strings.Join(problems, "; "))
	}

	for _, name := range order {
		gp, _ := g.profileByName(name)
		reqs = append(reqs, packCIs(gp, g.plannedStarts(gp), partial[name])...)
	}

	return reqs, nil
}

// plannedStarts says where compute instances of each size may start in a GPU instance of
// profile gp, from the GPU's compute profiles.
func (g *GPU) plannedStarts(gp GIProfileInfo) func(c uint32) []uint32 {
	return func(c uint32) []uint32 {
		p, _ := g.ciOffer(gp, c)

		return p.Starts
	}
}

// packCIs puts compute instances into as few GPU instances as first-fit
// decreasing finds.
func packCIs(gp GIProfileInfo, starts func(c uint32) []uint32, sizes []uint32) []request {
	sort.Slice(sizes, func(i, j int) bool { return sizes[i] > sizes[j] })

	var bins []request

	for _, c := range sizes {
		placed := false

		for i := range bins {
			if _, ok := placeCIs(gp.Info.SliceCount, starts, append(append([]uint32(nil), bins[i].cis...), c)); ok {
				bins[i].cis = append(bins[i].cis, c)
				placed = true

				break
			}
		}

		if !placed {
			bins = append(bins, request{profile: gp, cis: []uint32{c}})
		}
	}

	return bins
}

// placeCIs finds placements for compute instances (sizes, largest first) in a
// GPU instance of g slices by exhaustive search; starts says where each size may start.
func placeCIs(g uint32, starts func(c uint32) []uint32, sizes []uint32) ([]nvml.ComputeInstancePlacement, bool) {
	out := make([]nvml.ComputeInstancePlacement, len(sizes))
	used := make([]bool, g)

	var rec func(i int) bool
	rec = func(i int) bool {
		if i == len(sizes) {
			return true
		}

		c := sizes[i]
	starts:
		for _, s := range starts(c) {
			if s+c > g {
				continue
			}

			for k := s; k < s+c; k++ {
				if used[k] {
					continue starts
				}
			}

			for k := s; k < s+c; k++ {
				used[k] = true
			}

			out[i] = nvml.ComputeInstancePlacement{Start: s, Size: c}
			if rec(i + 1) {
				return true
			}

			for k := s; k < s+c; k++ {
				used[k] = false
			}
		}

		return false
	}

	return out, rec(0)
}

// solve places GPU instances by exhaustive, deterministic search over the
// GPU's possible placements: largest instances first, lowest start first. It
// finds a placement whenever one exists.
func solve(g *GPU, reqs []request) (State, error) {
	sort.SliceStable(reqs, func(i, j int) bool {
		a, b := reqs[i].profile, reqs[j].profile
		if a.Info.SliceCount != b.Info.SliceCount {
			return a.Info.SliceCount > b.Info.SliceCount
		}

		if sa, sb := placementSize(a), placementSize(b); sa != sb {
			return sa > sb
		}

		return a.Index < b.Index
	})

	count := map[uint32]uint32{}
	compute := uint32(0)

	for _, r := range reqs {
		count[r.profile.Info.Id]++
		compute += r.profile.Info.SliceCount

		if count[r.profile.Info.Id] > r.profile.Info.InstanceCount {
			return State{}, fmt.Errorf("%d × %s requested, the GPU has room for at most %d",
				countOf(reqs, r.profile.Info.Id), r.profile.Name, r.profile.Info.InstanceCount)
		}
	}

	if compute > 7 {
		return State{}, fmt.Errorf("needs %d compute slices, the GPU has 7", compute)
	}

	chosen := make([]nvml.GpuInstancePlacement, len(reqs))

	var rec func(i int, used uint32) bool
	rec = func(i int, used uint32) bool {
		if i == len(reqs) {
			return true
		}

		for _, pl := range reqs[i].profile.Placements {
			mask := uint32((1<<pl.Size)-1) << pl.Start
			if used&mask != 0 {
				continue
			}

			chosen[i] = pl
			if rec(i+1, used|mask) {
				return true
			}
		}

		return false
	}

	if !rec(0, 0) {
		var names []string
		for _, r := range reqs {
			names = append(names, r.profile.Name)
		}

		return State{}, fmt.Errorf("no placement fits %s together", strings.Join(names, " + "))
	}

	st := State{MigEnabled: true}

	for i, r := range reqs {
		cps, ok := placeCIs(r.profile.Info.SliceCount, g.plannedStarts(r.profile), r.cis)
		if !ok {
			return State{}, fmt.Errorf("compute instances %v do not fit in %s", r.cis, r.profile.Name)
		}

		in := Instance{Profile: r.profile.Name, ProfileIndex: r.profile.Index, Placement: chosen[i]}
		for j, c := range r.cis {
			in.ComputeInstances = append(in.ComputeInstances, ComputeInstance{
				Profile: ciName(r.profile.Name, r.profile.Info.SliceCount, c), Slices: c, Placement: cps[j],
			})
		}

		sort.Slice(in.ComputeInstances, func(a, b int) bool {
			return in.ComputeInstances[a].Placement.Start < in.ComputeInstances[b].Placement.Start
		})

		st.Instances = append(st.Instances, in)
	}

	sort.SliceStable(st.Instances, func(i, j int) bool { return st.Instances[i].Placement.Start < st.Instances[j].Placement.Start })

	return st, nil
}

// placementSize is the size of a profile's placements (memory slices), 0 with none.
func placementSize(p GIProfileInfo) uint32 {
	if len(p.Placements) == 0 {
		return 0
	}

	return p.Placements[0].Size
}

func countOf(reqs []request, id uint32) int {
	n := 0

	for _, r := range reqs {
		if r.profile.Info.Id == id {
			n++
		}
	}

	return n
}
