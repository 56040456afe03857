package docs_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/talos-nvidia/nvidia-driver/pkg/gpu/models"
	"github.com/talos-nvidia/nvidia-driver/pkg/mig"
)

var (
	// An NVIDIA PCI device id as device-filter writes it (device<<16 | 0x10DE).
	nvidiaDeviceID = regexp.MustCompile(`\b0x[0-9A-Fa-f]{4}10[Dd][Ee]\b`)
	// A MIG profile as nvidia-smi names it: GPU instance (1g.10gb, 1g.10gb+me, 1g.24gb-me) or
	// compute instance in one (1c.3g.40gb).
	migProfile = regexp.MustCompile(`\b(?:(\d+)c\.)?(\d+g\.\d+gb(?:\+me\.all|\+me|\+gfx|-me)?)\b`)
)

// docSource is one text the docs show a user: a page, or an example file.
type docSource struct {
	name string
	text string
}

// docSources reads every page of docs/ (and the README) and every file under docs/examples.
func docSources(t *testing.T) []docSource {
	t.Helper()
	var out []docSource
	for _, f := range markdownFiles(t) {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		out = append(out, docSource{name: f, text: string(data)})
	}
	require.NoError(t, filepath.WalkDir("examples", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("reading %s: %w", path, err)
		}
		out = append(out, docSource{name: path, text: string(data)})
		return nil
	}))
	return out
}

// lineOf is the line of offset in text, for messages.
func lineOf(text string, offset int) int { return strings.Count(text[:offset], "\n") + 1 }

// modelsByKey loads every model of pkg/gpu/models.
func modelsByKey(t *testing.T) map[string]models.Model {
	t.Helper()
	all := map[string]models.Model{}
	for _, k := range models.Keys() {
		m, err := models.Lookup(k)
		require.NoError(t, err)
		all[k] = m
	}
	return all
}

// TestDocsDeviceIDsAreKnownModels: every NVIDIA PCI device id the docs name is a model of
// the models table, so that a device-filter copied from them selects the GPU it says.
func TestDocsDeviceIDsAreKnownModels(t *testing.T) {
	byID := models.All()
	seen := 0
	for _, src := range docSources(t) {
		for _, loc := range nvidiaDeviceID.FindAllStringIndex(src.text, -1) {
			seen++
			s := src.text[loc[0]:loc[1]]
			id, err := mig.ParseDeviceID(s)
			require.NoError(t, err, "%s:%d: %s", src.name, lineOf(src.text, loc[0]), s)
			_, ok := byID[id]
			assert.True(t, ok, "%s:%d: device id %s is no model of pkg/gpu/models/data", src.name, lineOf(src.text, loc[0]), s)
		}
	}
	assert.Positive(t, seen)
}

// knownProfile says whether name (a GPU-instance profile, or Nc.<GPU-instance profile>) is a
// profile of some model, and which models have it.
func knownProfile(all map[string]models.Model, computeSlices, gi string) []string {
	var have []string
	for key, m := range all {
		for _, p := range m.Profiles {
			if p.Name != gi {
				continue
			}
			if computeSlices == "" {
				have = append(have, key)
				break
			}
			n, err := strconv.Atoi(computeSlices)
			if err == nil && n >= 1 && uint32(n) <= p.Info.SliceCount {
				have = append(have, key)
			}
			break
		}
	}
	slices.Sort(have)
	return have
}

// TestDocsMIGProfilesAreKnown: every MIG profile the docs name (in prose, layouts, resource
// names such as nvidia.com/mig-1g.10gb, metric labels) is a profile of some model.
func TestDocsMIGProfilesAreKnown(t *testing.T) {
	all := modelsByKey(t)
	seen := 0
	for _, src := range docSources(t) {
		for _, m := range migProfile.FindAllStringSubmatchIndex(src.text, -1) {
			if inNVIDIAFilesTable(src.text, m[0]) {
				continue // the names of NVIDIA's layouts, some for models the table lacks
			}
			seen++
			name := src.text[m[0]:m[1]]
			compute := ""
			if m[2] >= 0 {
				compute = src.text[m[2]:m[3]]
			}
			gi := src.text[m[4]:m[5]]
			assert.NotEmpty(t, knownProfile(all, compute, gi), "%s:%d: MIG profile %s is no model's (pkg/gpu/models/data)", src.name, lineOf(src.text, m[0]), name)
		}
	}
	assert.Positive(t, seen)
}

// inNVIDIAFilesTable says whether offset is in mig.md's generated table of NVIDIA's published
// layouts (TestNVIDIAFilesAsMigPartedAppliesThem writes it), whose layout names carry profiles
// of models the table does not have ("none" there).
func inNVIDIAFilesTable(text string, offset int) bool {
	begin := strings.LastIndex(text[:offset], "<!-- nvidia-files: begin")
	return begin >= 0 && !strings.Contains(text[begin:offset], "<!-- nvidia-files: end")
}

// migFile is a mig-parted layouts file the docs show, where it is.
type migFile struct {
	where string
	data  []byte
}

