# A real Talos v1.13.9 node (machined and talosctl from Talos's Go module) running the
# extension, in container mode inside a qemu guest (hack/talos-node, docs/talos-node.md). The
# top-level Makefile includes this file. make test runs test-talos-node: the node's checks,
# Kubernetes included, and the three controls; docs/talos-node.md gives the times.

.PHONY: talos-node-build talos-node talos-node-control test-talos-node

TALOS_NODE_EXTENSION ?= $(OUT)/extensions/nvidia-driver-dev-debian

# machined, talosctl, containerd, runc, the CNI plugins, the node's rootfs and the guest.
talos-node-build:
	hack/install-talos-node-deps.sh
	hack/talos-node/build.sh

# The checks of hack/talos-node/test.sh against the extension as make extension builds it,
# Kubernetes included (its images from hack/k8s-node: make k8s-node).
talos-node: extension talos-node-build k8s-node
	hack/talos-node/test.sh $(TALOS_NODE_EXTENSION) $(OUT)/talos-node/run

# What make test runs: the checks, then the controls, each of which passes only when the
# checks fail on its defect (hack/talos-node/control.sh).
TALOS_NODE_CONTROLS ?= tmpfs depends exit
test-talos-node: talos-node
	for c in $(TALOS_NODE_CONTROLS); do \
		TALOS_NODE_CONTROL=$$c hack/talos-node/control.sh $(TALOS_NODE_EXTENSION) $(OUT)/talos-node/control-$$c || exit 1; \
	done

# One control (TALOS_NODE_CONTROL=tmpfs, depends or exit; default tmpfs, the defect the node
# exists to catch): passes only when test.sh fails on it.
talos-node-control: extension talos-node-build
	hack/talos-node/control.sh $(TALOS_NODE_EXTENSION) $(OUT)/talos-node/control
