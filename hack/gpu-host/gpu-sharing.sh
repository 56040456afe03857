#!/usr/bin/env bash
# GPU sharing on the GPU test host: hack/gpu-host/gpu-run.sh with hack/gpu-host/test-sharing.sh
# (time-slicing and MPS through NVIDIA's device plugin as deploy/sharing deploys it), from the
# same packs as gpu-run.sh (hack/gpu-host/gpu-run-carry.sh). Output in $OUT as gpu-run.sh's.
# nvidia-smi is read, never used to change the GPU; the MPS control daemon sets the compute
# mode EXCLUSIVE_PROCESS while it runs and DEFAULT when it stops, which the test checks.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
"$here/gpu-run.sh" "$here/test-sharing.sh"
rc=$?
# Should the test have been cut short while the MPS daemon ran, say so (the next test on this
# machine would find the GPU in EXCLUSIVE_PROCESS mode).
m=$(nvidia-smi --query-gpu=compute_mode --format=csv,noheader 2>/dev/null)
echo "gpu-sharing: compute mode after the run: $m" | tee -a "${OUT:-/tmp/k8s-node-out}/gpu-run.log"
[[ $m == Default ]] || rc=1
exit $rc
