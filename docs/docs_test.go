// Tests for the user documentation: every machine config patch it shows is a file in
// docs/examples that Talos's own loader accepts and that validates once merged onto a
// generated worker config; the example pods decode as Kubernetes pods; every repository
// path, script and make target the docs name exists.
package docs_test

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/configpatcher"
	"github.com/siderolabs/talos/pkg/machinery/config/generate"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"
	"github.com/siderolabs/talos/pkg/machinery/config/validation"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"
)

const root = ".."

// metal is the runtime mode of an installed Talos node.
type metal struct{}

func (metal) String() string        { return "metal" }
func (metal) RequiresInstall() bool { return true }
func (metal) InContainer() bool     { return false }

var _ validation.RuntimeMode = metal{}

func TestMachineConfigPatches(t *testing.T) {
	// A worker config as `talosctl gen config` makes it; it validates on its own, so an
	// error below comes from the patch.
	input, err := generate.NewInput("gpu", "https://gpu.example.com:6443", constants.DefaultKubernetesVersion,
		generate.WithInstallDisk("/dev/nvme0n1"))
	require.NoError(t, err)
	plain, err := input.Config(machine.TypeWorker)
	require.NoError(t, err)
	_, err = plain.Validate(metal{}, validation.WithStrict())
	require.NoError(t, err)

	patches, err := filepath.Glob("examples/*.patch.yaml")
	require.NoError(t, err)
	require.NotEmpty(t, patches)

	checks := map[string]func(t *testing.T, env map[string][]string, cfgFiles map[string]map[string]string, modules, labels []string){
		"gpu-worker.patch.yaml": func(t *testing.T, _ map[string][]string, _ map[string]map[string]string, modules, labels []string) {
			assert.Equal(t, []string{"nvidia", "nvidia_uvm", "nvidia_drm", "nvidia_modeset"}, modules)
			// deploy/'s DaemonSets select on this label (siderolabs/talos#12103).
			assert.Contains(t, labels, "nvidia.com/gpu.present=true")
		},
		"mig.patch.yaml": func(t *testing.T, env map[string][]string, files map[string]map[string]string, _, labels []string) {
			assert.Contains(t, labels, "nvidia.com/device-plugin.config=mixed")
			assert.Contains(t, env["nvidia-driver"], "NVIDIA_DRIVER_MIG_LAYOUT=h200-balanced")
			layout, ok := files["nvidia-driver"]["/etc/nvidia-driver/mig.yaml"]
			require.True(t, ok, "the MIG layout file is mounted at /etc/nvidia-driver/mig.yaml")
			var migParted struct {
				Version    string                      `json:"version"`
				MigConfigs map[string][]map[string]any `json:"mig-configs"`
			}
			require.NoError(t, yaml.UnmarshalStrict([]byte(layout), &migParted))
			assert.Equal(t, "v1", migParted.Version)
			assert.Contains(t, migParted.MigConfigs, "h200-balanced", "the layout the environment names is in the file")
		},
	}

	for _, path := range patches {
		t.Run(filepath.Base(path), func(t *testing.T) {
			data, err := os.ReadFile(path)
			require.NoError(t, err)

			// Talos's loader, strict about unknown fields, as talosctl uses for patches.
			_, err = configloader.NewFromBytes(data, configloader.WithAllowPatchDelete())
			require.NoError(t, err)
			patch, err := configpatcher.LoadPatch(data)
			require.NoError(t, err)
			_, isStrategic := patch.(configpatcher.StrategicMergePatch)
			require.True(t, isStrategic, "a strategic merge patch, as the docs apply it")

			// Merged onto a generated worker config, the result validates strictly.
			base, err := input.Config(machine.TypeWorker)
			require.NoError(t, err)
			out, err := configpatcher.Apply(configpatcher.WithConfig(base), []configpatcher.Patch{patch})
			require.NoError(t, err)
			cfg, err := out.Config()
			require.NoError(t, err)
			warnings, err := cfg.Validate(metal{}, validation.WithStrict())
			require.NoError(t, err)
			assert.Empty(t, warnings)

			var modules, labels []string
			for _, m := range cfg.Machine().Kernel().Modules() {
				modules = append(modules, m.Name())
			}
			for k, v := range cfg.Machine().NodeLabels() {
				labels = append(labels, k+"="+v)
			}
			env := map[string][]string{}
			files := map[string]map[string]string{}
			for _, ext := range cfg.ExtensionServiceConfigs() {
				env[ext.Name()] = ext.Environment()
				files[ext.Name()] = map[string]string{}
				for _, f := range ext.ConfigFiles() {
					files[ext.Name()][f.MountPath()] = f.Content()
				}
			}
			check, ok := checks[filepath.Base(path)]
			require.True(t, ok, "add a check for %s", path)
			check(t, env, files, modules, labels)
		})
	}
}

