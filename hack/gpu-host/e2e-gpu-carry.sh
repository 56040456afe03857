#!/usr/bin/env bash
# Packs what hack/gpu-host/e2e-gpu.sh needs from _out/ (make e2e-tools) for a GPU host with no Go and
# no network, as DEST/e2e-out.tar.xz (default .carry/e2e of this checkout, git-ignored): the
# checkout itself goes with the device call, this archive is carried beside it. About 30 MiB.
#
# On the host, from the checkout's root (the host may have no xz):
#   python3 -c "import tarfile; tarfile.open('.carry/e2e/e2e-out.tar.xz').extractall('.', filter='fully_trusted')"
#   hack/gpu-host/e2e-gpu.sh
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
dest=${1:-$top/.carry/e2e}
cd "$top"
files=(_out/bin/nvidia-cdi-hook _out/bin/ldconfig _out/bin/nvidia-ctk _out/bin/cdi-e2e _out/bin/nvidia-device-plugin
	_out/bin/gpu-feature-discovery _out/bin/kubelet-e2e _out/bin/devchar-e2e _out/bin/persistenced-e2e
	_out/e2e _out/containers/nvidia-driver _out/debs)
for f in "${files[@]}"; do
	[[ -e $f ]] || { echo "e2e-gpu-carry: $f is missing: run make e2e-tools" >&2; exit 1; }
done
mkdir -p "$dest"
tar --sort=name -cf - "${files[@]}" | xz --x86 --lzma2=preset=9,dict=64MiB -T1 -c >"$dest/e2e-out.tar.xz.tmp"
mv "$dest/e2e-out.tar.xz.tmp" "$dest/e2e-out.tar.xz"
du -b "$dest/e2e-out.tar.xz" | awk '{printf "%s %.1f MiB\n", $2, $1/1048576}'
