#!/usr/bin/env bash
# Packs hack/nri/build.sh's output (NRI_OUT, default _out/nri: the toolkit image's root
# filesystem and packing flags, which test-nri.sh packs on the host) into DEST/nri.tar.xz
# (default .carry/k8s of this working tree, git-ignored), for hack/gpu-host/gpu-nri.sh on the GPU
# test host, which has no Go and no network; beside hack/gpu-host/gpu-run-carry.sh's
# node.tar.xz and tree.tar.xz. xz with the x86 filter, as gpu-run-carry.sh packs.
#
# On the host, after node.tar.xz and tree.tar.xz: python3 -c "import tarfile;
# tarfile.open('nri.tar.xz').extractall('/tmp/t', filter='fully_trusted')", then
# /tmp/t/hack/gpu-host/gpu-nri.sh.
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
dest=${1:-$top/.carry/k8s}
cd "$top"
b=$(realpath --relative-to="$top" "${NRI_OUT:-_out/nri}")
[[ -e $b/rootfs/container-toolkit.flags ]] || { echo "nri carry: $b/rootfs/container-toolkit.flags is missing: run hack/nri/build.sh" >&2; exit 1; }
mkdir -p "$dest"
tar --sort=name -cf - "$b" | xz --x86 --lzma2=preset=9e,dict=64MiB -T1 >"$dest/nri.tar.xz.tmp"
mv "$dest/nri.tar.xz.tmp" "$dest/nri.tar.xz"
du -b "$dest/nri.tar.xz" | awk '{printf "%s %.1f MiB\n", $2, $1/1048576}'
