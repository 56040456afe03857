#!/usr/bin/env bash
# The simulated GPU node (`make test-k8s-node`, after test-cpu.sh): NVIDIA's real device plugin
# on a real kubelet and containerd, the extension's real service, on a machine without a GPU.
#   1. the simulated libnvidia-ml (hack/simnvml) in a copy of the Debian subroot
#      (hack/simnvml/build.sh), and a development extension of it (hack/extension);
#   2. the service run as Talos runs it (hack/harness: the product build, its NVML jobs in
#      children that load the library from the subroot), after sim-node.sh has given the
#      harness's node the simulated driver's state and /proc files (-before-boot), with
#      persistenced off (it talks to the kernel driver, which is not there);
#   3. while it is ready, a one-node cluster (cluster.sh -gpu) running test-sim.sh.
# What cannot be simulated: CUDA, and anything else that talks to the kernel driver rather
# than to NVML (nvidia-persistenced, nvidia-smi's own ioctls, the fabric manager).
set -uo pipefail
cd "$(dirname "$0")/../.."
top=$PWD
t0=$SECONDS
hack/simnvml/build.sh _out/subroot-debian _out/subroot-sim || exit 1
_out/bin/extension -out _out -name nvidia-driver-dev-sim -payload _out/subroot-sim >/dev/null || exit 1
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o _out/bin/harness ./hack/harness || exit 1
echo "sim-run: built in $((SECONDS - t0)) s"
PATH=$top/_out/k8s-node/bin:$PATH _out/bin/harness -extension _out/extensions/nvidia-driver-dev-sim \
	-before-boot "$top/hack/k8s-node/sim-node.sh" \
	-env NVIDIA_DRIVER_HOST_ROOT=/run/nvidia/sim -env NVIDIA_DRIVER_PERSISTENCED=false \
	-env NVIDIA_DRIVER_NFD_FEATURES_DIR=/etc/kubernetes/node-feature-discovery/features.d \
	-config /etc/nvidia-driver/mig.yaml=hack/k8s-node/sim-mig.yaml \
	-until ready,degraded -after-ready-phases ready,degraded -wait 120s -runc "$top/_out/k8s-node/bin/runc" \
	-after-ready "$top/hack/k8s-node/cluster.sh -gpu -- $top/hack/k8s-node/test-sim.sh"
rc=$?
echo "sim-run: exit $rc after $((SECONDS - t0)) s"
exit $rc
