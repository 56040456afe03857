#!/usr/bin/env bash
# A CUDA workload that runs for SECONDS through the node's CDI spec, with plain runc: a
# PyTorch loop of matmuls, each checked against its known sum. For the restarts test
# (hack/e2e-restarts.sh), which changes the service's document while this runs. Prints each
# second's count; exits non-zero when any result is wrong, CUDA goes away, or it ends early.
#
#   hack/e2e-long-workload.sh [SECONDS] [SPEC_DIR] [DEVICE]   (default 60 /run/cdi nvidia.com/gpu=all)
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
out=$top/_out
W=$(mktemp -d /tmp/e2e-long.XXXXXX)
. "$top/hack/e2e-lib.sh"
secs=${1:-60} dir=${2:-/run/cdi} dev=${3:-nvidia.com/gpu=all}

loop='import sys, time, torch
secs = float(sys.argv[1]); a = torch.ones(1024, 1024, device="cuda")
n = bad = 0; start = last = time.time()
while time.time() - start < secs:
    s = (a @ a).sum().item(); n += 1
    if s != 1073741824: bad += 1
    if time.time() - last >= 1: print(f"t={time.time()-start:.0f}s matmuls={n} wrong={bad}", flush=True); last = time.time()
print(f"done matmuls={n} wrong={bad} seconds={time.time()-start:.1f}", flush=True)
sys.exit(1 if bad or n == 0 else 0)'

e2e_rootfs
E2E_CTR_TIMEOUT=$((secs + 120)) ctr long "$dir" "$dev" /opt/torch/.venv/bin/python3 -c "$loop" "$secs" | tee "$W/long.log"
rc=${PIPESTATUS[0]}
if [ "$rc" = 0 ] && grep -q '^done .* wrong=0 ' "$W/long.log"; then
  echo "long workload: $(grep '^done' "$W/long.log"): PASS"
  exit 0
fi
echo "long workload: exit $rc: FAIL"
exit 1
