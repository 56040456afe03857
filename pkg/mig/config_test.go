package mig_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/pkg/document"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu"
	"github.com/talos-nvidia/nvidia-driver/pkg/mig"
)

var badConfigs = []struct {
	name, yaml string
	want       []string
}{
	{"not yaml", "version: [v1\n", []string{"line 1: not YAML: did not find expected ',' or ']'"}},
	{"empty", "", []string{"empty document"}},
	{"top level list", "- a\n", []string{"line 1: top level must be a map with version and mig-configs"}},
	{"no version", "mig-configs:\n  a:\n    - devices: all\n      mig-enabled: false\n", []string{"version: required (want \"v1\")"}},
	{"wrong version", "version: v2\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: false\n", []string{"line 1: version: unsupported \"v2\" (want \"v1\")"}},
	{"unknown top key", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: false\nextra: 1\n", []string{"line 6: unknown top-level key \"extra\" (want version, mig-configs)"}},
	{"no mig-configs", "version: v1\n", []string{"mig-configs: required"}},
	{"mig-configs list", "version: v1\nmig-configs: [a]\n", []string{"line 2: mig-configs: must be a map of layout name to entries"}},
	{"layout not list", "version: v1\nmig-configs:\n  a: {devices: all}\n", []string{"line 3: layout \"a\": must be a list of entries"}},
	{"layout empty", "version: v1\nmig-configs:\n  a: []\n", []string{"line 3: layout \"a\": has no entries"}},
	{"entry not map", "version: v1\nmig-configs:\n  a:\n    - all\n", []string{"line 4: layout \"a\", entry 0: must be a map"}},
	{"unknown entry key", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enable: true\n      mig-enabled: false\n", []string{"line 5: layout \"a\", entry 0: unknown key \"mig-enable\" (want devices, device-filter, mig-enabled, mig-devices)"}},
	{"devices missing", "version: v1\nmig-configs:\n  a:\n    - mig-enabled: false\n", []string{"line 4: layout \"a\", entry 0, devices: required"}},
	{"devices word", "version: v1\nmig-configs:\n  a:\n    - devices: some\n      mig-enabled: false\n", []string{"line 4: layout \"a\", entry 0, devices: want \"all\" or a list of GPU indices, got \"some\""}},
	{"devices map", "version: v1\nmig-configs:\n  a:\n    - devices: {a: 1}\n      mig-enabled: false\n", []string{"line 4: layout \"a\", entry 0, devices: want \"all\" or a list of GPU indices"}},
	{"devices empty list", "version: v1\nmig-configs:\n  a:\n    - devices: []\n      mig-enabled: false\n", []string{"line 4: layout \"a\", entry 0, devices: empty list"}},
	{"devices not int", "version: v1\nmig-configs:\n  a:\n    - devices: [0, x]\n      mig-enabled: false\n", []string{"line 4: layout \"a\", entry 0, devices[1]: want a GPU index, got \"x\""}},
	{"devices negative", "version: v1\nmig-configs:\n  a:\n    - devices: [-1]\n      mig-enabled: false\n", []string{"line 4: layout \"a\", entry 0, devices[0]: GPU index -1 is negative"}},
	{"devices twice", "version: v1\nmig-configs:\n  a:\n    - devices: [1, 1]\n      mig-enabled: false\n", []string{"line 4: layout \"a\", entry 0, devices[1]: GPU index 1 listed twice"}},
	{"mig-enabled missing", "version: v1\nmig-configs:\n  a:\n    - devices: all\n", []string{"line 4: layout \"a\", entry 0, mig-enabled: required"}},
	{"mig-enabled string", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: \"true\"\n", []string{"line 5: layout \"a\", entry 0, mig-enabled: must be a boolean (true or false), got \"true\""}},
	// YAML 1.1, as mig-parted reads it: a tag that is not !!bool, or a !!bool value YAML 1.1
	// does not define, is no boolean; never false.
	{"mig-enabled !!bool 1", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: !!bool 1\n", []string{"line 5: layout \"a\", entry 0, mig-enabled: must be a boolean (true or false), got !!bool \"1\""}},
	{"mig-enabled !!str", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: !!str true\n", []string{"line 5: layout \"a\", entry 0, mig-enabled: must be a boolean (true or false), got !!str \"true\""}},
	{"mig-enabled local tag", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: !maybe yes\n", []string{"line 5: layout \"a\", entry 0, mig-enabled: must be a boolean (true or false), got !maybe \"yes\""}},
	{"mig-enabled list", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: [true]\n", []string{"line 5: layout \"a\", entry 0, mig-enabled: must be a boolean (true or false), got a list"}},
	// Lines right where YAML's own errors have none or the wrong one.
	{"tab indentation", "version: v1\nmig-configs:\n  a:\n    - devices: all\n\tmig-enabled: false\n", []string{"line 5: not YAML: found a tab character that violates indentation (YAML indents with spaces only)"}},
	{"not utf-8", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: f\xffalse\n", []string{"line 5, column 21: not UTF-8 (byte 0xFF): the file must be UTF-8 text"}},
	{"merge of a scalar", "version: v1\nmig-configs:\n  a:\n    - <<: 3\n      devices: all\n      mig-enabled: false\n", []string{"line 4: layout \"a\", entry 0, map merge requires map or sequence of maps as the value"}},
	{"mig-devices while disabled", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: false\n      mig-devices: {\"1g.10gb\": 1}\n", []string{"line 6: layout \"a\", entry 0, mig-devices: set while mig-enabled is false"}},
	{"mig-devices list", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-devices: [1g.10gb]\n", []string{"line 6: layout \"a\", entry 0, mig-devices: must be a map of profile name to count"}},
	{"bad profile", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1g10gb\": 1}\n", []string{"line 6: layout \"a\", entry 0, mig-devices[\"1g10gb\"]: invalid profile \"1g10gb\": want <g>g.<gb>gb or <c>c.<g>g.<gb>gb, optionally followed by +me, +me.all, +gfx or -me"}},
	{"bad suffix", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.10gb+xx\": 1}\n", []string{"line 6: layout \"a\", entry 0, mig-devices[\"1g.10gb+xx\"]: invalid profile \"1g.10gb+xx\": want <g>g.<gb>gb or <c>c.<g>g.<gb>gb, optionally followed by +me, +me.all, +gfx or -me"}},
	{"compute too big", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"4c.3g.40gb\": 1}\n", []string{"line 6: layout \"a\", entry 0, mig-devices[\"4c.3g.40gb\"]: invalid profile \"4c.3g.40gb\": 4 compute slices (want 1 to 3)"}},
	{"compute equal", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"3c.3g.40gb\": 1}\n", []string{"line 6: layout \"a\", entry 0, mig-devices[\"3c.3g.40gb\"]: invalid profile \"3c.3g.40gb\": a compute instance of the whole GPU instance is written 3g.40gb"}},
	{"zero slices", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"0g.10gb\": 1}\n", []string{"line 6: layout \"a\", entry 0, mig-devices[\"0g.10gb\"]: invalid profile \"0g.10gb\": 0 GPU slices (want 1 to 8)"}},
	{"nine slices", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"9g.10gb\": 1}\n", []string{"line 6: layout \"a\", entry 0, mig-devices[\"9g.10gb\"]: invalid profile \"9g.10gb\": 9 GPU slices (want 1 to 8)"}},
	{"zero memory", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.0gb\": 1}\n", []string{"line 6: layout \"a\", entry 0, mig-devices[\"1g.0gb\"]: invalid profile \"1g.0gb\": memory must be at least 1gb"}},
	{"count string", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.10gb\": \"2\"}\n", []string{"line 6: layout \"a\", entry 0, mig-devices[\"1g.10gb\"]: count must be an integer, got \"2\""}},
	{"count negative", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.10gb\": -1}\n", []string{"line 6: layout \"a\", entry 0, mig-devices[\"1g.10gb\"]: count -1 out of range 0..7"}},
	{"count too big", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.10gb\": 8}\n", []string{"line 6: layout \"a\", entry 0, mig-devices[\"1g.10gb\"]: count 8 out of range 0..7"}},
	{"count float", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.10gb\": 1.5}\n", []string{"line 6: layout \"a\", entry 0, mig-devices[\"1g.10gb\"]: count must be an integer, got \"1.5\""}},
	{"profile twice", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.10gb\": 1, \"1g.10gb\": 2}\n", []string{"line 6: layout \"a\", entry 0, mapping key \"1g.10gb\" already defined at line 6"}},
	{"filter no 0x", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      device-filter: 233510DE\n      mig-enabled: false\n", []string{"line 5: layout \"a\", entry 0, device-filter: \"233510DE\": want 0x followed by hex digits, such as 0x233510DE"}},
	{"filter not hex", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      device-filter: [\"0xZZ\"]\n      mig-enabled: false\n", []string{"line 5: layout \"a\", entry 0, device-filter: \"0xZZ\": want 0x followed by up to 8 hex digits, such as 0x233510DE"}},
	{"filter too long", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      device-filter: [\"0x1233510DE\"]\n      mig-enabled: false\n", []string{"line 5: layout \"a\", entry 0, device-filter: \"0x1233510DE\": want 0x followed by up to 8 hex digits, such as 0x233510DE"}},
	{"filter map", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      device-filter: {a: b}\n      mig-enabled: false\n", []string{"line 5: layout \"a\", entry 0, device-filter: want a PCI device id or a list of them"}},
	{"filter empty", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      device-filter: []\n      mig-enabled: false\n", []string{"line 5: layout \"a\", entry 0, device-filter: empty list"}},
	// What mig-parted v0.14.0 (the GPU Operator v26.3.1's mig-manager) rejects as well:
	// api/spec/v1/spec.go, pkg/types/mig_config.go, and YAML 1.1 numbers (sigs.k8s.io/yaml).
	{"filter unquoted", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      device-filter: 0x233510DE\n      mig-enabled: false\n", []string{"line 5: layout \"a\", entry 0, device-filter: 0x233510DE is read as a number; quote it: \"0x233510DE\""}},
	{"filter unquoted in list", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      device-filter: [\"0x233010DE\", 0x233510DE]\n      mig-enabled: false\n", []string{"line 5: layout \"a\", entry 0, device-filter: 0x233510DE is read as a number; quote it: \"0x233510DE\""}},
	{"enabled without mig-devices", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n", []string{"line 4: layout \"a\", entry 0, mig-devices: required when mig-enabled is true (write mig-devices: {} for MIG on with no instances)"}},
	{"every count 0", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.18gb\": 0, \"2g.35gb\": 0}\n", []string{"line 6: layout \"a\", entry 0, mig-devices: every count is 0 (write mig-devices: {} for MIG on with no instances)"}},
	{"layout twice", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: false\n  a:\n    - devices: all\n      mig-enabled: false\n", []string{"line 6: mapping key \"a\" already defined at line 3"}},
	{"many problems at once", "version: v1\nmig-configs:\n  good:\n    - devices: all\n      mig-enabled: false\n  bad:\n    - devices: [0]\n      mig-enabled: true\n      mig-devices: {\"1g.10gb\": 1}\n    - devices: nope\n      mig-enabled: maybe\n      mig-devices: {\"2g\": 1, \"3g.40gb\": 9}\n", []string{"line 10: layout \"bad\", entry 1, devices: want \"all\" or a list of GPU indices, got \"nope\"", "line 11: layout \"bad\", entry 1, mig-enabled: must be a boolean (true or false), got \"maybe\"", "line 12: layout \"bad\", entry 1, mig-devices[\"2g\"]: invalid profile \"2g\": want <g>g.<gb>gb or <c>c.<g>g.<gb>gb, optionally followed by +me, +me.all, +gfx or -me", "line 12: layout \"bad\", entry 1, mig-devices[\"3g.40gb\"]: count 9 out of range 0..7"}},
	// Duplicate keys anywhere (yaml.v3's own check): YAML itself would let the last one win.
	{"entry key twice", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.10gb\": 1}\n      mig-devices: {\"1g.10gb\": 7}\n", []string{"line 7: layout \"a\", entry 0, mapping key \"mig-devices\" already defined at line 6"}},
	{"devices key twice", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      devices: [0]\n      mig-enabled: false\n", []string{"line 5: layout \"a\", entry 0, mapping key \"devices\" already defined at line 4"}},
	{"top key twice", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: false\nversion: v1\n", []string{"line 6: mapping key \"version\" already defined at line 1"}},
	{"mig-configs twice", "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: false\nmig-configs:\n  b:\n    - devices: all\n      mig-enabled: false\n", []string{"line 6: mapping key \"mig-configs\" already defined at line 2"}},
}

