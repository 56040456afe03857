package talos114_test

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/generate"
	"github.com/siderolabs/talos/pkg/machinery/config/types/k8s"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/internal/talospatch"
	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
)

// example reads docs/examples/<name>.
func example(t *testing.T, name string) []byte {
	t.Helper()

	data, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "docs", "examples", name))
	require.NoError(t, err)

	return data
}

// generated is the worker config 1.14's generate makes, made once: configpatcher merges
// onto a clone (configpatcher/strategic.go), so every test can start from it.
var generated = sync.OnceValues(func() (config.Provider, error) { return talospatch.Worker() })

// worker is a worker config as 1.14's `talosctl gen config` makes it (with opts, a new one).
func worker(t *testing.T, opts ...generate.Option) config.Provider {
	t.Helper()

	var (
		cfg config.Provider
		err error
	)

	if len(opts) == 0 {
		cfg, err = generated()
	} else {
		cfg, err = talospatch.Worker(opts...)
	}

	require.NoError(t, err)

	return cfg
}

// baseWarnings are the warnings of the generated config itself (1.14 warns that
// installer.image is unset: it publishes its installer through the Image Factory only). A
// patch may add none.
func baseWarnings(t *testing.T) []string {
	t.Helper()

	w, err := talospatch.Validate(worker(t))
	require.NoError(t, err, "the generated config validates on its own")

	return w
}

// apply merges the patches onto a 1.14 worker, validates it strictly in metal mode and
// checks it adds no warning.
func apply(t *testing.T, patches ...[]byte) config.Provider {
	t.Helper()

	cfg, warnings, err := talospatch.ApplyAndValidate(worker(t), patches...)
	require.NoError(t, err)
	assert.Equal(t, baseWarnings(t), warnings)

	return cfg
}

func modules(cfg config.Provider) []string {
	var names []string
	for _, m := range cfg.KernelModuleConfigs() {
		names = append(names, m.Name())
	}

	return names
}

// kubelet is the config's KubeletConfig document (1.14's gen config writes one).
func kubelet(t *testing.T, cfg config.Provider) *k8s.KubeletConfigV1Alpha1 {
	t.Helper()

	for _, d := range cfg.Documents() {
		if d, ok := d.(*k8s.KubeletConfigV1Alpha1); ok {
			return d
		}
	}

	require.FailNow(t, "no KubeletConfig document")

	return nil
}

var registerTaint = []any{map[string]any{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}}

// escFiles returns the nvidia-driver ExtensionServiceConfig's files by mount path.
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

