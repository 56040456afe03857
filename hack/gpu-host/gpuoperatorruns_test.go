package gpuhost_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// stub stands in for gpu-run.sh, gpu-nri.sh and gpu-operator.sh beside a copy of
// gpu-operator-runs.sh: it writes the gpu-run.log that the real ones write, with the exit code
// and lines the test gives the run it plays (told apart by the script it stands in for and the
// variables the runs script sets; setup 1 only with the stop checks on, the control only as
// gpu-nri.sh).
const stub = `#!/usr/bin/env bash
case $(basename "$0"):${K8S_NODE_CUDA_FAULT:-0}:${GPU_OPERATOR_EXPECT_STOP:-} in
gpu-run.sh:0:) run=deploy ;;
gpu-nri.sh:0:) run=nri ;;
gpu-nri.sh:1:) run=control ;;
gpu-operator.sh:0:toolkit) run=setup1 ;;
*) run=unknown ;;
esac
mkdir -p "$OUT"
rc_var=RC_$run lines_var=LINES_$run
printf '%b\n' "${!lines_var:-}" >"$OUT/gpu-run.log"
exit "${!rc_var:-9}" # a run the test did not expect fails
`

// runs runs a copy of gpu-operator-runs.sh with the stubs and env, and returns its exit code
// and summary.txt.
func runs(t *testing.T, env ...string) (int, string) {
	t.Helper()
	script, err := os.ReadFile("gpu-operator-runs.sh")
	require.NoError(t, err)
	dir := t.TempDir()
	bin := filepath.Join(dir, "hack", "gpu-host")
	require.NoError(t, os.MkdirAll(bin, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(bin, "gpu-operator-runs.sh"), script, 0o755))
	for _, name := range []string{"gpu-run.sh", "gpu-nri.sh", "gpu-operator.sh"} {
		require.NoError(t, os.WriteFile(filepath.Join(bin, name), []byte(stub), 0o755))
	}
	res := filepath.Join(dir, "results")
	cmd := exec.Command("bash", filepath.Join(bin, "gpu-operator-runs.sh"), res)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	code := 0
	if err != nil {
		exitErr, ok := err.(*exec.ExitError)
		require.True(t, ok, "%v: %s", err, out)
		code = exitErr.ExitCode()
	}
	summary, err := os.ReadFile(filepath.Join(res, "summary.txt"))
	require.NoError(t, err, "%s", out)
	return code, string(summary)
}

// The runs as they should come out: deploy, the NRI plugin and setup 1 (its checks being its
// stop at the validator's toolkit check, GPU_OPERATOR_EXPECT_STOP) pass, the control fails.
var good = []string{
	"RC_deploy=0", "LINES_deploy=k8s-node-gpu: the node reports nvidia.com/gpu: 1 allocatable: PASS",
	"RC_nri=0", "LINES_nri=k8s-node-nri: containerd: the toolkit's NRI plugin connected and synchronized (4 s after apply): PASS",
	"RC_control=1", "LINES_control=k8s-node-nri: nri-cuda: the CUDA vector add is right on the GPU: FAIL",
	"RC_setup1=0",
	"LINES_setup1=k8s-node-operator: the validator's toolkit-validation failed where the operator's source says it must: PASS",
}

func with(env []string, changes ...string) []string {
	out := append([]string(nil), env...)
	for _, c := range changes {
		key := c[:strings.Index(c, "=")+1]
		for i, e := range out {
			if strings.HasPrefix(e, key) {
				out[i] = c
			}
		}
	}
	return out
}

func TestGPUOperatorRunsVerdict(t *testing.T) {
	code, summary := runs(t, good...)
	require.Equal(t, 0, code, summary)
	require.Contains(t, summary, "toolkit-validation failed where the operator's source says it must: PASS")
	require.Contains(t, summary, "gpu-operator-runs: verdict 0")

	for name, env := range map[string][]string{
		"nri failed":         with(good, "RC_nri=3"),
		"deploy failed":      with(good, "RC_deploy=1"),
		"the control passed": with(good, "RC_control=0"),
		"setup 1 failed":     with(good, "RC_setup1=1"),
	} {
		t.Run(name, func(t *testing.T) {
			code, summary := runs(t, env...)
			require.NotEqual(t, 0, code, summary)
			require.Contains(t, summary, "gpu-operator-runs: verdict 1")
		})
	}
}