func TestParseRejectsBadConfigs(t *testing.T) {
	require.GreaterOrEqual(t, len(badConfigs), 57, "the 40 earlier cases, issue 12's 6, the 4 mig-parted rules and issue 20's 7")

	for _, tc := range badConfigs {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := mig.Parse([]byte(tc.yaml))
			require.Error(t, err)
			assert.Nil(t, cfg)

			var verr *document.Invalid
			require.True(t, errors.As(err, &verr))
			assert.Equal(t, tc.want, verr.Problems)
		})
	}
}

// TestParseAcceptsWhatMigPartedAccepts: the edge forms mig-parted v0.14.0 takes
// (api/spec/v1/spec.go, pkg/types/mig_config.go) parse to what it means by them.
func TestParseAcceptsWhatMigPartedAccepts(t *testing.T) {
	for _, tc := range []struct {
		name, entry string
		want        mig.Entry
	}{
		{"filter quoted", "devices: all\n      device-filter: \"0x233510DE\"\n      mig-enabled: false", mig.Entry{AllDevices: true, Filter: []uint32{0x233510DE}}},
		{"filter list lower case", "devices: [1]\n      device-filter: ['0x233510de', \"0x233010DE\"]\n      mig-enabled: false", mig.Entry{Devices: []int{1}, DeviceLines: []int{4}, Filter: []uint32{0x233510DE, 0x233010DE}}},
		{"enabled, empty mig-devices", "devices: all\n      mig-enabled: true\n      mig-devices: {}", mig.Entry{AllDevices: true, MigEnabled: true, MigDevices: map[string]int{}}},
		{"disabled, empty mig-devices", "devices: all\n      mig-enabled: false\n      mig-devices: {}", mig.Entry{AllDevices: true, MigDevices: map[string]int{}}},
		{"!!bool yes", "devices: all\n      mig-enabled: !!bool yes\n      mig-devices: {}", mig.Entry{AllDevices: true, MigEnabled: true, MigDevices: map[string]int{}}},
		{"yes", "devices: all\n      mig-enabled: yes\n      mig-devices: {}", mig.Entry{AllDevices: true, MigEnabled: true, MigDevices: map[string]int{}}},
		{"On", "devices: all\n      mig-enabled: On\n      mig-devices: {}", mig.Entry{AllDevices: true, MigEnabled: true, MigDevices: map[string]int{}}},
		{"off", "devices: all\n      mig-enabled: off", mig.Entry{AllDevices: true}},
		{"!!bool NO", "devices: all\n      mig-enabled: !!bool NO", mig.Entry{AllDevices: true}},
		{"some counts 0", "devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.18gb\": 0, \"1c.3g.71gb\": 2}", mig.Entry{AllDevices: true, MigEnabled: true, MigDevices: map[string]int{"1g.18gb": 0, "1c.3g.71gb": 2}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := mig.Parse([]byte("version: v1\nmig-configs:\n  a:\n    - " + tc.entry + "\n"))
			require.NoError(t, err)
			require.Len(t, cfg.Layouts["a"], 1)

			tc.want.Layout = "a"
			assert.Equal(t, tc.want, cfg.Layouts["a"][0])
		})
	}
}

