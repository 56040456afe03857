package config_test

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/pkg/config"
	"github.com/talos-nvidia/nvidia-driver/pkg/document"
)

// load writes file as the configuration file and loads it with env.
func load(t *testing.T, file string, env ...string) (config.Config, error) {
	t.Helper()

	path := filepath.Join(t.TempDir(), "config.yaml")
	require.NoError(t, os.WriteFile(path, []byte(file), 0o644))

	return config.Load(append(env, config.EnvConfigFile+"="+path))
}

func TestDefaultsNeedNoConfiguration(t *testing.T) {
	// No variable set and no file at the default path (absent on this machine).
	if _, err := os.Stat(config.DefaultConfigFile); err == nil {
		t.Skipf("%s exists on this machine", config.DefaultConfigFile)
	}

	c, err := config.Load([]string{"PATH=/usr/bin", "HOME=/root"})
	require.NoError(t, err)

	assert.Equal(t, "/", c.HostRoot)
	assert.Equal(t, "/usr/local/glibc", c.Subroot)
	assert.Equal(t, slog.LevelInfo, c.LogLevel)
	assert.True(t, c.Persistenced)
	assert.True(t, c.PersistenceMode)
	assert.False(t, c.UVMPersistenceMode)
	assert.True(t, c.CDI)
	assert.Equal(t, "/run/cdi/nvidia.yaml", c.CDISpec)
	assert.Equal(t, "/etc/nvidia-driver/mig.yaml", c.MIGConfig)
	assert.Empty(t, c.MIGLayout)
	assert.Equal(t, "/run/nvidia/driver", c.DriverMount())
	assert.Equal(t, "/run/nvidia/validations", c.ValidationsDir())
}

func TestFileThenEnvironment(t *testing.T) {
	c, err := load(t, "version: v1alpha1\nlogLevel: debug\nmigLayout: all-1g\npersistenceMode: false\n",
		"NVIDIA_DRIVER_MIG_LAYOUT=all-balanced", "NVIDIA_DRIVER_HOST_ROOT=/tmp/x/")
	require.NoError(t, err)

	assert.Equal(t, slog.LevelDebug, c.LogLevel)
	assert.False(t, c.PersistenceMode)
	assert.Equal(t, "all-balanced", c.MIGLayout, "the environment wins over the file")
	assert.Equal(t, "env", c.Source["migLayout"])
	assert.Equal(t, "/tmp/x", c.HostRoot)
	assert.Equal(t, "/tmp/x/run/nvidia/driver", c.DriverMount())
}

// TestEveryProblemAtOnce: a user fixes a configuration in one round, not one error a restart.
func TestEveryProblemAtOnce(t *testing.T) {
	_, err := load(t, "version: v1alpha1\nlogLevl: debug\npersistenceMode: maybe\nsubroot: relative/path\nmigLayout: [a, b]\nlogLevel: loud\n",
		"NVIDIA_DRIVER_MIG_LAYOT=x", "NVIDIA_DRIVER_CDI=yes please", "NVIDIA_DRIVER_SIMULATE=h200:4")
	require.Error(t, err)

	msg := err.Error()
	for _, want := range []string{
		`config.yaml:2: unknown key "logLevl" (did you mean logLevel?)`,
		`config.yaml:3: persistenceMode: "maybe" is not a boolean (true or false)`,
		`config.yaml:4: subroot: "relative/path" is not an absolute path`,
		`config.yaml:5: migLayout: expected a single value`,
		`config.yaml:6: logLevel: slog: level string "loud": unknown name`,
		`environment: unknown variable NVIDIA_DRIVER_MIG_LAYOT (did you mean NVIDIA_DRIVER_MIG_LAYOUT?)`,
		`environment: NVIDIA_DRIVER_CDI: "yes please" is not a boolean`,
		"environment: unknown variable NVIDIA_DRIVER_SIMULATE", // only the demo build knows it
	} {
		assert.Contains(t, msg, want)
	}
}

func TestVersion(t *testing.T) {
	cases := map[string]string{
		"logLevel: info\n":                     `missing "version: v1alpha1"`,
		"version: v2\n":                        `version "v2" is not supported, this build reads "v1alpha1"`,
		"":                                     "empty file",
		"- a\n- b\n":                           "expected a mapping of settings",
		"version: v1alpha1\nversion: v1alpha1": `key "version" repeated (first on line 1)`,
		"version: [":                           "yaml:",
	}

	for file, want := range cases {
		t.Run(strings.TrimSpace(file), func(t *testing.T) {
			_, err := load(t, file)
			require.ErrorContains(t, err, want)
		})
	}
}

// TestNVIDIAVariablesAreNotOurs: environments of NVIDIA's tools carry variables with our
// prefix (seen on a GPU host: NVIDIA_DRIVER_CAPABILITIES); they must not fail the service.
func TestNVIDIAVariablesAreNotOurs(t *testing.T) {
	_, err := load(t, "version: v1alpha1\n", "NVIDIA_DRIVER_CAPABILITIES=compute,utility", "NVIDIA_DRIVER_ROOT=/run/nvidia/driver")
	require.NoError(t, err)
}

