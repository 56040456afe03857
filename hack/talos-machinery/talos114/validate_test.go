// Package talos114_test validates the extension with Talos 1.14's code: this module requires
// machinery v1.14.1, and builds the product's internal/extension (replace ../../..) against it, so
// the same validator that the product runs with Talos 1.13's machinery runs here with 1.14's
// (extensions.Load and Validate, services.Spec with the fields 1.14 added: RunnerMode, used
// below, exists only from 1.14 on, so this does not compile against 1.13's machinery). The product's
// go.mod stays on one machinery; make test runs both.
package talos114_test

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/siderolabs/talos/pkg/machinery/extensions/services"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/talos-nvidia/nvidia-driver/internal/extension"
	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
)

// Talos is the 1.14 release these tests validate against.
const Talos = "v1.14.1"

// TestExtensionValidFor114: the development extension, assembled with a constraint that
// admits 1.14, passes Talos 1.14's Load and Validate and the project's checks built on 1.14.
func TestExtensionValidFor114(t *testing.T) {
	o := testutil.DevExtension(t)
	o.TalosVersion, o.TalosConstraint = Talos, ">= v1.13.0 <= "+Talos

	res, err := extension.Assemble(slog.New(slog.NewTextHandler(io.Discard, nil)), o)
	require.NoError(t, err)
	require.NoError(t, extension.Validate(res.Dir, Talos))

	// 1.14's Validate still refuses what 1.13's does: a constraint that excludes it.
	m := filepath.Join(res.Dir, "manifest.yaml")
	data, err := os.ReadFile(m)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(m, []byte(strings.Replace(string(data), "<= "+Talos, "<= v1.13.9", 1)), 0o644))
	assert.ErrorContains(t, extension.Validate(res.Dir, Talos), "can't be satisfied with Talos version")
}

// TestServicesUnder114: every service YAML parses strictly as 1.14's services.Spec and
// passes its Validate in container mode, 1.14's default (runnerMode, preShutdown are new).
// As a control, the same YAML in host mode is refused with 1.14's own reasons.
func TestServicesUnder114(t *testing.T) {
	specs, err := filepath.Glob(filepath.Join(testutil.RepoRoot(t), "extension", "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, specs)

	for _, p := range specs {
		t.Run(filepath.Base(p), func(t *testing.T) {
			spec, err := extension.LoadServiceSpec(p)
			require.NoError(t, err)
			assert.Equal(t, services.RunnerModeContainer, spec.RunnerMode)
			assert.Nil(t, spec.PreShutdown)

			data, err := os.ReadFile(p)
			require.NoError(t, err)

			var host services.Spec
			require.NoError(t, yaml.Unmarshal(append(data, []byte("runnerMode: host\n")...), &host))
			err = host.Validate()
			require.Error(t, err)
			assert.Contains(t, err.Error(), "container mounts are not supported in host runner mode")
		})
	}
}