func TestParseAcceptsGPUOperatorDefault(t *testing.T) {
	data, err := os.ReadFile("testdata/gpu-operator-default-mig-config.yaml")
	require.NoError(t, err)

	// Verbatim: its all-disabled, all-enabled and all-balanced win over the built-in layouts
	// of those names, which stay for users without a file.
	cfg, err := mig.ParseFile("default.yaml", data)
	require.NoError(t, err)
	assert.Equal(t, "default.yaml", cfg.Source)

	all := cfg.WithBuiltins()
	assert.Equal(t, []string{mig.LayoutAllBalanced, mig.LayoutAllDisabled, mig.LayoutAllEnabled}, all.Overridden)
	assert.Equal(t, cfg.Layouts[mig.LayoutAllBalanced], all.Layouts[mig.LayoutAllBalanced], "the file's all-balanced")
	assert.Len(t, all.Layouts, 83, "the file's 81 and the built-in all-1g and all-max")
	assert.Equal(t, mig.LayoutAll1g, all.Layouts[mig.LayoutAll1g][0].Generic)
	assert.Empty(t, mig.Builtin().WithBuiltins().Overridden, "the built-ins alone override nothing")

	// The file as GPU Operator v26.3.1 ships it: 81 layouts, the B300 ones (0x318210DE,
	// 0x31C210DE) included, and all-1g.35gb split by device between H200 and B300.
	assert.Len(t, cfg.Layouts, 81)
	assert.Len(t, cfg.Layouts["all-balanced"], 12)
	assert.Equal(t, []uint32{0x20B710DE}, cfg.Layouts["all-balanced"][8].Filter)
	assert.Equal(t, []uint32{0x31C210DE}, cfg.Layouts["all-balanced"][11].Filter)
	require.Len(t, cfg.Layouts["all-1g.35gb"], 2)
	assert.Equal(t, []uint32{0x233510DE}, cfg.Layouts["all-1g.35gb"][0].Filter)
	assert.Equal(t, map[string]int{"1g.35gb": 4}, cfg.Layouts["all-1g.35gb"][0].MigDevices)
	assert.Equal(t, []uint32{0x31C210DE}, cfg.Layouts["all-1g.35gb"][1].Filter)
	assert.Equal(t, map[string]int{"1g.35gb": 7}, cfg.Layouts["all-1g.35gb"][1].MigDevices)
}

