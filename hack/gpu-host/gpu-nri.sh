#!/usr/bin/env bash
# NVIDIA's container toolkit in NRI plugin mode beside deploy/'s device plugin, on the GPU test
# host: hack/gpu-host/gpu-run.sh with hack/nri/test-nri.sh (the plugin registered, the driver
# injected into an annotated pod, the device plugin's allocation, a CUDA vector add in each,
# nothing in a pod without a GPU), from the packs of hack/gpu-host/gpu-run-carry.sh and
# hack/nri/carry.sh unpacked into one directory. Output in $OUT as gpu-run.sh's.
# K8S_NODE_CUDA_FAULT=1 is its control: the CUDA checks, and so the exit code, must fail.
# The build (on a machine with Go and network): make build k8s-node, then hack/nri/build.sh.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
nri_out=${NRI_OUT:-$here/../../_out/nri}
for f in "$nri_out/versions" "$nri_out/rootfs/container-toolkit.flags"; do
	[[ -e $f ]] || { echo "gpu-nri: $f is missing: unpack nri.tar.xz (hack/nri/carry.sh) here" >&2; exit 1; }
done
cat "$nri_out/versions"
NRI_OUT=$(realpath "$nri_out")
export NRI_OUT
exec "$here/gpu-run.sh" "$here/../nri/test-nri.sh"
