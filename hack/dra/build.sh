#!/usr/bin/env bash
# NVIDIA's DRA driver for GPUs (kubernetes-sigs/dra-driver-nvidia-gpu, formerly
# NVIDIA/k8s-dra-driver-gpu) built from its source at its release tag, for the test node
# (hack/dra/test-dra.sh). Its module is not served by the Go module proxy, so it is built
# from a git checkout of that repository that holds the tag:
#
#   hack/dra/build.sh CHECKOUT      (a clone, bare or not; DRA_OUT, default _out/dra)
#
# The tag's tree (git archive of the tag, its commit checked) goes outside this checkout
# (DRA_SRC, default ~/.cache/nvidia-driver-dra/src): bldr loads every .tmpl file of the tree
# it builds from, hidden directories and _out/ included (solver/filesystem_loader.go), and the
# DRA driver's tree has many (internal/recipes reports them).
# Into DRA_OUT:
#   rootfs/dra-driver/         the image as the tag's deployments/container/Dockerfile lays it
#   rootfs/dra-driver.flags      out, the GPU part only: gpu-kubelet-plugin (cgo, with its
#                              vendor/ and the Makefile's cmd-% flags) in /usr/bin, the chart's
#                              init script kubelet-plugin-prestart.sh, templates/, bash at
#                              /bin/bash (Debian's bash-static, as the Dockerfile takes it), on
#                              hack/k8s-node's distroless-like base (glibc, busybox at /busybox);
#                              left out: the ComputeDomain programs, the webhook, and the
#                              toolkit's nvidia-cdi-hook (deploy/dra/values.yaml names the
#                              host's, so the plugin never copies its own: main.go
#                              setNvidiaCDIHookPath)
#   images/dra-driver.tar      that image, registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu:TAG
#                              (the chart's default image for the tag, so the rendered chart
#                              needs no image override), packed by hack/k8s-node/image
#   bin/cdi-e2e                hack/gpu-host/cdi-e2e (static), which test-dra.sh checks the driver's CDI
#                              specs with
#   dra-driver.yaml            the chart (deployments/helm/dra-driver-nvidia-gpu of the tag)
#                              rendered as a user renders it: helm template with
#                              deploy/dra/values.yaml, namespace nvidia-dra-driver-gpu
# Needs make k8s-node (the image tool and busybox) and helm in _out/tools
# (hack/dev/install-deploy-test-deps.sh).
set -euo pipefail
tag=v0.4.1
commit=764900e7833798a1528bd52a2af3e1b2d5f7a616
mod=sigs.k8s.io/dra-driver-nvidia-gpu
ref=registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu:$tag

top=$(cd "$(dirname "$0")/../.." && pwd)
checkout=${1:?usage: hack/dra/build.sh CHECKOUT (a git repository of kubernetes-sigs/dra-driver-nvidia-gpu with tag $tag)}
out=${DRA_OUT:-$top/_out/dra}
src=${DRA_SRC:-${XDG_CACHE_HOME:-$HOME/.cache}/nvidia-driver-dra/src}
images=${K8S_NODE_IMAGES:-$top/_out/k8s-node/images}
helm=$top/_out/tools/helm
for f in "$images/image" "$images/busybox" "$helm"; do
	[[ -x $f ]] || { echo "dra: $f is missing: run make k8s-node and hack/dev/install-deploy-test-deps.sh" >&2; exit 1; }
done
got=$(git -C "$checkout" rev-parse --verify -q "$tag^{commit}") ||
	{ echo "dra: $checkout has no tag $tag" >&2; exit 1; }
[[ $got == "$commit" ]] || { echo "dra: tag $tag in $checkout is commit $got, not $commit" >&2; exit 1; }

