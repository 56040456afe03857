# The simulated GPU node (hack/sim-node): the real Kubernetes node of hack/k8s-node with the
# extension's service on simulated GPUs. The top-level Makefile includes this file.

.PHONY: test-k8s-sim test-k8s-sim-operator test-k8s-sim-nri

# The simulated GPU node: NVIDIA's device plugin from deploy/ on the real kubelet and
# containerd, the service's product build on 8 simulated H100s with NVSwitches, NVML being the
# project's own libnvidia-ml (hack/sim-node/simnvml); pods get GPUs' device nodes through CDI
# (hack/sim-node/sim-run.sh, test-sim.sh; docs/simulated-node.md); and the service's MIG pause
# through NFD's labels, end to end (sim-pause.sh; docs/mig.md section 5).
test-k8s-sim: k8s-node build
	hack/sim-node/sim-run.sh

# NVIDIA's GPU Operator, setup 1 (deploy/gpu-operator/values-cdi.yaml: driver and toolkit off,
# CDI on), on the simulated GPU node: the operator and its validator at the module proxy's
# newest version, the device plugin and GFD v0.19.0, built from source and the chart rendered
# with helm (hack/gpu-operator/build.sh), run by hack/gpu-operator/test-operator.sh. By the
# operator's source setup 1 stops at the validator's toolkit check without an NVIDIA runtime
# (docs/gpu-operator.md): the checks are that it gets there on the extension's driver root and
# stops there (GPU_OPERATOR_EXPECT_STOP=toolkit, hack/gpu-operator/setup1-stop.sh), with a
# control of the validator's driver check. Part of make test.
test-k8s-sim-operator: k8s-node build deploy-tools
	hack/gpu-operator/build.sh
	GPU_OPERATOR_EXPECT_STOP=toolkit hack/sim-node/sim-run.sh hack/gpu-operator/test-operator.sh

# NVIDIA's container toolkit in NRI plugin mode (v1.20.x, from its module: hack/nri/build.sh)
# as a DaemonSet of its own (hack/nri/nri-plugin.yaml) beside deploy/'s device plugin, on the
# simulated GPU node with containerd's NRI on (cluster.sh's default, as Talos 1.14 has it): the
# plugin registered, a pod annotated for the management CDI device gets the driver, the plugin
# refuses it outside its namespace, a pod annotated with one GPU of the extension's spec gets
# that GPU, the device plugin allocates, a pod without a GPU gets nothing (hack/nri/test-nri.sh).
# The working part of the GPU Operator's setup 2 (docs/gpu-operator.md). Part of make test.
test-k8s-sim-nri: k8s-node build
	hack/nri/build.sh
	hack/sim-node/sim-run.sh hack/nri/test-nri.sh