// TestExamplePatches114: every patch for 1.14 (docs/examples/talos-1.14/, and those written
// for both releases) loads strictly with 1.14's loader, merges with 1.14's configpatcher onto
// the worker config 1.14's generate makes, and validates strictly in metal mode with no
// warning added; each does what its comment says.
func TestExamplePatches114(t *testing.T) {
	checks := map[string]func(t *testing.T, cfg config.Provider){
		"talos-1.14/gpu-worker.patch.yaml": func(t *testing.T, cfg config.Provider) {
			assert.ElementsMatch(t, []string{"nvidia", "nvidia_uvm", "nvidia_drm", "nvidia_modeset"}, modules(cfg))
			assert.Nil(t, cfg.RawV1Alpha1().MachineConfig.MachineKernel, "no .machine.kernel: 1.14 deprecates it") //nolint:staticcheck // checking the deprecated field is unset
			// deploy/'s DaemonSets select on this label (siderolabs/talos#12103).
			assert.Equal(t, "true", cfg.K8sNodeConfig().Labels()["nvidia.com/gpu.present"])
			assert.Equal(t, registerTaint, kubelet(t, cfg).KubeletConfig.Object["registerWithTaints"])
		},
		"talos-1.14/mig.patch.yaml": func(t *testing.T, cfg config.Provider) {
			assert.Equal(t, "mixed", cfg.K8sNodeConfig().Labels()["nvidia.com/device-plugin.config"])
			assert.Contains(t, escFiles(t, cfg)["/etc/nvidia-driver/config.yaml"], "migLayout: inference")
		},
		"mig-h100.patch.yaml": func(t *testing.T, cfg config.Provider) {
			assert.Contains(t, escFiles(t, cfg)["/etc/nvidia-driver/config.yaml"], "migLayout: inference-h100")
		},
		// The removal patches, each on a node with what it undoes (undoes, below): nothing of
		// the GPU patches is left.
		"talos-1.14/gpu-worker-remove.patch.yaml": noGPUSettings,
		"talos-1.14/mig-remove.patch.yaml": func(t *testing.T, cfg config.Provider) {
			assert.NotContains(t, cfg.K8sNodeConfig().Labels(), "nvidia.com/device-plugin.config")
			assert.Empty(t, cfg.ExtensionServiceConfigs())
			// The GPU worker patch is still there until its own removal patch.
			assert.Equal(t, "true", cfg.K8sNodeConfig().Labels()["nvidia.com/gpu.present"])
		},
	}

	// What each removal patch is applied after, in order.
	undoes := map[string][]string{
		"talos-1.14/gpu-worker-remove.patch.yaml": {"talos-1.14/gpu-worker.patch.yaml"},
		"talos-1.14/mig-remove.patch.yaml":        {"talos-1.14/gpu-worker.patch.yaml", "talos-1.14/mig.patch.yaml"},
	}

	for _, glob := range []string{"talos-1.14/*.yaml", "*.patch.yaml"} {
		files, err := filepath.Glob(filepath.Join(testutil.RepoRoot(t), "docs", "examples", glob))
		require.NoError(t, err)

		for _, f := range files {
			name := strings.TrimPrefix(f, filepath.Join(testutil.RepoRoot(t), "docs", "examples")+"/")
			if strings.HasPrefix(name, "talos-1.13/") {
				continue
			}

			_, ok := checks[name]
			assert.True(t, ok, "docs/examples/%s: add a check for it here (or move it under talos-1.13/)", name)
		}
	}

	gpuWorker := example(t, "talos-1.14/gpu-worker.patch.yaml")

	for name, check := range checks {
		t.Run(name, func(t *testing.T) {
			if before, ok := undoes[name]; ok {
				var patches [][]byte
				for _, b := range before {
					patches = append(patches, example(t, b))
				}
				check(t, apply(t, append(patches, example(t, name))...))

				return
			}

			cfg := apply(t, example(t, name))
			check(t, cfg)

			if name == "talos-1.14/gpu-worker.patch.yaml" {
				assert.Empty(t, escFiles(t, cfg), "no document: the service runs with its defaults")

				return
			}

			// A MIG patch goes onto a GPU worker: both apply, and both do what they say.
			cfg = apply(t, gpuWorker, example(t, name))
			checks["talos-1.14/gpu-worker.patch.yaml"](t, cfg)
			check(t, cfg)
		})
	}
}

// TestMIGPatchSameDocument114: the 1.14 MIG patch's ExtensionServiceConfig is the 1.13 one,
// byte for byte, so that docs/docs_test.go's checks of it with the service's own loader and
// the MIG planner (run on the 1.13 patch) hold for it.
func TestMIGPatchSameDocument114(t *testing.T) {
	_, esc14, ok := strings.Cut(string(example(t, "talos-1.14/mig.patch.yaml")), "\n---\n")
	require.True(t, ok)
	_, esc13, ok := strings.Cut(string(example(t, "talos-1.13/mig.patch.yaml")), "\n---\n")
	require.True(t, ok)
	assert.Equal(t, esc13, esc14)
}

// TestBrokenPatchFails114: a patch that fails 1.14's validation fails this test's helper: a
// copy of the worker patch with a label value Kubernetes refuses loads and merges, and is
// refused by KubeNodeConfig's Validate.
func TestBrokenPatchFails114(t *testing.T) {
	good := string(example(t, "talos-1.14/gpu-worker.patch.yaml"))
	broken := strings.Replace(good, `nvidia.com/gpu.present: "true"`, `nvidia.com/gpu.present: "not a label value!"`, 1)
	require.NotEqual(t, good, broken)

	cfg, err := talospatch.Apply(worker(t), []byte(broken))
	require.NoError(t, err, "it loads and merges")

	_, err = talospatch.Validate(cfg)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "invalid node labels")

	// and one with a field KernelModuleConfig does not have fails strict loading
	_, err = talospatch.Apply(worker(t), []byte(strings.Replace(good, "name: nvidia_drm", "name: nvidia_drm\nparams: []", 1)))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "params")
}

