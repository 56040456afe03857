#!/usr/bin/env bash
# Builds the container images of the test node as image archives for `ctr images import`, into
# K8S_NODE_IMAGES (default _out/k8s-node/images), so that no pod needs a registry:
#   pause.tar          registry.k8s.io/pause:3.10.2 (containerd 2.3's default sandbox image):
#                      Kubernetes' own pause.c (k8s.io/kubernetes build/pause/linux), static
#   device-plugin.tar  nvcr.io/nvidia/k8s-device-plugin:v0.19.0, laid out as NVIDIA's image
#                      (deployments/container/Dockerfile in the plugin's module): the plugin,
#                      config-manager, mps-control-daemon and gpu-feature-discovery (in the same
#                      module and image since v0.15) in /usr/bin, on a distroless glibc base with
#                      busybox at /busybox and /bin/sh -> /busybox/sh, NVIDIA's environment; plus
#                      Debian's bash-static at /bin/bash, which NVIDIA's image does not have: the
#                      GPU Operator's device plugin DaemonSet up to 2025-09 runs its entrypoint
#                      with /bin/bash (assets/state-device-plugin, the module proxy's newest
#                      operator; NVIDIA's own plugin images of that time were UBI-based)
#   validator.tar      talos-nvidia/gpu-operator-validator:test: the GPU Operator's
#                      nvidia-validator (hack/k8s-node/validator/go.mod, CGO off as its Makefile
#                      builds it) in /usr/bin on the same base (NVIDIA's is UBI with bash)
#   base.tar           talos-nvidia/k8s-node-base:test, the same base alone
#   nfd.tar            registry.k8s.io/nfd/node-feature-discovery:v0.18.2: Node Feature
#                      Discovery's nfd-master and nfd-worker (hack/k8s-node/nfd/go.mod), static,
#                      with its Makefile's flags, in /usr/bin on the same base (NFD's "minimal"
#                      image is scratch)
#   nfd-deployment/    NFD's own kustomize bases and components (its module's deployment/)
#   nfd-features       the service's NFD feature file writer (hack/k8s-node/nfd-features)
#   image, busybox     the packing tool (hack/k8s-node/image) and busybox, for hosts that
#                      assemble an image themselves (the GPU test's CUDA workload)
# The plugin is built from its Go module (hack/k8s-node/plugin/go.mod) with cgo, as NVIDIA's
# Makefile builds it, against this machine's glibc, whose libraries go into the image (NVML,
# which the plugin dlopens, needs libm, libdl, libpthread and librt besides libc). busybox is
# Debian's busybox-static package.
#
# Each image is kept as a directory, rootfs/NAME, with its packing flags in rootfs/NAME.flags:
# `images.sh pack` packs them again, for a host that is given the directories (which compress
# far better than the archives' gzip layers) rather than the archives.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
out=${K8S_NODE_IMAGES:-$top/_out/k8s-node/images}
R=$out/rootfs

