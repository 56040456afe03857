package cli_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/pkg/gpu/models"
	"github.com/talos-nvidia/nvidia-driver/pkg/mig"
	"github.com/talos-nvidia/nvidia-driver/pkg/mig/cli"
)

const layouts = `version: v1
mig-configs:
  mixed:
    - devices: all
      mig-enabled: true
      mig-devices: {"1c.3g.40gb": 3, "4g.40gb": 1}
`

func TestPlanJSONGolden(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "mig.yaml")
	require.NoError(t, os.WriteFile(file, []byte(layouts), 0o600))

	var out, errOut bytes.Buffer
	code := cli.RunPlanCLI([]string{"--gpu", "h100-80gb", "--gpus", "2", "--config", file, "--select", "mixed", "-o", "json"}, &out, &errOut)
	require.Equal(t, 0, code, errOut.String())

	golden, err := os.ReadFile("testdata/h100-mixed.json")
	require.NoError(t, err)
	assert.Equal(t, string(golden), out.String())
}

// TestPlanRejectsIndicesTheNodeLacks: `devices: [0, 5]` planned for 2 GPUs names the file,
// line and key instead of planning GPU 0 and ignoring 5.
func TestPlanRejectsIndicesTheNodeLacks(t *testing.T) {
	file := filepath.Join(t.TempDir(), "mig.yaml")
	require.NoError(t, os.WriteFile(file, []byte("version: v1\nmig-configs:\n  pair:\n    - devices: [0, 5]\n      mig-enabled: true\n      mig-devices: {\"7g.80gb\": 1}\n"), 0o600))

	var out, errOut bytes.Buffer
	code := cli.RunPlanCLI([]string{"--gpu", "h100-80gb", "--gpus", "2", "--config", file, "--select", "pair"}, &out, &errOut)
	assert.Equal(t, 1, code)
	assert.Equal(t, "mig plan: invalid MIG config "+file+`: line 4: layout "pair", entry 0, devices[1]: GPU 5 does not exist: the node has 2 GPU(s), indices 0 to 1`+"\n", errOut.String())
	assert.Empty(t, out.String())
}

// TestPlanNotesUnverifiedData: a model whose file is not all from sources says so on stderr;
// one that is says nothing.
func TestPlanNotesUnverifiedData(t *testing.T) {
	for _, tc := range []struct{ gpu, note string }{
		{"b200", "mig plan: note: 9 facts of the b200 data are in no source (pkg/gpu/models/data/b200.json, \"unverified\"); on a node the service asks NVML\n"},
		{"h200", ""},
	} {
		var out, errOut bytes.Buffer
		code := cli.RunPlanCLI([]string{"--gpu", tc.gpu, "--select", "all-balanced"}, &out, &errOut)
		require.Equal(t, 0, code, errOut.String())
		assert.Equal(t, tc.note, errOut.String(), tc.gpu)
		assert.Contains(t, out.String(), "fits on 1 × "+tc.gpu)
	}
}

func TestPlanFailures(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--gpu", "a100-40gb", "--select", "all-balanced"}, 0, "layout \"all-balanced\" fits on 1 × a100-40gb (NVIDIA A100-SXM4-40GB):\n  GPU 0: MIG on: 2g.10gb@0[2g.10gb] 1g.5gb@2[1g.5gb] 1g.5gb@3[1g.5gb] 3g.20gb@4[3g.20gb]\n"},
		{[]string{"--gpu", "t4", "--select", "all-max"}, 2, "mig plan: unknown GPU model \"t4\" (known: a100-40gb, a100-80gb, a100-pcie-40gb, a100-pcie-80gb, a30, a800-40gb, a800-80gb, b200, b300, gb200, gb300, gh200, gh200-144gb, h100-80gb, h100-96gb, h100-nvl, h100-pcie, h20, h200, h200-nvl, h800, rtx-pro-6000)\n"},
		{[]string{"--gpu", "h200"}, 2, "mig plan: --select is required\n"},
		{[]string{"--gpu", "h200", "--select", "mixed"}, 1, "mig plan: no layout \"mixed\" (layouts: all-1g, all-balanced, all-disabled, all-enabled, all-max)\n"},
	} {
		var out, errOut bytes.Buffer
		code := cli.RunPlanCLI(tc.args, &out, &errOut)
		assert.Equal(t, tc.code, code, tc.args)

		got := out.String()
		if code != 0 {
			got = firstLine(errOut.String())
		}

		assert.Equal(t, tc.want, got)
	}
}

func firstLine(s string) string {
	i := bytes.IndexByte([]byte(s), '\n')
	if i < 0 {
		return s
	}

	return s[:i+1]
}

// BenchmarkPlanBuiltins is `mig plan --gpus 8` for every built-in layout and GPU model:
// loading the model's data file, building its 8 GPUs and planning. Reported per plan.
func BenchmarkPlanBuiltins(b *testing.B) {
	cfg := mig.Builtin()

	for _, model := range models.Keys() {
		for _, layout := range mig.BuiltinLayouts() {
			b.Run(model+"/"+layout, func(b *testing.B) {
				b.ReportAllocs()

				for i := 0; i < b.N; i++ {
					spec, err := models.Lookup(model)
					if err != nil {
						b.Fatal(err)
					}

					if _, err := cli.Plan(spec, 8, cfg, layout); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// TestPlanNVIDIAFileVerbatim: the GPU Operator's default file as it ships: its all-balanced
// wins over the built-in one, and a layout for other models is nothing to do.
func TestPlanNVIDIAFileVerbatim(t *testing.T) {
	const file = "../testdata/gpu-operator-default-mig-config.yaml"

	for _, tc := range []struct {
		layout, want string
	}{
		{"all-balanced", "layout \"all-balanced\" fits on 1 × h200 (NVIDIA H200):\n  GPU 0: MIG on: 2g.35gb@0[2g.35gb] 1g.18gb@2[1g.18gb] 1g.18gb@3[1g.18gb] 3g.71gb@4[3g.71gb]\n"},
		{"all-1g.10gb", "layout \"all-1g.10gb\" selects no h200 GPU (its device filters match none): nothing to do\n"},
	} {
		var out, errOut bytes.Buffer
		code := cli.RunPlanCLI([]string{"--gpu", "h200", "--config", file, "--select", tc.layout}, &out, &errOut)
		require.Equal(t, 0, code, errOut.String())
		assert.Equal(t, tc.want, out.String())
	}
}
