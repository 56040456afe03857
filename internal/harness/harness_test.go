package harness_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/internal/extension"
	"github.com/talos-nvidia/nvidia-driver/internal/harness"
	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
)

// The harness runs the service from nothing but the extension's files, under runc, with the
// OCI spec Talos would give it, and looks from the host side. The extension is assembled
// from the working tree's service (so a stale _out never passes) and the Debian subroot:
// the product build, or the demo build (-tags simulate) for the runs on simulated GPUs.

type assembly struct {
	once      sync.Once
	work, dir string
	err       error
}

// assemblies are the extensions built for this test binary, by build and service YAML.
var (
	assembliesMu sync.Mutex
	assemblies   = map[string]*assembly{}
)

func TestMain(m *testing.M) {
	code := m.Run()

	for _, a := range assemblies {
		if a.work != "" {
			os.RemoveAll(a.work) //nolint:errcheck // scratch
		}
	}

	os.Exit(code)
}

// assembled returns the extension of the product build (demo: the demo build) with the
// service YAML at spec ("" is the working tree's extension/nvidia-driver.yaml).
func assembled(t *testing.T, demo bool, spec string) string {
	t.Helper()
	testutil.RequireRoot(t)

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

	if spec == "" {
		spec = filepath.Join(top, "extension/nvidia-driver.yaml")
	}

	key := fmt.Sprint(demo, spec)

	assembliesMu.Lock()
	a, ok := assemblies[key]
	if !ok {
		a = &assembly{}
		assemblies[key] = a
	}
	assembliesMu.Unlock()

	bin := testutil.ServiceBinary(t)
	if demo {
		bin = testutil.DemoBinary(t)
	}

	subroot := testutil.Subroot(t)

	a.once.Do(func() {
		work, err := os.MkdirTemp("", "harness-ext-")
		if err != nil {
			a.err = err

			return
		}

		a.work = work

		ctr := filepath.Join(work, "ctr")

		if o, err := exec.Command(filepath.Join(top, "hack/dev/stage-service-rootfs.sh"), bin, ctr).CombinedOutput(); err != nil {
			a.err = err
			t.Logf("%s", o)

			return
		}

		res, err := extension.Assemble(slog.New(slog.NewTextHandler(io.Discard, nil)), extension.Options{
			Name: "nvidia-driver-harness", VersionSuffix: "-dev", TalosVersion: "v1.13.5", TalosConstraint: "= v1.13.5",
			Payload: subroot, ServiceRootfs: ctr,
			ServiceSpec: spec, FabricManagerSpec: filepath.Join(top, "extension/nvidia-fabricmanager.yaml"),
			Overlay: filepath.Join(top, "extension/rootfs"),
			Hook:    filepath.Join(out, "bin/nvidia-cdi-hook"), Ldconfig: filepath.Join(out, "bin/ldconfig"),
			OutDir: filepath.Join(work, "out"),
		})
		a.dir, a.err = res.Dir, err
	})

	require.NoError(t, a.err)

	return a.dir
}

// run builds the harness command and runs it (it re-executes itself in a private mount
// namespace) on the product build, or on the demo build when the document names
// NVIDIA_DRIVER_SIMULATE.
func run(t *testing.T, args ...string) harness.Result {
	t.Helper()

	return runSpec(t, "", args...)
}

// runSpec is run with the service YAML at spec.
func runSpec(t *testing.T, spec string, args ...string) harness.Result {
	t.Helper()

	res, _ := runExit(t, spec, args...)

	return res
}

// runExit is runSpec that also returns the harness's exit code (0, or 3 where the result is
// not what it waited for).
func runExit(t *testing.T, spec string, args ...string) (harness.Result, int) {
	t.Helper()

	demo := slices.ContainsFunc(args, func(s string) bool { return strings.HasPrefix(s, "NVIDIA_DRIVER_SIMULATE=") })
	ext := assembled(t, demo, spec)
	top := testutil.RepoRoot(t)

	bin := filepath.Join(t.TempDir(), "harness")
	build := exec.Command("go", "build", "-o", bin, "./hack/harness")
	build.Dir = top
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)

	cmd := exec.Command(bin, append([]string{"-json", "-extension", ext, "-runc", testutil.TalosRunc(t)}, args...)...)
	cmd.Stderr = os.Stderr
	out, err = cmd.Output()

	// Exit 3: the run's result is not what it waited for; the tests judge it themselves.
	code := 0

	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 3 {
		code = 3
	} else {
		require.NoError(t, err, "%s", out)
	}

	var res harness.Result
	require.NoError(t, json.Unmarshal(out, &res), "%s", out)

	return res, code
}

