#!/usr/bin/env bash
# NVIDIA's GPU Operator built from its source, with the images its setup-1 operands run
# (deploy/gpu-operator/values-cdi.yaml: driver and toolkit off, CDI on), and its Helm chart
# rendered the user way, for the test node (hack/gpu-operator/test-operator.sh):
#
#   hack/gpu-operator/build.sh
#
# The operator at the version the module proxy serves, the one hack/k8s-node/validator/go.mod
# requires (a 2025-09 pseudo-version; the proxy serves no release of the module); the device
# plugin and GFD v0.19.0 are hack/k8s-node/images.sh's. That version has no NRI mode
# (cdi.nriPluginEnabled came with v26.7.0), so values that turn the toolkit on (setup 2,
# values-nri.yaml) are refused: setup 2's working part, the toolkit's NRI plugin on the
# extension's driver root, is checked by hack/nri (docs/gpu-operator.md).
#
# Into GPU_OPERATOR_OUT (default _out/gpu-operator):
#   rootfs/NAME, rootfs/NAME.flags   each image's root filesystem and packing flags (packed by the
#                                    test on the node, as images.sh packs; they travel to the GPU
#                                    host far smaller than the archives):
#     gpu-operator   the operator (cmd/gpu-operator) in /usr/bin, its assets in
#                    /opt/gpu-operator (assets/, manifests/, the CRDs), as the module's
#                    docker/Dockerfile lays it out, on hack/k8s-node's distroless-like base
#                    (glibc, busybox); NVIDIA's CUDA sample vectorAdd is not in it (it needs
#                    CUDA: test-operator.sh builds a stand-in on the GPU host, see there)
#     validator      the validator (validator/) in /usr/bin and its workload manifests in
#                    /var/nvidia/manifests, as validator/Dockerfile
#   gpu-operator.yaml       the chart (deployments/gpu-operator of the same module) rendered with
#                           helm template, GPU_OPERATOR_VALUES (one values file or several,
#                           space- or colon-separated, in helm's -f order; default
#                           deploy/gpu-operator/values-cdi.yaml) and the image
#                           fields of the local images (imagePullPolicy Never), CRDs included
#   gpu-operator-sim.yaml   the same with the CUDA workload off (validator.cuda.env
#                           WITH_WORKLOAD=false): for the simulated GPU node, where CUDA cannot run
#   versions                what was built, from which module version
# Needs make k8s-node (images.sh: the image tool, busybox, bash) and helm in _out/tools
# (make deploy-tools).
set -euo pipefail
[[ $# == 0 ]] || { echo "usage: hack/gpu-operator/build.sh (no arguments: the module proxy's operator)" >&2; exit 2; }
mod=github.com/NVIDIA/gpu-operator

top=$(cd "$(dirname "$0")/../.." && pwd)
# Absolute: the builds below run in the sources' directories.
out=$(realpath -m "${GPU_OPERATOR_OUT:-$top/_out/gpu-operator}")
cache=${XDG_CACHE_HOME:-$HOME/.cache}/nvidia-driver-gpu-operator
images=${K8S_NODE_IMAGES:-$top/_out/k8s-node/images}
helm=$top/_out/tools/helm
# GPU_OPERATOR_VALUES: one values file or several, space- or colon-separated, applied in that
# order as helm's -f flags.
IFS=' :' read -r -a list <<<"${GPU_OPERATOR_VALUES:-}"
values=()
for f in "${list[@]}"; do values+=("$(realpath "$f")"); done
[[ ${#values[@]} -gt 0 ]] || values=("$top/deploy/gpu-operator/values-cdi.yaml")
values_flags=()
for f in "${values[@]}"; do
	[[ -f $f ]] || { echo "gpu-operator: values file $f is missing" >&2; exit 2; }
	values_flags+=(-f "$f")
done
# The toolkit on (setup 2) needs an operator with NRI mode: the last file that sets
# toolkit.enabled decides, as in helm's merge.
toolkit=$(python3 -c '
import sys, yaml
on = False
for p in sys.argv[1:]:
    v = yaml.safe_load(open(p)) or {}
    on = (v.get("toolkit") or {}).get("enabled", on)
print(1 if on else 0)' "${values[@]}")
[[ $toolkit == 0 ]] || { echo "gpu-operator: ${values[*]} turn the toolkit on (setup 2): the module proxy's operator has no NRI mode; hack/nri checks the toolkit's NRI plugin" >&2; exit 2; }
for f in "$images/image" "$images/busybox" "$images/bash" "$helm"; do
	[[ -x $f ]] || { echo "gpu-operator: $f is missing: run make k8s-node deploy-tools" >&2; exit 1; }
done
export CGO_CFLAGS="-O2 -Wno-deprecated-declarations"
env_path=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/busybox

rm -rf "$out"
mkdir -p "$out/rootfs" "$out/bin"
R=$out/rootfs
# The module proxy's version of the module (a zip without vendor/).
modver=$(cd "$top/hack/k8s-node/validator" && go list -m -f '{{.Version}}' $mod)
src=$(cd "$top/hack/k8s-node/validator" && go mod download -json "$mod@$modver" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
commit=${modver##*-}
version=$modver
gomod=-mod=readonly
plugin_tag=$(cd "$top/hack/k8s-node/plugin" && go list -m -f '{{.Version}}' github.com/NVIDIA/k8s-device-plugin)
echo "gpu-operator: $version ($commit) from $src" >&2
ld="-s -w -X $mod/internal/info.gitCommit=$commit -X $mod/internal/info.version=$version"

# The operator's image: its Makefile's cmd-% rule (CGO off) for each program its
# Dockerfile copies, and the assets where the operator reads them (/opt/gpu-operator).
r=$R/gpu-operator
"$top/hack/k8s-node/images.sh" base "$r"
t0=$SECONDS
cmds=(./cmd/gpu-operator)
[[ -d $src/cmd/nvidia-validator ]] && cmds+=(./cmd/nvidia-validator ./cmd/manage-crds)
(cd "$src" && CGO_ENABLED=0 nice -n 10 go build $gomod -trimpath -ldflags "$ld" -o "$r/usr/bin/" "${cmds[@]}")
mkdir -p "$r/opt/gpu-operator" "$r/licenses"
cp -r "$src"/assets/. "$r/opt/gpu-operator/"
cp -r "$src/manifests" "$r/opt/gpu-operator/manifests"
for c in "$src"/deployments/gpu-operator/crds/*.yaml; do cp "$c" "$r/opt/gpu-operator/"; done
cp "$src/deployments/gpu-operator/charts/node-feature-discovery/crds/nfd-api-crds.yaml" "$r/opt/gpu-operator/"
[[ -d $src/validator/manifests ]] && { mkdir -p "$r/opt/validator"; cp -r "$src/validator/manifests" "$r/opt/validator/manifests"; }
cp "$src/LICENSE" "$r/licenses/"
chmod -R u+w "$r"
op_ref=talos-nvidia/gpu-operator:$version
printf '%s\n' -ref "$op_ref" -entrypoint /usr/bin/gpu-operator -env "$env_path" \
	-env NVIDIA_VISIBLE_DEVICES=void >"$R/gpu-operator.flags"
val_ref=$op_ref
if [[ ! -d $src/cmd/nvidia-validator ]]; then
	# Before v26.x the validator had an image of its own (validator/Dockerfile, CGO off as
	# validator/Makefile builds it).
	r=$R/validator
	"$top/hack/k8s-node/images.sh" base "$r"
	(cd "$src" && CGO_ENABLED=0 nice -n 10 go build $gomod -trimpath -ldflags "$ld" -o "$r/usr/bin/nvidia-validator" ./validator)
	mkdir -p "$r/var/nvidia/manifests"
	cp "$src"/validator/*-workload-validation.yaml "$r/var/nvidia/manifests/"
	val_ref=talos-nvidia/gpu-operator-validator:$version
	printf '%s\n' -ref "$val_ref" -entrypoint /bin/sh -env "$env_path" -env NVIDIA_DISABLE_REQUIRE=true \
		-env NVIDIA_VISIBLE_DEVICES=void -env NVIDIA_DRIVER_CAPABILITIES=utility,compute >"$R/validator.flags"
fi
echo "gpu-operator: operator and validator built in $((SECONDS - t0)) s" >&2

# (The device plugin's image is images.sh's nvcr.io/nvidia/k8s-device-plugin:v0.19.0, which
# the node imports itself.)

# The chart, rendered as a user renders it: the project's values file, and on top what only
# the test node needs: the fields that point at the images built here (the user's values keep
# NVIDIA's); NFD off, because the node runs NFD v0.18.2 itself where a PCI device exists (the
# GPU host; the chart's NFD image is not built here) and the simulated node has no PCI device
# to find (test-operator.sh labels it); the operator tolerating the GPU taint, as a one-node
# cluster has no other node for it.
kube_version=$(cd "$top/hack/k8s-node/kube" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
node_sets=(
	--set "operator.repository=${op_ref%/*}" --set "operator.image=$(basename "${op_ref%:*}")" --set "operator.version=${op_ref##*:}"
	--set "validator.repository=${val_ref%/*}" --set "validator.image=$(basename "${val_ref%:*}")" --set "validator.version=${val_ref##*:}"
	--set devicePlugin.repository=nvcr.io/nvidia --set devicePlugin.image=k8s-device-plugin --set "devicePlugin.version=$plugin_tag"
	--set gfd.repository=nvcr.io/nvidia --set gfd.image=k8s-device-plugin --set "gfd.version=$plugin_tag"
	--set operator.imagePullPolicy=Never --set validator.imagePullPolicy=Never
	--set devicePlugin.imagePullPolicy=Never --set gfd.imagePullPolicy=Never
	--set nfd.enabled=false
	# Up to 2025-09 the operands' wait-for-toolkit init containers run operator.initContainer's
	# image (NVIDIA's CUDA base image, not built here): the validator's, which has a shell.
	--set "operator.initContainer.repository=${val_ref%/*}" --set "operator.initContainer.image=$(basename "${val_ref%:*}")"
	--set "operator.initContainer.version=${val_ref##*:}" --set operator.initContainer.imagePullPolicy=Never
	--set-json 'operator.tolerations=[{"key":"nvidia.com/gpu","operator":"Exists","effect":"NoSchedule"}]'
)
# --no-hooks: the chart's hooks are pre-upgrade and pre-delete only, which `helm install` does
# not run; kubectl apply of a rendering with them would.
render() { # FILE [HELM ARGS...]
	local f=$1
	shift
	"$helm" template gpu-operator "$src/deployments/gpu-operator" --namespace gpu-operator \
		--kube-version "$kube_version" --include-crds --no-hooks "${values_flags[@]}" \
		"${node_sets[@]}" "$@" >"$out/$f"
}
render gpu-operator.yaml
render gpu-operator-sim.yaml --set 'validator.cuda.env[0].name=WITH_WORKLOAD' --set-string 'validator.cuda.env[0].value=false'
{
	echo "gpu-operator $version $commit ($src)"
	echo "device-plugin+gfd $plugin_tag (module, hack/k8s-node/plugin/go.mod)"
	echo "values ${values[*]}"
	echo "images $op_ref $val_ref nvcr.io/nvidia/k8s-device-plugin:$plugin_tag"
} >"$out/versions"
echo "gpu-operator: $out/gpu-operator.yaml ($(grep -c '^kind:' "$out/gpu-operator.yaml") objects); $(tr '\n' ';' <"$out/versions")" >&2
