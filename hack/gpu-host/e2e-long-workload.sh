#!/usr/bin/env bash
# For the restarts test (hack/gpu-host/e2e-restarts.sh), which changes the service's document while
# this runs, through the node's CDI spec with plain runc, for SECONDS:
#   matmul  one CUDA workload: a PyTorch loop of matmuls, each checked against its known sum;
#           prints each second's count; fails when any result is wrong, CUDA goes away, or it
#           ends early;
#   starts  containers started one after another (nvidia-smi -L in each), so that some start
#           while the service restarts; fails when any of them fails.
#
#   hack/gpu-host/e2e-long-workload.sh matmul|starts [SECONDS] [SPEC_DIR] [DEVICE]   (default 60 /run/cdi nvidia.com/gpu=all)
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
out=$top/_out
W=$(mktemp -d /tmp/e2e-long.XXXXXX)
. "$top/hack/gpu-host/e2e-lib.sh"
mode=${1:?usage: e2e-long-workload.sh matmul|starts [SECONDS] [SPEC_DIR] [DEVICE]}
secs=${2:-60} dir=${3:-/run/cdi} dev=${4:-nvidia.com/gpu=all}

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

if [ "$mode" = starts ]; then
  ok=0 failed=0 n=0 end=$((SECONDS + secs))
  while [ $SECONDS -lt $end ]; do
    n=$((n + 1))
    ctr "loop$n" "$dir" "$dev" nvidia-smi -L >"$W/last.log" 2>&1
    if grep -q '^GPU 0: ' "$W/last.log"; then
      ok=$((ok + 1))
    else
      failed=$((failed + 1))
      echo "start loop: container $n failed at $(date +%T.%N | cut -c1-12)"
      [ $failed -gt 3 ] || sed 's/^/  /' "$W/last.log"
    fi
    rm -rf "$W/bundle-loop$n"
  done
  if [ $failed = 0 ] && [ $ok -gt 0 ]; then
    echo "start loop: $ok containers started and listed the GPU, 0 failed: PASS"
    exit 0
  fi
  echo "start loop: $ok started, $failed failed: FAIL"
  exit 1
fi

E2E_CTR_TIMEOUT=$((secs + 120)) ctr long "$dir" "$dev" /opt/torch/.venv/bin/python3 -c "$loop" "$secs" | tee "$W/long.log"
rc=${PIPESTATUS[0]}
if [ "$rc" = 0 ] && grep -q '^done .* wrong=0 ' "$W/long.log"; then
  echo "long workload: $(grep '^done' "$W/long.log"): PASS"
  exit 0
fi
echo "long workload: exit $rc: FAIL"
exit 1