func TestExamplePods(t *testing.T) {
	for file, resourceName := range map[string]corev1.ResourceName{
		"examples/gpu-pod.yaml": "nvidia.com/gpu",
		"examples/mig-pod.yaml": "nvidia.com/mig-1g.18gb",
	} {
		data, err := os.ReadFile(file)
		require.NoError(t, err)
		var pod corev1.Pod
		require.NoError(t, yaml.UnmarshalStrict(data, &pod), file)
		assert.Nil(t, pod.Spec.RuntimeClassName, "%s: no NVIDIA runtime class on Talos", file)
		require.Len(t, pod.Spec.Containers, 1)
		assert.Equal(t, resource.MustParse("1"), pod.Spec.Containers[0].Resources.Limits[resourceName], file)
		for _, e := range pod.Spec.Containers[0].Env {
			assert.NotEqual(t, "NVIDIA_VISIBLE_DEVICES", e.Name, "%s: the env var alone gives no GPU", file)
		}
	}
}

var (
	fence     = regexp.MustCompile("^```")
	repoPath  = regexp.MustCompile("(?:^|[\\s`(])((?:deploy|docs|hack|pkg)/[A-Za-z0-9_./-]*[A-Za-z0-9_])")
	makeCall  = regexp.MustCompile("(?m)(?:`|^\\s*)make ([a-z][a-z0-9-]*)") // in code, not prose
	patchLike = regexp.MustCompile(`(?m)^(machine|cluster):|^kind: ExtensionServiceConfig`)
)

type block struct {
	file, lang, text string
	line             int
}

func markdownFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("*.md")
	require.NoError(t, err)
	if _, err := os.Stat(filepath.Join(root, "README.md")); err == nil {
		files = append(files, filepath.Join(root, "README.md"))
	}
	require.NotEmpty(t, files)
	return files
}

func codeBlocks(t *testing.T, file string) []block {
	t.Helper()
	f, err := os.Open(file)
	require.NoError(t, err)
	defer f.Close()
	var blocks []block
	var cur *block
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur == nil && fence.MatchString(strings.TrimSpace(line)):
			cur = &block{file: file, lang: strings.TrimPrefix(strings.TrimSpace(line), "```"), line: n}
		case cur != nil && strings.TrimSpace(line) == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.text += line + "\n"
		}
	}
	require.NoError(t, sc.Err())
	require.Nil(t, cur, "%s: unclosed code block", file)
	return blocks
}

// A machine config patch shown in the docs is the verbatim content of a tested file,
// named by its first line.
func TestDocsShowOnlyTestedPatches(t *testing.T) {
	shown := 0
	for _, file := range markdownFiles(t) {
		for _, b := range codeBlocks(t, file) {
			if !patchLike.MatchString(b.text) {
				continue
			}
			first, _, _ := strings.Cut(b.text, "\n")
			name, ok := strings.CutPrefix(first, "# docs/examples/")
			require.True(t, ok, "%s:%d: a machine config patch must be one of docs/examples/*.patch.yaml, shown with its first line `# docs/examples/NAME`", b.file, b.line)
			require.True(t, strings.HasSuffix(name, ".patch.yaml"), "%s:%d", b.file, b.line)
			want, err := os.ReadFile(filepath.Join("examples", name))
			require.NoError(t, err, "%s:%d", b.file, b.line)
			assert.Equal(t, string(want), b.text, "%s:%d: differs from docs/examples/%s", b.file, b.line, name)
			shown++
		}
	}
	assert.Positive(t, shown)
}

// Paths, scripts and make targets the docs mention exist.
func TestDocsReferencesExist(t *testing.T) {
	targets := makeTargets(t)
	for _, file := range markdownFiles(t) {
		data, err := os.ReadFile(file)
		require.NoError(t, err)
		for _, m := range repoPath.FindAllStringSubmatch(string(data), -1) {
			p := strings.TrimSuffix(m[1], ".")
			if strings.Contains(p, "NAME") || strings.Contains(p, "...") {
				continue
			}
			_, err := os.Stat(filepath.Join(root, p))
			assert.NoError(t, err, "%s mentions %s", file, p)
		}
		for _, m := range makeCall.FindAllStringSubmatch(string(data), -1) {
			assert.True(t, slices.Contains(targets, m[1]), "%s runs `make %s`, which no Makefile defines", file, m[1])
		}
	}
}

func makeTargets(t *testing.T) []string {
	t.Helper()
	var targets []string
	for _, mk := range []string{filepath.Join(root, "Makefile"), filepath.Join(root, "hack", "deploy.mk")} {
		data, err := os.ReadFile(mk)
		if os.IsNotExist(err) {
			continue
		}
		require.NoError(t, err)
		for _, line := range strings.Split(string(data), "\n") {
			if name, _, ok := strings.Cut(line, ":"); ok && !strings.ContainsAny(name, " \t=$#.") && name != "" {
				targets = append(targets, name)
			}
		}
	}
	return targets
}
