#!/usr/bin/env bash
# A CUDA workload through the node's CDI spec, with plain runc: what a pod gets. For a node
# already brought up (e.g. by the runtime harness: make harness HARNESS_FLAGS='-after-ready
# hack/gpu-host/e2e-workload.sh ...'). Prints PASS or FAIL lines; exits non-zero on a failure.
#
#   hack/gpu-host/e2e-workload.sh [SPEC_DIR] [DEVICE]     (default /run/cdi nvidia.com/gpu=all)
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
out=$top/_out
W=$(mktemp -d /tmp/e2e-workload.XXXXXX)
. "$top/hack/gpu-host/e2e-lib.sh"
dir=${1:-/run/cdi} dev=${2:-nvidia.com/gpu=all}
fail=0

if e2e_rootfs; then echo "workload: the rootfs holds none of the host's driver: PASS"; else echo "workload: the host's driver is visible in the rootfs: FAIL"; fail=1; fi
smi=$(ctr smi "$dir" "$dev" nvidia-smi -L); echo "$smi" | sed 's/^/  /'
if echo "$smi" | grep -q '^GPU 0: '; then echo "workload: nvidia-smi -L lists the GPU: PASS"; else echo "workload: nvidia-smi -L: FAIL"; fail=1; fi
py=$(ctr torch "$dir" "$dev" /opt/torch/.venv/bin/python3 -c "$E2E_TORCH"); echo "$py" | tail -2 | sed 's/^/  /'
if echo "$py" | grep -q '^sum 1073741824'; then echo "workload: CUDA matmul in PyTorch is right: PASS"; else echo "workload: CUDA matmul: FAIL"; fail=1; fi
exit $fail
