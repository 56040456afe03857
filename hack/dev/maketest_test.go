package dev_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// stubs stand in, beside a copy of make-test.sh, for make and the scripts it runs. Each logs
// its name and arguments to $STUB_LOG and exits with STUB_RC_<name> (default 0); the Talos
// node's checks sleep STUB_SLEEP seconds first, with their PID in $STUB_LOG.pids.
var stubs = map[string]string{
	"make": `name=make_${@: -1}; name=${name//-/_}
echo "make $*" >>"$STUB_LOG"
rc=STUB_RC_$name; exit "${!rc:-0}"`,
	"gotest":                   `echo "gotest $PWD $*" >>"$STUB_LOG"; exit "${STUB_RC_gotest:-0}"`,
	"hack/talos-node/build.sh": `echo "talos-node/build.sh parts=${TALOS_NODE_PARTS:-all}" >>"$STUB_LOG"; exit "${STUB_RC_talos_build:-0}"`,
	"hack/k8s-node/build.sh":   `echo "k8s-node/build.sh $*" >>"$STUB_LOG"`,
	"hack/talos-node/simgpu/build.sh": `echo "simgpu/build.sh" >>"$STUB_LOG"
mkdir -p _out/extensions/nvidia-driver-dev-sim _out/extensions/simnvml-driver`,
	"hack/talos-node/test.sh": `echo "talos-node/test.sh $* kubernetes=$TALOS_NODE_KUBERNETES" >>"$STUB_LOG"
echo $$ >>"$STUB_LOG.pids"; sleep "${STUB_SLEEP:-0}"
echo "talos-node: checks"; exit "${STUB_RC_talos_node:-0}"`,
	"hack/talos-node/test-simgpu.sh": `echo "test-simgpu.sh $* checks=$TALOS_SIMGPU_CHECKS" >>"$STUB_LOG"
echo $$ >>"$STUB_LOG.pids"
[ -d _out/extensions/nvidia-driver-dev-sim ] && [ -d _out/extensions/simnvml-driver ] || exit 7
sleep "${STUB_SLEEP:-0}"
echo "talos-simgpu: checks"; exit "${STUB_RC_simgpu:-0}"`,
}

type result struct {
	code int
	out  string
	log  []string
	pids []string
}

// makeTest runs a copy of make-test.sh among the stubs with env, and returns what it did.
func makeTest(t *testing.T, env ...string) result {
	t.Helper()
	script, err := os.ReadFile("make-test.sh")
	require.NoError(t, err)
	dir := t.TempDir()
	files := map[string]string{"hack/dev/make-test.sh": string(script)}
	for name, body := range stubs {
		files[name] = "#!/usr/bin/env bash\n" + body + "\n"
	}
	for name, body := range files {
		p := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(body), 0o755))
	}
	log := filepath.Join(dir, "stub.log")

	// A make-test.sh that waits for a background that never ends fails here instead of hanging.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(dir, "hack/dev/make-test.sh"))
	cmd.WaitDelay = 10 * time.Second // the background's processes may hold the output open
	cmd.Env = append(os.Environ(), append([]string{
		"MAKE=" + filepath.Join(dir, "make"), "OUT=_out", "TEST_MODULES=. sub",
		"GO_TEST=" + filepath.Join(dir, "gotest"), "TALOS_NODE_EXTENSION=_out/extensions/dev",
		"TALOS_NODE_RUN=_out/talos-node/v1.14.1", "STUB_LOG=" + log,
	}, env...)...)
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "sub"), 0o755))
	out, err := cmd.CombinedOutput()
	require.NoError(t, ctx.Err(), "make-test.sh did not end: %s", out)
	res := result{out: string(out)}
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		res.code = exitErr.ExitCode()
	} else {
		require.NoError(t, err, "%s", out)
	}
	if b, err := os.ReadFile(log); err == nil {
		res.log = strings.Split(strings.TrimSpace(string(b)), "\n")
	}
	if b, err := os.ReadFile(log + ".pids"); err == nil {
		res.pids = strings.Fields(string(b))
	}
	return res
}

// alive says whether the process pid runs (a zombie, ended and not yet reaped, does not).
func alive(t *testing.T, pid string) bool {
	t.Helper()
	stat, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if errors.Is(err, os.ErrNotExist) {
		return false
	}
	require.NoError(t, err)
	// pid (comm) state ...: comm may hold spaces, the state follows its closing parenthesis.
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	return fields[0] != "Z" && fields[0] != "X"
}

