#!/usr/bin/env bash
# Render the manifests that hack/gpu-host/e2e-consumers.sh runs NVIDIA's consumers from, into OUTDIR:
#   deploy-device-plugin.yaml  what `kubectl apply -k deploy/device-plugin` installs
#   stock-cdi.yaml             NVIDIA's chart v0.19.0 with nvidiaDriverRoot=/run/nvidia/driver and
#                              the three settings Talos needs whatever the driver root
#                              (deviceListStrategy=cdi-cri, cdi.nvidiaHookPath,
#                              securityContext.privileged): no nvidiaDevRoot, no patches
#   stock-gfd.yaml             NVIDIA's chart with nvidiaDriverRoot=/run/nvidia/driver and
#                              gfd.enabled=true, for GPU feature discovery's DaemonSet
# Needs helm and kustomize in _out/tools (hack/dev/install-deploy-test-deps.sh).
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: render-consumers.sh OUTDIR}
tools=$top/_out/tools
chart=$(cd "$top/hack/dev/tools" && go mod download -json github.com/NVIDIA/k8s-device-plugin@v0.19.0 | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')/deployments/helm/nvidia-device-plugin
[ -d "$chart" ] || { echo "render-consumers: no chart at $chart" >&2; exit 1; }
mkdir -p "$out"
"$tools/kustomize" build "$top/deploy/device-plugin" >"$out/deploy-device-plugin.yaml"
helm() { "$tools/helm" template nvidia-device-plugin "$chart" --namespace nvidia-gpu --set nvidiaDriverRoot=/run/nvidia/driver "$@"; }
helm --set deviceListStrategy=cdi-cri --set cdi.nvidiaHookPath=/usr/bin/nvidia-cdi-hook --set securityContext.privileged=true >"$out/stock-cdi.yaml"
helm --set gfd.enabled=true >"$out/stock-gfd.yaml"
echo "render-consumers: $(ls "$out" | tr '\n' ' ')in $out" >&2
