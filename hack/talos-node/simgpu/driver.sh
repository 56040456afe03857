#!/bin/busybox sh
# The simulated NVIDIA kernel driver on the Talos test node, run by machined as the extension
# service ext-simnvml-driver (simnvml-driver.yaml). As hack/sim-node/sim-node.sh on the harness's
# node, before the product's service finds a driver:
#   - the simulated NVML's state (8 H100 80GB on an HGX board, 4 NVSwitches, registered with
#     the NVLink fabric) in /dev/.simnvml, made once: a restart of this service keeps it (a
#     MIG layout applied by the product's service survives);
#   - the /proc and /sys files a loaded driver offers, under the host root /run/nvidia/sim that
#     the product's service is given (NVIDIA_DRIVER_HOST_ROOT in its ExtensionServiceConfig,
#     hack/talos-node/simgpu/node.patch.yaml): no process can add them to the kernel's /proc;
#   - in that host root, dev/ and run/ are the node's own /dev and /run (binds), so what the
#     product makes there (device nodes, the driver root mount, /run/cdi/nvidia.yaml, the
#     readiness file) is where Talos's kubelet and containerd and the device plugin look.
# Then it stays up, as a loaded module does.
set -eu
export PATH=/bin
host=/run/nvidia/sim
# mounted PATH: a mount is at PATH (made by an earlier start: the binds reach the host).
mounted() { awk -v p="$1" '$5 == p { found = 1 } END { exit !found }' /proc/self/mountinfo; }
mkdir -p "$host/dev" "$host/run"
mounted "$host/dev" || mount --bind /dev "$host/dev"
mounted "$host/run" || mount --bind /host/run "$host/run"
# The host's NFD feature directory (as machined made it for this service's mount, 0700) at the
# host root's etc/kubernetes/node-feature-discovery/features.d, where the product writes its
# labels file: bound once, at this service's first start, so that a cri restart after it
# shows whether a bind made before the restart still reaches NFD (test-simgpu.sh).
features=$host/etc/kubernetes/node-feature-discovery/features.d
mkdir -p "$features"
mounted "$features" || mount --bind /host/features.d "$features"
# A restart of this service keeps the state (and a MIG layout in it); a restart of the node
# makes it anew, as a reboot would: its /run, with the host root's /proc files, is new, while
# container mode keeps the guest's /dev (seen 2026-12-05, when the harness restarted the node).
if [ -f /dev/.simnvml/state.json ] && [ -f "$host/proc/driver/nvidia/version" ]; then
	echo "simnvml-driver: the simulated GPUs' state is kept: /dev/.simnvml"
else
	/simnvml-node -dir /dev/.simnvml -host-root "$host" -gpus h100-80gb:8 -nvswitches 4 \
		-subroot /usr/local/glibc
fi
echo "simnvml-driver: loaded: $(cat "$host/proc/driver/nvidia/version" | head -1)"
trap 'exit 0' TERM INT
while :; do sleep 3600 & wait $!; done
