package harness_test

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/internal/extension"
	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
)

// TestServiceYAMLMountSources checks both services' mounts against what machined
// does with them (services/extension.go Runner: os.MkdirAll(source) from its read-only /):
// every source absolute; nothing of the host's /proc (through /proc/<pid>/root it opens the
// whole host, /system/state included); every bind rslave but /run/nvidia, the one mount that
// must propagate both ways (the driver root). f0d7957's YAML failed all three.
func TestServiceYAMLMountSources(t *testing.T) {
	top := testutil.RepoRoot(t)

	for _, name := range []string{"nvidia-driver", "nvidia-fabricmanager"} {
		t.Run(name, func(t *testing.T) {
			svc, err := extension.LoadServiceSpec(filepath.Join(top, "extension", name+".yaml"))
			require.NoError(t, err)

			for _, m := range svc.Container.Mounts {
				assert.True(t, filepath.IsAbs(m.Source), "%s: source %q is relative: machined creates it from /, read-only", m.Destination, m.Source)
				assert.False(t, m.Source == "/proc" || strings.HasPrefix(m.Source, "/proc/"), "%s: the host's /proc is not mounted", m.Destination)

				if m.Type != "bind" {
					continue
				}

				want := "rslave"
				if m.Source == "/run/nvidia" {
					want = "rshared"
				}

				assert.True(t, slices.Contains(m.Options, want), "%s: %v, want %s", m.Source, m.Options, want)
			}
		})
	}
}