// minimal is a document with one setting.
var minimal = []string{"-env", "NVIDIA_DRIVER_LOG_LEVEL=info"}

// simulated is a document for a node of simulated GPUs (the demo build of the service) whose
// host root lies under /run/nvidia, which the service binds rshared, so that the host side
// sees what it does.
func simulated(extra ...string) []string {
	args := []string{
		"-env", "NVIDIA_DRIVER_SIMULATE=h200:1", "-env", "NVIDIA_DRIVER_HOST_ROOT=/run/nvidia/sim",
		"-env", "NVIDIA_DRIVER_CDI=false",
	}

	return append(args, extra...)
}

func TestServiceWaitsForTheDriverAndStopsCleanly(t *testing.T) {
	res := run(t, append(minimal, "-until", "waiting,ready,failed", "-hold", "3s")...)

	if _, err := os.Stat("/proc/driver/nvidia/version"); err == nil {
		t.Skip("this host has an NVIDIA driver loaded: the CI case is for hosts without one")
	}

	assert.Equal(t, "ext-nvidia-driver", res.Service)
	assert.True(t, res.Up, "Talos counts the service Up, so the boot goes on: %v", res.Events)
	assert.Empty(t, res.Failed)
	assert.Equal(t, "shared", res.RootfsPropagates)

	assert.Equal(t, "waiting", res.Phase, res.Log)
	assert.Contains(t, res.Message, "waiting for the nvidia kernel module")
	assert.False(t, res.ExitedByItself, "no crash loop: it is still running after the hold:\n%s", res.Log)
	assert.Equal(t, 1, res.Starts)
	assert.Equal(t, 1, res.WaitingLogLines, "the wait is reported once:\n%s", res.Log)

	assert.Equal(t, harness.MountState{Mounted: true, ReadOnly: true}, res.DriverRoot, "the driver root reaches the host, read-only")
	assert.Equal(t, harness.MountState{Mounted: true, ReadOnly: true}, res.DriverRootAfter, "and stays after the service stops")

	assert.Equal(t, 0, res.ExitCode, res.Log)
	assert.Less(t, res.StopMillis, int64(10000), "inside Talos's 10 s grace")
	assert.Equal(t, []string{"cdi", "nvidia", "nvidia-driver", "nvidia-fabricmanager", "nvidia-persistenced"}, res.ContainerRun,
		"of the host's /run the service sees only what it uses")
	assert.False(t, res.CDISpec)
	assert.NotContains(t, res.DevEntries, "nvidiactl")
	t.Logf("status after %d ms; SIGTERM to exit: %d ms", res.StartMillis, res.StopMillis)
}

// TestDriverRootHasItsOwnPeerGroup: / is shared, as Talos mounts it, and so is
// /usr/local/glibc; the driver root is shared too (it reaches the host's /run) but in a peer
// group of its own, so nothing propagates between it and either of them.
func TestDriverRootHasItsOwnPeerGroup(t *testing.T) {
	res := run(t, append(minimal, "-until", "waiting,ready,failed", "-hold", "0s")...)

	groups := res.PeerGroups
	root, subroot, driver := groups["/"], groups["/usr/local/glibc"], groups["/run/nvidia/driver"]

	require.NotEmpty(t, root, "/ is shared, as on Talos: %v", groups)
	require.NotEmpty(t, subroot, "/usr/local/glibc is shared: %v", groups)
	require.NotEmpty(t, driver, "the driver root is shared: %v\n%s", groups, res.Log)
	assert.NotEqual(t, root, driver, "not a peer of /")
	assert.NotEqual(t, subroot, driver, "not a peer of /usr/local/glibc")
}

