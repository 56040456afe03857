package node_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/talos-nvidia/nvidia-driver/internal/sim"
	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
	"github.com/talos-nvidia/nvidia-driver/pkg/daemons"
	"github.com/talos-nvidia/nvidia-driver/pkg/node"
	"github.com/talos-nvidia/nvidia-driver/pkg/poll"
)

const envInNamespace = "NODE_TEST_IN_MOUNT_NAMESPACE"

// inPrivateRun runs the calling test again, alone, in a private mount namespace with a
// tmpfs on /run: nvidia-persistenced's run directory, /var/run/nvidia-persistenced, is
// compiled in, and the test must not touch the machine's. It reports whether this is that
// run; the outer one has checked the inner one's result and must return.
func inPrivateRun(t *testing.T) bool {
	t.Helper()
	testutil.RequireRoot(t)

	if os.Getenv(envInNamespace) == "1" {
		require.NoError(t, unix.Mount("tmpfs", "/run", "tmpfs", 0, "mode=0755"))
		if st, err := os.Lstat("/var/run"); err == nil && st.Mode().Type() != os.ModeSymlink {
			require.NoError(t, unix.Mount("tmpfs", "/var/run", "tmpfs", 0, "mode=0755"))
		}

		return true
	}

	testutil.Subroot(t) // built here, where _out is the machine's

	cmd := exec.Command("unshare", "--mount", "--propagation", "private", os.Args[0], "-test.run=^"+t.Name()+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), envInNamespace+"=1")
	out, err := cmd.CombinedOutput()
	t.Logf("in a private mount namespace:\n%s", out)
	require.NoError(t, err)
	require.Contains(t, string(out), "--- PASS: "+t.Name())

	return false
}

// persistencedNode is a runner on one simulated GPU whose subroot's nvidia-persistenced is
// the fake daemon, told its mode by a control file, with its syslog lines read by the
// service's sink.
type persistencedNode struct {
	r       *node.Runner
	host    string
	control string
	logs    *testutil.SyncBuffer
	started time.Time
}

func startPersistencedNode(t *testing.T, mode string, opts daemons.Options, setup ...func(host string)) *persistencedNode {
	t.Helper()

	dir, err := os.MkdirTemp("", "pst") // short: the syslog socket lives under it
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) }) //nolint:errcheck

	host := filepath.Join(dir, "h")
	n := &persistencedNode{host: host, control: filepath.Join(dir, "mode"), logs: &testutil.SyncBuffer{}}
	require.NoError(t, os.WriteFile(n.control, []byte(mode), 0o644))

	// The Debian subroot with the fake in place of nvidia-persistenced.
	upper, work, subroot := filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "subroot")
	for _, d := range []string{upper + "/usr/bin", work, subroot} {
		require.NoError(t, os.MkdirAll(d, 0o755))
	}

	data, err := os.ReadFile(testutil.FakeDaemon(t))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(upper, "usr/bin/nvidia-persistenced"), data, 0o755))

	sock := filepath.Join(dir, "log")
	env := fmt.Sprintf("FAKEDAEMON_CONTROL=%s\nFAKEDAEMON_SYSLOG=%s\n", n.control, sock)
	require.NoError(t, os.WriteFile(filepath.Join(upper, "usr/bin/nvidia-persistenced.env"), []byte(env), 0o644))
	require.NoError(t, unix.Mount("overlay", subroot, "overlay", 0, fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", testutil.Subroot(t), upper, work)))
	t.Cleanup(func() { unix.Unmount(subroot, unix.MNT_DETACH) }) //nolint:errcheck

	gpus := sim.New(testutil.Model(t, "h100-80gb"), 1)
	writeSimHost(t, host, gpus)

	for _, f := range setup {
		f(host)
	}

	log := slog.New(slog.NewTextHandler(n.logs, nil))

	sink, err := daemons.ListenSyslog(log, sock)
	require.NoError(t, err)

	sinkCtx, stopSink := context.WithCancel(context.Background())
	sinkDone := make(chan struct{})

	go func() { defer close(sinkDone); sink.Serve(sinkCtx) }() //nolint:errcheck

	n.r = simRunner(t, host, subroot, gpus, n.logs, node.WithDaemonOptions(opts), node.WithDaemonLog(sink.LastLine))

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	n.started = time.Now()

	go func() { done <- n.r.Run(ctx) }()

	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		stopSink()
		<-sinkDone

		if t.Failed() {
			t.Logf("log:\n%s", n.logs)
		}
	})

	return n
}

// waitFor polls the runner's status until cond holds (20 s at most) and returns it.
func (n *persistencedNode) waitFor(t *testing.T, what string, cond func(node.Status) bool) node.Status {
	t.Helper()

	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		if st := n.r.Status(); cond(st) {
			return st
		}
	}

	t.Fatalf("%s: not reached; status %+v", what, n.r.Status())

	return node.Status{}
}

func up(st node.Status) bool { return st.Phase == node.PhaseReady || st.Phase == node.PhaseDegraded }

var fastDaemons = daemons.Options{StartTimeout: 2 * time.Second, Backoff: poll.Backoff{Initial: time.Millisecond, Max: 20 * time.Millisecond},
	RestartDelay: time.Millisecond, StopGrace: 2 * time.Second, PollInterval: time.Millisecond}

