#!/usr/bin/env bash
# NVIDIA's container toolkit installer, whose NRI plugin hack/nri/test-nri.sh runs, as an image
# root filesystem for the test node: the toolkit at the version the project's go.mod requires
# (github.com/NVIDIA/nvidia-container-toolkit), built from its module with its own go.mod and
# its Makefile's cmd-% flags (cgo, its extldflags), laid out as its
# deployments/container/Dockerfile lays out the application stage: nvidia-ctk-installer in
# /work, the programs it installs in /artifacts/deb/usr/bin, on hack/k8s-node's
# distroless-like base (glibc, busybox).
#
# Not in it: libnvidia-container (libnvidia-container.so.1, libnvidia-container-go.so.1,
# nvidia-container-cli; C, from a repository of its own, served by neither the module proxy nor
# Debian). The installer refuses to install without them; hack/nri/nri-plugin.yaml runs it with
# its hidden testing flag --ignore-errors, and test-nri.sh checks that those three are the only
# errors it ignored. The NRI plugin and the management CDI spec use none of them (they serve
# the runtime modes that configure containerd).
#
# Into NRI_OUT (default _out/nri):
#   rootfs/container-toolkit, rootfs/container-toolkit.flags   the image's root filesystem and
#                       packing flags (test-nri.sh packs it on the node, as images.sh packs)
#   versions            what was built, from where
# Needs make k8s-node (images.sh: the image tool, busybox).
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
out=$(realpath -m "${NRI_OUT:-$top/_out/nri}")
images=${K8S_NODE_IMAGES:-$top/_out/k8s-node/images}
for f in "$images/image" "$images/busybox"; do
	[[ -x $f ]] || { echo "nri: $f is missing: run make k8s-node" >&2; exit 1; }
done
mod=github.com/NVIDIA/nvidia-container-toolkit
ver=$(cd "$top" && go list -m -f '{{.Version}}' $mod)
src=$(cd "$top" && go mod download -json "$mod@$ver" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')

rm -rf "$out"
mkdir -p "$out/rootfs"
r=$out/rootfs/container-toolkit
"$top/hack/k8s-node/images.sh" base "$r"
mkdir -p "$r/work" "$r/artifacts/deb/usr/bin" "$r/licenses"
t0=$SECONDS
(cd "$src" && CGO_ENABLED=1 CGO_CFLAGS="-O2 -Wno-deprecated-declarations" nice -n 10 go build -mod=readonly -trimpath \
	-o "$r/artifacts/deb/usr/bin/" -ldflags "-s -w \
	'-extldflags=-Wl,--export-dynamic -Wl,--unresolved-symbols=ignore-in-object-files -Wl,-z,lazy' \
	-X $mod/internal/info.version=$ver" \
	./cmd/nvidia-ctk-installer ./cmd/nvidia-ctk ./cmd/nvidia-cdi-hook ./cmd/nvidia-container-runtime \
	./cmd/nvidia-container-runtime.cdi ./cmd/nvidia-container-runtime.legacy ./cmd/nvidia-container-runtime-hook)
mv "$r/artifacts/deb/usr/bin/nvidia-ctk-installer" "$r/work/"
cp "$src/LICENSE" "$r/licenses/"
chmod -R u+w "$r"
ref=talos-nvidia/container-toolkit:$ver
printf '%s\n' -ref "$ref" -entrypoint /work/nvidia-ctk-installer \
	-env PATH=/work:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/busybox \
	-env NVIDIA_DISABLE_REQUIRE=true -env NVIDIA_VISIBLE_DEVICES=void -env NVIDIA_DRIVER_CAPABILITIES=utility \
	>"$out/rootfs/container-toolkit.flags"
printf 'container-toolkit %s (module, %s)\nimage %s\n' "$ver" "$src" "$ref" >"$out/versions"
echo "nri: $ref built from $src in $((SECONDS - t0)) s" >&2
