#!/usr/bin/env bash
# Packs what hack/k8s-node/gpu-run.sh needs on a GPU host that has no Go and no network (one
# transfer to the H200 test host holds at most 64 MiB), into DEST (default .carry/k8s of this
# checkout):
#   node.tar.xz   the test node's programs (make k8s-node: _out/k8s-node/bin, cni, base spec)
#   rest.tar.xz   this checkout's files (tracked and untracked, not ignored), the service's
#                       rootfs, hook and ldconfig (make build), the harness and extension tools,
#                       and the node's images as directories (hack/k8s-node/images.sh packs
#                       them there)
# Archives are xz with the x86 filter. On the host: extract both into one directory and run
# hack/k8s-node/gpu-run.sh from there.
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
dest=${1:-$top/.carry/k8s}
cd "$top"
for f in _out/bin/nvidia-cdi-hook _out/bin/ldconfig _out/containers/nvidia-driver \
	_out/k8s-node/bin/kube _out/k8s-node/images/rootfs/device-plugin; do
	[[ -e $f ]] || { echo "carry: $f is missing: run make build k8s-node" >&2; exit 1; }
done
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o _out/bin/harness ./hack/harness
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o _out/bin/extension ./hack/extension
mkdir -p "$dest"
xz9() { xz --x86 --lzma2=preset=9e -T1; } # one thread: one block, the best ratio
tar -cf - _out/k8s-node/bin _out/k8s-node/cni _out/k8s-node/base-spec.json | xz9 >"$dest/node.tar.xz"
{ git ls-files -co --exclude-standard; echo _out/bin/nvidia-cdi-hook; echo _out/bin/ldconfig
	echo _out/bin/harness; echo _out/bin/extension; echo _out/containers/nvidia-driver
	echo _out/k8s-node/images/rootfs; echo _out/k8s-node/images/image; echo _out/k8s-node/images/busybox; } |
	tar -T - -cf - | xz9 >"$dest/rest.tar.xz"
du -b "$dest"/* | awk '{printf "%s %.1f MiB\n", $2, $1/1048576}'
