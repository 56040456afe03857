#!/usr/bin/env bash
# Packs what hack/gpu-host/gpu-run.sh needs on a GPU host that has no Go and no network, into
# two archives in DEST (default .carry/k8s of this checkout):
#   node.tar.xz  the test node's programs (make k8s-node) and its images as directories
#                (gpu-run.sh packs them there with `images.sh pack`: they compress far better
#                than the archives' gzip layers), with NFD's deployment files;
#   tree.tar.xz  this checkout's files (tracked and untracked, not ignored), the service's
#                rootfs, hook and ldconfig (make build), the harness and extension tools.
# Both unpack into one directory, which is then a checkout with its _out/.
#
# One transfer to the H200 test host holds at most 64 MiB with the checkout, and the two
# together do not fit: node.tar.xz was 58.2 MiB (488 MiB of tar) and tree.tar.xz about 10 MiB
# (2026-12-01, NFD's nfd-master and nfd-worker added 107 MiB to the node's), so each goes in a
# call of its own, the second while the machine is still warm. The programs share much code
# (Go's runtime, client-go, gRPC, protobuf): xz with the x86 filter and a dictionary larger
# than the tar finds it across files. node.tar.xz takes about 10 minutes and 5.5 GiB of
# memory to make, so it is made again only when its tar changed (node.tar.sha256).
#
# On the host: python3 -c "import tarfile; tarfile.open('node.tar.xz').extractall('/tmp/t',
# filter='fully_trusted')" (the host may have no xz), the same for tree.tar.xz, then
# /tmp/t/hack/gpu-host/gpu-run.sh.
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
dest=${1:-$top/.carry/k8s}
cd "$top"
for f in _out/bin/nvidia-cdi-hook _out/bin/ldconfig _out/containers/nvidia-driver \
	_out/k8s-node/bin/kube _out/k8s-node/base-spec.json _out/k8s-node/images/rootfs/device-plugin \
	_out/k8s-node/images/nfd-deployment; do
	[[ -e $f ]] || { echo "gpu-run-carry: $f is missing: run make build k8s-node" >&2; exit 1; }
done
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o _out/bin/harness ./hack/harness
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o _out/bin/extension ./hack/release/extension
mkdir -p "$dest"

# gpu-feature-discovery (49 MiB) and bash in the device plugin's image, there for the simulated
# node's GPU Operator test, stay here: no GPU-host test runs images.sh's plugin image with them
# (the GPU Operator's test carries the plugin and GFD of its own version,
# hack/gpu-operator/carry.sh), and node.tar.xz with the checkout must stay under 64 MiB
# (2026-12-04: 60.0 MiB with both left out, 60.5 MiB with bash in).
pack() { # NAME DICT: the tar of the paths on stdin, as DEST/NAME.tar.xz, unless it is unchanged
	local name=$1 dict=$2 sum
	tar --exclude=_out/k8s-node/images/rootfs/device-plugin/usr/bin/gpu-feature-discovery \
		--exclude=_out/k8s-node/images/rootfs/device-plugin/bin/bash -T - --sort=name -cf "$dest/$name.tar"
	sum=$(sha256sum <"$dest/$name.tar" | cut -c1-64)
	if [[ -f $dest/$name.tar.xz && $(cat "$dest/$name.tar.sha256" 2>/dev/null) == "$sum" ]]; then
		echo "gpu-run-carry: $name.tar unchanged" >&2
	else
		xz --x86 --lzma2=preset=9e,dict="$dict" -T1 -c "$dest/$name.tar" >"$dest/$name.tar.xz.tmp"
		mv "$dest/$name.tar.xz.tmp" "$dest/$name.tar.xz"
		echo "$sum" >"$dest/$name.tar.sha256"
	fi
	rm "$dest/$name.tar"
	du -b "$dest/$name.tar.xz" | awk '{printf "%s %.1f MiB\n", $2, $1/1048576}'
}
printf '%s\n' _out/k8s-node/bin _out/k8s-node/cni _out/k8s-node/base-spec.json _out/k8s-node/images/rootfs \
	_out/k8s-node/images/image _out/k8s-node/images/busybox _out/k8s-node/images/nfd-deployment | pack node 512MiB
{
	git ls-files -co --exclude-standard
	printf '%s\n' _out/bin/nvidia-cdi-hook _out/bin/ldconfig _out/bin/harness _out/bin/extension \
		_out/containers/nvidia-driver
} | pack tree 64MiB
