package node_test

// Faults on the host path that clear by themselves (a link removed, a file system made
// writable again) are retried until they do: the node gets there without a restart, and
// the status says what is retried meanwhile (issue 32, item 4).

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/talos-nvidia/nvidia-driver/internal/sim"
	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
	"github.com/talos-nvidia/nvidia-driver/pkg/driverroot"
	"github.com/talos-nvidia/nvidia-driver/pkg/nfd"
	"github.com/talos-nvidia/nvidia-driver/pkg/node"
)

// runningNode is a runner running until the test ends.
type runningNode struct {
	t    *testing.T
	r    *node.Runner
	logs *testutil.SyncBuffer
}

func runNode(t *testing.T, r *node.Runner, logs *testutil.SyncBuffer) *runningNode {
	t.Helper()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- r.Run(ctx) }()

	t.Cleanup(func() {
		cancel()

		select {
		case err := <-done:
			assert.NoError(t, err)
		case <-time.After(5 * time.Second):
			t.Error("the runner did not stop within 5 s of its context's end")
		}
	})

	return &runningNode{t: t, r: r, logs: logs}
}

// waitFor waits up to 10 s for the status to meet cond, and returns it.
func (n *runningNode) waitFor(what string, cond func(node.Status) bool) node.Status {
	n.t.Helper()

	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		if st := n.r.Status(); cond(st) {
			return st
		}
	}

	n.t.Fatalf("%s not reached: %+v\n%s", what, n.r.Status(), n.logs)

	return node.Status{}
}

// settled: the node is up, or has given up.
func settled(st node.Status) bool {
	return st.Phase == node.PhaseReady || st.Phase == node.PhaseDegraded || st.Phase == node.PhaseFailed
}

// retrying waits until the node either retries what (its status waiting and naming what)
// or settles, and requires the first.
func (n *runningNode) retrying(what string) node.Status {
	n.t.Helper()

	st := n.waitFor("the retry of "+what, func(st node.Status) bool {
		return settled(st) || st.Phase == node.PhaseWaiting && strings.Contains(st.Message, what)
	})
	require.Equal(n.t, node.PhaseWaiting, st.Phase, "%s\n%s", st.Message, n.logs)

	return st
}

// TestLinkAtRunNvidiaIsRetriedUntilReplaced: <host>/run/nvidia is a link; the driver root is
// not mounted through it, and the mount is retried, the status saying so, until the link is
// replaced by a directory: then the node comes up, mounted, without a restart.
func TestLinkAtRunNvidiaIsRetriedUntilReplaced(t *testing.T) {
	if !inPrivateRun(t) {
		return
	}

	gpus := sim.New(testutil.Model(t, "h100-80gb"), 1)
	host := t.TempDir()
	writeSimHost(t, host, gpus)

	elsewhere := filepath.Join(host, "etc/elsewhere")
	require.NoError(t, os.MkdirAll(elsewhere, 0o755))
	link := filepath.Join(host, "run/nvidia")
	require.NoError(t, os.MkdirAll(filepath.Dir(link), 0o755))
	require.NoError(t, os.Symlink(elsewhere, link))

	subroot := testutil.Subroot(t)
	logs := &testutil.SyncBuffer{}
	n := runNode(t, simRunner(t, host, subroot, gpus, logs), logs)

	st := n.retrying("the driver root")
	assert.Contains(t, st.Message, "retrying")
	assert.Contains(t, st.Message, link+" is a symbolic link")

	time.Sleep(100 * time.Millisecond) // some ten retries

	require.NoError(t, os.Remove(link))
	require.NoError(t, os.MkdirAll(link, 0o755)) // the retry may have made it first

	st = n.waitFor("ready", settled)
	require.Equal(t, node.PhaseReady, st.Phase, "%s\n%s", st.Message, logs)

	mounted, err := driverroot.IsMounted(subroot, filepath.Join(link, "driver"))
	require.NoError(t, err)
	assert.True(t, mounted, "the driver root is mounted")
	assert.FileExists(t, filepath.Join(link, "validations", driverroot.ReadyFile))

	entries, err := os.ReadDir(elsewhere)
	require.NoError(t, err)
	assert.Empty(t, entries, "nothing made through the link")
	assert.Equal(t, 1, strings.Count(logs.String(), "symbolic link"), "the retried error is logged once:\n%s", logs)
}

