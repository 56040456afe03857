#!/usr/bin/env bash
# Packs what hack/k8s-node/gpu-run.sh needs on a GPU host that has no Go and no network, into
# DEST/all.tar.xz (default DEST .carry/k8s of this checkout): this checkout's files (tracked
# and untracked, not ignored), the service's rootfs, hook and ldconfig (make build), the
# harness and extension tools, the test node's programs (make k8s-node) and its images as
# directories (gpu-run.sh packs them there with `images.sh pack`: they compress far better
# than the archives' gzip layers).
#
# One transfer to the H200 test host holds at most 64 MiB with the checkout. The programs
# share much code (Go's runtime, client-go, gRPC, protobuf): xz with the x86 filter and a
# dictionary as large as the whole tar finds it across files, 55 MiB for 410 MiB (2026-12-01;
# the default 64 MiB dictionary gave 63 MiB). That takes about 7 minutes and 11 GiB of
# memory to compress, 9 s and 1 GiB to unpack.
#
# On the host: python3 -c "import tarfile; tarfile.open('all.tar.xz').extractall('/tmp/t',
# filter='fully_trusted')" (the host may have no xz), then /tmp/t/hack/k8s-node/gpu-run.sh.
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
dest=${1:-$top/.carry/k8s}
cd "$top"
for f in _out/bin/nvidia-cdi-hook _out/bin/ldconfig _out/containers/nvidia-driver \
	_out/k8s-node/bin/kube _out/k8s-node/base-spec.json _out/k8s-node/images/rootfs/device-plugin; do
	[[ -e $f ]] || { echo "carry: $f is missing: run make build k8s-node" >&2; exit 1; }
done
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o _out/bin/harness ./hack/harness
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o _out/bin/extension ./hack/extension
mkdir -p "$dest"
{
	git ls-files -co --exclude-standard
	printf '%s\n' _out/bin/nvidia-cdi-hook _out/bin/ldconfig _out/bin/harness _out/bin/extension \
		_out/containers/nvidia-driver _out/k8s-node/bin _out/k8s-node/cni _out/k8s-node/base-spec.json \
		_out/k8s-node/images/rootfs _out/k8s-node/images/image _out/k8s-node/images/busybox
} | tar -T - -cf - | xz --x86 --lzma2=preset=9e,dict=1024MiB -T1 >"$dest/all.tar.xz.tmp"
mv "$dest/all.tar.xz.tmp" "$dest/all.tar.xz"
du -b "$dest/all.tar.xz" | awk '{printf "%s %.1f MiB\n", $2, $1/1048576}'
