# nvidia-driver for Talos Linux.
#
#   make build   the service (for this machine and for the extension), the CDI hook, a static ldconfig
#   make demo    the service against a simulated GPU node, in a private mount namespace
#   make lint    gofmt and go vet
#   make extension  the development extension image (_out/extensions/), validated with Talos's code
#   make harness    run that image's service as Talos does, with runc, and print what the host saw
#   make flavors    re-render the generated release recipes (vars.yaml, flavors/, stages/nvidia-userspace-*)
#                   from the release facts, hack/release/releases.yaml (docs/extension.md: adding a release)
#   make release-image  one flavor's release image with docker buildx and bldr (FLAVOR, TALOS_VERSION, IMAGE)
#
# The test tiers (docs/development.md says what each proves and how long it takes):
#   make check    the fast loop: gofmt, vet and the unit tests (-short) of every module
#   make test     what CI runs (installs what the tests need first): every module's tests in
#                 full, the real Kubernetes node (test-k8s-node), the simulated GPU node
#                 (test-k8s-sim), NVIDIA's GPU Operator's setup 1 on it, up to its documented
#                 stop (test-k8s-sim-operator), NVIDIA's container toolkit's NRI plugin there
#                 beside deploy/'s device plugin (test-k8s-sim-nri), the real Talos node's
#                 document and reboot checks (test-talos-node, Talos v1.14.1), simulated GPUs
#                 on that node's kubelet (test-talos-simgpu, core)
#   make test-talos-node-1.13 the same checks on Talos v1.13.9
#   make test-talos-k8s       Kubernetes and deploy/ on the real Talos node
#   make test-talos-controls  the Talos node's three controls, each on its own boot
#   make test-arm64           the arm64 service, subroot and extension under qemu-user
#   make test-all             test and the four above
#   make e2e-gpu, hack/gpu-host/gpu-run.sh ...   on a host with an NVIDIA GPU (README)

SHELL := /bin/bash
OUT ?= _out
# Where the extension puts the glibc subroot on a Talos node. Programs that the host runs
# directly (the CDI hook) take their ELF interpreter and libc from there.
GLIBC_ROOT ?= /usr/local/glibc
# The subroot's glibc loader, the hook's interpreter: x86-64's standard path; the release
# recipe's binaries stage passes its platform's (GLIBC_LOADER of the root vars.yaml).
GLIBC_LOADER ?= lib64/ld-linux-x86-64.so.2
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)

export CGO_ENABLED := 1
# One build configuration for every Go package that make builds, vets and tests, and for the
# upstream programs its scripts build (they add GO_TAGS to their programs' own tags): Talos's
# (its Makefile builds with GOAMD64=v2, which Talos's own binaries need, and the grpcnotrace
# tag), with Go's own DNS resolver and user lookup (netgo, osusergo), so that a package is
# compiled alike with cgo and without. -trimpath, GOAMD64 and the files that tags pick are part
# of Go's build-cache key: with one configuration the packages that our tests, Kubernetes,
# machined, containerd and NVIDIA's programs share (the standard library, grpc, client-go at
# the versions they have in common) compile once, not once per configuration.
export GOAMD64 := v2
export GO_TAGS := grpcnotrace,netgo,osusergo
export GOFLAGS := -trimpath -tags=$(GO_TAGS)
# go-nvml's header marks some calls deprecated; the warnings are noise.
export CGO_CFLAGS := -O2 -Wno-deprecated-declarations

GO_LDFLAGS := -s -w -X main.version=$(VERSION)
HOOK_PKG := github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook
SUBROOT := $(OUT)/subroot-debian
SUBROOT_ARM64 := $(OUT)/subroot-debian-arm64

.PHONY: all check test-all build binaries binaries-arm64 test-arm64 extension-arm64 release-image subroot test lint demo deps clean extension harness flavors

all: build

build: binaries $(SUBROOT)
	install -m 0755 $(SUBROOT)/sbin/ldconfig $(OUT)/bin/ldconfig

# The binaries alone, without the Debian subroot: what the release recipe's
# nvidia-driver-binaries stage (pkg.yaml) runs. The extension validator is static: the
# recipes' test steps run it in a musl image.
binaries:
	go build -trimpath -ldflags '$(GO_LDFLAGS)' -o $(OUT)/bin/nvidia-driver ./service
	go build -trimpath -o $(OUT)/bin/nvidia-cdi-hook \
	  -ldflags "-s -w -linkmode external -extldflags '-Wl,--dynamic-linker=$(GLIBC_ROOT)/$(GLIBC_LOADER) -Wl,-rpath,$(GLIBC_ROOT)/usr/lib64'" \
	  $(HOOK_PKG)
	CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o $(OUT)/bin/extension ./hack/release/extension
	hack/dev/stage-service-rootfs.sh $(OUT)/bin/nvidia-driver $(OUT)/containers/nvidia-driver
	# ext-nvidia-fabricmanager runs the same binary from a root filesystem of its own.
	rm -rf $(OUT)/containers/nvidia-fabricmanager
	cp -a $(OUT)/containers/nvidia-driver $(OUT)/containers/nvidia-fabricmanager