// TestServiceRunsWithoutADocument: a node without the nvidia-driver document (a patch that
// forgot it, a non-GPU node from the same installer) finishes booting: the service is Up with
// the defaults and says what it waits for.
func TestServiceRunsWithoutADocument(t *testing.T) {
	res := run(t, "-until", "waiting,ready,failed", "-wait", "20s", "-hold", "0s")

	assert.True(t, res.Up, "Up: StartAllServices goes on: %v", res.Events)
	assert.Equal(t, 1, res.Starts, "%v", res.Events)
	assert.NotContains(t, res.Events, "Waiting for extension service config")
	assert.Contains(t, []string{"waiting", "ready"}, res.Phase, res.Log)
	assert.Contains(t, res.Log, "watching for a first nvidia-driver ExtensionServiceConfig", res.Log)
	assert.True(t, res.DriverRoot.Mounted, "the driver root is there, as with a document")
}

// TestFirstDocumentReachesRunningService: the node booted without the document and gets it
// later, the normal way to add a MIG layout. Talos does not restart a running service for a
// document at version "1" and would not mount its files into the running container; the
// service notices the document, exits 0, is started again by `restart: always`, and reads
// the document's file from Talos's directory.
func TestFirstDocumentReachesRunningService(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("version: v1alpha1\npersistenced: false\n"), 0o644))

	res := run(t, "-config", "/etc/nvidia-driver/config.yaml="+cfg,
		"-document-after", "2s", "-until", "waiting,ready,failed", "-wait", "30s", "-hold", "12s")

	assert.Contains(t, res.Events, "service running and config at version 1: no restart (it is assumed to wait for its configuration)")
	assert.Contains(t, res.Log, "an nvidia-driver ExtensionServiceConfig arrived", res.Log)
	assert.Equal(t, []int{0}, res.Exits, "it stopped once, cleanly, for the document: %v", res.Events)
	assert.Equal(t, 2, res.Starts, "%v", res.Events)
	assert.Contains(t, res.Log, "key=persistenced from=/system/overlays/extensions/nvidia-driver/etc-nvidia-driver-config.yaml",
		"the second run read the document's file from Talos's directory:\n%s", res.Log)
	assert.Contains(t, res.Log, "came after Talos made this container", res.Log)
}

// TestTalosStopKeepsTheSocketMount: the service runs nvidia-persistenced (the fake daemon in
// place of the subroot's, which needs a GPU driver) and is stopped as Talos stops it (runc
// kill --all SIGTERM, which runc 1.4 sends to the init alone). No daemon is started during the stop, the socket directory
// mounted under the driver root stays, and the next start reuses it.
func TestTalosStopKeepsTheSocketMount(t *testing.T) {
	fake := filepath.Join(t.TempDir(), "fakedaemon")
	build := exec.Command("go", "build", "-o", fake, "./internal/fakedaemon")
	build.Dir = testutil.RepoRoot(t)
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)

	res := run(t, simulated("-override", "/usr/local/glibc/usr/bin/nvidia-persistenced="+fake,
		"-until", "ready,failed", "-wait", "30s", "-hold", "1s", "-then", "restart")...)

	require.Equal(t, "ready", res.Phase, res.Log)
	assert.Equal(t, 1, res.SocketDir, "the socket directory is mounted under the driver root, seen from the host")
	assert.Equal(t, 1, strings.Count(res.Log, "msg=ready daemon=nvidia-persistenced"), res.Log)
	assert.NotContains(t, res.Log, "restarting", "no daemon started during the stop")
	// runc 1.4 (Talos v1.13's) sends the stop's SIGTERM to the container's init alone: the
	// daemon is stopped by the service's supervisor, never by Talos's signal.
	assert.Contains(t, res.Log, `msg="daemon stopped"`, res.Log)
	assert.NotContains(t, res.Log, "daemon stopped together with the service", res.Log)
	assert.Equal(t, 0, res.ExitCode, res.Log)
	assert.Equal(t, 1, res.SocketDirAfterStop, "the socket mount stays: containers' specs point at it")

	require.NotNil(t, res.Second)
	assert.Equal(t, "ready", res.Second.Phase, res.Second.Log)
	assert.Contains(t, res.Second.Log, "run dir mirrored", res.Second.Log)
	assert.Contains(t, res.Second.Log, "result=reused", "the next start reuses it")
	assert.Equal(t, 1, res.Second.SocketDir, "reused, not stacked")
	assert.Equal(t, 0, res.Second.ExitCode)
}

