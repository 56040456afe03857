#!/usr/bin/env bash
# A simulated GPU node's "kernel driver", run by the harness on its Talos-shaped node before
# the service starts (hack/harness -before-boot), as a node loads its modules before
# extension services start. For hack/sim-node/sim-run.sh:
#   - the simulated NVML's state (8 H100 80GB on an HGX board: 4 NVSwitches, the GPUs
#     registered with the NVLink fabric) in /dev/.simnvml, where every NVML client on the node
#     finds it: the service's NVML jobs through /dev, the device plugin through the driver
#     root's dev/ (hack/sim-node/simnvml/main.go);
#   - the /proc and /sys files a loaded driver offers (sim.WriteProcFS, sim.WriteNVSwitchFS:
#     /proc/devices with the nvidia-frontend, nvidia-uvm, nvidia-caps, nvidia-nvswitch majors,
#     /proc/driver/nvidia/{version,params,gpus/*/information}, /proc/driver/nvidia-caps/
#     mig-minors, /sys/module/nvidia*, the NVSwitches' PCI functions) under the service's host
#     root SIM_HOST (NVIDIA_DRIVER_HOST_ROOT): no process can add them to the kernel's /proc;
#   - in that host root, dev/ and run/ are the node's own /dev and /run (binds), so what the
#     service makes there (device nodes from /proc/devices' majors, the driver root mount at
#     run/nvidia/driver, run/cdi/nvidia.yaml, the readiness file) is where the kubelet,
#     containerd and the device plugin look on a node;
#   - NFD's features.d in that host root, made 0700 as Talos makes a missing mount source of
#     an extension service (machined's services/extension.go): the service's feature file
#     goes there (NVIDIA_DRIVER_NFD_FEATURES_DIR), and test-sim.sh binds it where NFD's worker
#     reads it.
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
host=${SIM_HOST:-/run/nvidia/sim}
gpus=${SIM_GPUS:-h100-80gb:8}
mkdir -p "$host/dev" "$host/run"
mount --bind /dev "$host/dev"
mount --bind /run "$host/run"
mkdir -p "$host/etc/kubernetes/node-feature-discovery"
mkdir -m 0700 "$host/etc/kubernetes/node-feature-discovery/features.d"
"$top/_out/bin/simnvml-node" -dir /dev/.simnvml -host-root "$host" -gpus "$gpus" -nvswitches 4 \
	-subroot /usr/local/glibc
