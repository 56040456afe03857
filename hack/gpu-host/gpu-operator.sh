#!/usr/bin/env bash
# NVIDIA's GPU Operator, setup 1 (deploy/gpu-operator/values-cdi.yaml), on the GPU test host:
# hack/gpu-host/gpu-run.sh with hack/gpu-operator/test-operator.sh, from the packs of
# hack/gpu-host/gpu-run-carry.sh and hack/gpu-operator/carry.sh unpacked into one directory. Output in
# $OUT as gpu-run.sh's. The build (on a machine with Go and network): hack/gpu-operator/build.sh,
# the module proxy's operator, as CI builds it. Setup 1 stops at the validator's toolkit check
# by the operator's source: run it with GPU_OPERATOR_EXPECT_STOP=toolkit, whose checks are that
# stop (hack/gpu-host/gpu-operator-runs.sh does).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
go_out=${GPU_OPERATOR_OUT:-$here/../../_out/gpu-operator}
for f in "$go_out/gpu-operator.yaml" "$go_out/versions" "$go_out/rootfs/gpu-operator.flags"; do
	[[ -e $f ]] || { echo "gpu-operator: $f is missing: unpack gpu-operator.tar.xz (hack/gpu-operator/carry.sh) here" >&2; exit 1; }
done
cat "$go_out/versions"
# The service's NFD feature file off, as docs/gpu-operator.md tells the operator's users: there
# GFD and the MIG manager own nvidia.com/gpu.product, mps.capable and mig.config, and the
# service's mps.capable=true scheduled the operator's MPS control daemon, whose mount-shm
# replaced /run/nvidia/mps/shm under the running device plugin (the H200, 2026-12-05).
export GPU_RUN_NFD_FEATURES=0
exec "$here/gpu-run.sh" "$here/../gpu-operator/test-operator.sh"