# arm64 (DGX Spark, GH200, GB200): the service and the CDI hook cross-built with Debian's
# gcc-aarch64-linux-gnu (cgo), into $(OUT)/arm64/bin. The hook's interpreter is the aarch64
# loader's standard path inside the subroot (pkg/driverroot layout_arm64.go).
ARM64_ENV := GOARCH=arm64 CC=aarch64-linux-gnu-gcc
binaries-arm64:
	$(ARM64_ENV) go build -trimpath -ldflags '$(GO_LDFLAGS)' -o $(OUT)/arm64/bin/nvidia-driver ./service
	$(ARM64_ENV) go build -trimpath -o $(OUT)/arm64/bin/nvidia-cdi-hook \
	  -ldflags "-s -w -linkmode external -extldflags '-Wl,--dynamic-linker=$(GLIBC_ROOT)/lib/ld-linux-aarch64.so.1 -Wl,-rpath,$(GLIBC_ROOT)/usr/lib64'" \
	  $(HOOK_PKG)

# The service's CPU tests as arm64 binaries under qemu-user (qemu-aarch64-static, Debian's
# arm64 glibc from libc6-dev-arm64-cross). Left out: packages whose tests execute other
# programs they build (nvmljobs re-runs its own test binary, fabricmanager, daemons, node and
# cdi start fake daemons or the service) or those of the build machine (driverroot,
# extension, gpu, service): without binfmt_misc, which this machine does not mount and which
# is the kernel's, not a test's, to change, an arm64 program run directly fails with "exec
# format error"; and memory, whose page accounting is qemu's, not the program's.
ARM64_QEMU := qemu-aarch64-static -L /usr/aarch64-linux-gnu
ARM64_CPU_TESTS := ./pkg/atomicfile ./pkg/config ./pkg/devnodes ./pkg/document ./pkg/gpu/models ./internal/sim \
  ./pkg/mig/... ./pkg/nfd ./pkg/nvswitch ./internal/ociimage
# The arm64 subroot (Debian's arm64 packages): NVIDIA's aarch64 nvidia-smi and
# nvidia-persistenced run from it with its own loader, and the arm64 service accepts it
# while refusing the amd64 one. driverroot's checks run on it; its mount tests re-run
# their own test binary, which needs binfmt_misc.
test-arm64: binaries-arm64 $(SUBROOT_ARM64)
	@file $(OUT)/arm64/bin/nvidia-driver | grep -q 'ARM aarch64' || { echo "$(OUT)/arm64/bin/nvidia-driver is not an arm64 program"; exit 1; }
	@file $(OUT)/arm64/bin/nvidia-cdi-hook | grep -q 'interpreter $(GLIBC_ROOT)/lib/ld-linux-aarch64.so.1' || { echo "nvidia-cdi-hook: not the subroot's aarch64 loader"; exit 1; }
	$(ARM64_QEMU) $(OUT)/arm64/bin/nvidia-driver version
	$(ARM64_QEMU) $(OUT)/arm64/bin/nvidia-driver check-root $(SUBROOT_ARM64)
	@if $(ARM64_QEMU) $(OUT)/arm64/bin/nvidia-driver check-root $(SUBROOT) >/dev/null 2>&1; then echo "the arm64 service accepted the amd64 subroot"; exit 1; fi
	@out=$$(qemu-aarch64-static $(SUBROOT_ARM64)/lib/ld-linux-aarch64.so.1 --library-path $(SUBROOT_ARM64)/usr/lib64 $(SUBROOT_ARM64)/usr/bin/nvidia-smi 2>&1); \
	  echo "$$out" | grep -q "couldn't communicate with the NVIDIA driver" || { echo "arm64 nvidia-smi from the subroot: $$out"; exit 1; }
	qemu-aarch64-static $(SUBROOT_ARM64)/lib/ld-linux-aarch64.so.1 --library-path $(SUBROOT_ARM64)/usr/lib64 $(SUBROOT_ARM64)/usr/bin/nvidia-persistenced --version
	$(ARM64_QEMU) $(OUT)/arm64/bin/nvidia-driver mig plan --gpu h100-80gb --select all-1g >/dev/null
	$(ARM64_ENV) go test -count=1 -exec '$(ARM64_QEMU)' $(ARM64_CPU_TESTS)
	$(ARM64_ENV) go test -count=1 -exec '$(ARM64_QEMU)' -run 'TestCheck|TestReport' ./pkg/driverroot
	$(ARM64_ENV) go test -count=1 -exec '$(ARM64_QEMU)' -run 'TestArchLoaderIsTheServices' ./internal/recipes
	$(MAKE) extension-arm64
	@# the service from its staged container: that container's loader and glibc (qemu -L roots them there)
	qemu-aarch64-static -L $(ARM64_OUT)/containers/nvidia-driver $(ARM64_OUT)/containers/nvidia-driver/usr/bin/nvidia-driver \
	  check-root $(ARM64_OUT)/extensions/nvidia-driver-dev-debian/rootfs/usr/local/glibc
	@cfg=$$(tar -xOf $(ARM64_OUT)/extensions/nvidia-driver-dev-debian.tar manifest.json | sed -n 's/.*"Config":"\([^"]*\)".*/\1/p'); \
	  tar -xOf $(ARM64_OUT)/extensions/nvidia-driver-dev-debian.tar "$$cfg" | grep -q '"architecture":"arm64"' || { echo "the arm64 extension's image is not linux/arm64"; exit 1; }
	@out=$$($(OUT)/bin/extension -validate $(ARM64_OUT)/extensions/nvidia-driver-dev-debian 2>&1) && { echo "the amd64 validator accepted the arm64 extension"; exit 1; }; \
	  echo "$$out" | grep -q 'an EM_AARCH64 file in an amd64 extension\|/usr/local/glibc/lib64/ld-linux-x86-64.so.2' || { echo "the amd64 validator refused the arm64 extension for another reason: $$out"; exit 1; }
	@echo "test-arm64: PASS"

