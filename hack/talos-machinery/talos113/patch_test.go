// Package talos113_test applies the example machine config patches for Talos 1.13 with the
// machinery of v1.13.9, the newest 1.13 release of the recipes: this module requires machinery
// v1.13.9 (the product's go.mod stays on v1.13.5, where docs/docs_test.go runs the same patches
// with the service's own loader and the MIG planner), so the config they are merged onto is
// the one v1.13.9's `talosctl gen config` makes.
package talos113_test

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/internal/talospatch"
)

// examples is docs/examples of the repository, two levels above this module (go test runs
// in the package's directory). The module imports nothing of the product but talospatch.
func examples(t *testing.T) string {
	t.Helper()

	dir, err := filepath.Abs(filepath.Join("..", "..", "..", "docs", "examples"))
	require.NoError(t, err)

	return dir
}

func example(t *testing.T, name string) []byte {
	t.Helper()

	data, err := os.ReadFile(filepath.Join(examples(t), name))
	require.NoError(t, err)

	return data
}

// generated is the worker config v1.13.9's generate makes, made once: configpatcher merges
// onto a clone (configpatcher/strategic.go), so every test can start from it.
var generated = sync.OnceValues(func() (config.Provider, error) { return talospatch.Worker() })

func worker(t *testing.T) config.Provider {
	t.Helper()

	cfg, err := generated()
	require.NoError(t, err)

	return cfg
}

// apply merges the patches onto a v1.13.9 worker and validates the result strictly in metal
// mode, with no warning (the generated config has none: checked first).
func apply(t *testing.T, patches ...[]byte) config.Provider {
	t.Helper()

	base, err := talospatch.Validate(worker(t))
	require.NoError(t, err, "the generated config validates on its own")
	require.Empty(t, base)

	cfg, warnings, err := talospatch.ApplyAndValidate(worker(t), patches...)
	require.NoError(t, err)
	assert.Empty(t, warnings)

	return cfg
}

func escFiles(t *testing.T, cfg config.Provider) map[string]string {
	t.Helper()

	files := map[string]string{}

	for _, ext := range cfg.ExtensionServiceConfigs() {
		require.Equal(t, "nvidia-driver", ext.Name(), "the extension's service is named nvidia-driver")
		assert.Empty(t, ext.Environment(), "settings in files, not environment (docs/extension.md)")

		for _, f := range ext.ConfigFiles() {
			files[f.MountPath()] = f.Content()
		}
	}

	return files
}

// TestExamplePatches113: every patch for 1.13 (docs/examples/talos-1.13/, and those written
// for both releases) loads strictly with v1.13.9's loader, merges with its configpatcher onto
// the worker config its generate makes, validates strictly in metal mode without a warning,
// and does what its comment says.
func TestExamplePatches113(t *testing.T) {
	const gpuWorker = "talos-1.13/gpu-worker.patch.yaml"

	checks := map[string]func(t *testing.T, cfg config.Provider){
		gpuWorker: func(t *testing.T, cfg config.Provider) {
			var modules []string
			for _, m := range cfg.Machine().Kernel().Modules() {
				modules = append(modules, m.Name())
			}

			assert.Equal(t, []string{"nvidia", "nvidia_uvm", "nvidia_drm", "nvidia_modeset"}, modules)
			// deploy/'s DaemonSets select on this label (siderolabs/talos#12103).
			assert.Equal(t, "true", cfg.Machine().NodeLabels()["nvidia.com/gpu.present"])
			assert.Equal(t,
				[]any{map[string]any{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}},
				cfg.Machine().Kubelet().ExtraConfig()["registerWithTaints"])
		},
		"talos-1.13/mig.patch.yaml": func(t *testing.T, cfg config.Provider) {
			assert.Equal(t, "mixed", cfg.Machine().NodeLabels()["nvidia.com/device-plugin.config"])
			assert.Contains(t, escFiles(t, cfg)["/etc/nvidia-driver/config.yaml"], "migLayout: inference")
		},
		"mig-h100.patch.yaml": func(t *testing.T, cfg config.Provider) {
			assert.Contains(t, escFiles(t, cfg)["/etc/nvidia-driver/config.yaml"], "migLayout: inference-h100")
		},
	}

	// every patch for 1.13 has a check: those under talos-1.13/ and the ones for both
	// releases at the top
	for _, glob := range []string{"talos-1.13/*.yaml", "*.patch.yaml"} {
		files, err := filepath.Glob(filepath.Join(examples(t), glob))
		require.NoError(t, err)

		for _, f := range files {
			name := strings.TrimPrefix(f, examples(t)+"/")
			_, ok := checks[name]
			assert.True(t, ok, "docs/examples/%s: add a check for it here", name)
		}
	}

	for name, check := range checks {
		t.Run(name, func(t *testing.T) {
			cfg := apply(t, example(t, name))
			check(t, cfg)

			if name == gpuWorker {
				assert.Empty(t, escFiles(t, cfg), "no document: the service runs with its defaults")

				return
			}

			// A MIG patch goes onto a GPU worker: both apply, and both do what they say.
			cfg = apply(t, example(t, gpuWorker), example(t, name))
			checks[gpuWorker](t, cfg)
			check(t, cfg)
		})
	}
}

// TestBrokenPatchFails113: a patch that fails v1.13.9's validation fails the helper this
// module's tests use: a copy of the worker patch with a label value Kubernetes refuses loads
// and merges, and the v1alpha1 config's Validate refuses it.
func TestBrokenPatchFails113(t *testing.T) {
	good := string(example(t, "talos-1.13/gpu-worker.patch.yaml"))
	broken := strings.Replace(good, `nvidia.com/gpu.present: "true"`, `nvidia.com/gpu.present: "not a label value!"`, 1)
	require.NotEqual(t, good, broken)

	cfg, err := talospatch.Apply(worker(t), []byte(broken))
	require.NoError(t, err, "it loads and merges")

	_, err = talospatch.Validate(cfg)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "invalid machine node labels")
	assert.Contains(t, err.Error(), `label value "not a label value!" is invalid`)
}

// TestPatches114On113: the 1.14 patches name documents v1.13.9 does not know, and its strict
// loader refuses them: a 1.13 node needs the talos-1.13/ patches.
func TestPatches114On113(t *testing.T) {
	for _, name := range []string{"talos-1.14/gpu-worker.patch.yaml", "talos-1.14/mig.patch.yaml"} {
		_, err := talospatch.Apply(worker(t), example(t, name))
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), "KubeNodeConfig", name)
	}
}

// TestDocPatches113: every patch a page of docs/ or the README shows, written for 1.13 or for
// both releases (talospatch.DocRelease), loads, merges and validates strictly on v1.13.9's
// worker config (with the 1.13 GPU worker patch under it, as the docs apply them), so that a
// 1.14 document or key in a 1.13 patch fails here.
func TestDocPatches113(t *testing.T) {
	root, err := filepath.Abs(filepath.Join(examples(t), "..", ".."))
	require.NoError(t, err)

	patches, err := talospatch.DocPatchesFor(root, talospatch.Release113)
	require.NoError(t, err)
	require.NotEmpty(t, patches)

	for _, p := range patches {
		t.Run(p.Where, func(t *testing.T) { apply(t, example(t, "talos-1.13/gpu-worker.patch.yaml"), []byte(p.Text)) })
	}
}