mkdir -p "$out"
rm -rf "$out/rootfs" "$out/images"
mkdir -p "$out/rootfs" "$out/images"
# The tag's tree and its kubelet plugin, made again only when the tag or this script changed.
stamp=$commit-3 # the tag's commit, and a count to bump when the build below changes
if [[ $(cat "$out/.stamp" 2>/dev/null) != "$stamp" ]]; then
	rm -rf "$src" "$out/src" "$out/bin"
	mkdir -p "$src" "$out/bin"
	git -C "$checkout" archive "$commit" | tar -x -C "$src"
	echo "dra: $tag ($commit) in $src" >&2
	# The Makefile's cmd-% rule (go-nvml's cgo flags need the ALLOW), with its vendor/.
	t0=$SECONDS
	(cd "$src" && CGO_LDFLAGS_ALLOW='-Wl,--unresolved-symbols=ignore-in-object-files' CGO_ENABLED=1 \
		CGO_CFLAGS="-O2 -Wno-deprecated-declarations" go build -mod=vendor -trimpath -o "$out/bin/" \
		-ldflags "-s -w -X $mod/internal/info.gitCommit=$commit -X $mod/internal/info.version=$tag" \
		./cmd/gpu-kubelet-plugin)
	echo "dra: gpu-kubelet-plugin built in $((SECONDS - t0)) s" >&2
	echo "$stamp" >"$out/.stamp"
fi
# The project's CDI spec checker, for test-dra.sh on a host without Go.
(cd "$top" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/bin/cdi-e2e" ./hack/gpu-host/cdi-e2e)
r=$out/rootfs/dra-driver
"$top/hack/k8s-node/images.sh" base "$r"
install -m 0755 "$out/bin/gpu-kubelet-plugin" "$r/usr/bin/gpu-kubelet-plugin"

# bash: the chart runs both containers with `bash` (Debian's bash-static, as the Dockerfile).
W=$(mktemp -d /tmp/dra-build.XXXXXX)
trap 'rm -rf "$W"' EXIT
chmod 755 "$W" # apt's download user writes here
if ! (cd "$W" && apt-get -q -o APT::Sandbox::User=root download bash-static >&2); then
	apt-get update -q >&2
	(cd "$W" && apt-get -q -o APT::Sandbox::User=root download bash-static >&2)
fi
dpkg -x "$W"/bash-static_*.deb "$W/x"
install -m 0755 "$W/x/bin/bash-static" "$r/bin/bash"
install -m 0755 "$src/hack/kubelet-plugin-prestart.sh" "$r/usr/bin/kubelet-plugin-prestart.sh"
cp -r "$src/templates" "$r/templates"
cp "$src/LICENSE" "$r/LICENSE"
"$r/usr/bin/gpu-kubelet-plugin" --version >&2 # the Dockerfile's smoke test, on its own program

printf '%s\n' -ref "$ref" -entrypoint /bin/bash \
	-env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/busybox \
	-env NVIDIA_DISABLE_REQUIRE=true -env NVIDIA_VISIBLE_DEVICES=all -env NVIDIA_DRIVER_CAPABILITIES=utility \
	>"$out/rootfs/dra-driver.flags"
mapfile -t flags <"$out/rootfs/dra-driver.flags"
"$images/image" -rootfs "$r" -out "$out/images/dra-driver.tar" "${flags[@]}" >/dev/null

# The chart, rendered the user way with this project's values, for the Kubernetes version of
# Talos v1.13.9 (the test node's; helm template knows no cluster, and the chart wants >=1.32).
kube_version=$(cd "$top/hack/k8s-node/kube" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
"$helm" template dra-driver-nvidia-gpu "$src/deployments/helm/dra-driver-nvidia-gpu" \
	--namespace nvidia-dra-driver-gpu --kube-version "$kube_version" -f "$top/deploy/dra/values.yaml" >"$out/dra-driver.yaml"
echo "dra: $out/images/dra-driver.tar ($ref), $out/dra-driver.yaml ($(grep -c '^kind:' "$out/dra-driver.yaml") objects)" >&2