# The arm64 development extension, in $(ARM64_OUT)/extensions: the arm64 service's container
# (its glibc from Debian's libc6-arm64-cross, the sysroot it was linked against), hook and
# ldconfig, the arm64 subroot, assembled and validated by the arm64 build of hack/release/extension
# under qemu-user: Talos's own Load and Validate, and driverroot's checks as the arm64
# service makes them. Its image archive's platform is linux/arm64.
ARM64_OUT := $(OUT)/arm64
extension-arm64: binaries-arm64 $(SUBROOT_ARM64)
	STAGE_SYSROOT=/usr/aarch64-linux-gnu STAGE_RUN=qemu-aarch64-static STAGE_LDCONFIG="qemu-aarch64-static $(SUBROOT_ARM64)/sbin/ldconfig" \
	  hack/dev/stage-service-rootfs.sh $(ARM64_OUT)/bin/nvidia-driver $(ARM64_OUT)/containers/nvidia-driver
	rm -rf $(ARM64_OUT)/containers/nvidia-fabricmanager
	cp -a $(ARM64_OUT)/containers/nvidia-driver $(ARM64_OUT)/containers/nvidia-fabricmanager
	install -m 0755 $(SUBROOT_ARM64)/sbin/ldconfig $(ARM64_OUT)/bin/ldconfig
	GOARCH=arm64 CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o $(ARM64_OUT)/bin/extension ./hack/release/extension
	qemu-aarch64-static $(ARM64_OUT)/bin/extension -out $(ARM64_OUT) -payload $(SUBROOT_ARM64) $(EXTENSION_FLAGS) >/dev/null

# The development subroot, from Debian's non-free packages (the tests' and the demo's fixture).
subroot: $(SUBROOT)
$(SUBROOT):
	hack/dev/build-subroot.sh debian $(SUBROOT)
$(SUBROOT_ARM64):
	SUBROOT_ARCH=arm64 hack/dev/build-subroot.sh debian $(SUBROOT_ARM64)

# Debian packages and tools the tests use (runc, util-linux's unshare).
deps:
	hack/dev/install-test-deps.sh
	bash hack/dev/install-deploy-test-deps.sh
	hack/talos-node/install-deps.sh

# hack/gpu-host/consumers is a module of its own (NVIDIA's device plugin at its own dependency
# versions, and the e2e's pod-to-OCI translation): vetted and tested from its directory.
# hack/talos-machinery/talos114 too: the product's validators built with Talos 1.14's machinery (the
# product's go.mod stays on 1.13's), and the 1.14 example patches on 1.14's generated config;
# hack/talos-machinery/talos113: the 1.13 example patches on v1.13.9's generated config.
# hack/talos-node/v1.14.1 (Talos v1.14.1's module, for machined): its packages of ours,
# controlplane (the simulated GPUs' host control plane, hack/talos-node/controlplane.sh) and
# docscheck (the docs' talosctl command lines against talosctl's own command tree).
TEST_MODULES := . hack/gpu-host/consumers hack/talos-machinery/talos113 hack/talos-machinery/talos114 hack/talos-node/v1.14.1

