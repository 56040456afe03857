#!/usr/bin/env bash
# The demo: run the service's main job against a simulated GPU node. A private mount
# namespace holds a throwaway host root (tmpfs, shared like Talos's /run) so nothing on this
# machine changes; the GPUs are simulated NVML; the subroot is the Debian-built one.
# Needs root (mounts, mknod).
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
# The demo build of the service (go build -tags simulate): it alone knows NVIDIA_DRIVER_SIMULATE.
bin=${BIN:-$top/_out/bin/nvidia-driver-demo}
subroot=${SUBROOT:-$top/_out/subroot-debian}
gpus=${SIMULATE:-h200:4}
layout=${MIG_LAYOUT:-all-balanced}

if [ "${DEMO_IN_NAMESPACE:-}" != 1 ]; then
  [ "$(id -u)" = 0 ] || { echo "demo: needs root (mount namespaces, mknod)" >&2; exit 1; }
  exec env DEMO_IN_NAMESPACE=1 unshare --mount --propagation private "$0" "$@"
fi

host=$(mktemp -d /tmp/nvidia-driver-demo.XXXXXX)
mount -t tmpfs demo-host "$host"
mount --make-shared "$host"
mkdir -p "$host/run" "$host/dev"
# nvcdi reads MIG minors from /proc/driver/nvidia-caps itself: point this namespace's at the
# simulated driver's.
mount -t tmpfs demo-proc-driver /proc/driver
ln -s "$host/proc/driver/nvidia-caps" /proc/driver/nvidia-caps
log=$host/service.log

echo "== simulated node: $gpus, MIG layout $layout, host root $host (private mount namespace)"
echo "== starting: nvidia-driver run"
# A node's binary lies on a read-only squashfs; a freshly built one has dirty page-cache
# pages, which the kernel does not page out when the service releases its memory.
sync
NVIDIA_DRIVER_HOST_ROOT=$host NVIDIA_DRIVER_SUBROOT=$subroot NVIDIA_DRIVER_SIMULATE=$gpus \
  NVIDIA_DRIVER_MIG_LAYOUT=$layout \
  NVIDIA_DRIVER_PERSISTENCED=false \
  "$bin" run 2>"$log" &
pid=$!

ready=$host/run/nvidia/validations/nvidia-driver.ready
for _ in $(seq 100); do
  [ -f "$ready" ] && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.1
done
cat "$log"
[ -f "$ready" ] || { echo "demo: the service did not become ready" >&2; kill $pid 2>/dev/null; exit 1; }

echo
echo "== the driver root, as this namespace (the \"host\") sees it"
findmnt -n -o TARGET,OPTIONS,PROPAGATION "$host/run/nvidia/driver"
findmnt -n -o TARGET,OPTIONS,PROPAGATION "$host/run/nvidia/driver/dev"
echo "   $(ls "$host/run/nvidia/driver/dev" | grep -c nvidia) nvidia* entries under the driver root's dev/ (the host's /dev, docs/driver-root.md)"
echo "== device nodes"
ls -l "$host/dev" | grep nvidia || true
echo "   /dev/nvidia-caps: $(ls "$host/dev/nvidia-caps" | wc -l) capability nodes (MIG config, monitor, and one per GPU and compute instance)"
echo "== /dev/char links: $(ls "$host/dev/char" | wc -l)"
echo "== CDI spec $host/run/cdi/nvidia.yaml, devices:"
grep -E '^    - name:' "$host/run/cdi/nvidia.yaml" | sed 's/^ *- name: //' | tr -d '"' | fmt -w 100 | sed 's/^/  /' 
echo "== status ($host/run/nvidia-driver/status.json), GPUs shortened"
grep -vE '^ {6}"(busId|minor|memoryMiB|index|uuid|layout|changed)"' "$host/run/nvidia-driver/status.json"
sleep 1
before=$(grep -o 'rssBeforeKiB=[0-9]*' "$log" | tail -1 | cut -d= -f2)
echo "== idle RSS of the service, 1 s after ready: $(awk '/VmRSS/{print $2, $3}' /proc/$pid/status) (at ready, before releasing the bring-up's memory: ${before:-?} kB)"

echo
echo "== stopping with SIGTERM"
start=$(date +%s%N)
kill -TERM $pid
rc=0
wait $pid || rc=$?
echo "exit code $rc after $(( ($(date +%s%N) - start) / 1000000 )) ms"
tail -n 2 "$log"
findmnt -n -o TARGET,OPTIONS "$host/run/nvidia/driver" >/dev/null && findmnt -n "$host/run/nvidia/driver/dev" >/dev/null && echo "driver root and its dev/ still mounted after stop: yes"
exit $rc
