// Package talospatch applies a machine config patch the way talosctl does and validates the
// result as an installed (metal) node does, with Talos's own code: configloader, configpatcher,
// generate and the documents' Validate. It names no Talos release: it is compiled against the
// machinery of the module that imports it (the product's go.mod: v1.13.5; hack/talos-machinery/talos113:
// v1.13.9; hack/talos-machinery/talos114: v1.14.1), so one test runs each example patch against the
// `talosctl gen config` output of the release its module requires.
package talospatch

import (
	"fmt"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/configpatcher"
	"github.com/siderolabs/talos/pkg/machinery/config/generate"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"
	"github.com/siderolabs/talos/pkg/machinery/config/validation"
	"github.com/siderolabs/talos/pkg/machinery/constants"
)

// Metal is the runtime mode of an installed Talos node (`talosctl gen config`'s target).
type Metal struct{}

func (Metal) String() string        { return "metal" }
func (Metal) RequiresInstall() bool { return true }
func (Metal) InContainer() bool     { return false }

var _ validation.RuntimeMode = Metal{}

// Worker returns a worker's machine config as `talosctl gen config gpu
// https://gpu.example.com:6443 --install-disk /dev/nvme0n1` makes it with this machinery:
// its default Kubernetes version, secrets and version contract, plus opts (for example
// generate.WithVersionContract, as `--talos-version` sets it).
func Worker(opts ...generate.Option) (config.Provider, error) {
	input, err := generate.NewInput("gpu", "https://gpu.example.com:6443", constants.DefaultKubernetesVersion,
		append([]generate.Option{generate.WithInstallDisk("/dev/nvme0n1")}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("generate input: %w", err)
	}

	cfg, err := input.Config(machine.TypeWorker)
	if err != nil {
		return nil, fmt.Errorf("generate worker config: %w", err)
	}

	return cfg, nil
}

// Apply loads each patch as talosctl does (strictly: an unknown field or document kind is an
// error; a strategic merge patch, not a JSON patch) and merges them, in order, onto base.
func Apply(base config.Provider, patches ...[]byte) (config.Provider, error) {
	loaded := make([]configpatcher.Patch, 0, len(patches))

	for i, data := range patches {
		if _, err := configloader.NewFromBytes(data, configloader.WithAllowPatchDelete()); err != nil {
			return nil, fmt.Errorf("patch %d: load: %w", i, err)
		}

		patch, err := configpatcher.LoadPatch(data)
		if err != nil {
			return nil, fmt.Errorf("patch %d: %w", i, err)
		}

		if _, ok := patch.(configpatcher.StrategicMergePatch); !ok {
			return nil, fmt.Errorf("patch %d: a %T, not a strategic merge patch", i, patch)
		}

		loaded = append(loaded, patch)
	}

	out, err := configpatcher.Apply(configpatcher.WithConfig(base), loaded)
	if err != nil {
		return nil, fmt.Errorf("apply: %w", err)
	}

	cfg, err := out.Config()
	if err != nil {
		return nil, fmt.Errorf("patched config: %w", err)
	}

	return cfg, nil
}

// Validate validates cfg strictly in metal mode, as machined does before it accepts a config
// (talosctl apply-config and patch run the same validation), and returns its warnings.
func Validate(cfg config.Provider) ([]string, error) {
	warnings, err := cfg.Validate(Metal{}, validation.WithStrict())
	if err != nil {
		return warnings, fmt.Errorf("validate (metal, strict): %w", err)
	}

	return warnings, nil
}

// ApplyAndValidate is Apply then Validate: the patched config and its warnings, or the first
// error of either.
func ApplyAndValidate(base config.Provider, patches ...[]byte) (config.Provider, []string, error) {
	cfg, err := Apply(base, patches...)
	if err != nil {
		return nil, nil, err
	}

	warnings, err := Validate(cfg)

	return cfg, warnings, err
}