# The fast loop: no upstream program built, no node booted. go test's own vet is off: lint has
# run go vet (every analyzer) on the same packages.
GO_TEST := go test -count=1 -vet=off -ldflags=-w
check: lint
	for m in $(TEST_MODULES); do (cd $$m && $(GO_TEST) -short ./...) || exit 1; done

# make test's recipe is hack/dev/make-test.sh: machined and talosctl (most of a cold run's
# compiling) build at nice 19 in the background from the start, on the CPU the foreground leaves
# idle while it downloads and waits on its containers and nodes; the Talos node's document and
# reboot checks (test-talos-node) and then its simulated GPUs (test-talos-simgpu's core checks:
# boot, allocatable, a 2-GPU pod and a no-GPU pod) follow there, beside the foreground's module
# tests, Kubernetes node, simulated GPU node, GPU Operator and NRI plugin. The script says what
# each line waits for.
test: deps
	MAKE="$(MAKE)" OUT="$(OUT)" TEST_MODULES="$(TEST_MODULES)" GO_TEST="$(GO_TEST)" \
	  TALOS_NODE_EXTENSION="$(TALOS_NODE_EXTENSION)" TALOS_NODE_RUN="$(TALOS_NODE_RUN)" hack/dev/make-test.sh

test-all: test test-talos-node-1.13 test-talos-k8s test-talos-simgpu test-talos-controls test-arm64

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	go vet ./...
	go vet -tags $(GO_TAGS),simulate ./service
	cd hack/gpu-host/consumers && go vet ./...
	cd hack/talos-machinery/talos113 && go vet ./...
	cd hack/talos-machinery/talos114 && go vet ./...
	cd hack/talos-node/v1.14.1 && go vet ./...
	cd hack/k8s-node/runtime && go vet ./...

# EXTENSION_FLAGS: e.g. -name nvidia-driver-dev-host -payload _out/subroot-host (see hack/release/extension).
extension: build
	go run ./hack/release/extension -out $(OUT) $(EXTENSION_FLAGS)

# HARNESS_FLAGS: e.g. -extension _out/extensions/nvidia-driver-dev-host -env NVIDIA_DRIVER_PERSISTENCE_MODE=false -until ready,failed
# (-env/-config make the ExtensionServiceConfig, which the service waits for).
HARNESS_FLAGS ?= -env NVIDIA_DRIVER_LOG_LEVEL=info
harness: deps extension
	go run ./hack/harness $(HARNESS_FLAGS)

flavors:
	go run ./hack/release/gen-flavors

# A release image of one flavor with bldr's frontend (docker buildx), as siderolabs/extensions
# builds its own (docs/extension.md). TALOS_VERSION empty: the recipes' default release.
# IMAGE set: tagged and pushed there; unset: an image archive in $(OUT)/<flavor>.tar.
# PLATFORM: linux/amd64 or linux/arm64 (DGX Spark, GH200, GB200).
#   make release-image FLAVOR=nvidia-driver-lts-open TALOS_VERSION=v1.13.5 IMAGE=registry.example.com/talos/nvidia-driver-lts-open:580.167.08-v1.13.5
FLAVOR ?= nvidia-driver-production-open
PLATFORM ?= linux/amd64
TALOS_VERSION ?=
PKGS_PREFIX ?= ghcr.io/siderolabs
IMAGE ?=
release-image:
	docker buildx build . --file=Pkgfile --target=$(FLAVOR) --platform=$(PLATFORM) --provenance=false --sbom=false \
	  $(if $(TALOS_VERSION),--build-arg=TALOS_VERSION=$(TALOS_VERSION)) --build-arg=PKGS_PREFIX=$(PKGS_PREFIX) --build-arg=TAG=$(VERSION) \
	  $(if $(IMAGE),--tag=$(IMAGE) --push,--output=type=docker,dest=$(OUT)/$(FLAVOR).tar)

# The demo build: the service plus simulated GPUs (-tags simulate); the product has neither.
demo: build
	go build -trimpath -tags $(GO_TAGS),simulate -o $(OUT)/bin/nvidia-driver-demo ./service
	hack/dev/demo.sh

include hack/dev/deploy.mk
include hack/gpu-host/gpu-host.mk
include hack/k8s-node/k8s-node.mk
include hack/sim-node/sim-node.mk
include hack/talos-node/talos-node.mk

clean:
	rm -rf $(OUT)
