package mig_test

// NVIDIA's published layout files (testdata/nvidia, SOURCES names each one's repository, tag,
// commit and path) planned for every model we have data for, and compared with what
// mig-parted v0.15.0 would apply. mig-parted's behaviour is modelled here from its source:
//   - which entries a GPU gets: cmd/nvidia-mig-parted/assert/assert.go
//     WalkSelectedMigConfigForEachGPU (every entry in file order, each GPU whose device id
//     matches its device-filter and whose index its devices select; an entry that matches a
//     GPU already matched is applied after the first) and api/spec/v1/helpers.go
//     (MatchesDeviceFilter: no filter or an empty one matches any GPU; MatchesDevices: "all"
//     or the listed indices; pkg/types/device.go NewDeviceIDFromString and Matches);
//   - what it creates: cmd/nvidia-mig-parted/apply/config.go ApplyMigConfig and
//     pkg/mig/config/config.go SetMigConfig: every profile of mig-devices must be one the
//     GPU lists (resolveMigProfileOnDevice), it tries every order of the instances
//     (iteratePermutationsUntilSuccess) and succeeds when NVML can create them all, and the
//     result, read back by GetMigConfig, is mig-devices itself: profile name → count.
// Whether NVML can create them all is decided here by an exhaustive search over the model's
// placements (a set of instances fits when each takes one of its profile's placements with no
// two sharing a memory slice, no profile beyond its instance count, compute slices within
// the GPU's), not by our planner: NVML's own choice of placement in each order is not
// modelled, so a layout that fits only at placements NVML would not pick is counted as
// applied by mig-parted.

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/talos-nvidia/nvidia-driver/pkg/gpu/models"
	"github.com/talos-nvidia/nvidia-driver/pkg/mig"
)

// nodeSize: GPUs per simulated node, as on an HGX or DGX board (the files' index lists go
// up to 7).
const nodeSize = 8

type nvidiaFile struct {
	name, repo, tag, path, sha string
	layouts                    []byte // the mig-parted v1 document
}

// nvidiaFiles reads testdata/nvidia/SOURCES and each file it names; from a Kubernetes
// manifest it takes the ConfigMap key config.yaml, as mig-manager mounts it.
func nvidiaFiles(t *testing.T) []nvidiaFile {
	f, err := os.Open("testdata/nvidia/SOURCES")
	require.NoError(t, err)

	defer f.Close()

	var out []nvidiaFile

	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}

		fields := strings.Fields(line)
		require.Len(t, fields, 6, line)

		data, err := os.ReadFile(filepath.Join("testdata/nvidia", fields[0]))
		require.NoError(t, err)

		sum := sha256.Sum256(data)
		require.Equal(t, fields[5], hex.EncodeToString(sum[:]), "%s is no longer the file SOURCES names", fields[0])

		out = append(out, nvidiaFile{
			name: fields[0], repo: fields[1], tag: fields[2], path: fields[4], sha: fields[5],
			layouts: configMapLayouts(t, data),
		})
	}

	require.NoError(t, sc.Err())
	require.Len(t, out, 6)

	return out
}

// configMapLayouts returns data itself when it is a layout file, else the config.yaml of
// the first ConfigMap that has one.
func configMapLayouts(t *testing.T, data []byte) []byte {
	dec := yaml.NewDecoder(bytes.NewReader(data))

	for {
		var doc struct {
			Kind    string            `yaml:"kind"`
			Version string            `yaml:"version"`
			Data    map[string]string `yaml:"data"`
		}

		err := dec.Decode(&doc)
		require.NoError(t, err)

		if doc.Version == "v1" {
			return data
		}

		if doc.Kind == "ConfigMap" && doc.Data["config.yaml"] != "" {
			return []byte(doc.Data["config.yaml"])
		}
	}
}

// mpEntry is one entry as mig-parted's api/spec/v1 reads it.
type mpEntry struct {
	Devices    any            `yaml:"devices"`
	Filter     any            `yaml:"device-filter"`
	MigEnabled bool           `yaml:"mig-enabled"`
	MigDevices map[string]int `yaml:"mig-devices"`
}

