#!/usr/bin/env bash
# NVIDIA's DRA driver for GPUs (kubernetes-sigs/dra-driver-nvidia-gpu, formerly
# NVIDIA/k8s-dra-driver-gpu) v0.5.0, built from its Go module for the test node
# (hack/dra/test-dra.sh):
#
#   hack/dra/build.sh               (DRA_OUT, default _out/dra)
#
# The module proxy serves the module as github.com/NVIDIA/k8s-dra-driver-gpu at v0.5.0 when
# asked for that version exactly; its go.mod names sigs.k8s.io/dra-driver-nvidia-gpu, so it
# builds only as the main module, against its own go.mod (two requirements changed, below).
# Of the module's tree only the Go part (DRA_OUT/src) and the image's files come under _out/:
# bldr loads every .tmpl file under the tree it builds from, _out/ included, and the module
# has some elsewhere (test/, tests/, hack/ci/).
# Into DRA_OUT:
#   src/, bin/                 the module's Go tree the plugin is built in, and the programs
#   rootfs/dra-driver/         the image as the module's deployments/container/Dockerfile lays
#   rootfs/dra-driver.flags      it out, the GPU part only: gpu-kubelet-plugin (cgo, the
#                              Makefile's cmd-% flags) in /usr/bin, the chart's init script
#                              kubelet-plugin-prestart.sh, templates/, LICENSE, bash at /bin/bash
#                              (Debian's bash-static, as the Dockerfile takes it), on
#                              hack/k8s-node's distroless-like base (glibc, busybox at /busybox);
#                              left out: the ComputeDomain programs, the webhook, and the
#                              toolkit's nvidia-cdi-hook (deploy/dra/values.yaml names the
#                              host's, so the plugin never copies its own: main.go
#                              setNvidiaCDIHookPath)
#   images/dra-driver.tar      that image, registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu:v0.5.0
#                              (the chart's default image for its appVersion, so the rendered
#                              chart needs no image override), packed by hack/k8s-node/image
#   bin/cdi-e2e                hack/gpu-host/cdi-e2e (static), which test-dra.sh checks the
#                              driver's CDI specs with
#   dra-driver.yaml            the module's chart (deployments/helm/dra-driver-nvidia-gpu)
#                              rendered as `helm install` renders it: helm template with
#                              deploy/dra/values.yaml, namespace nvidia-dra-driver-gpu, its CRDs
# Needs make k8s-node's images (hack/k8s-node/images.sh: the image tool and busybox) and helm
# in _out/tools (hack/dev/install-deploy-test-deps.sh).
set -euo pipefail
mod=github.com/NVIDIA/k8s-dra-driver-gpu
ver=v0.5.0
sum=h1:AH5/wdVxMRP5BDbbRZGi0YASwTH5omzHzd+4c3GsVpQ= # the module zip's hash, as go.sum writes it
ref=registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu:$ver
chart=deployments/helm/dra-driver-nvidia-gpu

