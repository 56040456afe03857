# The one-node Kubernetes test cluster (hack/k8s-node). The top-level Makefile includes this file.

.PHONY: k8s-node test-k8s-node

# kubelet, control plane, kubectl, etcd, containerd, runc and CNI plugins at Talos v1.13.9's
# versions, built from their Go modules, and the node's images (pause, device plugin, NFD, base),
# into _out/k8s-node. Cached: rebuilt when their go.mod/go.sum or scripts change.
k8s-node:
	hack/dev/install-test-deps.sh
	hack/k8s-node/build.sh
	hack/k8s-node/images.sh

# deploy/ on a real node without a GPU: server-side validation, scheduling by the docs' node
# label, the device plugin held by its wait-for-driver init container, the service's NFD feature
# file turned into the Node's labels by Node Feature Discovery v0.18.2 (hack/k8s-node/test-cpu.sh).
test-k8s-node: k8s-node
	hack/k8s-node/cluster.sh -- hack/k8s-node/test-cpu.sh
