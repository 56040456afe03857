package harness_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/internal/harness"
	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
	"github.com/talos-nvidia/nvidia-driver/pkg/extension"
)

// The harness runs the service from nothing but the extension's files, under runc, with the
// OCI spec Talos would give it, and looks from the host side. The extension is assembled
// from the working tree's service (so a stale _out never passes) and the Debian subroot.

var (
	extOnce sync.Once
	extWork string
	extDir  string
	extErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()

	if extWork != "" {
		os.RemoveAll(extWork) //nolint:errcheck // scratch
	}

	os.Exit(code)
}

func assembled(t *testing.T) string {
	t.Helper()
	testutil.RequireRoot(t)

	if _, err := exec.LookPath("runc"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("runc missing: hack/install-test-deps.sh installs it")
		}

		t.Skip("runc missing: run hack/install-test-deps.sh")
	}

	top := testutil.RepoRoot(t)
	out := filepath.Join(top, "_out")

	for _, p := range []string{"bin/nvidia-cdi-hook", "bin/ldconfig"} {
		if _, err := os.Stat(filepath.Join(out, p)); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s missing: CI runs make build first", p)
			}

			t.Skipf("%s missing: run make build first", p)
		}
	}

	bin := testutil.ServiceBinary(t)
	subroot := testutil.Subroot(t)

	extOnce.Do(func() {
		work, err := os.MkdirTemp("", "harness-ext-")
		if err != nil {
			extErr = err

			return
		}

		extWork = work

		ctr := filepath.Join(work, "ctr")

		if o, err := exec.Command(filepath.Join(top, "hack/stage-service-rootfs.sh"), bin, ctr).CombinedOutput(); err != nil {
			extErr = err
			t.Logf("%s", o)

			return
		}

		res, err := extension.Assemble(slog.New(slog.NewTextHandler(io.Discard, nil)), extension.Options{
			Name: "nvidia-driver-harness", VersionSuffix: "-dev", TalosVersion: "v1.13.5", TalosConstraint: "= v1.13.5",
			Payload: subroot, ServiceRootfs: ctr,
			ServiceSpec: filepath.Join(top, "extension/nvidia-driver.yaml"), Overlay: filepath.Join(top, "extension/rootfs"),
			Hook: filepath.Join(out, "bin/nvidia-cdi-hook"), Ldconfig: filepath.Join(out, "bin/ldconfig"),
			OutDir: filepath.Join(work, "out"),
		})
		extDir, extErr = res.Dir, err
	})

	require.NoError(t, extErr)

	return extDir
}

// run builds the harness command and runs it (it re-executes itself in a private mount
// namespace).
func run(t *testing.T, args ...string) harness.Result {
	t.Helper()

	ext := assembled(t)
	top := testutil.RepoRoot(t)

	bin := filepath.Join(t.TempDir(), "harness")
	build := exec.Command("go", "build", "-o", bin, "./hack/harness")
	build.Dir = top
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)

	cmd := exec.Command(bin, append([]string{"-json", "-extension", ext}, args...)...)
	cmd.Stderr = os.Stderr
	out, err = cmd.Output()
	require.NoError(t, err, "%s", out)

	var res harness.Result
	require.NoError(t, json.Unmarshal(out, &res), "%s", out)

	return res
}

func TestServiceWaitsForTheDriverAndStopsCleanly(t *testing.T) {
	res := run(t, "-until", "waiting,ready,failed", "-hold", "3s")

	if len(res.DependsMet) > 0 {
		t.Skip("this host has an NVIDIA driver loaded: the CI case is for hosts without one")
	}

	assert.Equal(t, "ext-nvidia-driver", res.Service)
	assert.Equal(t, []string{"/proc/driver/nvidia/version"}, res.DependsUnmet, "Talos would wait on this dependency")
	assert.Equal(t, "shared", res.RootfsPropagates)

	assert.Equal(t, "waiting", res.Phase, res.Log)
	assert.Contains(t, res.Message, "waiting for the nvidia kernel module")
	assert.False(t, res.ExitedByItself, "no crash loop: it is still running after the hold:\n%s", res.Log)
	assert.Equal(t, 1, res.WaitingLogLines, "the wait is reported once:\n%s", res.Log)

	assert.Equal(t, harness.MountState{Mounted: true, ReadOnly: true}, res.DriverRoot, "the driver root reaches the host, read-only")
	assert.Equal(t, harness.MountState{Mounted: true, ReadOnly: true}, res.DriverRootAfter, "and stays after the service stops")

	assert.Equal(t, 0, res.ExitCode, res.Log)
	assert.Less(t, res.StopMillis, int64(10000), "inside Talos's 10 s grace")
	assert.False(t, res.CDISpec)
	assert.NotContains(t, res.DevEntries, "nvidiactl")
	t.Logf("status after %d ms; SIGTERM to exit: %d ms", res.StartMillis, res.StopMillis)
}

func TestBadConfigurationIsReportedAndChangesNothing(t *testing.T) {
	badMIG := filepath.Join(t.TempDir(), "mig.yaml")
	require.NoError(t, os.WriteFile(badMIG, []byte("version: v1\nmig-configs:\n  half:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"9g.999gb\": 1}\n"), 0o644))

	cases := []struct {
		name      string
		args      []string
		exits     bool
		want      []string
		wantPhase string
	}{
		{
			name:      "MIG layout file with an error",
			args:      []string{"-config", "/etc/nvidia-driver/mig.yaml=" + badMIG, "-env", "NVIDIA_DRIVER_MIG_LAYOUT=half"},
			wantPhase: "failed",
			want:      []string{"/etc/nvidia-driver/mig.yaml", "9g.999gb"},
		},
		{
			name:      "unknown MIG layout",
			args:      []string{"-env", "NVIDIA_DRIVER_MIG_LAYOUT=no-such-layout"},
			wantPhase: "failed",
			want:      []string{`no layout "no-such-layout"`},
		},
		{
			name:  "bad environment variable",
			args:  []string{"-env", "NVIDIA_DRIVER_PERSISTENCE_MODE=sometimes"},
			exits: true,
			want:  []string{`NVIDIA_DRIVER_PERSISTENCE_MODE: "sometimes" is not a boolean`},
		},
	}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := run(t, append([]string{"-until", "failed,ready", "-wait", "15s", "-hold", "1s"}, tc.args...)...)

			all := res.Message + "\n" + res.Log
			for _, w := range tc.want {
				assert.Contains(t, all, w)
			}

			if tc.exits {
				assert.True(t, res.ExitedByItself)
				assert.NotEqual(t, 0, res.ExitCode)
			} else {
				assert.Equal(t, tc.wantPhase, res.Phase, res.Log)
				assert.False(t, res.ExitedByItself, "reported and waited on, not a crash loop")
				assert.Equal(t, 0, res.ExitCode)
			}

			assert.False(t, res.DriverRoot.Mounted, "nothing mounted")
			assert.False(t, res.ReadyFile)
			assert.NotContains(t, res.DevEntries, "nvidiactl")
		})
	}
}
