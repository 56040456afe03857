# shellcheck shell=bash
# Sourced by hack/talos-node's scripts: the Talos release the node runs, TALOS_NODE_VERSION
# (default v1.14.1; v1.13.9 too), each with its own module directory (hack/talos-node/<version>:
# machined and talosctl), its own build output (_out/talos-node/<version>, or TALOS_NODE_OUT)
# and the volumes its docker provisioner gives a node container: /var (EPHEMERAL),
# /system/state and each path of machinery's constants.Overlays (v1.13.9: /etc/cni,
# /etc/kubernetes, /usr/libexec/kubernetes, /opt; v1.14.1: /opt only), without the leading /.
TALOS_NODE_VERSION=${TALOS_NODE_VERSION:-v1.14.1}
case $TALOS_NODE_VERSION in
v1.14.1) talos_volumes="var system/state opt" ;;
v1.13.9) talos_volumes="var system/state etc/cni etc/kubernetes usr/libexec/kubernetes opt" ;;
*)
	echo "talos-node: TALOS_NODE_VERSION $TALOS_NODE_VERSION: not one of v1.14.1, v1.13.9" >&2
	exit 2
	;;
esac
release_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$TALOS_NODE_VERSION
release_out=${TALOS_NODE_OUT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/_out/talos-node/$TALOS_NODE_VERSION}
export TALOS_NODE_VERSION