pack() {
	local f n flags
	for f in "$R"/*.flags; do
		n=$(basename "$f" .flags)
		mapfile -t flags <"$f"
		"$out/image" -rootfs "$R/$n" -out "$out/$n.tar" "${flags[@]}" >/dev/null
	done
}
base_at() { # DIR: the distroless-like base with glibc and busybox ($out/busybox) in DIR
	local r=$1 a l
	mkdir -p "$r/busybox" "$r/bin" "$r/usr/bin" "$r/lib64" "$r/lib/x86_64-linux-gnu" "$r/tmp" "$r/etc"
	chmod 1777 "$r/tmp"
	install -m 0755 "$out/busybox" "$r/busybox/busybox"
	for a in $("$r/busybox/busybox" --list); do
		[[ $a == busybox ]] || ln -s busybox "$r/busybox/$a"
	done
	ln -s /busybox/sh "$r/bin/sh"
	cp -L /lib64/ld-linux-x86-64.so.2 "$r/lib64/"
	for l in libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1; do
		cp -L "/lib/x86_64-linux-gnu/$l" "$r/lib/x86_64-linux-gnu/"
	done
	printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$r/etc/passwd"
	printf 'root:x:0:\nnogroup:x:65534:\n' >"$r/etc/group"
}
base() { base_at "$R/$1"; } # NAME: the base in rootfs/NAME
# `images.sh base DIR`: that base alone, for images built elsewhere (hack/dra/build.sh), after
# images.sh has run once (it needs $out/busybox).
if [[ ${1:-} == base ]]; then
	[[ -x $out/busybox && -n ${2:-} ]] || { echo "images.sh base DIR: needs DIR and $out/busybox (run images.sh first)" >&2; exit 1; }
	base_at "$2"
	exit 0
fi
if [[ ${1:-} == pack ]]; then
	pack
	exit 0
fi

mkdir -p "$out"
exec 9>"$out/.lock"
flock 9
stamp=$(cat "$here/images.sh" "$here"/{plugin,validator,nfd}/go.{mod,sum} "$here"/image/*.go "$top"/internal/ociimage/*.go "$here"/nfd-features/*.go "$top"/pkg/nfd/*.go |
	sha256sum | cut -c1-16)
if [[ "$(cat "$out/.stamp" 2>/dev/null)" == "$stamp" ]]; then
	exit 0
fi
rm -rf "$R"
mkdir -p "$R"
W=$(mktemp -d /tmp/k8s-node-images.XXXXXX)
trap 'rm -rf "$W"' EXIT

(cd "$top" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/image" ./hack/k8s-node/image)
# The service's NFD feature file writer, for test-cpu.sh (see nfd-features/main.go).
(cd "$top" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/nfd-features" ./hack/k8s-node/nfd-features)
flags() { local n=$1; shift; printf '%s\n' "$@" >"$R/$n.flags"; } # NAME FLAGS...

# pause: as Kubernetes' build/pause Makefile builds it (static, VERSION defined).
kdir=$(cd "$here/kube" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)
mkdir -p "$R/pause"
gcc -Os -Wall -Werror -static -DVERSION=v3.10.2-k8s-node -o "$R/pause/pause" "$kdir/build/pause/linux/pause.c"
strip "$R/pause/pause"
flags pause -ref registry.k8s.io/pause:3.10.2 -entrypoint /pause

# busybox from Debian, its applets as links in /busybox (distroless "debug" images' layout).
mkdir -p "$W/deb" && chmod 755 "$W/deb"
if ! (cd "$W/deb" && apt-get -q -o APT::Sandbox::User=root download busybox-static >&2); then
	apt-get update -q >&2
	(cd "$W/deb" && apt-get -q -o APT::Sandbox::User=root download busybox-static >&2)
fi
dpkg -x "$W"/deb/busybox-static_*.deb "$W/deb/x"
install -m 0755 "$W/deb/x/bin/busybox" "$out/busybox"
# bash, static, for the device plugin's image (see device-plugin.tar above).
(cd "$W/deb" && apt-get -q -o APT::Sandbox::User=root download bash-static >&2)
dpkg -x "$W"/deb/bash-static_*.deb "$W/deb/b"
install -m 0755 "$W/deb/b/bin/bash-static" "$out/bash"

env_path=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/busybox

base base
flags base -ref talos-nvidia/k8s-node-base:test -env "$env_path" -entrypoint /bin/sh

# The device plugin and config-manager, with the ldflags of the plugin's Makefile.
base device-plugin
pkg=github.com/NVIDIA/k8s-device-plugin
ver=$(cd "$here/plugin" && go list -m -f '{{.Version}}' $pkg)
(cd "$here/plugin" && CGO_ENABLED=1 go build -trimpath -o "$R/device-plugin/usr/bin/" -ldflags "-s -w \
	'-extldflags=-Wl,--export-dynamic -Wl,--unresolved-symbols=ignore-in-object-files' \
	-X $pkg/internal/info.version=$ver" $pkg/cmd/nvidia-device-plugin $pkg/cmd/config-manager $pkg/cmd/mps-control-daemon \
	$pkg/cmd/gpu-feature-discovery)
install -m 0755 "$out/bash" "$R/device-plugin/bin/bash"
mkdir -p "$R/device-plugin/licenses"
cp "$(cd "$here/plugin" && go list -m -f '{{.Dir}}' $pkg)/LICENSE" "$R/device-plugin/licenses/"
flags device-plugin -ref "nvcr.io/nvidia/k8s-device-plugin:$ver" -entrypoint nvidia-device-plugin \
	-env "$env_path" -env NVIDIA_DISABLE_REQUIRE=true -env NVIDIA_VISIBLE_DEVICES=all \
	-env NVIDIA_DRIVER_CAPABILITIES=compute,utility

# The GPU Operator's validator, as validator/Makefile builds it.
base validator
(cd "$here/validator" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" \
	-o "$R/validator/usr/bin/nvidia-validator" github.com/NVIDIA/gpu-operator/validator)
flags validator -ref talos-nvidia/gpu-operator-validator:test -entrypoint /bin/sh \
	-env "$env_path" -env NVIDIA_DISABLE_REQUIRE=true -env NVIDIA_VISIBLE_DEVICES=void \
	-env NVIDIA_DRIVER_CAPABILITIES=utility,compute

# Node Feature Discovery, as its Makefile's BUILD_FLAGS and Dockerfile (HOSTMOUNT_PREFIX /host-)
# build it, CGO off (static).
base nfd
nfd=sigs.k8s.io/node-feature-discovery
nfd_ver=$(cd "$here/nfd" && go list -m -f '{{.Version}}' $nfd)
(cd "$here/nfd" && CGO_ENABLED=0 go build -trimpath -tags "osusergo,netgo${GO_TAGS:+,$GO_TAGS}" -o "$R/nfd/usr/bin/" -ldflags "-s -w \
	-X $nfd/pkg/version.version=$nfd_ver -X $nfd/pkg/utils/hostpath.pathPrefix=/host-" \
	$nfd/cmd/nfd-master $nfd/cmd/nfd-worker)
flags nfd -ref "registry.k8s.io/nfd/node-feature-discovery:$nfd_ver" -entrypoint nfd-worker -env "$env_path"
# NFD's own kustomize bases and components, which hack/k8s-node/nfd.sh deploys it from, here
# so that a host without Go (the GPU test's) has them too.
rm -rf "$out/nfd-deployment"
mkdir -p "$out/nfd-deployment"
cp -r "$(cd "$here/nfd" && go list -m -f '{{.Dir}}' $nfd)"/deployment/{base,components} "$out/nfd-deployment/"
chmod -R u+w "$out/nfd-deployment"

pack
echo "$stamp" >"$out/.stamp"