func FuzzParse(f *testing.F) {
	data, err := os.ReadFile("testdata/gpu-operator-default-mig-config.yaml")
	require.NoError(f, err)
	f.Add(data)

	for _, tc := range badConfigs {
		f.Add([]byte(tc.yaml))
	}

	f.Fuzz(func(t *testing.T, in []byte) {
		cfg, err := mig.Parse(in)
		if err != nil {
			var verr *document.Invalid
			if !errors.As(err, &verr) || len(verr.Problems) == 0 {
				t.Fatalf("error without problems: %v", err)
			}

			if cfg != nil {
				t.Fatal("config returned with an error")
			}

			return
		}

		// A valid file only holds well-formed profiles and counts.
		for name, entries := range cfg.Layouts {
			for _, e := range entries {
				for p, n := range e.MigDevices {
					if _, perr := mig.ParseProfile(p); perr != nil || n < 0 || n > 7 {
						t.Fatalf("layout %q accepted bad %q: %d", name, p, n)
					}
				}
			}
		}
	})
}

// TestErrorsNameTheFile: a file's errors, and the GPU indices it names that the node lacks
// (found at planning, when the GPU count is known), name the file, line and key.
func TestErrorsNameTheFile(t *testing.T) {
	_, err := mig.ParseFile("/etc/nvidia-driver/mig.yaml", []byte("version: v1\nmig-configs:\n  a:\n    - devices: all\n      devices: all\n      mig-enabled: false\n"))
	require.EqualError(t, err, `invalid MIG config /etc/nvidia-driver/mig.yaml: line 5: layout "a", entry 0, mapping key "devices" already defined at line 4`)

	cfg, err := mig.ParseFile("/etc/nvidia-driver/mig.yaml", []byte("version: v1\nmig-configs:\n  two:\n    - devices: [0, 5]\n      mig-enabled: false\n    - devices:\n        - 1\n        - 7\n      mig-enabled: false\n"))
	require.NoError(t, err)

	gpus := []*mig.GPU{{GPU: gpu.GPU{Index: 0}}, {GPU: gpu.GPU{Index: 1}}}
	_, err = mig.PlanLayout(cfg.WithBuiltins(), "two", gpus)

	var verr *document.Invalid
	require.ErrorAs(t, err, &verr)
	assert.Equal(t, "/etc/nvidia-driver/mig.yaml", verr.File)
	assert.Equal(t, []string{
		`line 4: layout "two", entry 0, devices[1]: GPU 5 does not exist: the node has 2 GPU(s), indices 0 to 1`,
		`line 8: layout "two", entry 1, devices[1]: GPU 7 does not exist: the node has 2 GPU(s), indices 0 to 1`,
	}, verr.Problems)
	assert.Contains(t, err.Error(), "invalid MIG config /etc/nvidia-driver/mig.yaml (2 problems)")
}