// TestChangedDocumentRestartsTheService: a change (version 2) stops and starts the service,
// which comes up with the new settings.
func TestChangedDocumentRestartsTheService(t *testing.T) {
	res := run(t, simulated("-env", "NVIDIA_DRIVER_PERSISTENCED=false", "-until", "ready,failed", "-wait", "30s", "-hold", "0s",
		"-then", "change", "-then-env", "NVIDIA_DRIVER_SIMULATE=h200:1", "-then-env", "NVIDIA_DRIVER_HOST_ROOT=/run/nvidia/sim",
		"-then-env", "NVIDIA_DRIVER_CDI=false", "-then-env", "NVIDIA_DRIVER_PERSISTENCED=false", "-then-env", "NVIDIA_DRIVER_MIG_LAYOUT=all-1g")...)

	require.Equal(t, "ready", res.Phase, res.Log)
	assert.NotContains(t, res.Message, "MIG layout")
	require.NotNil(t, res.Second)
	assert.Equal(t, "ready", res.Second.Phase, res.Second.Log)
	assert.Contains(t, res.Second.Message, `MIG layout "all-1g": success`)
	assert.Equal(t, 2, res.Starts, "%v", res.Events)
	assert.Contains(t, res.Events, "extension service config changed, restarting")
}

// TestRemovedDocumentRestartsTheService: removing the document restarts the service, which
// runs again with the defaults; what running containers use stays.
func TestRemovedDocumentRestartsTheService(t *testing.T) {
	res := run(t, append(minimal, "-until", "waiting,ready,failed", "-hold", "0s", "-then", "remove")...)

	assert.Equal(t, 2, res.Starts, "restarted, without a document: %v", res.Events)
	assert.Contains(t, res.Events, "extension service config changed, restarting")
	assert.Equal(t, 0, res.ExitCode, res.Log)
	assert.Equal(t, harness.MountState{Mounted: true, ReadOnly: true}, res.DriverRootAfter)
}

// TestBadConfigurationIsReportedAndChangesNothing: a setting the service cannot use. (A MIG
// layout that cannot be applied is the MIG job's to report, once there are GPUs: the GPUs are
// then served as they are, pkg/node's TestLayoutThatCannotBeAppliedLeavesTheGPUsServed.)
func TestBadConfigurationIsReportedAndChangesNothing(t *testing.T) {
	cases := []struct {
		name string
		args []string
		hold string
		want []string
	}{
		{
			// Held past Talos's 5 s restart interval: an exit would show as a second start.
			name: "bad environment variable",
			args: []string{"-env", "NVIDIA_DRIVER_PERSISTENCE_MODE=sometimes"},
			hold: "6s",
			want: []string{`NVIDIA_DRIVER_PERSISTENCE_MODE: "sometimes" is not a boolean`},
		},
	}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hold := tc.hold
			if hold == "" {
				hold = "1s"
			}

			res := run(t, append([]string{"-until", "failed,ready", "-wait", "15s", "-hold", hold}, tc.args...)...)

			for _, w := range tc.want {
				assert.Contains(t, res.Message, w, "the status file says what is wrong")
			}

			assert.Equal(t, "failed", res.Phase, res.Log)
			assert.Equal(t, 1, strings.Count(res.Log, "level=ERROR"), "reported once:\n%s", res.Log)
			assert.False(t, res.ExitedByItself, "reported and waited on, not a crash loop: %v", res.Events)
			assert.Equal(t, 1, res.Starts, "no restart loop: %v", res.Events)
			assert.Equal(t, 0, res.ExitCode)

			assert.False(t, res.DriverRoot.Mounted, "nothing mounted")
			assert.False(t, res.ReadyFile)
			assert.NotContains(t, res.DevEntries, "nvidiactl")
		})
	}
}

