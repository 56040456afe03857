# shellcheck shell=bash
# Sourced by hack/talos-node's scripts: the Talos release the node runs, TALOS_NODE_VERSION
# (default v1.14.1; v1.13.9 too), each with its own module directory (hack/talos-node/<version>:
# machined and talosctl), its own build output (_out/talos-node/<version>, or TALOS_NODE_OUT)
# and the volumes its docker provisioner gives a node container: /var (EPHEMERAL),
# /system/state and each path of machinery's constants.Overlays (v1.13.9: /etc/cni,
# /etc/kubernetes, /usr/libexec/kubernetes, /opt; v1.14.1: /opt only), without the leading /,
# the guest's kernel: v1.13.9 the build machine's own, v1.14.1 Debian 13's backported 6.18
# (guest_kernel from guest_kernel_suite; build.sh says why), and the machine config patches in
# the release's documents: the test node's own (node_patch), its Kubernetes (k8s_patch; as a
# worker of hack/talos-node/controlplane.sh, v1.14.1 only: k8s_worker_patch) and the
# docs' GPU worker (worker_patch; v1.14 refuses the 1.13 patch's .machine.kubelet next to its
# KubeletConfig).
TALOS_NODE_VERSION=${TALOS_NODE_VERSION:-v1.14.1}
case $TALOS_NODE_VERSION in
v1.14.1)
	talos_volumes="var system/state opt"
	guest_kernel=linux-image-6.18.15+deb13-amd64
	guest_kernel_suite=trixie-backports
	node_patch=v1.14.1/node.patch.yaml
	k8s_patch=v1.14.1/k8s.patch.yaml
	k8s_worker_patch=v1.14.1/k8s-worker.patch.yaml
	worker_patch=docs/examples/talos-1.14/gpu-worker.patch.yaml
	;;
v1.13.9)
	talos_volumes="var system/state etc/cni etc/kubernetes usr/libexec/kubernetes opt"
	guest_kernel=
	node_patch=node.patch.yaml
	k8s_patch=k8s.patch.yaml
	worker_patch=docs/examples/talos-1.13/gpu-worker.patch.yaml
	;;
*)
	echo "talos-node: TALOS_NODE_VERSION $TALOS_NODE_VERSION: not one of v1.14.1, v1.13.9" >&2
	exit 2
	;;
esac
# node_patch and k8s_patch are relative to hack/talos-node, worker_patch to the repository.
node_patch=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$node_patch
k8s_patch=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$k8s_patch
k8s_worker_patch=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/${k8s_worker_patch:-}
worker_patch=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/$worker_patch
release_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$TALOS_NODE_VERSION
release_out=${TALOS_NODE_OUT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/_out/talos-node/$TALOS_NODE_VERSION}
export TALOS_NODE_VERSION
