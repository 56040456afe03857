#!/usr/bin/env bash
# Builds the simulated libnvidia-ml (hack/sim-node/simnvml) and a subroot that carries it in place of
# NVIDIA's: a copy of SUBROOT (default _out/subroot-debian, `make subroot`) whose
# libnvidia-ml.so.<version> is this library under the same name, so that the driver version
# (read from that name by pkg/driverroot, reported by NVML, used by nvcdi to find the other
# libraries) stays the subroot's, and whose usr/bin/nvidia-smi is a stand-in (hack/sim-node/simnvml/smi).
# Also builds the node tool (hack/sim-node/simnvml/node), the MIG listing (migls) and the /proc/driver
# hook (prochook).
#
#   hack/sim-node/simnvml/build.sh [SUBROOT [OUT]]      OUT default _out/subroot-sim
set -euo pipefail
top=$(cd "$(dirname "$0")/../../.." && pwd)
src=${1:-$top/_out/subroot-debian}
out=${2:-$top/_out/subroot-sim}
cd "$top"
export CGO_ENABLED=1 CGO_CFLAGS="${CGO_CFLAGS:--O2 -Wno-deprecated-declarations}"
# The SONAME NVIDIA's library has (Go's c-shared mode sets none): without it ldconfig makes no
# libnvidia-ml.so.1 link beside the file, and a CDI spec that mounts only the file (the toolkit's
# management spec, setup 2 in docs/gpu-operator.md) leaves dlopen("libnvidia-ml.so.1") failing.
go build -trimpath -buildmode=c-shared -ldflags '-s -w -extldflags=-Wl,-soname,libnvidia-ml.so.1' -o _out/simnvml/libnvidia-ml.so ./hack/sim-node/simnvml
go build -trimpath -ldflags '-s -w' -o _out/bin/simnvml-node ./hack/sim-node/simnvml/node
go build -trimpath -ldflags '-s -w' -o _out/bin/simnvml-migls ./hack/sim-node/simnvml/migls
CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o _out/bin/simnvml-prochook ./hack/sim-node/simnvml/prochook
go build -trimpath -ldflags '-s -w' -o _out/bin/simnvml-smi ./hack/sim-node/simnvml/smi
real=$(basename "$(readlink -f "$src/usr/lib64/libnvidia-ml.so.1")")
[[ $real == libnvidia-ml.so.* ]] || { echo "simnvml: $src has no libnvidia-ml.so.1" >&2; exit 1; }
rm -rf "$out.new"
cp -a "$src" "$out.new"
chmod u+w "$out.new/usr/lib64"
install -m 0755 _out/simnvml/libnvidia-ml.so "$out.new/usr/lib64/$real"
# NVIDIA's nvidia-smi refuses the simulated library; its stand-in (hack/sim-node/simnvml/smi) lists the
# GPUs through NVML, for the GPU Operator's validator (hack/gpu-operator/test-operator.sh).
chmod u+w "$out.new/usr/bin"
install -m 0755 _out/bin/simnvml-smi "$out.new/usr/bin/nvidia-smi"
echo "simnvml $(cat "$src/usr/share/nvidia-driver/source" 2>/dev/null)" | (chmod u+w "$out.new/usr/share/nvidia-driver" "$out.new/usr/share/nvidia-driver/source" && cat >"$out.new/usr/share/nvidia-driver/source")
chmod -R go-w "$out.new"
rm -rf "$out"
mv "$out.new" "$out"
echo "simnvml: $out (libnvidia-ml: $real is hack/sim-node/simnvml)" >&2
