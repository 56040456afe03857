package gpuhost_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// stub stands in for gpu-run.sh and gpu-operator.sh beside a copy of gpu-operator-runs.sh: it
// writes the gpu-run.log and k8s-logs.tar.xz that the real ones write, with the exit code and
// lines the test gives the run it plays (told apart by the variables the runs script sets).
const stub = `#!/usr/bin/env bash
if [[ ${K8S_NODE_CUDA_FAULT:-0} == 1 ]]; then run=control
elif [[ ${GPU_OPERATOR_OUT:-} == *-nri ]]; then run=setup2
elif [[ -n ${GPU_OPERATOR_OUT:-} ]]; then run=setup1
else run=deploy; fi
mkdir -p "$OUT" "$OUT/logs/results"
rc_var=RC_$run lines_var=LINES_$run toolkit_var=TOOLKIT_$run
printf '%b\n' "${!lines_var:-}" >"$OUT/gpu-run.log"
printf '%b\n' "${!toolkit_var:-}" >"$OUT/logs/results/validator-toolkit-validation.log"
tar -C "$OUT/logs" -cJf "$OUT/k8s-logs.tar.xz" .
exit "${!rc_var:-0}"
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
	for _, name := range []string{"gpu-run.sh", "gpu-operator.sh"} {
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

// The runs as they should come out: deploy and setup 2 pass, the control fails, setup 1 stops
// at the validator's toolkit check.
var good = []string{
	"RC_deploy=0", "LINES_deploy=k8s-node-gpu: the node reports nvidia.com/gpu: 1 allocatable: PASS",
	"RC_setup2=0", "LINES_setup2=k8s-node-operator: the ClusterPolicy reached ready (40 s after apply): PASS",
	"RC_control=1", "LINES_control=k8s-node-operator: op-a: the CUDA vector add is right on the GPU: FAIL",
	"RC_setup1=1",
	"LINES_setup1=k8s-node-operator: the validator's driver-validation passed (exit code 0; ...): PASS",
	"TOOLKIT_setup1=Error: error validating toolkit installation: exec: \"nvidia-smi\": executable file not found in $PATH",
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
	if _, err := exec.LookPath("xz"); err != nil {
		t.Skip("no xz for the stubs' k8s-logs.tar.xz")
	}
	code, summary := runs(t, good...)
	require.Equal(t, 0, code, summary)
	require.Contains(t, summary, "PASS setup1: stopped where the source says")
	require.Contains(t, summary, "gpu-operator-runs: verdict 0")

	for name, env := range map[string][]string{
		"setup 2 failed":                  with(good, "RC_setup2=3"),
		"deploy failed":                   with(good, "RC_deploy=1"),
		"the control passed":              with(good, "RC_control=0"),
		"setup 1 reached ready":           with(good, "RC_setup1=0"),
		"setup 1 stopped somewhere else":  with(good, "TOOLKIT_setup1=Error: something else"),
		"setup 1 without the driver pass": with(good, "LINES_setup1=the validator's driver-validation passed: FAIL"),
	} {
		t.Run(name, func(t *testing.T) {
			code, summary := runs(t, env...)
			require.NotEqual(t, 0, code, summary)
			require.Contains(t, summary, "gpu-operator-runs: verdict 1")
		})
	}
}
