#!/usr/bin/env bash
# The GPU Operator's runs of one GPU-host session, one after the other on the same machine, so
# that their measurements compare (docs/gpu-operator.md):
#   deploy   deploy/'s own DaemonSets (hack/gpu-host/gpu-run.sh, test-gpu.sh), the baseline;
#   nri      setup 2's working part: NVIDIA's container toolkit in NRI plugin mode beside
#            deploy/'s device plugin (hack/gpu-host/gpu-nri.sh, hack/nri/test-nri.sh), NRI on
#            as in Talos v1.14.1;
#   control  nri with K8S_NODE_CUDA_FAULT=1: the CUDA pods fail, so its exit code must;
#   setup1   the operator with values-cdi.yaml (_out/gpu-operator), which by the operator's
#            source stops at the validator's toolkit check (docs/gpu-operator.md): run with
#            GPU_OPERATOR_EXPECT_STOP=toolkit, whose checks are that it stops there and nowhere
#            earlier (hack/gpu-operator/setup1-stop.sh).
# Each run's output in RESULTS/NAME (gpu-run.sh's gpu-run.log and k8s-logs.tar.xz); then
# RESULTS/summary.txt: every PASS, FAIL and MEASURE line and each run's exit code, and the
# verdict. Exits 0 only when every run came out as said above. Unpack node.tar.xz,
# tree.tar.xz, gpu-operator.tar.xz (hack/gpu-operator/carry.sh) and nri.tar.xz
# (hack/nri/carry.sh) into one directory first. RUNS picks some of them.
#
#   hack/gpu-host/gpu-operator-runs.sh RESULTS
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
res=${1:?usage: gpu-operator-runs.sh RESULTS}
mkdir -p "$res"
declare -A rcs
read -r -a runs <<<"${RUNS:-deploy nri control setup1}"
for run in "${runs[@]}"; do
	echo "== $run: start $(date -u +%T)"
	case $run in
	deploy) OUT=$res/$run "$here/gpu-run.sh" ;;
	nri) OUT=$res/$run "$here/gpu-nri.sh" ;;
	control) OUT=$res/$run K8S_NODE_CUDA_FAULT=1 "$here/gpu-nri.sh" ;;
	setup1) OUT=$res/$run GPU_OPERATOR_EXPECT_STOP=toolkit GPU_OPERATOR_OUT=$top/_out/gpu-operator "$here/gpu-operator.sh" ;;
	*) echo "gpu-operator-runs: unknown run $run" >&2; exit 2 ;;
	esac >/dev/null 2>&1
	rcs[$run]=$?
	echo "== $run: exit ${rcs[$run]} $(date -u +%T)"
done
verdict=0
{
	for run in "${runs[@]}"; do
		echo "== $run (exit ${rcs[$run]})"
		grep -E '(PASS|FAIL|MEASURE)|gpu-run: exit|node .* Ready' "$res/$run/gpu-run.log"
		case $run in
		control) [[ ${rcs[$run]} != 0 ]] || { echo "FAIL control: exit 0 with CUDA failing in the pods"; verdict=1; } ;;
		*) [[ ${rcs[$run]} == 0 ]] || verdict=1 ;;
		esac
	done
	echo "gpu-operator-runs: verdict $verdict"
} >"$res/summary.txt" 2>&1
exit $verdict
