#!/usr/bin/env bash
# Packs what hack/k8s-node/gpu-run.sh needs on a GPU host that has no Go and no network, into
# DEST (default .carry/k8s of this checkout):
#   tree.tar.xz  this checkout's files (tracked and untracked, not ignored)
#   out.tar.xz   the service, hook and ldconfig (make build), the harness and extension tools,
#                the test node's programs and images (make k8s-node); binaries are stripped, and
#                the archive is xz with the x86 filter
# On the host: extract both into one directory and run hack/k8s-node/gpu-run.sh from there.
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
dest=${1:-$top/.carry/k8s}
mkdir -p "$dest"
cd "$top"
for f in _out/bin/nvidia-driver _out/bin/nvidia-cdi-hook _out/bin/ldconfig _out/containers/nvidia-driver \
	_out/k8s-node/bin/kube _out/k8s-node/images/device-plugin.tar; do
	[[ -e $f ]] || { echo "carry: $f is missing: run make build k8s-node" >&2; exit 1; }
done
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o _out/bin/harness ./hack/harness
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o _out/bin/extension ./hack/extension
git ls-files -co --exclude-standard -z | tar --null -T - -cf - | xz -6 >"$dest/tree.tar.xz"
tar -cf - _out/bin/nvidia-driver _out/bin/nvidia-cdi-hook _out/bin/ldconfig _out/bin/harness _out/bin/extension \
	_out/containers/nvidia-driver _out/k8s-node/bin _out/k8s-node/cni \
	_out/k8s-node/images/*.tar _out/k8s-node/images/image _out/k8s-node/images/busybox |
	xz --x86 --lzma2=preset=9e -T2 >"$dest/out.tar.xz"
du -b "$dest"/* | awk '{printf "%s %.1f MiB\n", $2, $1/1048576}'