func (e mpEntry) matchesFilter(t *testing.T, id uint32) bool {
	var filters []string

	switch f := e.Filter.(type) {
	case nil:
	case string:
		if f != "" {
			filters = []string{f}
		}
	case []any:
		for _, s := range f {
			filters = append(filters, s.(string))
		}
	default:
		t.Fatalf("device-filter %v: %T", f, f)
	}

	if len(filters) == 0 {
		return true
	}

	for _, f := range filters {
		v, err := strconv.ParseUint(f, 0, 32) // NewDeviceIDFromString: strconv base 0
		require.NoError(t, err, f)

		if uint32(v) == id {
			return true
		}
	}

	return false
}

func (e mpEntry) matchesDevice(t *testing.T, i int) bool {
	switch d := e.Devices.(type) {
	case string:
		return d == "all"
	case []any:
		for _, x := range d {
			if x.(int) == i {
				return true
			}
		}

		return false
	}

	t.Fatalf("devices %v: %T", e.Devices, e.Devices)

	return false
}

// mpOutcome is what mig-parted leaves on a node: per GPU the entry applied last (nil: not
// touched), or the error that stops it.
type mpOutcome struct {
	final []*mpEntry
	err   string
}

func migParted(t *testing.T, entries []mpEntry, m models.Model) mpOutcome {
	out := mpOutcome{final: make([]*mpEntry, nodeSize)}

	for k := range entries {
		e := &entries[k]

		for i := 0; i < nodeSize; i++ {
			if !e.matchesFilter(t, m.PciDeviceID) || !e.matchesDevice(t, i) {
				continue
			}

			if e.MigEnabled {
				if err := fits(m, e.MigDevices); err != "" {
					return mpOutcome{err: fmt.Sprintf("GPU %d: %s", i, err)}
				}
			}

			out.final[i] = e
		}
	}

	return out
}

// fits says why NVML could not hold these instances on the model ("" when it can), by
// exhaustive search over the model's placements.
func fits(m models.Model, want map[string]int) string {
	byName := map[string]models.GIProfile{}
	for _, p := range m.Profiles {
		byName[p.Name] = p
	}

	var items []models.GIProfile

	for name, n := range want {
		p, ok := byName[name]
		if !ok {
			return fmt.Sprintf("%s is not a profile of the %s", name, m.Key)
		}

		for range n {
			items = append(items, p)
		}
	}

	var (
		used  uint32 // memory slices taken, a bit each
		count = map[uint32]uint32{}
		place func(k int, compute uint32) bool
	)

	place = func(k int, compute uint32) bool {
		if k == len(items) {
			return true
		}

		p := items[k]
		if count[p.Info.Id] == p.Info.InstanceCount || compute+p.Info.SliceCount > m.ComputeSlices() {
			return false
		}

		for _, pl := range p.Placements {
			bits := uint32((1<<pl.Size)-1) << pl.Start
			if used&bits != 0 {
				continue
			}

			used |= bits
			count[p.Info.Id]++

			ok := place(k+1, compute+p.Info.SliceCount)

			used &^= bits
			count[p.Info.Id]--

			if ok {
				return true
			}
		}

		return false
	}

	if !place(0, 0) {
		return fmt.Sprintf("%v do not fit on a %s", want, m.Key)
	}

	return ""
}

// ciCounts is a planned state as mig-parted's GetMigConfig reads a GPU back: compute
// instance profile name → count.
func ciCounts(s mig.State) map[string]int {
	out := map[string]int{}

	for _, in := range s.Instances {
		for _, ci := range in.ComputeInstances {
			out[ci.Profile]++
		}
	}

	return out
}

func nonZero(m map[string]int) map[string]int {
	out := map[string]int{}

	for k, v := range m {
		if v > 0 {
			out[k] = v
		}
	}

	return out
}

