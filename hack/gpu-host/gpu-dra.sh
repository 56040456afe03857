#!/usr/bin/env bash
# NVIDIA's DRA driver on the GPU test host: hack/gpu-host/gpu-run.sh with
# hack/dra/test-dra.sh (the driver from its chart as hack/dra/build.sh rendered it, in place
# of deploy/'s device plugin), from the packs of hack/gpu-host/gpu-run-carry.sh and the DRA pack of
# hack/dra/carry.sh unpacked into one directory. Output in $OUT as gpu-run.sh's.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dra=${DRA_OUT:-$here/../../_out/dra}
for f in "$dra/dra-driver.yaml" "$dra/rootfs/dra-driver.flags" "$dra/bin/cdi-e2e"; do
	[[ -e $f ]] || { echo "gpu-dra: $f is missing: unpack dra.tar.xz (hack/dra/carry.sh) here" >&2; exit 1; }
done
exec "$here/gpu-run.sh" "$here/../dra/test-dra.sh"
