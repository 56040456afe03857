#!/usr/bin/env bash
# Packs what hack/gpu-host/gpu-dra.sh needs besides hack/gpu-host/gpu-run-carry.sh's two
# archives into DEST/dra.tar.xz (default .carry/k8s of this repository), for the GPU test host,
# which has no Go and no network: of hack/dra/build.sh's _out/dra, the image's root filesystem
# and packing flags (test-dra.sh packs the image there, as images.sh packs the others), the
# rendered chart and cdi-e2e; not the image archive, nor the build's own files (bin/, src/).
# Programs are stripped already (-s -w); xz with the x86 filter as gpu-run-carry.sh.
#
# On the host, after node.tar.xz and tree.tar.xz: python3 -c "import tarfile;
# tarfile.open('dra.tar.xz').extractall('/tmp/t', filter='fully_trusted')", then
# /tmp/t/hack/gpu-host/gpu-dra.sh.
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
dest=${1:-$top/.carry/k8s}
cd "$top"
for f in _out/dra/dra-driver.yaml _out/dra/rootfs/dra-driver.flags _out/dra/rootfs/dra-driver/usr/bin/gpu-kubelet-plugin _out/dra/bin/cdi-e2e; do
	[[ -e $f ]] || { echo "dra carry: $f is missing: run hack/dra/build.sh" >&2; exit 1; }
done
mkdir -p "$dest"
tar --sort=name -cf - _out/dra/dra-driver.yaml _out/dra/rootfs _out/dra/bin/cdi-e2e |
	xz --x86 --lzma2=preset=9e,dict=64MiB -T1 >"$dest/dra.tar.xz.tmp"
mv "$dest/dra.tar.xz.tmp" "$dest/dra.tar.xz"
du -b "$dest/dra.tar.xz" | awk '{printf "%s %.1f MiB\n", $2, $1/1048576}'