// TestNVIDIAFilesAsMigPartedAppliesThem: every layout of every published file, on a node of
// eight GPUs of every model: the service plans what mig-parted would apply (the same GPUs,
// MIG mode and instances), rejects what mig-parted would fail on, and does nothing where
// mig-parted does nothing. The table of docs/mig.md is what this finds.
func TestNVIDIAFilesAsMigPartedAppliesThem(t *testing.T) {
	var rows []tableRow

	applied, nothing, rejected := 0, 0, 0

	for _, f := range nvidiaFiles(t) {
		cfg, err := mig.ParseFile(f.name, f.layouts)
		require.NoError(t, err, "%s: the service takes the file as it is", f.name)

		var doc struct {
			Configs map[string][]mpEntry `yaml:"mig-configs"`
		}
		require.NoError(t, yaml.Unmarshal(f.layouts, &doc), f.name)
		require.ElementsMatch(t, keys(doc.Configs), cfg.Names(), f.name)

		for _, layout := range cfg.Names() {
			var on []string

			for _, key := range models.Keys() {
				m, err := models.Lookup(key)
				require.NoError(t, err)

				gpus := make([]*mig.GPU, nodeSize)
				for i := range gpus {
					gpus[i] = mig.FromModel(m, i)
				}

				where := fmt.Sprintf("%s: layout %s on %d × %s", f.name, layout, nodeSize, key)
				theirs := migParted(t, doc.Configs[layout], m)
				plan, err := mig.PlanLayout(cfg, layout, gpus)

				if theirs.err != "" {
					require.Error(t, err, "%s: mig-parted fails (%s), the service planned it", where, theirs.err)

					rejected++

					continue
				}

				require.NoError(t, err, "%s: mig-parted applies it", where)

				selected := false

				for i, gp := range plan.GPUs {
					e := theirs.final[i]
					require.Equal(t, e != nil, gp.Selected, "%s, GPU %d: selected", where, i)

					if e == nil {
						continue
					}

					selected = true

					assert.Equal(t, e.MigEnabled, gp.Target.MigEnabled, "%s, GPU %d: MIG mode", where, i)

					if e.MigEnabled {
						assert.Equal(t, nonZero(e.MigDevices), ciCounts(gp.Target), "%s, GPU %d: instances", where, i)
					}
				}

				if !selected {
					nothing++

					continue
				}

				applied++

				on = append(on, key)
			}

			rows = append(rows, tableRow{file: f, layout: layout, on: on})
		}
	}

	t.Logf("%d (layout, model) pairs applied, %d nothing to do, %d rejected as by mig-parted", applied, nothing, rejected)
	require.Positive(t, applied)

	checkDocTable(t, rows)
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}

	sort.Strings(out)

	return out
}

type tableRow struct {
	file   nvidiaFile
	layout string
	on     []string // models it applies on
}

const (
	tableBegin = "<!-- nvidia-files: begin (TestNVIDIAFilesAsMigPartedAppliesThem writes it with MIG_DOCS_UPDATE=1) -->"
	tableEnd   = "<!-- nvidia-files: end -->"
)

// checkDocTable compares the table of docs/mig.md with what the test found: one row per
// layout and set of models, naming the files that give it.
func checkDocTable(t *testing.T, rows []tableRow) {
	files := nvidiaFiles(t)
	code := map[string]string{}

	var b strings.Builder

	b.WriteString(tableBegin + "\n")

	for i, f := range files {
		code[f.name] = strconv.Itoa(i + 1)
		fmt.Fprintf(&b, "%d. %s `%s` at %s\n", i+1, strings.TrimPrefix(f.repo, "github.com/"), f.path, f.tag)
	}

	all := strings.Join(models.Keys(), ", ")

	type key struct{ layout, on string }

	var order []key

	in := map[key][]string{}

	for _, r := range rows {
		on := strings.Join(r.on, ", ")

		switch {
		case on == all:
			on = "every model"
		case on == "":
			on = "none (nothing to do, or a profile it lacks)"
		}

		k := key{r.layout, on}
		if _, ok := in[k]; !ok {
			order = append(order, k)
		}

		in[k] = append(in[k], code[r.file.name])
	}

	sort.SliceStable(order, func(i, j int) bool { return order[i].layout < order[j].layout })

	b.WriteString("\n| layout | applied on (8 GPUs of each) | files |\n|---|---|---|\n")

	for _, k := range order {
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", k.layout, k.on, strings.Join(in[k], ", "))
	}

	b.WriteString(tableEnd)

	const doc = "../../docs/mig.md"

	data, err := os.ReadFile(doc)
	require.NoError(t, err)

	s := string(data)
	begin, end := strings.Index(s, tableBegin), strings.Index(s, tableEnd)
	require.True(t, begin >= 0 && end > begin, "docs/mig.md has no table between %q and %q", tableBegin, tableEnd)

	if os.Getenv("MIG_DOCS_UPDATE") == "1" {
		s = s[:begin] + b.String() + s[end+len(tableEnd):]
		require.NoError(t, os.WriteFile(doc, []byte(s), 0o644))

		return
	}

	assert.Equal(t, b.String(), s[begin:end+len(tableEnd)], "docs/mig.md's table; MIG_DOCS_UPDATE=1 go test ./pkg/mig -run TestNVIDIAFiles rewrites it")
}