top=$(cd "$(dirname "$0")/../.." && pwd)
(($# == 0)) || { echo "usage: hack/dra/build.sh (no arguments; DRA_OUT sets the output directory)" >&2; exit 2; }
out=${DRA_OUT:-$top/_out/dra}
images=${K8S_NODE_IMAGES:-$top/_out/k8s-node/images}
helm=$top/_out/tools/helm
for f in "$images/image" "$images/busybox" "$helm"; do
	[[ -x $f ]] || { echo "dra: $f is missing: run hack/k8s-node/images.sh (make k8s-node) and hack/dev/install-deploy-test-deps.sh" >&2; exit 1; }
done

info=$(cd "$top" && go mod download -json "$mod@$ver") ||
	{ echo "dra: go mod download $mod@$ver failed:" >&2; echo "$info" >&2; exit 1; }
field() { sed -n "s/^[[:space:]]*\"$1\": \"\(.*\)\",\{0,1\}\$/\1/p" <<<"$info"; }
src=$(field Dir)
[[ -d $src ]] || { echo "dra: go mod download gave no directory for $mod@$ver:" >&2; echo "$info" >&2; exit 1; }
[[ $(field Sum) == "$sum" ]] || { echo "dra: $mod@$ver has hash $(field Sum), not $sum" >&2; exit 1; }
gomod=$(sed -n 's/^module[[:space:]]\{1,\}\([^[:space:]]*\).*/\1/p' "$src/go.mod")
[[ $(tr -d '[:space:]' <"$src/VERSION") == "$ver" ]] || { echo "dra: $src/VERSION is not $ver" >&2; exit 1; }

mkdir -p "$out"
rm -rf "$out/rootfs" "$out/images"
mkdir -p "$out/rootfs" "$out/images"
# The kubelet plugin, made again only when the module, this build or its Go settings changed.
stamp="$mod@$ver $sum 5 $(go env GOVERSION GOAMD64 GOFLAGS | tr '\n' ' ')"
if [[ $(cat "$out/.stamp" 2>/dev/null) != "$stamp" ]]; then
	rm -rf "$out/bin" "$out/src"
	mkdir -p "$out/bin" "$out/src"
	# The module's Go tree as its Dockerfile copies it, writable (go may add to go.sum).
	cp -r "$src"/{go.mod,go.sum,api,cmd,internal,pkg} "$out/src/"
	chmod -R u+w "$out/src"
	echo "dra: $mod@$ver ($gomod) from $src in $out/src" >&2
	# Two of the module's requirements are not served by the module proxy (2026-12-08: "This
	# module version is not available"): k8s.io/kubernetes v1.37.0-rc.0, whose release v1.37.0
	# is (the test node's Kubernetes), and github.com/NVIDIA/go-nvfm, at no version. The go.mod
	# takes v1.37.0 and drops go-nvfm, and the one file that imports it,
	# pkg/fabricmanager/client_nvfm.go, gives way to ours below, whose NewClient is the
	# package's own stub client. Only the alpha FabricManagerPartitioning gate (off here)
	# reaches it: with the gate on, opening Fabric Manager fails with ErrUnimplemented.
	go mod edit -require=k8s.io/kubernetes@v1.37.0 -droprequire=github.com/NVIDIA/go-nvfm "$out/src/go.mod"
	rm "$out/src/pkg/fabricmanager/client_nvfm.go" "$out/src/pkg/fabricmanager/client_nvfm_test.go"
	cat >"$out/src/pkg/fabricmanager/client_stub.go" <<-'EOF'
		package fabricmanager

		// NewClient stands in for the go-nvfm client (hack/dra/build.sh says why).
		func NewClient(string, ConnectParams) Client { return NewStubClient() }
	EOF
	# The Makefile's cmd-% rule (go-nvml's cgo flags need the ALLOW); -mod=mod, as the module
	# has no vendor/. It carries no commit, so only the version is stamped in.
	t0=$SECONDS
	(cd "$out/src" && GOWORK=off CGO_LDFLAGS_ALLOW='-Wl,--unresolved-symbols=ignore-in-object-files' CGO_ENABLED=1 \
		CGO_CFLAGS="-O2 -Wno-deprecated-declarations" go build -mod=mod -trimpath \
		-o "$out/bin/" -ldflags "-s -w -X $gomod/internal/info.version=$ver" ./cmd/gpu-kubelet-plugin)
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
install -m 0644 "$src/LICENSE" "$r/LICENSE"
chmod -R u+w,go-w "$r/templates" # the module cache's files are read-only
"$r/usr/bin/gpu-kubelet-plugin" --version >&2 # the Dockerfile's smoke test, on its own program

printf '%s\n' -ref "$ref" -entrypoint /bin/bash \
	-env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/busybox \
	-env NVIDIA_DISABLE_REQUIRE=true -env NVIDIA_VISIBLE_DEVICES=all -env NVIDIA_DRIVER_CAPABILITIES=utility \
	>"$out/rootfs/dra-driver.flags"
mapfile -t flags <"$out/rootfs/dra-driver.flags"
"$images/image" -rootfs "$r" -out "$out/images/dra-driver.tar" "${flags[@]}" >/dev/null

# The chart, rendered the user way with this project's values, for the Kubernetes version of
# the test node (hack/k8s-node/kube; helm template knows no cluster, and the chart wants
# >=1.32). --include-crds: helm install applies the chart's crds/ (the ComputeDomain CRDs).
kube_version=$(cd "$top/hack/k8s-node/kube" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
"$helm" template dra-driver-nvidia-gpu "$src/$chart" --include-crds \
	--namespace nvidia-dra-driver-gpu --kube-version "$kube_version" -f "$top/deploy/dra/values.yaml" >"$out/dra-driver.yaml"
echo "dra: $out/images/dra-driver.tar ($ref), $out/dra-driver.yaml ($(grep -c '^kind:' "$out/dra-driver.yaml") objects)" >&2