// TestParseAnchorsAliasesAndMergeKeys: anchors, aliases and merge keys mean what YAML says
// (yaml.org/type/merge.html): a layout may be an alias of another, an entry may merge a
// shared map and override its keys, and of several merged maps the first wins.
func TestParseAnchorsAliasesAndMergeKeys(t *testing.T) {
	cfg, err := mig.Parse([]byte(`version: v1
mig-configs:
  base: &base
    - devices: all
      mig-enabled: true
      mig-devices: &small {"1g.18gb": 7}
  same: *base
  merged:
    - &common
      devices: all
      mig-enabled: true
      mig-devices: *small
    - <<: *common
      devices: [1]
    - <<: [{devices: [2], mig-devices: {"3g.71gb": 2}}, *common]
    - <<: *common
      mig-devices:
        <<: *small
        "1g.18gb": 3
        "3g.71gb": 1
`))
	require.NoError(t, err)

	small := map[string]int{"1g.18gb": 7}
	assert.Equal(t, cfg.Layouts["base"][0].MigDevices, cfg.Layouts["same"][0].MigDevices)
	assert.Equal(t, small, cfg.Layouts["same"][0].MigDevices)

	m := cfg.Layouts["merged"]
	require.Len(t, m, 4)
	assert.True(t, m[0].AllDevices)
	assert.Equal(t, []int{1}, m[1].Devices, "the entry's own devices win")
	assert.Equal(t, small, m[1].MigDevices)
	assert.Equal(t, []int{2}, m[2].Devices, "the first merged map wins")
	assert.Equal(t, map[string]int{"3g.71gb": 2}, m[2].MigDevices)
	assert.True(t, m[2].MigEnabled)
	assert.Equal(t, map[string]int{"1g.18gb": 3, "3g.71gb": 1}, m[3].MigDevices)
	assert.True(t, m[3].MigEnabled)
}