// TestReadOnlyReadinessDirIsRetriedUntilWritable: the readiness directory is on a read-only
// mount (a read-only /run); the readiness files are retried, the status saying so, until it
// is writable again: then they appear and the node is ready, without a restart.
func TestReadOnlyReadinessDirIsRetriedUntilWritable(t *testing.T) {
	if !inPrivateRun(t) {
		return
	}

	gpus := sim.New(testutil.Model(t, "h100-80gb"), 1)
	host := t.TempDir()
	writeSimHost(t, host, gpus)

	dir := filepath.Join(host, "run/nvidia/validations")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, unix.Mount(dir, dir, "", unix.MS_BIND, ""))
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) }) //nolint:errcheck
	require.NoError(t, unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""))

	logs := &testutil.SyncBuffer{}
	n := runNode(t, simRunner(t, host, testutil.Subroot(t), gpus, logs), logs)

	st := n.retrying("the readiness files")
	assert.Contains(t, st.Message, "retrying")
	assert.Contains(t, st.Message, "read-only file system")
	assert.NoFileExists(t, filepath.Join(dir, driverroot.ReadyFile))

	time.Sleep(100 * time.Millisecond) // some ten retries

	require.NoError(t, unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_BIND, ""))

	st = n.waitFor("ready", settled)
	require.Equal(t, node.PhaseReady, st.Phase, "%s\n%s", st.Message, logs)
	assert.FileExists(t, filepath.Join(dir, driverroot.ReadyFile))
	assert.FileExists(t, filepath.Join(dir, driverroot.OperatorReadyFile))
	assert.Equal(t, 1, strings.Count(logs.String(), "read-only file system"), "the retried error is logged once:\n%s", logs)
}

// TestLinkAtNFDDirIsRetriedUntilReplaced: the NFD features directory is a link; the node
// serves its GPUs, degraded, the status saying the labels are retried, until the link is
// replaced by a directory: then the labels are written and the node is ready, without a
// restart.
func TestLinkAtNFDDirIsRetriedUntilReplaced(t *testing.T) {
	if !inPrivateRun(t) {
		return
	}

	gpus := sim.New(testutil.Model(t, "h100-80gb"), 1)
	host := t.TempDir()
	writeSimHost(t, host, gpus)

	elsewhere := filepath.Join(host, "etc/elsewhere")
	require.NoError(t, os.MkdirAll(elsewhere, 0o755))
	link := filepath.Join(host, "etc/nfd")
	require.NoError(t, os.Symlink(elsewhere, link))

	logs := &testutil.SyncBuffer{}
	n := runNode(t, simRunnerEnv(t, host, testutil.Subroot(t), gpus, logs, []string{"NVIDIA_DRIVER_NFD_FEATURES_DIR=/etc/nfd"}), logs)

	st := n.waitFor("the node up", settled)
	require.Equal(t, node.PhaseDegraded, st.Phase, "%s\n%s", st.Message, logs)
	assert.Contains(t, st.Message, "Node Feature Discovery labels")
	assert.Contains(t, st.Message, "retrying")
	assert.Contains(t, st.Message, link+": it is a symbolic link")
	assert.FileExists(t, filepath.Join(host, "run/nvidia/validations", driverroot.ReadyFile), "the node serves its GPUs meanwhile")

	time.Sleep(100 * time.Millisecond) // some ten retries

	require.NoError(t, os.Remove(link))
	require.NoError(t, os.MkdirAll(link, 0o755)) // the retry may have made it first

	st = n.waitFor("ready", func(st node.Status) bool { return st.Phase != node.PhaseDegraded })
	require.Equal(t, node.PhaseReady, st.Phase, "%s\n%s", st.Message, logs)

	labels, err := os.ReadFile(filepath.Join(link, nfd.DefaultName))
	require.NoError(t, err)
	assert.Contains(t, string(labels), nfd.LabelMPSCapable+"=")

	entries, err := os.ReadDir(elsewhere)
	require.NoError(t, err)
	assert.Empty(t, entries, "nothing written through the link")
	assert.Equal(t, 1, strings.Count(logs.String(), "level=WARN msg=\"retrying the Node Feature Discovery labels"),
		"the retried error is logged once:\n%s", logs)
}