// TestGPUWorkerPatch113On114: the 1.13 patch does not apply to a config 1.14 generates,
// which is why docs/examples/talos-1.14/ has its own.
func TestGPUWorkerPatch113On114(t *testing.T) {
	_, _, err := talospatch.ApplyAndValidate(worker(t), example(t, "talos-1.13/gpu-worker.patch.yaml"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "kubelet config is already set in v1alpha1 config (.machine.kubelet)")
}

// TestPatchesOnConfigFrom113: a cluster created on 1.13 and upgraded keeps the machine config
// 1.13's gen config made (`talosctl gen config --talos-version v1.13` makes the same with
// 1.14's talosctl). On it, 1.14 takes the 1.13 patch (the deprecated keys still work, with the
// same modules, label and taint), and refuses the 1.14 one, whose KubeletConfig and
// KubeNodeConfig conflict with that config's .machine.kubelet: the patch to use follows the
// config's origin, not the Talos version the node runs.
func TestPatchesOnConfigFrom113(t *testing.T) {
	from113 := worker(t, generate.WithVersionContract(config.TalosVersion1_13))

	cfg, err := talospatch.Apply(from113, example(t, "talos-1.13/gpu-worker.patch.yaml"))
	require.NoError(t, err)
	_, err = talospatch.Validate(cfg)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"nvidia", "nvidia_uvm", "nvidia_drm", "nvidia_modeset"}, modules(cfg))
	assert.Equal(t, "true", cfg.K8sNodeConfig().Labels()["nvidia.com/gpu.present"])

	_, _, err = talospatch.ApplyAndValidate(from113, example(t, "talos-1.14/gpu-worker.patch.yaml"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "already set in v1alpha1 config")
}

// TestInstallImageWarning114: docs/getting-started.md says 1.14's generated config warns of an
// unset installer image (1.14 publishes no plain installer: its CHANGELOG), and that
// `--install-image` (generate.WithInstallImage) leaves no warning.
func TestInstallImageWarning114(t *testing.T) {
	assert.Equal(t, []string{"installer.image is not set, if Talos is not booted from asset built by Image Factory, installation will fail"}, baseWarnings(t))

	w, err := talospatch.Validate(worker(t, generate.WithInstallImage("registry.example.com/talos/installer:v1.14.1-nvidia")))
	require.NoError(t, err)
	assert.Empty(t, w)
}

// TestGPUWorkerConfigOfItsOwn114: docs/getting-started.md makes the GPU workers' config with a
// second `talosctl gen config` from the same secrets, `--install-image` naming the GPU
// installer and `--config-patch-worker` the GPU patch: that config validates with no warning
// and carries both, while the CPU workers' config keeps neither.
func TestGPUWorkerConfigOfItsOwn114(t *testing.T) {
	const installer = "registry.example.com/talos/installer:v1.14.1-nvidia"

	cfg, warnings, err := talospatch.ApplyAndValidate(worker(t, generate.WithInstallImage(installer)), example(t, "talos-1.14/gpu-worker.patch.yaml"))
	require.NoError(t, err)
	assert.Empty(t, warnings)
	assert.Equal(t, installer, cfg.UnattendedInstallConfig().InstallerImage())
	assert.Equal(t, "true", cfg.K8sNodeConfig().Labels()["nvidia.com/gpu.present"])

	cpu := worker(t)
	assert.Empty(t, cpu.UnattendedInstallConfig().InstallerImage())
	assert.NotContains(t, cpu.K8sNodeConfig().Labels(), "nvidia.com/gpu.present")
	assert.Empty(t, modules(cpu))
}

