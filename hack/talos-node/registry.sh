#!/usr/bin/env bash
# The Talos test node's image registry: distribution's registry (hack/talos-node/registry,
# from its module) on 127.0.0.1 of this machine, which the guest reaches as 10.0.2.2 (qemu's
# user network), holding every image the node pulls, so that machined and its CRI containerd
# pull them as on any node: through the mirror the machine config names
# (`RegistryMirrorConfig` "*", skipFallback; node.sh writes it).
#   registry.sh start DIR    starts it (state in DIR/registry), pushes the images, writes
#                            DIR/registry.port
#   registry.sh stop DIR
# The images (crane push of OCI layouts, from hack/k8s-node's builds, at Talos v1.14.1's
# versions; the tags are the versions hack/k8s-node/kube/go.mod builds):
#   registry.k8s.io/kube-apiserver, kube-controller-manager, kube-scheduler:v1.37.0,
#   ghcr.io/siderolabs/kubelet:v1.37.0, registry.k8s.io/etcd:v3.7.1
#       one image: hack/k8s-node's kube binary (each program from its module, chosen by the
#       name it is started as) at /usr/local/bin/<program>, where Talos starts each
#       (control_plane_static_pod.go, services/kubelet.go, services/etcd.go), and busybox's
#       mount and umount, which the kubelet runs for tmpfs volumes (Talos's kubelet image has
#       util-linux's); /var/run links to /run as in Debian's base of that image, so the
#       kubelet's /var/run bind (services/kubelet.go) is where it looks for the CRI socket,
#       /run/containerd/containerd.sock
#   registry.k8s.io/pause:3.10.2, nvcr.io/nvidia/k8s-device-plugin:v0.19.0,
#   talos-nvidia/k8s-node-base:test, registry.k8s.io/nfd/node-feature-discovery:v0.18.2
#                                       hack/k8s-node/images.sh's
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
. "$here/release.sh"
out=$release_out
k8s=${K8S_NODE_BIN:-$top/_out/k8s-node}
images=${K8S_NODE_IMAGES:-$top/_out/k8s-node/images}
cmd=$1 dir=$2
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