func TestExplicitFileMustExist(t *testing.T) {
	_, err := config.Load([]string{config.EnvConfigFile + "=/nonexistent/config.yaml"})
	require.ErrorContains(t, err, "reading configuration file: open /nonexistent/config.yaml")
}

// TestInvalidConfigurationStillSaysWhereToReport: with an error, Load returns the settings
// it could read, so that the service logs at the asked level and writes its failed status
// under the host root; a host root it was not given right is left empty.
func TestInvalidConfigurationStillSaysWhereToReport(t *testing.T) {
	cases := []struct {
		name     string
		env      []string
		hostRoot string
		level    slog.Level
	}{
		{"bad boolean", []string{"NVIDIA_DRIVER_HOST_ROOT=/tmp/node", "NVIDIA_DRIVER_LOG_LEVEL=debug", "NVIDIA_DRIVER_CDI=maybe"}, "/tmp/node", slog.LevelDebug},
		{"bad host root", []string{"NVIDIA_DRIVER_HOST_ROOT=relative"}, "", slog.LevelInfo},
	}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := load(t, "version: v1alpha1\n", tc.env...)
			require.Error(t, err)
			assert.Equal(t, tc.hostRoot, c.HostRoot)
			assert.Equal(t, tc.level, c.LogLevel)
		})
	}
}

// TestRetiredSettingsAreIgnoredAndSaid: a document written for an earlier build still loads;
// what it sets that this build no longer has is named, with what replaced it.
func TestRetiredSettingsAreIgnoredAndSaid(t *testing.T) {
	c, err := load(t, "version: v1alpha1\nfabricManager: false\n", "NVIDIA_DRIVER_FABRIC_MANAGER=false")
	require.NoError(t, err)
	require.Len(t, c.Ignored, 2)
	assert.Contains(t, c.Ignored[0], ":2: fabricManager is ignored: the fabric manager runs in the ext-nvidia-fabricmanager service")
	assert.Contains(t, c.Ignored[1], "environment: NVIDIA_DRIVER_FABRIC_MANAGER is ignored")
}

// TestDocumentSizeLimits: a file larger than document.MaxFileSize is refused before it is
// parsed, and the error names the file and the limit; a file of the limit loads (issue 32: a
// 10 MB document took 26 s, 813 MB and 74 MB of log and status).
func TestDocumentSizeLimits(t *testing.T) {
	head := "version: v1alpha1\nlogLevel: debug\n"
	pad := func(n int) string { return head + "#" + strings.Repeat("x", n-len(head)-2) + "\n" }

	c, err := load(t, pad(document.MaxFileSize))
	require.NoError(t, err)
	assert.Equal(t, slog.LevelDebug, c.LogLevel)

	_, err = load(t, pad(document.MaxFileSize+1))
	require.ErrorIs(t, err, document.ErrTooLarge)
	assert.Contains(t, err.Error(), "config.yaml: 65537 bytes: larger than 64 KiB, the limit of a document file")
}

// TestValueLengthLimit: a value longer than MaxValueLen, in the file or the environment, is
// refused before it is parsed; the error names the key or variable and the limit, not the value.
func TestValueLengthLimit(t *testing.T) {
	long := strings.Repeat("a", config.MaxValueLen+1)

	_, err := load(t, "version: v1alpha1\nmigLayout: "+long+"\n", "NVIDIA_DRIVER_SUBROOT=/"+long)
	require.Error(t, err)

	msg := err.Error()
	assert.Contains(t, msg, "config.yaml:2: migLayout: a value of 4097 bytes, longer than the limit of 4096")
	assert.Contains(t, msg, "environment: NVIDIA_DRIVER_SUBROOT: a value of 4098 bytes, longer than the limit of 4096")
	assert.NotContains(t, msg, long[:100])

	c, err := load(t, "version: v1alpha1\nmigLayout: "+long[1:]+"\n")
	require.NoError(t, err, "a value of the limit is taken")
	assert.Len(t, c.MIGLayout, config.MaxValueLen)
}

// TestBadDocumentReportIsBounded: the error of a document with thousands of problems lists the
// first MaxProblems, each cut short, and counts the rest, so the log line and the status file
// stay small.
func TestBadDocumentReportIsBounded(t *testing.T) {
	var b strings.Builder

	b.WriteString("version: v1alpha1\n" + strings.Repeat("k", 1000) + ": x\n")

	for i := range 5000 {
		fmt.Fprintf(&b, "u%d: x\n", i)
	}

	require.Less(t, b.Len(), document.MaxFileSize)

	_, err := load(t, b.String(), "NVIDIA_DRIVER_"+strings.Repeat("V", 3000)+"=x")
	require.Error(t, err)

	msg := err.Error()
	assert.Less(t, len(msg), 8<<10, "the report is bounded")
	assert.Contains(t, msg, `config.yaml:2: unknown key "kkkk`)
	assert.Contains(t, msg, `config.yaml:21: unknown key "u18"`)
	assert.NotContains(t, msg, `"u19"`, "only the first problems are listed")
	assert.Contains(t, msg, "\n  - and 4982 more", "5001 keys and 1 variable unknown, 20 listed")
	assert.NotContains(t, msg, strings.Repeat("k", 400), "a long problem is cut")
}