// TestInstallerPatchLosesDiskSelector114: why the docs make the GPU workers' config with a
// second `talosctl gen config` rather than a patch naming the installer. 1.14's configpatcher
// merges an UnattendedInstallConfig patch that sets only installer.image over the generated
// document's provisioning, dropping its disk selector, and the result no longer validates.
func TestInstallerPatchLosesDiskSelector114(t *testing.T) {
	patch := []byte("apiVersion: v1alpha1\nkind: UnattendedInstallConfig\ninstaller:\n  image: registry.example.com/talos/installer:v1.14.1-nvidia\n")

	_, _, err := talospatch.ApplyAndValidate(worker(t), patch)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "provisioning.diskSelector.match is required")
}

// noGPUSettings: a config with nothing of the GPU patches: no NVIDIA module, label, taint or
// nvidia-driver document.
func noGPUSettings(t *testing.T, cfg config.Provider) {
	t.Helper()
	assert.Empty(t, modules(cfg))
	assert.NotContains(t, cfg.K8sNodeConfig().Labels(), "nvidia.com/gpu.present")
	assert.NotContains(t, cfg.K8sNodeConfig().Labels(), "nvidia.com/device-plugin.config")
	assert.NotContains(t, kubelet(t, cfg).KubeletConfig.Object, "registerWithTaints")
	assert.Empty(t, cfg.ExtensionServiceConfigs())
}

// TestUninstallPatches114: docs/day-2.md's uninstall on a node with both GPU patches (the MIG
// removal, then the GPU worker's) leaves nothing of them; on a node without the GPU patch the
// removal fails, as its comment says.
func TestUninstallPatches114(t *testing.T) {
	cfg := apply(t,
		example(t, "talos-1.14/gpu-worker.patch.yaml"), example(t, "talos-1.14/mig.patch.yaml"),
		example(t, "talos-1.14/mig-remove.patch.yaml"), example(t, "talos-1.14/gpu-worker-remove.patch.yaml"))
	noGPUSettings(t, cfg)

	_, err := talospatch.Apply(worker(t), example(t, "talos-1.14/gpu-worker-remove.patch.yaml"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "lookup failed")
}

// TestDocPatches114: every patch a page of docs/ or the README shows, written for 1.14 or for
// both releases (talospatch.DocRelease), loads strictly, merges with 1.14's configpatcher
// onto the worker config 1.14's generate makes (with the 1.14 GPU worker patch under it, as
// the docs apply them) and validates strictly in metal mode with no warning added, so that a
// 1.13 key in a 1.14 page's patch fails here.
func TestDocPatches114(t *testing.T) {
	patches, err := talospatch.DocPatchesFor(testutil.RepoRoot(t), talospatch.Release114)
	require.NoError(t, err)
	require.NotEmpty(t, patches)

	for _, p := range patches {
		t.Run(p.Where, func(t *testing.T) { apply(t, example(t, "talos-1.14/gpu-worker.patch.yaml"), []byte(p.Text)) })
	}
}

// TestDocPatchChecksFail114: the classification and the check fail on slips of their kind: a
// 1.13 key in a patch a 1.14 page shows is a 1.13 patch, which 1.14's config refuses; a 1.14
// document is never taken for a patch of both releases.
func TestDocPatchChecksFail114(t *testing.T) {
	slip := "machine:\n  nodeLabels:\n    nvidia.com/gpu.present: \"true\"\n  kubelet:\n    extraConfig:\n      registerWithTaints: []\n"
	release, ok := talospatch.DocRelease(slip)
	require.True(t, ok)
	assert.Equal(t, talospatch.Release113, release)

	_, _, err := talospatch.ApplyAndValidate(worker(t), []byte(slip))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "already set in v1alpha1 config")

	release, ok = talospatch.DocRelease("apiVersion: v1alpha1\nkind: KubeNodeConfig\nlabels: {}\n---\napiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: nvidia-driver\n")
	require.True(t, ok)
	assert.Equal(t, talospatch.Release114, release)

	_, ok = talospatch.DocRelease("apiVersion: v1\nkind: Pod\n")
	assert.False(t, ok)
}