// layoutFiles finds every mig-parted layouts file in the docs: the mig.yaml of each
// nvidia-driver ExtensionServiceConfig (in an example file or a YAML block of a page), and a
// YAML block that is a layouts file itself.
func layoutFiles(t *testing.T) []migFile {
	t.Helper()
	var out []migFile
	fromYAML := func(where, text string) {
		dec := yaml.NewDecoder(strings.NewReader(text))
		for i := 0; ; i++ {
			var doc map[string]any
			err := dec.Decode(&doc)
			if err != nil {
				require.ErrorContains(t, err, "EOF", "%s: document %d", where, i)
				return
			}
			if _, ok := doc["mig-configs"]; ok {
				out = append(out, migFile{where: where, data: []byte(text)})
				continue
			}
			if doc["kind"] != "ExtensionServiceConfig" {
				continue
			}
			files, _ := doc["configFiles"].([]any)
			for _, f := range files {
				f, _ := f.(map[string]any)
				path, _ := f["mountPath"].(string)
				content, _ := f["content"].(string)
				if strings.Contains(content, "mig-configs:") {
					out = append(out, migFile{where: fmt.Sprintf("%s (%s)", where, path), data: []byte(content)})
				}
			}
		}
	}
	for _, src := range docSources(t) {
		switch {
		case strings.HasSuffix(src.name, ".md"):
			for _, b := range codeBlocks(t, src.name) {
				if b.lang == "yaml" && strings.Contains(b.text, "mig-configs:") {
					fromYAML(fmt.Sprintf("%s:%d", src.name, b.line), b.text)
				}
			}
		case strings.HasSuffix(src.name, ".yaml"):
			fromYAML(src.name, src.text)
		}
	}
	return out
}

// gpusOf makes n offline GPUs of a model that report the PCI device id id (a model's own, or
// one it shares its table with).
func gpusOf(m models.Model, id uint32, n int) []*mig.GPU {
	gpus := make([]*mig.GPU, n)
	for i := range gpus {
		gpus[i] = mig.FromModel(m, i)
		gpus[i].PciDeviceID = id
	}
	return gpus
}

// TestDocsMIGLayoutsFitTheirModels: every layout in the docs' layouts files parses as the
// service parses it, and is planned, offline, on the GPUs it is written for: on each model
// its device filters name it must select every GPU (not "nothing to do") and fit; a layout
// without filters must fit some model. So a profile of the wrong model (H200 profiles on an
// H100 PCIe) fails here, as it would leave the node degraded.
func TestDocsMIGLayoutsFitTheirModels(t *testing.T) {
	all := modelsByKey(t)
	byID := models.All()
	files := layoutFiles(t)
	require.NotEmpty(t, files)
	for _, f := range files {
		cfg, err := mig.Parse(f.data)
		require.NoError(t, err, "%s: the service rejects this layouts file", f.where)
		for _, layout := range cfg.Names() {
			entries, err := cfg.Select(layout)
			require.NoError(t, err)
			var ids []uint32
			for _, e := range entries {
				for _, id := range e.Filter {
					if !slices.Contains(ids, id) {
						ids = append(ids, id)
					}
				}
			}
			if len(ids) == 0 {
				var fits []string
				for key, m := range all {
					plan, err := mig.PlanLayout(cfg, layout, gpusOf(m, m.PciDeviceID, 8))
					if err == nil && plan.Selected() == 8 {
						fits = append(fits, key)
					}
				}
				assert.NotEmpty(t, fits, "%s: layout %q fits no model of pkg/gpu/models/data", f.where, layout)
				continue
			}
			for _, id := range ids {
				m, ok := byID[id]
				if !assert.True(t, ok, "%s: layout %q filters on 0x%08X, no model of pkg/gpu/models/data", f.where, layout, id) {
					continue
				}
				plan, err := mig.PlanLayout(cfg, layout, gpusOf(m, id, 2))
				if !assert.NoError(t, err, "%s: layout %q on two %s (0x%08X)", f.where, layout, m.Key, id) {
					continue
				}
				assert.Equal(t, 2, plan.Selected(), "%s: layout %q selects no %s (0x%08X): nothing to do there", f.where, layout, m.Key, id)
			}
		}
	}
}

// TestMIGModelChecksFail: each of the three checks fails on a slip of its kind: an unknown
// device id, a profile no model has, and a layout whose profiles are another model's.
func TestMIGModelChecksFail(t *testing.T) {
	all := modelsByKey(t)
	byID := models.All()

	_, ok := byID[0x233F10DE]
	assert.False(t, ok, "0x233F10DE must stay unknown for this control")
	assert.Empty(t, knownProfile(all, "", "1g.11gb"), "no model has 1g.11gb")
	assert.Empty(t, knownProfile(all, "8", "3g.40gb"), "8 compute slices do not fit a 3g")
	assert.Equal(t, []string{"h200", "h200-nvl"}, knownProfile(all, "", "2g.35gb"))

	// H200 profiles filtered on the H100 PCIe: the planner refuses them there.
	bad := []byte(`version: v1
mig-configs:
  wrong-model:
    - device-filter: ["0x233110DE"]
      devices: all
      mig-enabled: true
      mig-devices: {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}
`)
	cfg, err := mig.Parse(bad)
	require.NoError(t, err, "it parses: only the plan knows the model")
	_, err = mig.PlanLayout(cfg, "wrong-model", gpusOf(byID[0x233110DE], 0x233110DE, 2))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "1g.18gb")

	// A filter on the H100 SXM planned on the H100 PCIe: nothing to do, which the test counts
	// as a failure for a layout written for that id.
	sxmOnly := bytes.ReplaceAll(bad, []byte("0x233110DE"), []byte("0x233010DE"))
	sxmOnly = bytes.ReplaceAll(sxmOnly, []byte(`{"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}`), []byte(`{"1g.10gb": 2}`))
	cfg, err = mig.Parse(sxmOnly)
	require.NoError(t, err)
	plan, err := mig.PlanLayout(cfg, "wrong-model", gpusOf(byID[0x233110DE], 0x233110DE, 2))
	require.NoError(t, err)
	assert.Zero(t, plan.Selected())
}
