#!/usr/bin/env bash
# Packs what hack/gpu-host/gpu-operator.sh needs besides hack/gpu-host/gpu-run-carry.sh's two archives
# into DEST/gpu-operator.tar.xz (default .carry/k8s of this working tree, git-ignored), for the GPU
# test host, which has no Go and no network: the output of hack/gpu-operator/build.sh
# (GPU_OPERATOR_OUT, default _out/gpu-operator): the images' root filesystems and packing
# flags (which test-operator.sh packs on the host), the rendered chart, the versions. Programs
# are stripped already (-s -w); xz with the x86 filter as gpu-run-carry.sh. One transfer holds
# at most 64 MiB: this goes in a call of its own or beside tree.tar.xz.
#
# On the host, after node.tar.xz and tree.tar.xz: python3 -c "import tarfile;
# tarfile.open('gpu-operator.tar.xz').extractall('/tmp/t', filter='fully_trusted')", then
# /tmp/t/hack/gpu-host/gpu-operator.sh.
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
dest=${1:-$top/.carry/k8s}
cd "$top"
b=$(realpath --relative-to="$top" "${GPU_OPERATOR_OUT:-_out/gpu-operator}")
for f in "$b/gpu-operator.yaml" "$b/versions" "$b/rootfs/gpu-operator.flags"; do
	[[ -e $f ]] || { echo "gpu-operator carry: $f is missing: run hack/gpu-operator/build.sh" >&2; exit 1; }
done
mkdir -p "$dest"
tar --sort=name -cf - "$b" |
	xz --x86 --lzma2=preset=9e,dict=64MiB -T1 >"$dest/gpu-operator.tar.xz.tmp"
mv "$dest/gpu-operator.tar.xz.tmp" "$dest/gpu-operator.tar.xz"
du -b "$dest/gpu-operator.tar.xz" | awk '{printf "%s %.1f MiB\n", $2, $1/1048576}'
