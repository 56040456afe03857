# The simulated GPU node (hack/sim-node): the real Kubernetes node of hack/k8s-node with the
# extension's service on simulated GPUs. The top-level Makefile includes this file.

.PHONY: test-k8s-sim test-k8s-sim-operator test-k8s-sim-operator-nri

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

# Setup 2 (deploy/gpu-operator/values-nri.yaml: the toolkit in NRI plugin mode) on the simulated
# GPU node with containerd's NRI on, as Talos 1.14 has it (cluster.sh K8S_NODE_NRI=1). NRI mode
# needs v26.7.0, which the module proxy does not serve: git repositories of NVIDIA/gpu-operator
# and NVIDIA/k8s-device-plugin with the tags v26.7.0 and v0.20.0, as GPU_OPERATOR_CHECKOUT and
# DEVICE_PLUGIN_CHECKOUT. The toolkit (v1.20.0, as v26.7.0's values.yaml names it) comes from its
# module. Not in `make test`: docs/gpu-operator.md (setup 2) says what it gives.
test-k8s-sim-operator-nri: k8s-node build deploy-tools
	@test -n "$(GPU_OPERATOR_CHECKOUT)" -a -n "$(DEVICE_PLUGIN_CHECKOUT)" || \
		{ echo "set GPU_OPERATOR_CHECKOUT and DEVICE_PLUGIN_CHECKOUT (git repositories with v26.7.0 and v0.20.0)" >&2; exit 2; }
	GPU_OPERATOR_VALUES=deploy/gpu-operator/values-nri.yaml GPU_OPERATOR_OUT=$(CURDIR)/_out/gpu-operator-nri \
		hack/gpu-operator/build.sh $(GPU_OPERATOR_CHECKOUT) $(DEVICE_PLUGIN_CHECKOUT)
	GPU_OPERATOR_OUT=$(CURDIR)/_out/gpu-operator-nri K8S_NODE_NRI=1 hack/sim-node/sim-run.sh hack/gpu-operator/test-operator.sh