// TestParseCapsItsProblems: a large file of bad entries gives the first MaxProblems problems
// and a count, not a message as large as the file; each problem is bounded too.
func TestParseCapsItsProblems(t *testing.T) {
	var b strings.Builder

	b.WriteString("version: v1\nmig-configs:\n  bad:\n")

	for i := range 5000 {
		fmt.Fprintf(&b, "    - devices: [x%d]\n      mig-enabled: maybe\n", i)
	}

	fmt.Fprintf(&b, "  long:\n    - devices: all\n      mig-enabled: %s\n", strings.Repeat("z", 100000))

	_, err := mig.Parse([]byte(b.String()))

	var verr *document.Invalid
	require.ErrorAs(t, err, &verr)
	assert.Len(t, verr.Problems, document.MaxProblems)
	assert.Equal(t, 10001-document.MaxProblems, verr.More)
	assert.Equal(t, `line 4: layout "bad", entry 0, devices[0]: want a GPU index, got "x0"`, verr.Problems[0])
	assert.Contains(t, err.Error(), "(10001 problems)")
	assert.True(t, strings.HasSuffix(err.Error(), fmt.Sprintf("\n  - and %d more", 10001-document.MaxProblems)), err.Error()[len(err.Error())-100:])
	assert.Less(t, len(err.Error()), 8000)

	_, err = mig.Parse(fmt.Appendf(nil, "version: v1\nmig-configs:\n  long:\n    - devices: all\n      mig-enabled: %s\n", strings.Repeat("z", 100000)))
	require.ErrorAs(t, err, &verr)
	require.Len(t, verr.Problems, 1)
	assert.Less(t, len(verr.Problems[0]), 400)
}