// TestPersistencedThatNeverStartsDegradesTheNode: a daemon that exits at once is given up
// after its starts; the node comes up degraded, and says which daemon and why, with its
// last log line.
func TestPersistencedThatNeverStartsDegradesTheNode(t *testing.T) {
	if !inPrivateRun(t) {
		return
	}

	n := startPersistencedNode(t, "fail", fastDaemons)
	st := n.waitFor(t, "the daemon given up", func(st node.Status) bool {
		return up(st) && st.Persistenced == string(daemons.StateFailed) && strings.Contains(st.Message, "last log line")
	})

	assert.Equal(t, node.PhaseDegraded, st.Phase)
	assert.Contains(t, st.Message, "node degraded: 1 GPU(s)")
	assert.Contains(t, st.Message, "nvidia-persistenced is not running (failed: nvidia-persistenced never became ready")
	assert.Contains(t, st.Message, `its last log line: "Failed to query NVIDIA devices"`)
}

// TestPersistencedStartThatHangsDoesNotHoldTheBringUp: a start that never returns holds the
// bring-up one start timeout, not the three starts the supervisor tries (3 × 2 s here).
func TestPersistencedStartThatHangsDoesNotHoldTheBringUp(t *testing.T) {
	if !inPrivateRun(t) {
		return
	}

	n := startPersistencedNode(t, "never-ready", fastDaemons)
	st := n.waitFor(t, "the node up", up)
	took := time.Since(n.started)

	assert.Equal(t, node.PhaseDegraded, st.Phase)
	assert.Contains(t, st.Message, "nvidia-persistenced is not running")
	assert.Less(t, took, 3*fastDaemons.StartTimeout, "the bring-up waited for every start")
	t.Logf("up after %s", took.Round(time.Millisecond))
}

// TestPersistencedCrashLoopAfterReadyShows: the node is ready; its daemon dies and every
// restart fails: the node says degraded while it does, and ready once a restart works.
func TestPersistencedCrashLoopAfterReadyShows(t *testing.T) {
	if !inPrivateRun(t) {
		return
	}

	n := startPersistencedNode(t, "ok", fastDaemons)
	st := n.waitFor(t, "ready", up)
	require.Equal(t, node.PhaseReady, st.Phase, st.Message)
	assert.Equal(t, string(daemons.StateReady), st.Persistenced)

	// Every later start fails; then the daemon dies.
	require.NoError(t, os.WriteFile(n.control, []byte("fail"), 0o644))
	pidData, err := os.ReadFile(filepath.Join(n.host, daemons.PersistencedRunDir, "nvidia-persistenced.pid"))
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(pidData)))
	require.NoError(t, err)
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))

	st = n.waitFor(t, "degraded", func(st node.Status) bool {
		return st.Phase == node.PhaseDegraded && strings.Contains(st.Message, `its last log line: "Failed to query NVIDIA devices"`)
	})
	assert.Contains(t, st.Message, "nvidia-persistenced is not running")

	require.NoError(t, os.WriteFile(n.control, []byte("ok"), 0o644))
	st = n.waitFor(t, "ready again", func(st node.Status) bool { return st.Phase == node.PhaseReady })
	assert.Equal(t, "node ready: 1 GPU(s), driver "+st.DriverVersion, st.Message)
}

// TestLinkAtPersistencedRunDirIsRetriedUntilReplaced: nvidia-persistenced's run directory on
// the host is a link; nothing is made where it points, the bring-up waits, the status naming
// the link, until it is replaced by a directory: then the daemon starts and the node is
// ready, without a restart (issue 50).
func TestLinkAtPersistencedRunDirIsRetriedUntilReplaced(t *testing.T) {
	if !inPrivateRun(t) {
		return
	}

	var link, elsewhere string

	n := startPersistencedNode(t, "ok", fastDaemons, func(host string) {
		link, elsewhere = filepath.Join(host, daemons.PersistencedRunDir), filepath.Join(host, "etc/elsewhere")
		require.NoError(t, os.MkdirAll(elsewhere, 0o755))
		require.NoError(t, os.MkdirAll(filepath.Dir(link), 0o755))
		require.NoError(t, os.Symlink(elsewhere, link))
	})
	st := n.waitFor(t, "the link named", func(st node.Status) bool {
		return up(st) || st.Phase == node.PhaseWaiting && strings.Contains(st.Message, link+" is a symbolic link")
	})
	require.Equal(t, node.PhaseWaiting, st.Phase, st.Message)
	assert.Contains(t, st.Message, "retrying nvidia-persistenced's run directory")

	time.Sleep(100 * time.Millisecond) // some retries

	require.NoError(t, os.Remove(link))
	require.NoError(t, os.MkdirAll(link, 0o755))

	st = n.waitFor(t, "ready", up)
	require.Equal(t, node.PhaseReady, st.Phase, st.Message)
	assert.Equal(t, string(daemons.StateReady), st.Persistenced)

	entries, err := os.ReadDir(elsewhere)
	require.NoError(t, err)
	assert.Empty(t, entries, "nothing made through the link")
}

// TestSimulatedRunLeavesNothingOutsideItsHostRoot: a node on simulated GPUs under a
// throwaway host root, with nvidia-persistenced on, keeps the daemon's run directory, pid
// file and socket under that host root; the machine's /run (here this test's own tmpfs) gets
// nothing, though the daemon writes its compiled-in /var/run/nvidia-persistenced (issue 50).
func TestSimulatedRunLeavesNothingOutsideItsHostRoot(t *testing.T) {
	if !inPrivateRun(t) {
		return
	}

	n := startPersistencedNode(t, "ok", fastDaemons)
	require.Equal(t, string(daemons.StateReady), n.waitFor(t, "ready", up).Persistenced, "the daemon runs")

	assert.FileExists(t, filepath.Join(n.host, daemons.PersistencedRunDir, "nvidia-persistenced.pid"))
	assert.FileExists(t, filepath.Join(n.host, daemons.PersistencedRunDir, "socket"))

	entries, err := os.ReadDir("/run")
	require.NoError(t, err)
	assert.Empty(t, entries, "nothing made on the machine's /run")
}