// index is the place of the first log line that starts with prefix, failing the test if none.
func index(t *testing.T, log []string, prefix string) int {
	t.Helper()
	for i, l := range log {
		if strings.HasPrefix(l, prefix) {
			return i
		}
	}
	require.Failf(t, "not run", "no %q in the stubs' log:\n%s", prefix, strings.Join(log, "\n"))
	return -1
}

// lastIndex is the place of the last log line that starts with prefix, failing the test if none.
func lastIndex(t *testing.T, log []string, prefix string) int {
	t.Helper()
	i := index(t, log, prefix)
	for j := i; j < len(log); j++ {
		if strings.HasPrefix(log[j], prefix) {
			i = j
		}
	}
	return i
}

func TestMakeTestPassesWhenBothLinesPass(t *testing.T) {
	t.Parallel()
	res := makeTest(t)
	require.Equal(t, 0, res.code, res.out)
	require.Contains(t, res.out, "make test: PASS")
	require.Contains(t, res.out, "=== make test, in the background: test-talos-node")
	require.Contains(t, res.out, "talos-simgpu: checks")

	// The background builds the rest of the node only after the foreground's runtime, and boots
	// the simulated GPUs once the foreground is done and has built their extensions.
	require.Less(t, index(t, res.log, "k8s-node/build.sh _out/k8s-node runtime"), index(t, res.log, "make --no-print-directory talos-node-build"))
	require.Less(t, index(t, res.log, "talos-node/build.sh parts=programs"), index(t, res.log, "make --no-print-directory talos-node-build"))
	require.Less(t, index(t, res.log, "simgpu/build.sh"), index(t, res.log, "test-simgpu.sh"))
	// The Talos node's checks start once every module's tests are done (they leave no CPU idle).
	require.Less(t, lastIndex(t, res.log, "gotest "), index(t, res.log, "talos-node/test.sh"))
	// The simulated GPUs' guest runs once the foreground is done.
	require.Less(t, index(t, res.log, "make --no-print-directory test-k8s-sim-nri"), index(t, res.log, "test-simgpu.sh"))
	index(t, res.log, "talos-node/test.sh _out/extensions/dev _out/talos-node/v1.14.1/run kubernetes=0")
	index(t, res.log, "test-simgpu.sh _out/talos-node/v1.14.1/simgpu checks=core")
	for _, target := range []string{"test-k8s-node", "test-k8s-sim", "test-k8s-sim-operator", "test-k8s-sim-nri"} {
		index(t, res.log, "make --no-print-directory "+target)
	}
	require.Len(t, res.pids, 2)
}

func TestMakeTestFailsWhenTheBackgroundFails(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ env, line string }{
		{"STUB_RC_talos_node=1", "make test: test-talos-node exit 1"},
		{"STUB_RC_simgpu=1", "make test: test-talos-simgpu exit 1"},
		{"STUB_RC_talos_build=1", "make test: test-talos-node exit 1"},
	} {
		t.Run(tc.env, func(t *testing.T) {
			t.Parallel()
			res := makeTest(t, tc.env)
			require.Equal(t, 1, res.code, res.out)
			require.Contains(t, res.out, tc.line)
			require.Contains(t, res.out, "make test: FAIL")
			// The foreground ran to its end all the same.
			index(t, res.log, "make --no-print-directory test-k8s-sim-nri")
		})
	}
}

func TestMakeTestStopsTheBackgroundWhenTheForegroundFails(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ env, line string }{
		{"STUB_RC_make_extension=1", "make test: FAIL: build, lint or extension"},
		{"STUB_RC_gotest=1", "make test: FAIL: go test in ."},
		{"STUB_RC_make_test_k8s_sim=1", "make test: FAIL: test-k8s-sim"},
	} {
		t.Run(tc.env, func(t *testing.T) {
			t.Parallel()
			// The Talos node's checks would run for 10 minutes: make-test.sh must end them.
			res := makeTest(t, tc.env, "STUB_SLEEP=600")
			require.Equal(t, 1, res.code, res.out)
			require.Contains(t, res.out, tc.line)
			require.NotContains(t, res.out, "make test: PASS")
			for _, pid := range res.pids {
				require.False(t, alive(t, pid), "the background's check %s still runs", pid)
			}
		})
	}
}
