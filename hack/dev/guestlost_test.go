package dev_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// waitOnNode sources hack/talos-node/lib.sh over a node directory holding qemuLog and
// console, and waits limit seconds for a check that never passes, as the node's checks wait.
func waitOnNode(t *testing.T, qemuLog, console string, limit int) (code int, out string, took time.Duration) {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "qemu.log"), []byte(qemuLog), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "console.log"), []byte(console), 0o644))
	here, err := filepath.Abs("../talos-node")
	require.NoError(t, err)
	script := `here=$1 dir=$2 report=talos-simgpu
. "$here/lib.sh"
boot_start=$SECONDS
until_ok "$3" false || echo "the wait ran out"
echo "after the wait"`
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	b, err := exec.CommandContext(ctx, "bash", "-c", script, "bash", here, dir, strconv.Itoa(limit)).CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return code, string(b), time.Since(start)
}

func TestAWaitEndsTheChecksWhenTheGuestIsGone(t *testing.T) {
	console := "[talos] boot sequence: done\n" +
		"Oops: int3: 0000 [#1] SMP NOPTI\n" +
		"RIP: 0010:get_page_from_freelist+0x5/0x10\n" +
		"Kernel panic - not syncing: Fatal exception\n"
	code, out, took := waitOnNode(t, "node.sh: qemu exited with status 0\n", console, 9)
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "FAIL: the guest is gone")
	require.Contains(t, out, "node.sh: qemu exited with status 0")
	require.Contains(t, out, "Oops: int3: 0000 [#1] SMP NOPTI")
	require.Contains(t, out, "Kernel panic - not syncing")
	require.Contains(t, out, "talos-simgpu: FAIL")
	require.NotContains(t, out, "after the wait")
	require.Less(t, took, 5*time.Second, "the wait went on against a guest that is gone")
}

func TestAWaitOnARunningGuestRunsItsCourse(t *testing.T) {
	// No exit line from node.sh in qemu's log: qemu runs.
	code, out, _ := waitOnNode(t, "", "[talos] boot sequence: done\n", 1)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "the wait ran out")
	require.Contains(t, out, "after the wait")
	require.NotContains(t, out, "FAIL")
}