// TestHarnessModelOfMachinedRunsTheServiceYAML: the harness's model of what machined does
// with the service YAML before the service runs (talos.go, root.go, each behaviour from
// Talos's source; real machined judges the same YAML in hack/talos-node, make talos-node and
// talos-node-control). The shipped YAML is Up on a node without a GPU or a document; each
// variant below brings back a defect the shipped one fixed (f0d7957 had all of them), and the
// model must fail it as Talos fails it.
func TestHarnessModelOfMachinedRunsTheServiceYAML(t *testing.T) {
	shipped, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "extension/nvidia-driver.yaml"))
	require.NoError(t, err)

	cases := []struct {
		name   string
		edit   func(string) string
		up     bool
		failed string // Talos's Failed message, "" for none
		event  string // an event Talos shows
	}{
		{name: "shipped", edit: func(s string) string { return s }, up: true},
		{
			// machined's Runner: os.MkdirAll("tmpfs") from its working directory, the read-only /.
			name: "relative tmpfs source",
			edit: func(s string) string {
				return s + "    - source: tmpfs\n      destination: /tmp\n      type: tmpfs\n      options: [nosuid, nodev, noexec, mode=1777, size=16m]\n"
			},
			failed: "Failed to create runner: mkdir tmpfs: read-only file system",
		},
		{
			// /etc/kubernetes is read-only until cri's volumes are mounted.
			name:   "NFD directory without waiting for cri",
			edit:   func(s string) string { return strings.Replace(s, "  - service: cri\n", "", 1) },
			failed: "Failed to create runner: mkdir /etc/kubernetes/node-feature-discovery: read-only file system",
		},
		{
			// A dependency that never comes true holds the service Waiting: the boot stalls.
			name: "path dependency on the module",
			edit: func(s string) string {
				return strings.Replace(s, "depends:\n", "depends:\n  - path: /proc/driver/nvidia/version\n", 1)
			},
			event: `Waiting for file "/proc/driver/nvidia/version" to exist`,
		},
		{
			name: "configuration dependency",
			edit: func(s string) string {
				return strings.Replace(s, "depends:\n", "depends:\n  - configuration: true\n", 1)
			},
			event: "Waiting for extension service config",
		},
	}

	if _, err := os.Stat("/proc/driver/nvidia/version"); err == nil {
		t.Skip("this host has an NVIDIA driver loaded: the cases are for a node without one")
	}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := filepath.Join(t.TempDir(), "nvidia-driver.yaml")
			edited := tc.edit(string(shipped))
			require.NoError(t, os.WriteFile(spec, []byte(edited), 0o644))

			if tc.name != "shipped" {
				require.NotEqual(t, string(shipped), edited, "the variant must change the YAML")
			}

			res := runSpec(t, spec, "-until", "waiting,ready,failed", "-wait", "8s", "-hold", "0s")

			assert.Equal(t, tc.up, res.Up, "Up (the boot goes on): %v", res.Events)
			assert.Equal(t, tc.failed, res.Failed, "%v", res.Events)

			if tc.event != "" {
				assert.Contains(t, res.Events, tc.event)
			}

			if !tc.up {
				assert.Equal(t, 0, res.Starts, "%v", res.Events)
			}
		})
	}
}

// TestHarnessExitsNonZeroWhenItsCheckFails: a harness run reports PASS only by exiting 0.
// An -after-ready command that fails, or a phase it did not wait for, exits 3.
func TestHarnessExitsNonZeroWhenItsCheckFails(t *testing.T) {
	ready := simulated("-env", "NVIDIA_DRIVER_PERSISTENCED=false", "-until", "ready", "-wait", "30s", "-hold", "0s")

	res, code := runExit(t, "", append(ready, "-after-ready", "exit 0")...)
	require.Equal(t, "ready", res.Phase, res.Log)
	assert.Equal(t, 0, code, "a passing command")

	res, code = runExit(t, "", append(ready, "-after-ready", "exit 7")...)
	require.NotNil(t, res.AfterReadyExit)
	assert.Equal(t, 7, *res.AfterReadyExit)
	assert.Equal(t, 3, code, "a failing -after-ready command fails the harness")

	if _, err := os.Stat("/proc/driver/nvidia/version"); err == nil {
		return // a GPU host: the product build may well get ready
	}

	_, code = runExit(t, "", "-until", "ready", "-wait", "3s", "-hold", "0s")
	assert.Equal(t, 3, code, "no GPU here: the service never gets ready, which the run waited for")
}

