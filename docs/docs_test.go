// Tests for the user documentation: every machine config patch it shows is a file in
// docs/examples that Talos's own loader accepts and that validates once merged onto a
// generated worker config; the example pods decode as Kubernetes pods; every repository
// path, script and make target the docs name exists.
package docs_test

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	talosconfig "github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/talos-nvidia/nvidia-driver/internal/sim"
	"github.com/talos-nvidia/nvidia-driver/internal/talospatch"
	"github.com/talos-nvidia/nvidia-driver/pkg/config"
	"github.com/talos-nvidia/nvidia-driver/pkg/document"
	"github.com/talos-nvidia/nvidia-driver/pkg/mig"
	migcli "github.com/talos-nvidia/nvidia-driver/pkg/mig/cli"
)

const root = ".."

// patched is a machine config patch merged onto a generated worker config.
type patched struct {
	modules, labels []string
	env             map[string][]string          // by extension service
	files           map[string]map[string]string // by service, then mount path
	service         *config.Config               // the nvidia-driver document's settings
}

// workerConfig returns a generated worker config, as `talosctl gen config` makes it with this
// module's machinery (v1.13.5; hack/talos-machinery/talos113 runs the 1.13 patches on v1.13.9's, hack/talos-machinery/talos114
// the 1.14 ones on v1.14.1's); it validates on its own, so a validation error after patching
// comes from the patch.
func workerConfig(t *testing.T) talosconfig.Provider {
	t.Helper()
	cfg, err := talospatch.Worker()
	require.NoError(t, err)
	warnings, err := talospatch.Validate(cfg)
	require.NoError(t, err)
	require.Empty(t, warnings)
	return cfg
}

// applyPatch loads a patch the way talosctl does, merges it onto a worker config and
// validates the result strictly (internal/talospatch); the nvidia-driver service's settings
// in it are checked with the service's own loader and its MIG layout file with the MIG
// package's parser.
func applyPatch(t *testing.T, base talosconfig.Provider, data ...[]byte) patched {
	t.Helper()
	cfg, warnings, err := talospatch.ApplyAndValidate(base, data...)
	require.NoError(t, err)
	assert.Empty(t, warnings)

	p := patched{env: map[string][]string{}, files: map[string]map[string]string{}}
	for _, m := range cfg.Machine().Kernel().Modules() {
		p.modules = append(p.modules, m.Name())
	}
	for k, v := range cfg.Machine().NodeLabels() {
		p.labels = append(p.labels, k+"="+v)
	}
	for _, ext := range cfg.ExtensionServiceConfigs() {
		p.env[ext.Name()] = ext.Environment()
		p.files[ext.Name()] = map[string]string{}
		for _, f := range ext.ConfigFiles() {
			p.files[ext.Name()][f.MountPath()] = f.Content()
		}
	}
	for name := range p.env {
		assert.Equal(t, "nvidia-driver", name, "the extension's service is named nvidia-driver")
	}
	if _, ok := p.files["nvidia-driver"]; ok {
		svc := loadService(t, p)
		p.service = &svc
		if data, err := os.ReadFile(svc.MIGConfig); err == nil {
			layouts, err := mig.Parse(data)
			require.NoError(t, err, "the service rejects its MIG layout file")
			if svc.MIGLayout != "" && !slices.Contains(mig.BuiltinLayouts(), svc.MIGLayout) {
				_, err := layouts.Select(svc.MIGLayout)
				require.NoError(t, err)
			}
		}
	}
	return p
}

// loadService loads the nvidia-driver document's settings with the service's own loader, its
// files laid where Talos writes them on a node (/system/overlays/extensions/nvidia-driver/,
// package document) under a throwaway host root: the path a document added to a running
// node takes, and the one that reads the same files as a mounted document.
func loadService(t *testing.T, p patched) config.Config {
	t.Helper()
	host := t.TempDir()
	dir := string(document.For(host, config.ServiceName))
	require.NoError(t, os.MkdirAll(dir, 0o755))
	for mountPath, content := range p.files["nvidia-driver"] {
		require.NoError(t, os.WriteFile(filepath.Join(dir, document.FileName(mountPath)), []byte(content), 0o644))
	}
	svc, err := config.Load(append([]string{"NVIDIA_DRIVER_HOST_ROOT=" + host}, p.env["nvidia-driver"]...))
	require.NoError(t, err, "the service rejects its document")
	return svc
}

