package dev_test

import (
	"os"
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
	return runBash(t, script, nil, here, dir, strconv.Itoa(limit))
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

// apiUpOnNode sources hack/talos-node/lib.sh over a node directory and runs api_up, the
// Talos node checks' wait for machined's boot and the API server's /readyz, against stand-in
// talosctl and kubectl programs: talosctl reports the boot done, kubectl answers /readyz as
// readyz says (the text an API server whose RBAC bootstrap hook has not finished returns,
// or "ok").
func apiUpOnNode(t *testing.T, readyz string, readyzExit int) (code int, out string, took time.Duration) {
	t.Helper()
	dir, bin := t.TempDir(), t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "kube.port"), []byte("6443\n"), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(bin, "bin"), 0o755))
	talosctl := `#!/bin/sh
shift 2 # --talosconfig FILE
case "$1 $2" in
"get machinestatus") echo "  stage: running" ;;
"kubeconfig --force") echo "server: https://10.0.2.15:6443" >"$3" ;;
"read /proc/loadavg") echo "18.05 17.50 11.36 19/304 2291" ;;
"logs kubelet") echo 'No valid client certificate is found and the server is responsive, exiting.' ;;
esac
`
	kubectl := "#!/bin/sh\nprintf '%s\\n' \"$READYZ\"\nexit $READYZ_EXIT\n"
	require.NoError(t, os.WriteFile(filepath.Join(bin, "bin", "talosctl"), []byte(talosctl), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(bin, "bin", "kubectl"), []byte(kubectl), 0o755))
	here, err := filepath.Abs("../talos-node")
	require.NoError(t, err)
	script := `here=$1 dir=$2 report=talos-simgpu
. "$here/lib.sh"
out=$3 k8s_bin=$3/bin
boot_start=$SECONDS
api_up
echo "after api_up"`
	return runBash(t, script, []string{"TALOS_NODE_WAIT=1", "TALOS_NODE_K8S_WAIT=1",
		"READYZ=" + readyz, "READYZ_EXIT=" + strconv.Itoa(readyzExit)}, here, dir, bin)
}

func TestAnAPIServerThatNeverGetsReadyEndsTheChecks(t *testing.T) {
	// What kubectl printed for an emulated API server on 2026-12-07 (docs/talos-node.md, "Over
	// the cliff alone"), shortened.
	readyz := `Error from server (InternalError): an error on the server ("[+]ping ok\n[+]etcd ok\n` +
		`[-]poststarthook/rbac/bootstrap-roles failed: reason withheld\n[+]shutdown ok\nreadyz check failed") ` +
		`has prevented the request from succeeding`
	code, out, took := apiUpOnNode(t, readyz, 1)
	require.Equal(t, 1, code, out)
	for _, want := range []string{
		"FAIL: the API server never answered /readyz",  // what failed
		"[-]poststarthook/rbac/bootstrap-roles failed", // the API server's failing check
		"load average: 18.05",                          // the guest's load
		"No valid client certificate is found",         // the kubelet's last line
		"talos-simgpu: FAIL",                           // the checks' last line
	} {
		require.Contains(t, out, want)
	}
	require.NotContains(t, out, "after api_up", "the checks went on after the API server never got ready")
	require.Less(t, took, 30*time.Second)
}

func TestAnAPIServerThatAnswersLetsTheChecksGoOn(t *testing.T) {
	code, out, _ := apiUpOnNode(t, "ok", 0)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "the API server answered /readyz")
	require.Contains(t, out, "after api_up")
	require.NotContains(t, out, "FAIL")
}