// TestDocumentChangesWhileAWorkloadRuns: three changes of the document, each a stop and
// start by Talos, while a command runs on the host side (on the H200, a CUDA workload:
// hack/gpu-host/e2e-restarts.sh). The service comes back ready each time and reuses its driver root.
func TestDocumentChangesWhileAWorkloadRuns(t *testing.T) {
	res, code := runExit(t, "", simulated("-env", "NVIDIA_DRIVER_PERSISTENCED=false", "-until", "ready", "-wait", "30s", "-hold", "0s",
		"-changes", "3", "-after-ready", "sleep 2")...)

	assert.Equal(t, 0, code, "%v\n%s", res.Events, res.Log)
	assert.Equal(t, []string{"ready", "ready", "ready"}, res.ChangePhases, "%v", res.Events)
	assert.Equal(t, 4, res.Starts, "%v", res.Events)
	assert.Equal(t, 1, res.DriverRootMounts, "the driver root is reused, never stacked")
	require.NotNil(t, res.AfterReadyExit)
	assert.Equal(t, 0, *res.AfterReadyExit)
}

// TestDocumentChangeAskedForByTheCommand: the -after-ready command asks for a change of the
// document when it chooses (a request file in $HARNESS_DOCUMENT_REQUESTS), as a user's patch
// in the middle of a test; Talos restarts the service on it, with the entry set and the
// document's other entries kept (the service's log, $HARNESS_SERVICE_LOG, says so). A request
// that is not K=V changes nothing.
func TestDocumentChangeAskedForByTheCommand(t *testing.T) {
	ask := `r=$HARNESS_DOCUMENT_REQUESTS
		printf 'NVIDIA_DRIVER_LOG_LEVEL=debug\n' >$r/1.tmp && mv $r/1.tmp $r/1.env
		printf 'not an entry\n' >$r/2.tmp && mv $r/2.tmp $r/2.env
		for i in $(seq 300); do [ -e $r/2.applied ] && grep -q 'msg=setting key=logLevel from=env' $HARNESS_SERVICE_LOG && break; sleep 0.1; done
		ls $r | tr '\n' ' ' >&2
		grep -c 'msg=setting key=persistenced from=env' $HARNESS_SERVICE_LOG >&2
		[ -e $r/2.applied ] && [ $(grep -c 'msg=setting key=persistenced from=env' $HARNESS_SERVICE_LOG) = 2 ] &&
			grep -q 'msg=setting key=logLevel from=env' $HARNESS_SERVICE_LOG`
	res, code := runExit(t, "", simulated("-env", "NVIDIA_DRIVER_PERSISTENCED=false", "-until", "ready", "-wait", "30s", "-hold", "0s",
		"-after-ready", ask)...)

	assert.Equal(t, 0, code, "%v\n%s", res.Events, res.Log)
	assert.Equal(t, 2, res.Starts, "one restart, for the request that is an entry: %v", res.Events)
	assert.Contains(t, res.Events, "extension service config changed, restarting")
	require.NotNil(t, res.AfterReadyExit)
	assert.Equal(t, 0, *res.AfterReadyExit, "the new run has the entry asked for (logLevel) and the document's other entry (persistenced)")
}

// TestBeforeBootRunsBeforeTheService: the -before-boot command runs on the node before the
// service starts (what it writes is there when the service is ready), and -after-ready-phases
// names the phases the -after-ready command runs in.
func TestBeforeBootRunsBeforeTheService(t *testing.T) {
	args := simulated("-env", "NVIDIA_DRIVER_PERSISTENCED=false", "-until", "ready", "-wait", "30s", "-hold", "0s",
		"-before-boot", "echo booted >/run/before-boot",
		"-after-ready", "grep -q booted /run/before-boot")

	res, code := runExit(t, "", args...)
	require.Equal(t, "ready", res.Phase, res.Log)
	require.NotNil(t, res.AfterReadyExit)
	assert.Equal(t, 0, *res.AfterReadyExit, "the -before-boot command's file was there")
	assert.Equal(t, 0, code)

	res, code = runExit(t, "", append(args, "-after-ready-phases", "degraded")...)
	assert.Nil(t, res.AfterReadyExit, "not run in phase %s", res.Phase)
	assert.Equal(t, 3, code, "an -after-ready command that never ran fails the harness")
}
