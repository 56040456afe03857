#!/usr/bin/env bash
# Builds the programs of a one-node Kubernetes test cluster at Talos v1.14.1's versions, from
# their Go modules (pinned in hack/k8s-node/kube/go.mod and hack/k8s-node/runtime/go.mod), into
# OUT (default _out/k8s-node):
#   bin/kube          kubelet, kube-apiserver, kube-scheduler, kube-controller-manager, kubectl
#                     and etcd in one binary (links by those names point at it)
#   bin/containerd, bin/ctr, bin/containerd-shim-runc-v2   containerd 2.3.5
#   bin/runc          runc 1.5.1, static, with seccomp (Talos's kubelet defaults to the
#                     RuntimeDefault seccomp profile)
#   base-spec.json    Talos's CRI base runtime spec for this platform (see runtime/base-spec)
#   bin/node-setup    the node's network namespace and certificates (see runtime/node-setup)
#   cni/bridge, cni/host-local, cni/loopback, cni/firewall, cni/portmap
#                     the CNI plugins (the test node uses the first three; the Talos node's
#                     rootfs carries all five, as Talos's does)
# This is the one home of the node runtime: the Talos node (hack/talos-node/build.sh) and the
# tests' runc (internal/testutil.TalosRunc) take these programs from here.
# PARTS (after OUT): kube, runtime or both (the default).
# Rebuilds a module's programs only when its go.mod, go.sum, sources or this script changed. Needs gcc and
# libseccomp-dev (the static runc), which hack/dev/install-test-deps.sh installs.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/../../_out/k8s-node}
shift || true
parts=" ${*:-kube runtime} "
mkdir -p "$out"
out=$(cd "$out" && pwd)
exec 9>"$out/.lock"
flock 9

# One stamp per module: a change to one rebuilds only its programs.
stamp() { cat "$here/build.sh" "$@" | sha256sum | cut -c1-16; }
kube_stamp=$(stamp "$here"/kube/go.{mod,sum} "$here"/kube/*.go)
runtime_stamp=$(stamp "$here"/runtime/go.{mod,sum} "$here"/runtime/*/*.go)
mkdir -p "$out/bin" "$out/cni"
start=$SECONDS

if [[ $parts == *" kube "* && "$(cat "$out/.stamp-kube" 2>/dev/null)" != "$kube_stamp" ]]; then
	k8s_version=$(cd "$here/kube" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
	k8s_minor=${k8s_version#v*.}
	k8s_minor=${k8s_minor%%.*}
	echo "k8s-node: building Kubernetes $k8s_version (kubelet, control plane, kubectl, etcd) into $out/bin" >&2
	# With machined's GOAMD64 and grpc tag (hack/talos-node/build.sh), make's GO_TAGS (the
	# Makefile's one build configuration) and, in kube/go.mod, the versions machined v1.14.1
	# builds the modules both use at: the thousand packages the two share (client-go, the API
	# types, grpc, etcd's client) compile once.
	(cd "$here/kube" && CGO_ENABLED=0 GOAMD64=v2 go build -trimpath -tags "grpcnotrace${GO_TAGS:+,$GO_TAGS}" -o "$out/bin/kube" -ldflags "-s -w \
		-X k8s.io/component-base/version.gitVersion=$k8s_version \
		-X k8s.io/component-base/version.gitMajor=1 \
		-X k8s.io/component-base/version.gitMinor=$k8s_minor \
		-X k8s.io/component-base/version.gitTreeState=clean \
		-X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z" .)
	for p in kubelet kube-apiserver kube-scheduler kube-controller-manager kubectl etcd; do
		ln -sf kube "$out/bin/$p"
	done
	echo "$kube_stamp" >"$out/.stamp-kube"
fi

if [[ $parts == *" runtime "* && "$(cat "$out/.stamp-runtime" 2>/dev/null)" != "$runtime_stamp" ]]; then
	cd "$here/runtime"
	containerd_version=$(go list -m -f '{{.Version}}' github.com/containerd/containerd/v2)
	runc_version=$(go list -m -f '{{.Version}}' github.com/opencontainers/runc)
	echo "k8s-node: building containerd $containerd_version, runc $runc_version and CNI plugins" >&2
	# containerd's own Makefile: version in version.Version, no btrfs snapshotter without cgo.
	CGO_ENABLED=0 go build -trimpath -tags "no_btrfs,urfave_cli_no_docs${GO_TAGS:+,$GO_TAGS}" -o "$out/bin/" \
		-ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=${containerd_version#v}" \
		github.com/containerd/containerd/v2/cmd/containerd \
		github.com/containerd/containerd/v2/cmd/ctr \
		github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
	# runc's Makefile "static" target: cgo (nsenter), seccomp, static PIE.
	CGO_ENABLED=1 go build -trimpath -buildmode=pie -tags "seccomp,urfave_cli_no_docs,netgo,osusergo${GO_TAGS:+,$GO_TAGS}" \
		-o "$out/bin/runc" -ldflags "-s -w -linkmode external -extldflags -static-pie" \
		github.com/opencontainers/runc
	CGO_ENABLED=0 go build -trimpath -o "$out/cni/" -ldflags "-s -w" \
		github.com/containernetworking/plugins/plugins/main/bridge \
		github.com/containernetworking/plugins/plugins/ipam/host-local \
		github.com/containernetworking/plugins/plugins/main/loopback \
		github.com/containernetworking/plugins/plugins/meta/firewall \
		github.com/containernetworking/plugins/plugins/meta/portmap
	CGO_ENABLED=0 go build -trimpath -o "$out/bin/" -ldflags "-s -w" ./node-setup
	# The base spec depends on the platform only: made here, so the node needs no extra program.
	go run ./base-spec >"$out/base-spec.json"
	echo "$runtime_stamp" >"$out/.stamp-runtime"
fi

echo "k8s-node: up to date ($((SECONDS - start)) s)" >&2
