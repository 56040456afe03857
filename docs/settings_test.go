package docs_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/pkg/config"
)

var (
	// A line of config.Describe: the variable, the key, its default.
	describeLine = regexp.MustCompile(`^\s+(NVIDIA_DRIVER_\w+)\s+(\w+)\s+default (\S+)$`)
	// A row of extension.md's settings table.
	settingsRow = regexp.MustCompile("^\\| `(\\w+)` \\| `(NVIDIA_DRIVER_\\w+)` \\| (`[^`]*`|\\(empty\\)) \\|")
	serviceVar  = regexp.MustCompile(`\bNVIDIA_DRIVER_[A-Z_]*[A-Z]\b`)
)

// serviceSettings is the service's own list: variable → key and default.
func serviceSettings(t *testing.T) map[string][2]string {
	t.Helper()
	out := map[string][2]string{}
	for _, line := range strings.Split(config.Describe(), "\n") {
		if m := describeLine.FindStringSubmatch(line); m != nil {
			def := m[3]
			if def == `""` {
				def = ""
			}
			out[m[1]] = [2]string{m[2], def}
		}
	}
	require.NotEmpty(t, out, "config.Describe's format changed")
	return out
}

// docSettingsTable reads extension.md's settings table: variable → key and default.
func docSettingsTable(t *testing.T, text string) map[string][2]string {
	t.Helper()
	out := map[string][2]string{}
	for _, line := range strings.Split(text, "\n") {
		if m := settingsRow.FindStringSubmatch(line); m != nil {
			def := strings.Trim(m[3], "`")
			if def == "(empty)" {
				def = ""
			}
			out[m[2]] = [2]string{m[1], def}
		}
	}
	return out
}

// TestSettingsTable: extension.md's settings table is the service's own list (config.Describe,
// what `nvidia-driver help` prints): every key, variable and default, none missing, none
// extra but the test-only host root.
func TestSettingsTable(t *testing.T) {
	data, err := os.ReadFile("extension.md")
	require.NoError(t, err)
	want := serviceSettings(t)
	delete(want, config.EnvPrefix+"HOST_ROOT") // the tests' and the demo's, not a node's
	assert.Equal(t, want, docSettingsTable(t, string(data)))
}

// TestDocsNameOnlyKnownVariables: every NVIDIA_DRIVER_ variable the docs name is one of the
// service's settings, its configuration file's variable, or NVIDIA's own two that share the
// prefix.
func TestDocsNameOnlyKnownVariables(t *testing.T) {
	known := serviceSettings(t)
	for _, v := range []string{config.EnvConfigFile, "NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_DRIVER_ROOT"} {
		known[v] = [2]string{}
	}
	host := t.TempDir()
	for _, src := range docSources(t) {
		for _, loc := range serviceVar.FindAllStringIndex(src.text, -1) {
			v := src.text[loc[0]:loc[1]]
			_, ok := known[v]
			assert.True(t, ok || retired(host, v), "%s:%d: %s is no setting of the service (pkg/config)", src.name, lineOf(src.text, loc[0]), v)
		}
	}
}

// retired says whether the service takes v as a setting it no longer has (loads, and says it
// ignores it), as nvswitch.md says of NVIDIA_DRIVER_FABRIC_MANAGER.
func retired(host, v string) bool {
	c, err := config.Load([]string{config.EnvPrefix + "HOST_ROOT=" + host, v + "=false"})
	if err != nil {
		return false
	}
	for _, why := range c.Ignored {
		if strings.Contains(why, v) {
			return true
		}
	}
	return false
}

// TestSettingsChecksFail: the checks fail on a slip of their kind: a table row with a wrong
// default, and a variable the service does not have.
func TestSettingsChecksFail(t *testing.T) {
	want := serviceSettings(t)
	table := docSettingsTable(t, "| `migRetry` | `NVIDIA_DRIVER_MIG_RETRY` | `5m` | ... |\n")
	assert.NotEqual(t, want["NVIDIA_DRIVER_MIG_RETRY"], table["NVIDIA_DRIVER_MIG_RETRY"])
	_, ok := want["NVIDIA_DRIVER_MIG_LAYOUTS"]
	assert.False(t, ok)
	assert.Equal(t, []string{"NVIDIA_DRIVER_MIG_LAYOUTS"}, serviceVar.FindAllString("set NVIDIA_DRIVER_MIG_LAYOUTS=x", -1))
	assert.False(t, retired(t.TempDir(), "NVIDIA_DRIVER_MIG_LAYOUTS"), "an unknown variable is no retired one")
	assert.True(t, retired(t.TempDir(), "NVIDIA_DRIVER_FABRIC_MANAGER"))
}
