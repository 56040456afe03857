#!/usr/bin/env bash
# Containers started one after another for SECONDS through the node's CDI spec, with plain
# runc (nvidia-smi -L in each): for the restarts test (hack/e2e-restarts.sh), so that some
# start while the service restarts. Prints how many started and listed the GPU; exits
# non-zero when any failed.
#
#   hack/e2e-start-loop.sh [SECONDS] [SPEC_DIR] [DEVICE]   (default 60 /run/cdi nvidia.com/gpu=all)
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
out=$top/_out
W=$(mktemp -d /tmp/e2e-loop.XXXXXX)
. "$top/hack/e2e-lib.sh"
secs=${1:-60} dir=${2:-/run/cdi} dev=${3:-nvidia.com/gpu=all}

e2e_rootfs
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
