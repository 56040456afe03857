#!/usr/bin/env bash
# On a GPU host, as root: the service run as Talos runs it (hack/harness, runc 1.5.1), ready,
# then its ExtensionServiceConfig changed three times (each a stop and start by Talos) while a
# CUDA workload runs through the service's CDI spec (hack/gpu-host/e2e-long-workload.sh matmul) and containers
# are started one after another (... starts), some during the restarts. Passes
# (exit 0) only when the service came back ready after every change, the driver root was
# reused (one mount), the workload ran its whole time with every result right, and every
# container started. Skipped (exit 0)
# without an NVIDIA driver. Nothing on the host changes (the harness's private namespace;
# nvidia-persistenced with --no-persistence-mode).
#
# Needs _out/ built elsewhere: bin/{harness,extension,nvidia-cdi-hook,ldconfig,cdi-e2e},
# containers/nvidia-driver, k8s-node/bin/runc (hack/k8s-node/build.sh _out/k8s-node runtime builds it).
#
#   hack/gpu-host/e2e-restarts.sh [DRIVER_TREE] [SECONDS]    (default /usr/local/nvidia 60)
set -uo pipefail
cd "$(dirname "$0")/../.."
tree=${1:-/usr/local/nvidia} secs=${2:-60}
[ -e /proc/driver/nvidia/version ] || { echo "e2e-restarts: SKIP: no NVIDIA kernel driver"; exit 0; }
out=${OUT:-/tmp/e2e-restarts}
mkdir -p "$out"
echo "== modes before: $(nvidia-smi --query-gpu=persistence_mode,mig.mode.current --format=csv,noheader | tr '\n' ' ')"
LDCONFIG=_out/bin/ldconfig hack/dev/build-subroot.sh host _out/subroot-host "$tree" || exit 1
_out/bin/extension -out _out -name nvidia-driver-dev-host -payload _out/subroot-host >/dev/null || exit 1
PATH=$PWD/_out/k8s-node/bin:$PATH _out/bin/harness -json -runc "$PWD/_out/k8s-node/bin/runc" \
  -extension _out/extensions/nvidia-driver-dev-host \
  -env NVIDIA_DRIVER_PERSISTENCE_MODE=false -env NVIDIA_DRIVER_LOG_LEVEL=info \
  -until ready -wait 120s -hold 1s -changes 3 -change-every $((secs / 5))s \
  -after-ready "$PWD/hack/gpu-host/e2e-long-workload.sh matmul $secs & $PWD/hack/gpu-host/e2e-long-workload.sh starts $secs; loop=\$?; wait \$!; long=\$?; [ \$loop = 0 ] && [ \$long = 0 ]" >"$out/restarts.json"
rc=$?
echo "== modes after: $(nvidia-smi --query-gpu=persistence_mode,mig.mode.current --format=csv,noheader | tr '\n' ' ')"
python3 - "$out/restarts.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("starts", r.get("starts"), "phase", r.get("phase"), "changePhases", r.get("changePhases"),
      "afterReadyExit", r.get("afterReadyExit"), "driverRootMounts", r.get("driverRootMounts"), "up", r.get("up"))
ok = r.get("changePhases") == ["ready"] * 3 and r.get("afterReadyExit") == 0 and r.get("driverRootMounts") == 1 and r.get("starts") == 4
print("e2e-restarts: " + ("PASS" if ok else "FAIL"))
sys.exit(0 if ok else 1)
PY
check=$?
[ $rc = 0 ] && [ $check = 0 ]
