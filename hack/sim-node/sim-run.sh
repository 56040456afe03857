#!/usr/bin/env bash
# The simulated GPU node (`make test-k8s-sim`): NVIDIA's real device plugin
# on a real kubelet and containerd, the extension's real service, on a machine without a GPU.
#   1. the simulated libnvidia-ml (hack/sim-node/simnvml) in a copy of the Debian subroot
#      (hack/sim-node/simnvml/build.sh), and a development extension of it (hack/release/extension);
#   2. the service run as Talos runs it (hack/harness: the product build, its NVML jobs in
#      children that load the library from the subroot), after sim-node.sh has given the
#      harness's node the simulated driver's state and /proc files (-before-boot), with
#      persistenced off (it talks to the kernel driver, which is not there);
#   3. while it is ready, a one-node cluster (cluster.sh -gpu) running test-sim.sh;
#   4. the same with the MIG layout all-1g set in the service's ExtensionServiceConfig,
#      running test-sim-mig.sh (the plugin's mixed and single strategies).
# With TEST, only step 3, running TEST instead (hack/dra/test-dra.sh runs NVIDIA's DRA
# driver there).
#
#   hack/sim-node/sim-run.sh [TEST]
# The kernel's /proc/driver entries reach every container through an OCI createContainer
# hook (hack/sim-node/simnvml/prochook): the service's (harness -oci-hook) and the node's (the base
# runtime spec, cluster.sh K8S_NODE_OCI_HOOK).
# What cannot be simulated: CUDA, and anything else that talks to the kernel driver rather
# than to NVML (nvidia-persistenced, nvidia-smi's own ioctls, the fabric manager).
set -uo pipefail
cd "$(dirname "$0")/../.."
top=$PWD
t0=$SECONDS
hack/sim-node/simnvml/build.sh _out/subroot-debian _out/subroot-sim || exit 1
_out/bin/extension -out _out -name nvidia-driver-dev-sim -payload _out/subroot-sim >/dev/null || exit 1
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o _out/bin/harness ./hack/harness || exit 1
(cd hack/k8s-node/kube && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$top/_out/bin/cdiplugin" ./cdiplugin) || exit 1
echo "sim-run: built in $((SECONDS - t0)) s"
# The kernel's /proc/driver entries, in the service's container and in every container of
# the node (hack/sim-node/simnvml/prochook).
hook="$top/_out/bin/simnvml-prochook -source /run/nvidia/sim/proc/driver -state /dev/.simnvml"
node() { # CHECKS [HARNESS ARGS...]: one harness run of the simulated node, CHECKS in its cluster
	local checks=$1; shift
	PATH=$top/_out/k8s-node/bin:$PATH K8S_NODE_OCI_HOOK=$hook _out/bin/harness -extension _out/extensions/nvidia-driver-dev-sim \
		-before-boot "$top/hack/sim-node/sim-node.sh" -oci-hook "$hook" \
		-env NVIDIA_DRIVER_HOST_ROOT=/run/nvidia/sim -env NVIDIA_DRIVER_PERSISTENCED=false "$@" \
		-until ready,degraded -after-ready-phases ready,degraded -wait 120s -runc "$top/_out/k8s-node/bin/runc" \
		-after-ready "$top/hack/k8s-node/cluster.sh -gpu -- $checks"
}
if [ -n "${1:-}" ]; then
	node "$(realpath "$1")"
	rc=$?
	echo "sim-run: exit $rc after $((SECONDS - t0)) s"
	exit $rc
fi
rc=0
t1=$SECONDS
# MIG off, with NFD's feature directory and a MIG layout file for the pause cycle
# (hack/sim-node/sim-pause.sh).
node "$top/hack/sim-node/test-sim.sh" \
	-env NVIDIA_DRIVER_NFD_FEATURES_DIR=/etc/kubernetes/node-feature-discovery/features.d \
	-config /etc/nvidia-driver/mig.yaml=hack/sim-node/sim-mig.yaml || rc=1
echo "sim-run: MIG off: $((SECONDS - t1)) s"
# MIG: the layout from the service's ExtensionServiceConfig (docs/mig.md), as a user sets it.
t1=$SECONDS
SIM_MIG_LAYOUT=all-1g node "$top/hack/sim-node/test-sim-mig.sh" -env NVIDIA_DRIVER_MIG_LAYOUT=all-1g || rc=1
echo "sim-run: MIG layout all-1g: $((SECONDS - t1)) s"
echo "sim-run: exit $rc after $((SECONDS - t0)) s"
exit $rc