stop() {
	if [ -f "$dir/registry.pid" ]; then
		kill "$(cat "$dir/registry.pid")" 2>/dev/null || true
		rm -f "$dir/registry.pid"
	fi
}
case $cmd in
stop) stop; exit 0 ;;
start) ;;
*) echo "registry.sh: unknown command $cmd" >&2; exit 2 ;;
esac
stop
k8s_version=$(cd "$top/hack/k8s-node/kube" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
etcd_version=$(cd "$top/hack/k8s-node/kube" && go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)

# The images are pushed as OCI image layouts with zstd layers (hack/k8s-node/image -layout):
# the node's containerd unpacks each image it pulls under qemu's emulated CPUs, and decompresses
# zstd in about a third of gzip's time (measured natively on the kube layer, docs/talos-node.md).
# The kube image's root filesystem, made again only when the kube binary changed.
kube_root=$out/images/kube
if [ ! -d "$out/images/kube.oci" ] || [ "$k8s/bin/kube" -nt "$out/images/kube.oci" ] || [ "$0" -nt "$out/images/kube.oci" ]; then
	rm -rf "$kube_root" "$out/images/kube.tar" && mkdir -p "$kube_root/usr/local/bin" "$kube_root/bin" "$kube_root/tmp" "$kube_root/run" "$kube_root/var"
	ln -s ../run "$kube_root/var/run"
	# The kubelet reads /etc/passwd for its user namespace mappings (a "kubelet" user, absent
	# here: the defaults).
	mkdir -p "$kube_root/etc"
	printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$kube_root/etc/passwd"
	printf 'root:x:0:\nnogroup:x:65534:\n' >"$kube_root/etc/group"
	chmod 1777 "$kube_root/tmp"
	install -m 0755 "$k8s/bin/kube" "$kube_root/usr/local/bin/kube"
	for p in kubelet kube-apiserver kube-controller-manager kube-scheduler etcd; do
		ln -s kube "$kube_root/usr/local/bin/$p"
	done
	install -m 0755 "$images/busybox" "$kube_root/bin/busybox"
	for a in sh mount umount; do ln -s busybox "$kube_root/bin/$a"; done
	"$images/image" -layout -rootfs "$kube_root" -out "$out/images/kube.oci" \
		-ref "registry.k8s.io/kube-apiserver:$k8s_version" -env PATH=/usr/local/bin:/usr/bin:/bin >/dev/null
fi
# hack/k8s-node/images.sh's images, from its image directories and their packing flags, made
# again when it made them again (its .stamp).
for n in pause device-plugin base nfd; do
	l=$out/images/$n.oci
	if [ ! -d "$l" ] || [ "$images/.stamp" -nt "$l" ] || [ "$0" -nt "$l" ]; then
		mapfile -t flags <"$images/rootfs/$n.flags"
		"$images/image" -layout -rootfs "$images/rootfs/$n" -out "$l" "${flags[@]}" >/dev/null
	fi
done

port=
for _ in $(seq 50); do
	p=$((20000 + RANDOM % 20000))
	if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then port=$p; break; fi
done
[ -n "$port" ] || { echo "registry.sh: no free port found" >&2; exit 1; }

# distribution's configuration (docs/content/about/configuration.md of its module): filesystem
# storage, plain HTTP on the port; the guest reaches it through qemu's 10.0.2.2. Not crane's
# registry (`crane registry serve`, a quarter of the packages to build): containerd resumes a
# blob with `Range: bytes=N-`, which it answers 416 "We don't understand your Range"
# (go-containerregistry v0.22.1 pkg/registry/blobs.go; seen here 2026-12-05: no kubelet image).
rm -rf "$dir/registry"
mkdir -p "$dir/registry/data"
cat >"$dir/registry/config.yml" <<EOF
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $dir/registry/data
http:
  addr: 127.0.0.1:$port
EOF
# (OTEL_TRACES_EXPORTER: distribution exports traces to localhost:4318 unless told not to.)
OTEL_TRACES_EXPORTER=none "$out/bin/registry" serve "$dir/registry/config.yml" >"$dir/registry/log" 2>&1 &
echo $! >"$dir/registry.pid"
for _ in $(seq 100); do
	(exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
	kill -0 "$(cat "$dir/registry.pid")" 2>/dev/null || { cat "$dir/registry/log" >&2; exit 1; }
	sleep 0.1
done
echo "$port" >"$dir/registry.port"

push() { # LAYOUT REPOSITORY:TAG (the path under the mirror: the reference without its registry)
	"$out/bin/crane" push --insecure "$1" "127.0.0.1:$port/$2" >/dev/null 2>>"$dir/registry/push.log" && return
	echo "registry.sh: crane push $1 $2 failed:" >&2
	tail -5 "$dir/registry/push.log" >&2
	exit 1
}
# etcd under both spellings of its tag: Talos v1.13.9 names v3.6.12, v1.14.1 names 3.7.1
# (machinery constants DefaultEtcdVersion; seen: "failed to resolve reference
# registry.k8s.io/etcd:3.7.1: not found" when only v3.7.1 was served).
for ref in kube-apiserver:$k8s_version kube-controller-manager:$k8s_version kube-scheduler:$k8s_version \
	siderolabs/kubelet:$k8s_version etcd:$etcd_version etcd:${etcd_version#v}; do
	push "$out/images/kube.oci" "$ref"
done
push "$out/images/pause.oci" pause:3.10.2
push "$out/images/device-plugin.oci" nvidia/k8s-device-plugin:v0.19.0
push "$out/images/base.oci" talos-nvidia/k8s-node-base:test
push "$out/images/nfd.oci" "nfd/node-feature-discovery:$(cd "$top/hack/k8s-node/nfd" && go list -m -f '{{.Version}}' sigs.k8s.io/node-feature-discovery)"
echo "registry.sh: serving on 127.0.0.1:$port (the guest's 10.0.2.2:$port)" >&2
