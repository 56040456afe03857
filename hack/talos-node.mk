# A real Talos v1.13.9 node (machined and talosctl from Talos's Go module) running the
# extension, in container mode inside a qemu guest (hack/talos-node, docs/talos-node.md). The
# top-level Makefile includes this file. Not part of make test: docs/talos-node.md gives the
# times that keep it out.

.PHONY: talos-node-build talos-node talos-node-control

TALOS_NODE_EXTENSION ?= $(OUT)/extensions/nvidia-driver-dev-debian

# machined, talosctl, containerd, runc, the CNI plugins, the node's rootfs and the guest.
talos-node-build:
	hack/install-talos-node-deps.sh
	hack/talos-node/build.sh

# The checks of hack/talos-node/test.sh against the extension as make extension builds it.
talos-node: extension talos-node-build
	hack/talos-node/test.sh $(TALOS_NODE_EXTENSION) $(OUT)/talos-node/run

# The same checks against the extension with its service YAML given back `source: tmpfs`
# (the defect the node exists to catch): passes only when test.sh fails.
talos-node-control: extension talos-node-build
	hack/talos-node/control.sh $(TALOS_NODE_EXTENSION) $(OUT)/talos-node/control