// TestParseAliasBomb: aliases of aliases that would expand to billions of nodes, in lists or
// through merge keys, are an error in bounded time (yaml.v3's bound on alias expansion), not
// a hang.
func TestParseAliasBomb(t *testing.T) {
	var b strings.Builder

	b.WriteString("a0: &a0 [\"1g.18gb\"]\n")

	for i := 1; i < 30; i++ {
		fmt.Fprintf(&b, "a%d: &a%d [*a%d, *a%d, *a%d, *a%d]\n", i, i, i-1, i-1, i-1, i-1)
	}

	b.WriteString("version: v1\nmig-configs:\n  bomb:\n    - devices: *a29\n      mig-enabled: false\n")

	start := time.Now()
	_, err := mig.Parse([]byte(b.String()))
	require.Error(t, err)
	assert.Less(t, time.Since(start), 5*time.Second)
	assert.Contains(t, err.Error(), `unknown top-level key "a0"`)

	// Merge keys: each map merges four of the one before.
	b.Reset()
	b.WriteString("version: v1\nmig-configs:\n  bomb:\n    - &m0 {devices: all, mig-enabled: true, mig-devices: {\"1g.18gb\": 1}}\n")

	for i := 1; i < 30; i++ {
		fmt.Fprintf(&b, "    - &m%d {<<: [*m%d, *m%d, *m%d, *m%d]}\n", i, i-1, i-1, i-1, i-1)
	}

	start = time.Now()
	_, err = mig.Parse([]byte(b.String()))
	require.Error(t, err)
	assert.Less(t, time.Since(start), 5*time.Second)
	assert.Contains(t, err.Error(), `line 8: layout "bomb", entry 4, document contains excessive aliasing`)
}

// TestLoadFileSizeLimit: a layouts file larger than document.MaxFileSize is refused before it
// is parsed, naming the file; every NVIDIA file in testdata fits under the limit.
func TestLoadFileSizeLimit(t *testing.T) {
	files, err := filepath.Glob("testdata/nvidia/*.yaml")
	require.NoError(t, err)
	require.NotEmpty(t, files)

	for _, f := range files {
		st, err := os.Stat(f)
		require.NoError(t, err)
		assert.Less(t, st.Size(), int64(document.MaxFileSize/4), f)
	}

	path := filepath.Join(t.TempDir(), "mig.yaml")
	big := "version: v1\nmig-configs:\n" + strings.Repeat("  l: [{devices: all, mig-enabled: false}]\n", document.MaxFileSize/40)
	require.NoError(t, os.WriteFile(path, []byte(big), 0o644))

	_, err = mig.LoadFile(path)
	require.ErrorIs(t, err, document.ErrTooLarge)
	assert.Contains(t, err.Error(), path)
}
