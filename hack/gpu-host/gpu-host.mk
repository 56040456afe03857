# The GPU host's end-to-end test (hack/gpu-host; docs/development.md, "Run history"). The
# top-level Makefile includes this file. The Kubernetes runs on a GPU host
# (hack/gpu-host/gpu-run.sh and its siblings) need no make: their carry scripts pack what they
# need.

.PHONY: e2e-tools e2e-gpu

# What the GPU end-to-end test needs besides `make build`: nvidia-ctk from the same toolkit
# version (the reference), its Go helpers, the persistenced test driver, NVIDIA's device
# plugin and GPU feature discovery from their module at the chart's version (hack/gpu-host/consumers)
# with the manifests they run from (hack/gpu-host/render-consumers.sh), and Debian's runc as .deb
# files for hosts without runc.
e2e-tools: build deploy-tools
	go build -trimpath -o $(OUT)/bin/nvidia-ctk github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk
	go build -trimpath -o $(OUT)/bin/cdi-e2e ./hack/gpu-host/cdi-e2e
	cd hack/gpu-host/consumers && go build -trimpath -ldflags '-s -w' -o $(abspath $(OUT))/bin/ \
	  github.com/NVIDIA/k8s-device-plugin/cmd/nvidia-device-plugin \
	  github.com/NVIDIA/k8s-device-plugin/cmd/gpu-feature-discovery ./kubelet-e2e ./devchar-e2e
	hack/gpu-host/render-consumers.sh $(OUT)/e2e
	CGO_ENABLED=0 go build -trimpath -o $(OUT)/bin/persistenced-e2e ./hack/gpu-host/persistenced-e2e
	mkdir -p $(OUT)/debs && cd $(OUT)/debs && apt-get download -q runc libseccomp2 >/dev/null

# On a host with an NVIDIA GPU (skipped elsewhere): see hack/gpu-host/e2e-gpu.sh.
e2e-gpu: e2e-tools
	hack/gpu-host/e2e-gpu.sh
