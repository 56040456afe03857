#!/usr/bin/env bash
# GPU host end-to-end test of the nvidia-persistenced supervisor (pkg/daemons).
#
#   hack/gpu-host/e2e-persistenced.sh SUBROOT [PERSISTENCED_E2E_BINARY] [-- extra flags, e.g. --kills 20]
#
# Runs the real nvidia-persistenced from SUBROOT (a glibc subroot built from
# this host's driver: lib64/ld-linux-x86-64.so.2, usr/lib64/libnvidia-cfg.so.1,
# usr/bin/nvidia-persistenced) under the supervisor, in a private mount
# namespace with private tmpfs on /run (and /var/run if it is not a link to
# /run): checks that its socket answers, kill -9s it and measures the time until
# it is ready again, stops it cleanly, and prints a summary.
#
# It never changes persistence mode, MIG, or resets a GPU: the daemon runs with
# --no-persistence-mode --no-uvm-persistence-mode (the binary has no flag to
# change that), and the script compares the GPUs' persistence and MIG modes
# before and after (read-only nvidia-smi queries).
#
# Build the binary on the build machine (static, no cgo):
#   CGO_ENABLED=0 go build -o persistenced-e2e ./hack/gpu-host/persistenced-e2e
set -euo pipefail

die() { echo "e2e-persistenced: $*" >&2; exit 2; }

[ $# -ge 1 ] || die "usage: $0 SUBROOT [PERSISTENCED_E2E_BINARY] [-- flags]"
[ "$(id -u)" = 0 ] || die "must run as root"
SUBROOT=$(realpath -e "$1") || die "no subroot at $1"
shift
BIN=$(dirname "$(realpath "$0")")/persistenced-e2e
if [ $# -ge 1 ] && [ "$1" != -- ]; then BIN=$1; shift; fi
BIN=$(realpath -e "$BIN") || die "no persistenced-e2e binary (build it: CGO_ENABLED=0 go build -o persistenced-e2e ./hack/gpu-host/persistenced-e2e)"
[ "${1:-}" = -- ] && shift

for p in "$SUBROOT" "$BIN"; do
  case "$p" in /run/*|/var/run/*) die "$p is under /run, which the test hides behind a private tmpfs";; esac
done
for f in lib64/ld-linux-x86-64.so.2 usr/bin/nvidia-persistenced usr/lib64/libnvidia-cfg.so.1; do
  [ -e "$SUBROOT/$f" ] || die "subroot lacks $f"
done
command -v unshare >/dev/null || die "unshare (util-linux) is needed"

# Read-only GPU state queries, with the subroot's nvidia-smi if it has one.
smi() {
  if [ -x "$SUBROOT/usr/bin/nvidia-smi" ]; then
    "$SUBROOT/lib64/ld-linux-x86-64.so.2" --library-path "$SUBROOT/usr/lib64" "$SUBROOT/usr/bin/nvidia-smi" "$@"
  elif command -v nvidia-smi >/dev/null; then
    nvidia-smi "$@"
  else
    return 127
  fi
}
gpu_state() { smi --query-gpu=index,pci.bus_id,persistence_mode,mig.mode.current --format=csv,noheader 2>&1 || true; }

before=$(gpu_state)
echo "GPU state before: ${before:-<no nvidia-smi>}"

set +e
export PERSISTENCED_E2E_OUTER_MNTNS PERSISTENCED_E2E_OUTER_RUN_DEV
PERSISTENCED_E2E_OUTER_MNTNS=$(readlink /proc/self/ns/mnt)
PERSISTENCED_E2E_OUTER_RUN_DEV=$(stat -L -c %d /run)
# unshare -m gives a new mount namespace; everything below happens only there.
unshare --mount --propagation private -- /bin/bash -euc '
  mount --make-rprivate /
  mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /run
  if [ -d /var/run ] && [ ! -L /var/run ]; then
    mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /var/run
  fi
  bin=$1; root=$2; shift 2
  exec "$bin" --subroot "$root" "$@"
' e2e "$BIN" "$SUBROOT" "$@"
rc=$?
set -e

after=$(gpu_state)
echo "GPU state after:  ${after:-<no nvidia-smi>}"
if [ "$before" != "$after" ]; then
  echo "FAIL: GPU persistence/MIG state changed" >&2
  rc=1
else
  echo "GPU persistence/MIG state unchanged"
fi
exit $rc
