#!/usr/bin/env bash
# Builds or fetches the tools that the deploy/ and docs tests need, into _out/tools:
#   helm, kustomize  built from the Go module proxy, versions pinned in hack/dev/tools/go.mod
#                    (a module of its own, so they stay out of the service's go.mod)
#   promtool         from Debian's "prometheus" package, unpacked with dpkg -x (nothing is
#                    installed, no daemon starts)
# and downloads the NVIDIA device plugin module (its Helm chart) into the module cache.
# Safe to run repeatedly and concurrently; rebuilds when hack/dev/tools/go.mod changes.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
out="$root/_out/tools"
mkdir -p "$out"
exec 9>"$out/.lock"
flock 9

stamp=$(sha256sum "$root/hack/dev/tools/go.mod" "$root/hack/dev/tools/go.sum" | sha256sum | cut -c1-16)

build() { # name package
	local name=$1 pkg=$2
	if [[ -x "$out/$name" && "$(cat "$out/$name.stamp" 2>/dev/null)" == "$stamp" ]]; then
		return
	fi
	echo "building $name ($pkg) into $out" >&2
	# With the Kubernetes node's flags (hack/k8s-node/build.sh: no cgo, GOAMD64=v2, grpcnotrace
	# and make's GO_TAGS)
	# and, in tools/go.mod, its versions of the modules both use: the 784 packages that helm
	# and kustomize share with kube are then compiled once (2026-12-05, go list -deps).
	(cd "$root/hack/dev/tools" && CGO_ENABLED=0 GOAMD64=v2 go build -tags "grpcnotrace${GO_TAGS:+,$GO_TAGS}" -ldflags '-s -w' -o "$out/$name.tmp" "$pkg")
	mv "$out/$name.tmp" "$out/$name"
	echo "$stamp" >"$out/$name.stamp"
}

build helm helm.sh/helm/v3/cmd/helm
build kustomize sigs.k8s.io/kustomize/kustomize/v5

if [[ ! -x "$out/promtool" ]]; then
	echo "fetching promtool from Debian's prometheus package" >&2
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	chmod 755 "$tmp" # apt's download user must be able to write here
	if ! (cd "$tmp" && apt-get -o APT::Sandbox::User=root download prometheus >&2); then
		apt-get update >&2
		(cd "$tmp" && apt-get -o APT::Sandbox::User=root download prometheus >&2)
	fi
	dpkg -x "$tmp"/prometheus_*.deb "$tmp/root"
	install -m 0755 "$tmp/root/usr/bin/promtool" "$out/promtool.tmp"
	mv "$out/promtool.tmp" "$out/promtool"
fi

# The device plugin's Helm chart ships inside its Go module.
(cd "$root/hack/dev/tools" && go mod download github.com/NVIDIA/k8s-device-plugin@v0.19.0)

"$out/helm" version --short >&2
"$out/kustomize" version >&2
"$out/promtool" --version 2>&1 | head -1 >&2