// TestMachineConfigPatches: the patches for Talos 1.13 (examples/talos-1.13/ and those for
// both releases at the top of examples/) on this module's machinery, each with what it must
// do beyond validating; the 1.14 patches are hack/talos-machinery/talos114's.
func TestMachineConfigPatches(t *testing.T) {
	input := workerConfig(t)

	var examples []string
	for _, glob := range []string{"examples/talos-1.13/*.yaml", "examples/*.yaml"} {
		files, err := filepath.Glob(glob)
		require.NoError(t, err)
		examples = append(examples, files...)
	}

	// What each patch must do beyond validating, and for MIG patches the GPUs they are
	// written for: the layout is planned on simulated GPUs of each model.
	checks := map[string]struct {
		check func(t *testing.T, p patched)
		gpus  []string
	}{
		"talos-1.13/gpu-worker.patch.yaml": {check: func(t *testing.T, p patched) {
			assert.Equal(t, []string{"nvidia", "nvidia_uvm", "nvidia_drm", "nvidia_modeset"}, p.modules)
			// No document: the service runs with its defaults (docs/extension.md).
			assert.NotContains(t, p.files, "nvidia-driver")
			// deploy/'s DaemonSets select on this label (siderolabs/talos#12103).
			assert.Contains(t, p.labels, "nvidia.com/gpu.present=true")
		}},
		"talos-1.13/mig.patch.yaml": {gpus: []string{"h100-80gb", "h100-pcie", "h200", "a100-80gb", "a100-pcie-80gb", "a100-40gb", "a100-pcie-40gb", "a30"}, check: func(t *testing.T, p patched) {
			assert.Contains(t, p.labels, "nvidia.com/device-plugin.config=mixed")
			require.NotNil(t, p.service)
			assert.Equal(t, "inference", p.service.MIGLayout)
			// In files, not environment: they reach a service running when the document is added.
			assert.Empty(t, p.env["nvidia-driver"])
		}},
		"mig-h100.patch.yaml": {gpus: []string{"h100-80gb", "h100-pcie"}, check: func(t *testing.T, p patched) {
			require.NotNil(t, p.service)
			assert.Equal(t, "inference-h100", p.service.MIGLayout)
			assert.Empty(t, p.env["nvidia-driver"])
		}},
	}

	worker, err := os.ReadFile("examples/talos-1.13/gpu-worker.patch.yaml")
	require.NoError(t, err)

	seen := 0
	for _, path := range examples {
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		if _, ok := talospatch.DocRelease(string(data)); !ok {
			continue // a Kubernetes manifest
		}
		seen++
		name := strings.TrimPrefix(path, "examples/")
		t.Run(name, func(t *testing.T) {
			c, ok := checks[name]
			require.True(t, ok, "add a check for %s", path)
			p := applyPatch(t, input, data)
			c.check(t, p)
			if len(c.gpus) == 0 {
				return
			}
			// A MIG patch goes onto a GPU worker.
			p = applyPatch(t, input, worker, data)
			c.check(t, p)
			svc := *p.service
			mf, err := os.ReadFile(svc.MIGConfig)
			require.NoError(t, err)
			layouts, err := mig.Parse(mf)
			require.NoError(t, err)
			for _, gpu := range c.gpus {
				spec, err := sim.LookupModel(gpu)
				require.NoError(t, err)
				plan, err := migcli.Plan(spec, 2, layouts, svc.MIGLayout)
				require.NoError(t, err, "layout %q does not fit two %s", svc.MIGLayout, gpu)
				// Not "nothing to do": the layout is written for this model.
				assert.Equal(t, 2, plan.Selected(), "layout %q selects no %s", svc.MIGLayout, gpu)
			}
		})
	}
	assert.Equal(t, len(checks), seen, "every checked patch exists")
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
	fence    = regexp.MustCompile("^```")
	repoPath = regexp.MustCompile("(?:^|[\\s`(])((?:deploy|docs|hack|pkg)/[A-Za-z0-9_./-]*[A-Za-z0-9_])")
	makeCall = regexp.MustCompile("(?m)(?:`|^\\s*)make ([a-z](?:[a-z0-9.-]*[a-z0-9])?)") // in code, not prose; test-talos-node-1.13
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

// Every machine config patch shown in the docs validates like the example files, and
// one that names its file on its first line (`# docs/examples/NAME`) is that file
// verbatim. A 1.14 patch (named under talos-1.14/, or made of 1.14's documents:
// talospatch.DocRelease) is only compared here: hack/talos-machinery/talos114 validates it,
// as it does every patch written for both releases; hack/talos-machinery/talos113 validates
// the 1.13 ones on v1.13.9.
func TestDocsPatchesValidate(t *testing.T) {
	input := workerConfig(t)
	shown := 0
	for _, file := range markdownFiles(t) {
		for _, b := range codeBlocks(t, file) {
			release, ok := talospatch.DocRelease(b.text)
			if !ok {
				continue
			}
			shown++
			t.Run(fmt.Sprintf("%s:%d", filepath.Base(b.file), b.line), func(t *testing.T) {
				first, _, _ := strings.Cut(b.text, "\n")
				if release != talospatch.Release114 {
					applyPatch(t, input, []byte(b.text))
				}
				if name, ok := strings.CutPrefix(first, "# docs/examples/"); ok {
					want, err := os.ReadFile(filepath.Join("examples", name))
					require.NoError(t, err)
					assert.Equal(t, string(want), b.text, "differs from docs/examples/%s", name)
				}
			})
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
	// The Makefile and the files it includes (each folder of hack/ its own targets' file).
	makefile := filepath.Join(root, "Makefile")
	top, err := os.ReadFile(makefile)
	require.NoError(t, err)
	files := []string{makefile}
	for _, line := range strings.Split(string(top), "\n") {
		if inc, ok := strings.CutPrefix(line, "include "); ok {
			files = append(files, filepath.Join(root, strings.TrimSpace(inc)))
		}
	}
	require.Greater(t, len(files), 1, "the Makefile includes no targets' file")
	for _, mk := range files {
		data, err := os.ReadFile(mk)
		require.NoError(t, err)
		for _, line := range strings.Split(string(data), "\n") {
			// Not .PHONY and the like, pattern rules or variables; a dot inside a name is fine.
			if name, _, ok := strings.Cut(line, ":"); ok && !strings.ContainsAny(name, " \t=$#%") && name != "" && !strings.HasPrefix(name, ".") {
				targets = append(targets, name)
			}
		}
	}
	return targets
}
