#!/usr/bin/env bash
# NVIDIA's GPU Operator built from its source, with the images its setup-1 operands run
# (deploy/gpu-operator/values-cdi.yaml: driver and toolkit off, CDI on), and its Helm chart
# rendered the user way, for the test node (hack/gpu-operator/test-operator.sh):
#
#   hack/gpu-operator/build.sh                    (CI) the operator at the version the module
#                                                 proxy serves, the one hack/k8s-node/validator/go.mod
#                                                 requires (a 2025-09 pseudo-version; the proxy
#                                                 serves no release of the module); device plugin
#                                                 and GFD v0.19.0 from hack/k8s-node/images.sh
#   hack/gpu-operator/build.sh OPERATOR PLUGIN    the operator at tag v26.7.0 from OPERATOR, a git
#                                                 repository of NVIDIA/gpu-operator, and the device
#                                                 plugin and GFD at the tag its values.yaml names
#                                                 (v0.20.0) from PLUGIN, one of NVIDIA/k8s-device-plugin
#
# Into GPU_OPERATOR_OUT (default _out/gpu-operator):
#   rootfs/NAME, rootfs/NAME.flags   each image's root filesystem and packing flags (packed by the
#                                    test on the node, as images.sh packs; they travel to the GPU
#                                    host far smaller than the archives):
#     gpu-operator   the operator (cmd/gpu-operator; from v26.x also cmd/nvidia-validator and
#                    manage-crds, which its one image carries) in /usr/bin, its assets in
#                    /opt/gpu-operator (assets/, manifests/, the CRDs), as the tag's
#                    docker/Dockerfile lays it out, on hack/k8s-node's distroless-like base
#                    (glibc, busybox); NVIDIA's CUDA sample vectorAdd is not in it (it needs
#                    CUDA: test-operator.sh builds a stand-in on the GPU host, see there)
#     validator      (module version only) the validator (validator/) in /usr/bin and its
#                    workload manifests in /var/nvidia/manifests, as validator/Dockerfile
#     device-plugin  (checkout only) the plugin, config-manager, mps-control-daemon and
#                    gpu-feature-discovery of the tag in /usr/bin, as images.sh builds v0.19.0
#     toolkit        (when the values file turns the toolkit on: setup 2, values-nri.yaml;
#                    checkout only) NVIDIA's container toolkit at the version the tag's
#                    values.yaml names (v1.20.0), from its module: nvidia-ctk-installer in
#                    /work and the programs it installs in /artifacts/deb/usr/bin, as the
#                    toolkit's deployments/container/Dockerfile lays them out, without
#                    libnvidia-container (C, its own repository, not built here; NRI mode
#                    does not use it), so /work/nvidia-toolkit, which the operator's entrypoint
#                    execs, is a stand-in: a two-line sh that execs the real installer with
#                    its testing flag --ignore-errors (which lets it install without
#                    libnvidia-container.so.1, libnvidia-container-go.so.1 and
#                    nvidia-container-cli)
#   gpu-operator.yaml       the chart (deployments/gpu-operator of the same source) rendered with
#                           helm template, GPU_OPERATOR_VALUES (one values file or several,
#                           space- or colon-separated, in helm's -f order; default
#                           deploy/gpu-operator/values-cdi.yaml) and the image
#                           fields of the local images (imagePullPolicy Never), CRDs included
#   gpu-operator-sim.yaml   the same with the CUDA workload off (validator.cuda.env
#                           WITH_WORKLOAD=false): for the simulated GPU node, where CUDA cannot run
#   versions                what was built, from which source and commit
# Needs make k8s-node (images.sh: the image tool, busybox, bash) and helm in _out/tools
# (make deploy-tools).
set -euo pipefail
tag=v26.7.0
commit=10ee5b3638b89e11e949412aafa5ba99279c3721
plugin_tag=v0.20.0
plugin_commit=1b826acc6af3079d8923bac395c3124b8861a9a6
mod=github.com/NVIDIA/gpu-operator

