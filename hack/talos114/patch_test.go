package talos114_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/configpatcher"
	"github.com/siderolabs/talos/pkg/machinery/config/generate"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"
	"github.com/siderolabs/talos/pkg/machinery/config/types/k8s"
	"github.com/siderolabs/talos/pkg/machinery/config/validation"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
)

type metal struct{}

func (metal) String() string        { return "metal" }
func (metal) RequiresInstall() bool { return true }
func (metal) InContainer() bool     { return false }

// patchWorker loads a patch (none: nil) as talosctl does (strictly) and merges it onto a worker config
// as 1.14's `talosctl gen config` makes it.
func patchWorker(t *testing.T, data []byte) config.Provider {
	t.Helper()

	var patches []configpatcher.Patch

	if data != nil {
		_, err := configloader.NewFromBytes(data, configloader.WithAllowPatchDelete())
		require.NoError(t, err)

		patch, err := configpatcher.LoadPatch(data)
		require.NoError(t, err)

		patches = append(patches, patch)
	}

	input, err := generate.NewInput("gpu", "https://gpu.example.com:6443", constants.DefaultKubernetesVersion,
		generate.WithInstallDisk("/dev/nvme0n1"))
	require.NoError(t, err)

	base, err := input.Config(machine.TypeWorker)
	require.NoError(t, err)

	out, err := configpatcher.Apply(configpatcher.WithConfig(base), patches)
	require.NoError(t, err)

	cfg, err := out.Config()
	require.NoError(t, err)

	return cfg
}

// TestGPUWorkerPatch114: docs/examples/talos-1.14/gpu-worker.patch.yaml loads strictly with
// 1.14's loader, merges onto a 1.14 worker config and validates strictly without a warning;
// its modules are KernelModuleConfig documents and .machine.kernel is empty.
func TestGPUWorkerPatch114(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "docs", "examples", "talos-1.14", "gpu-worker.patch.yaml"))
	require.NoError(t, err)

	cfg := patchWorker(t, data)

	// The patch adds no warning to those of the config 1.14 generates (which warns that
	// installer.image is unset: 1.14 publishes its installer through the Image Factory).
	baseWarnings, err := patchWorker(t, nil).Validate(metal{}, validation.WithStrict())
	require.NoError(t, err)

	warnings, err := cfg.Validate(metal{}, validation.WithStrict())
	require.NoError(t, err)
	assert.Equal(t, baseWarnings, warnings)

	var modules []string
	for _, m := range cfg.KernelModuleConfigs() {
		modules = append(modules, m.Name())
	}

	assert.ElementsMatch(t, []string{"nvidia", "nvidia_uvm", "nvidia_drm", "nvidia_modeset"}, modules)
	assert.Nil(t, cfg.RawV1Alpha1().MachineConfig.MachineKernel, "no .machine.kernel: 1.14 deprecates it")

	var node *k8s.KubeNodeConfigV1Alpha1

	var kubelet *k8s.KubeletConfigV1Alpha1

	for _, d := range cfg.Documents() {
		switch d := d.(type) {
		case *k8s.KubeNodeConfigV1Alpha1:
			node = d
		case *k8s.KubeletConfigV1Alpha1:
			kubelet = d
		}
	}

	require.NotNil(t, node, "1.14's generated config has a KubeNodeConfig")
	require.NotNil(t, kubelet, "and a KubeletConfig")
	// deploy/'s DaemonSets select on this label (siderolabs/talos#12103).
	assert.Equal(t, "true", node.LabelsConfig["nvidia.com/gpu.present"])
	assert.Equal(t, []any{map[string]any{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}}, kubelet.KubeletConfig.Object["registerWithTaints"])
}

// TestGPUWorkerPatch113On114: the 1.13 patch does not apply to a config 1.14 generates,
// which is why docs/examples/talos-1.14/ has its own.
func TestGPUWorkerPatch113On114(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "docs", "examples", "gpu-worker.patch.yaml"))
	require.NoError(t, err)

	cfg := patchWorker(t, data)
	_, err = cfg.Validate(metal{}, validation.WithStrict())
	assert.ErrorContains(t, err, "kubelet config is already set in v1alpha1 config (.machine.kubelet)")
}
