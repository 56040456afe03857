# A real Talos node (machined and talosctl from Talos's Go module) running the extension, in
# container mode inside a qemu guest (hack/talos-node, docs/talos-node.md), at Talos v1.14.1;
# TALOS_NODE_VERSION=v1.13.9 picks the release before (hack/talos-node/release.sh). The
# top-level Makefile includes this file. make test runs test-talos-node (the document and
# reboot checks) on v1.14.1; the same on v1.13.9 (test-talos-node-1.13), Kubernetes on the
# node and the three controls each boot the node again and are their own targets
# (test-talos-k8s, test-talos-controls); docs/talos-node.md gives the times.

.PHONY: talos-node-build talos-node test-talos-simgpu test-talos-node test-talos-node-1.13 test-talos-k8s talos-node-control test-talos-controls

TALOS_NODE_EXTENSION ?= $(OUT)/extensions/nvidia-driver-dev-debian
export TALOS_NODE_VERSION ?= v1.14.1
TALOS_NODE_RUN = $(OUT)/talos-node/$(TALOS_NODE_VERSION)

# machined, talosctl, the node runtime (from hack/k8s-node/build.sh), the node's rootfs and
# the guest; the registry too unless TALOS_NODE_KUBERNETES=0.
talos-node-build:
	hack/talos-node/install-deps.sh
	hack/talos-node/build.sh

# The checks of hack/talos-node/test.sh against the extension as make extension builds it,
# Kubernetes included (its images from hack/k8s-node: make k8s-node). hack/k8s-node builds
# Talos v1.14.1's Kubernetes 1.37.0 and etcd 3.7.1, the images hack/talos-node/v1.14.1/k8s.patch.yaml
# leaves at v1.14.1's defaults; on v1.13.9 (TALOS_NODE_VERSION=v1.13.9, k8s.patch.yaml) the
# images would be of a Kubernetes newer than 1.13 supports (machinery v1.13.9
# compatibility/talos113: 1.31.0 to 1.36.99).
# Kubernetes needs both of the guest's vCPUs at once (hack/talos-node/node.sh).
talos-node: export TALOS_NODE_ACCEL ?= tcg,thread=multi
talos-node: extension talos-node-build k8s-node
	hack/talos-node/test.sh $(TALOS_NODE_EXTENSION) $(TALOS_NODE_RUN)/run

# What make test runs: boot with no document and no module, a first, a changed, a removed and
# a bad document, a reboot; no Kubernetes (no registry, no bootstrap).
test-talos-node: export TALOS_NODE_KUBERNETES := 0
test-talos-node: extension talos-node-build
	hack/talos-node/test.sh $(TALOS_NODE_EXTENSION) $(TALOS_NODE_RUN)/run

# The same checks on Talos v1.13.9, the release before (its own build, _out/talos-node/v1.13.9).
test-talos-node-1.13:
	$(MAKE) --no-print-directory test-talos-node TALOS_NODE_VERSION=v1.13.9

# The same checks with Kubernetes and deploy/ on the node (bootstrap, the node Ready with the
# patch's label and taint, deploy/'s DaemonSets scheduled, the plugin held by its wait).
test-talos-k8s: talos-node

# Simulated GPUs on the node (hack/talos-node/test-simgpu.sh): the product's service on a
# subroot with the simulated libnvidia-ml, the simulated kernel driver as a test-only extension
# service (hack/talos-node/simgpu), NVIDIA's device plugin from deploy/ on Talos's kubelet and
# containerd, GPU pods, a service restart under a running GPU pod, measurements.
test-talos-simgpu: export TALOS_NODE_ACCEL ?= tcg,thread=multi
test-talos-simgpu: extension talos-node-build k8s-node
	hack/talos-node/simgpu/build.sh
	hack/talos-node/test-simgpu.sh $(TALOS_NODE_RUN)/simgpu

# The controls, each of which passes only when the checks fail on its defect
# (hack/talos-node/control.sh).
# The controls stop before Kubernetes (control.sh): no registry to build.
TALOS_NODE_CONTROLS ?= tmpfs depends exit
test-talos-controls: export TALOS_NODE_KUBERNETES := 0
test-talos-controls: extension talos-node-build
	for c in $(TALOS_NODE_CONTROLS); do \
		TALOS_NODE_CONTROL=$$c hack/talos-node/control.sh $(TALOS_NODE_EXTENSION) $(TALOS_NODE_RUN)/control-$$c || exit 1; \
	done

# One control (TALOS_NODE_CONTROL=tmpfs, depends or exit; default tmpfs, the defect the node
# exists to catch): passes only when test.sh fails on it.
talos-node-control: export TALOS_NODE_KUBERNETES := 0
talos-node-control: extension talos-node-build
	hack/talos-node/control.sh $(TALOS_NODE_EXTENSION) $(TALOS_NODE_RUN)/control