top=$(cd "$(dirname "$0")/../.." && pwd)
# Absolute: the builds below run in the sources' directories.
out=$(realpath -m "${GPU_OPERATOR_OUT:-$top/_out/gpu-operator}")
cache=${XDG_CACHE_HOME:-$HOME/.cache}/nvidia-driver-gpu-operator
images=${K8S_NODE_IMAGES:-$top/_out/k8s-node/images}
helm=$top/_out/tools/helm
# GPU_OPERATOR_VALUES: one values file or several, space- or colon-separated, applied in that
# order as helm's -f flags (setup 2 with the Cozystack overlay: "values-nri.yaml
# values-cozystack.yaml").
IFS=' :' read -r -a list <<<"${GPU_OPERATOR_VALUES:-}"
values=()
for f in "${list[@]}"; do values+=("$(realpath "$f")"); done
[[ ${#values[@]} -gt 0 ]] || values=("$top/deploy/gpu-operator/values-cdi.yaml")
values_flags=()
for f in "${values[@]}"; do
	[[ -f $f ]] || { echo "gpu-operator: values file $f is missing" >&2; exit 2; }
	values_flags+=(-f "$f")
done
# The toolkit is built only when the values turn it on (setup 2): the last file that sets
# toolkit.enabled decides, as in helm's merge.
toolkit=$(python3 -c '
import sys, yaml
on = False
for p in sys.argv[1:]:
    v = yaml.safe_load(open(p)) or {}
    on = (v.get("toolkit") or {}).get("enabled", on)
print(1 if on else 0)' "${values[@]}")
for f in "$images/image" "$images/busybox" "$images/bash" "$helm"; do
	[[ -x $f ]] || { echo "gpu-operator: $f is missing: run make k8s-node deploy-tools" >&2; exit 1; }
done
export CGO_CFLAGS="-O2 -Wno-deprecated-declarations"
env_path=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/busybox

rm -rf "$out"
mkdir -p "$out/rootfs" "$out/bin"
R=$out/rootfs
if [[ $# -ge 1 ]]; then
	# --- v26.7.0 from a checkout: the tag's tree outside this checkout, built with its vendor/
	[[ $# == 2 ]] || { echo "usage: hack/gpu-operator/build.sh [OPERATOR_CHECKOUT PLUGIN_CHECKOUT]" >&2; exit 2; }
	got=$(git -C "$1" rev-parse --verify -q "$tag^{commit}") || { echo "gpu-operator: $1 has no tag $tag" >&2; exit 1; }
	[[ $got == "$commit" ]] || { echo "gpu-operator: tag $tag in $1 is $got, not $commit" >&2; exit 1; }
	got=$(git -C "$2" rev-parse --verify -q "$plugin_tag^{commit}") || { echo "gpu-operator: $2 has no tag $plugin_tag" >&2; exit 1; }
	[[ $got == "$plugin_commit" ]] || { echo "gpu-operator: tag $plugin_tag in $2 is $got, not $plugin_commit" >&2; exit 1; }
	src=$cache/gpu-operator-$tag
	psrc=$cache/k8s-device-plugin-$plugin_tag
	# Without tests/ (end-to-end suites with vendor trees of their own, not built here; a
	# snapshot clone may lack some of their largest files).
	[[ -f $src/go.mod ]] || { rm -rf "$src"; mkdir -p "$src"; git -C "$1" archive "$commit" -- . ':(exclude)tests' | tar -x -C "$src"; }
	[[ -f $psrc/go.mod ]] || { rm -rf "$psrc"; mkdir -p "$psrc"; git -C "$2" archive "$plugin_commit" -- . ':(exclude)tests' | tar -x -C "$psrc"; }
	version=$tag
	gomod=-mod=vendor
	# The tag's values.yaml names the plugin version this build must match.
	named=$(awk '/^devicePlugin:/{p=1} p&&/^  version:/{print $2; exit}' "$src/deployments/gpu-operator/values.yaml")
	[[ $named == "$plugin_tag" ]] || { echo "gpu-operator: $tag's values.yaml names device plugin $named, not $plugin_tag" >&2; exit 1; }
	toolkit_tag=$(awk '/^toolkit:/{p=1} p&&/^  version:/{print $2; exit}' "$src/deployments/gpu-operator/values.yaml")
else
	[[ $toolkit == 0 ]] || { echo "gpu-operator: ${values[*]} turn the toolkit on (NRI mode): that needs v26.7.0 from a checkout (build.sh OPERATOR PLUGIN)" >&2; exit 2; }
	# --- CI: the module proxy's newest version of the module (a zip without vendor/)
	modver=$(cd "$top/hack/k8s-node/validator" && go list -m -f '{{.Version}}' $mod)
	src=$(cd "$top/hack/k8s-node/validator" && go mod download -json "$mod@$modver" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
	commit=${modver##*-}
	version=$modver
	gomod=-mod=readonly
	plugin_commit=""
	plugin_tag=$(cd "$top/hack/k8s-node/plugin" && go list -m -f '{{.Version}}' github.com/NVIDIA/k8s-device-plugin)
fi
echo "gpu-operator: $version ($commit) from $src" >&2
ld="-s -w -X $mod/internal/info.gitCommit=$commit -X $mod/internal/info.version=$version"

# The operator's image: its Makefile's cmd-% rule (CGO off) for each program the tag's
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

if [[ $# -ge 1 ]]; then
	# The device plugin and GFD of the tag the operator's values name, with its Makefile's
	# cmd-% flags (cgo; go-nvml's link flags), as images.sh builds v0.19.0.
	r=$R/device-plugin
	"$top/hack/k8s-node/images.sh" base "$r"
	ppkg=github.com/NVIDIA/k8s-device-plugin
	(cd "$psrc" && CGO_ENABLED=1 CGO_LDFLAGS_ALLOW='-Wl,--unresolved-symbols=ignore-in-object-files' nice -n 10 \
		go build -mod=vendor -trimpath -o "$r/usr/bin/" -ldflags "-s -w \
		'-extldflags=-Wl,--export-dynamic -Wl,--unresolved-symbols=ignore-in-object-files' \
		-X $ppkg/internal/info.version=$plugin_tag -X $ppkg/internal/info.gitCommit=$plugin_commit" \
		./cmd/nvidia-device-plugin ./cmd/config-manager ./cmd/mps-control-daemon ./cmd/gpu-feature-discovery)
	install -m 0755 "$images/bash" "$r/bin/bash"
	mkdir -p "$r/licenses" && cp "$psrc/LICENSE" "$r/licenses/"
	printf '%s\n' -ref "nvcr.io/nvidia/k8s-device-plugin:$plugin_tag" -entrypoint nvidia-device-plugin \
		-env "$env_path" -env NVIDIA_DISABLE_REQUIRE=true -env NVIDIA_VISIBLE_DEVICES=all \
		-env NVIDIA_DRIVER_CAPABILITIES=compute,utility >"$R/device-plugin.flags"
fi
if [[ $toolkit == 1 ]]; then
	# NVIDIA's container toolkit at the version the operator's values.yaml names, from its
	# module (the toolkit's Makefile cmd-% flags: cgo, its extldflags), laid out as its
	# deployments/container/Dockerfile lays out its application stage.
	tmod=github.com/NVIDIA/nvidia-container-toolkit
	tsrc=$(cd "$top/hack/gpu-operator" && go mod download -json "$tmod@$toolkit_tag" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
	r=$R/toolkit
	"$top/hack/k8s-node/images.sh" base "$r"
	mkdir -p "$r/work" "$r/artifacts/deb/usr/bin" "$r/licenses"
	t0=$SECONDS
	(cd "$tsrc" && CGO_ENABLED=1 nice -n 10 go build -mod=readonly -trimpath -o "$r/artifacts/deb/usr/bin/" -ldflags "-s -w \
		'-extldflags=-Wl,--export-dynamic -Wl,--unresolved-symbols=ignore-in-object-files -Wl,-z,lazy' \
		-X $tmod/internal/info.version=$toolkit_tag" \
		./cmd/nvidia-ctk-installer ./cmd/nvidia-ctk ./cmd/nvidia-cdi-hook ./cmd/nvidia-container-runtime \
		./cmd/nvidia-container-runtime.cdi ./cmd/nvidia-container-runtime.legacy ./cmd/nvidia-container-runtime-hook)
	mv "$r/artifacts/deb/usr/bin/nvidia-ctk-installer" "$r/work/"
	# The stand-in for NVIDIA's symlink /work/nvidia-toolkit -> nvidia-ctk-installer (see the
	# header): the same program, with --ignore-errors for the missing libnvidia-container.
	printf '#!/bin/sh\n# stand-in (hack/gpu-operator/build.sh): no libnvidia-container in this image\nexec /work/nvidia-ctk-installer --ignore-errors "$@"\n' >"$r/work/nvidia-toolkit"
	chmod 0755 "$r/work/nvidia-toolkit"
	cp "$tsrc/LICENSE" "$r/licenses/"
	chmod -R u+w "$r"
	tk_ref=talos-nvidia/container-toolkit:$toolkit_tag
	printf '%s\n' -ref "$tk_ref" -entrypoint /work/nvidia-ctk-installer -env "PATH=/work:${env_path#PATH=}" \
		-env NVIDIA_DISABLE_REQUIRE=true -env NVIDIA_VISIBLE_DEVICES=void -env NVIDIA_DRIVER_CAPABILITIES=utility >"$R/toolkit.flags"
	echo "gpu-operator: toolkit $toolkit_tag built from $tsrc in $((SECONDS - t0)) s" >&2
fi
# (In CI the device plugin's image is images.sh's nvcr.io/nvidia/k8s-device-plugin:v0.19.0,
# which the node imports itself.)

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
[[ $toolkit == 1 ]] && node_sets+=(--set "toolkit.repository=${tk_ref%/*}" --set "toolkit.image=$(basename "${tk_ref%:*}")"
	--set "toolkit.version=${tk_ref##*:}" --set toolkit.imagePullPolicy=Never)
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
	echo "device-plugin+gfd $plugin_tag ${plugin_commit:-"(module, hack/k8s-node/plugin/go.mod)"}"
	[[ $toolkit == 1 ]] && echo "container-toolkit $toolkit_tag (module, $tsrc)"
	echo "values ${values[*]}"
	echo "images $op_ref $val_ref nvcr.io/nvidia/k8s-device-plugin:$plugin_tag"
} >"$out/versions"
echo "gpu-operator: $out/gpu-operator.yaml ($(grep -c '^kind:' "$out/gpu-operator.yaml") objects); $(tr '\n' ';' <"$out/versions")" >&2
