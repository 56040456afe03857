#!/usr/bin/env bash
# Builds a Talos v1.13.9 node for container mode from upstream parts, into OUT (default
# _out/talos-node):
#   bin/machined, bin/talosctl   Talos's main module at v1.13.9 (hack/talos-node/go.mod), with
#                                the tags and linker flags of Talos's Makefile
#   rootfs/                      the node's root filesystem, laid out as Talos's Dockerfile
#                                (rootfs-base, then the container-mode rootfs-base stage) lays it
#                                out: machined at /usr/bin/init, containerd 2.2.7 and its shim,
#                                runc 1.4.3, CNI plugins, Talos's hack/ config files
#   bin/registry, bin/crane      distribution's registry and go-containerregistry's crane
#                                (hack/talos-node/registry/go.mod): the images the node pulls
#                                (hack/talos-node/registry.sh)
#   guest/                       the KVM/TCG guest's pieces: the Debian kernel, busybox, the
#                                kernel modules the node uses, and the guest's init
# Rebuilds each part only when its inputs changed. The extension and the machine config are
# not part of it: hack/talos-node/node.sh adds them when it boots a node.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/../../_out/talos-node}
mkdir -p "$out"
out=$(cd "$out" && pwd)
exec 9>"$out/.lock"
flock 9

# go list names a module's directory only once it is in the module cache: on a cold cache the
# config files below would be read from "/hack/...".
(cd "$here" && go mod download github.com/siderolabs/talos github.com/siderolabs/talos/pkg/machinery)
talos_mod=$(cd "$here" && go list -m -f '{{.Dir}}' github.com/siderolabs/talos)
[ -n "$talos_mod" ] || { echo "talos-node: Talos's module is not in the module cache" >&2; exit 1; }
stamp() { cat "$here/build.sh" "$@" | sha256sum | cut -c1-16; }
start=$SECONDS
mkdir -p "$out/bin"

# Talos's Makefile: GO_BUILDTAGS tcell_minimal,grpcnotrace (talosctl: grpcnotrace), GOAMD64 v2,
# -s -w, and for machined the wireguard socket directory (GO_MACHINED_LDFLAGS). The version
# strings come from the machinery module's gendata, as in a release build.
talos_stamp=$(stamp "$here"/go.{mod,sum})
if [[ "$(cat "$out/.stamp-talos" 2>/dev/null)" != "$talos_stamp" ]]; then
	echo "talos-node: building machined and talosctl (Talos $(cd "$here" && go list -m -f '{{.Version}}' github.com/siderolabs/talos))" >&2
	t=$SECONDS
	(cd "$here" && CGO_ENABLED=0 GOAMD64=v2 go build -trimpath -tags tcell_minimal,grpcnotrace \
		-ldflags '-s -w -X golang.zx2c4.com/wireguard/ipc.socketDirectory=/system/wireguard-sock' \
		-o "$out/bin/machined" github.com/siderolabs/talos/internal/app/machined)
	# talosctl with machined's GOAMD64 (not Talos's Makefile's): GOAMD64 is in every package's
	# build-cache key, so the packages the two share are compiled once.
	(cd "$here" && CGO_ENABLED=0 GOAMD64=v2 go build -trimpath -tags grpcnotrace -ldflags '-s -w' \
		-o "$out/bin/talosctl" github.com/siderolabs/talos/cmd/talosctl)
	echo "talos-node: machined and talosctl built in $((SECONDS - t)) s" >&2
	echo "$talos_stamp" >"$out/.stamp-talos"
fi

# containerd, its shim, runc and the CNI plugins at Talos v1.13.9's pins: built once, by
# hack/k8s-node/build.sh (their one home), and copied from there.
k8s_out=${K8S_NODE_OUT:-$here/../../_out/k8s-node}
"$here/../k8s-node/build.sh" "$k8s_out" runtime
k8s_out=$(cd "$k8s_out" && pwd)
runtime_stamp=$(cat "$k8s_out/.stamp-runtime")
if [[ "$(cat "$out/.stamp-runtime" 2>/dev/null)" != "$runtime_stamp" ]]; then
	mkdir -p "$out/bin/cni"
	install -m 0755 "$k8s_out"/bin/{containerd,containerd-shim-runc-v2,runc} "$out/bin/"
	install -m 0755 "$k8s_out"/cni/{bridge,loopback,host-local,firewall,portmap} "$out/bin/cni/"
	echo "$runtime_stamp" >"$out/.stamp-runtime"
fi

# The registry and crane serve the images of the Kubernetes checks only.
registry_stamp=$(stamp "$here"/registry/go.{mod,sum})
if [[ ${TALOS_NODE_KUBERNETES:-1} != 0 && "$(cat "$out/.stamp-registry" 2>/dev/null)" != "$registry_stamp" ]]; then
	echo "talos-node: building the image registry and crane" >&2
	(cd "$here/registry" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/bin/" \
		github.com/distribution/distribution/v3/cmd/registry \
		github.com/google/go-containerregistry/cmd/crane)
	echo "$registry_stamp" >"$out/.stamp-registry"
fi

# The root filesystem. Talos v1.13.9 Dockerfile, rootfs-base-amd64: the FHS links (pkgs' fhs),
# containerd without ctr, runc, the CNI plugins at /opt/cni/bin, machined at /usr/bin/init and
# its links; the directories and empty files its RUN steps make; hack/nfsmount.conf (the
# kubelet's container binds it), hack/containerd.toml, hack/cri-containerd.toml,
# hack/cri-plugin.part, hack/udevd's rules, hack/lvm.conf; then the rootfs-base stage for containers:
# /usr/etc/in-container, an empty /usr/lib/modules. Talos's other packages (e2fsprogs, xfsprogs,
# lvm2, cryptsetup, iptables, nftables, udevd, ...) are C programs machined does not run in
# container mode; they are not here (docs/talos-node.md).
rootfs_stamp=$(stamp "$out/.stamp-talos" "$out/.stamp-runtime")
if [[ "$(cat "$out/.stamp-rootfs" 2>/dev/null)" != "$rootfs_stamp" ]]; then
	r=$out/rootfs
	rm -rf "$r"
	mkdir -p "$r"/{dev,proc,sys,run,tmp,var,etc,usr/bin,usr/lib,usr/local/bin}
	ln -s usr/bin "$r/bin"
	ln -s usr/bin "$r/sbin"
	ln -s usr/lib "$r/lib"
	ln -s usr/lib "$r/lib64"
	ln -s bin "$r/usr/sbin"
	ln -s lib "$r/usr/lib64"
	install -m 0755 "$out/bin/machined" "$r/usr/bin/init"
	for l in poweroff shutdown reboot dashboard; do ln -s init "$r/usr/bin/$l"; done
	install -m 0755 "$out/bin/containerd" "$out/bin/containerd-shim-runc-v2" "$out/bin/runc" "$r/usr/bin/"
	mkdir -p "$r/opt/cni/bin"
	install -m 0755 "$out"/bin/cni/* "$r/opt/cni/bin/"
	mkdir -p "$r"/{boot/EFI,etc/{iscsi,nvme,cri/conf.d/hosts},usr/lib/firmware,usr/etc,usr/local/share,usr/share/zoneinfo/Etc,mnt,system,opt,.extra}
	mkdir -p "$r"/{etc/kubernetes/manifests,etc/cni/net.d,etc/ssl/certs,usr/libexec/kubernetes,usr/local/lib/kubelet/credentialproviders,etc/selinux/targeted/contexts/files}
	mkdir -p "$r"/opt/{containerd/bin,containerd/lib} "$r/usr/share/spdx" "$r/usr/lib/modules"
	install -m 0644 "$talos_mod/hack/zoneinfo/Etc/UTC" "$r/usr/share/zoneinfo/Etc/UTC"
	install -m 0644 "$talos_mod/hack/nfsmount.conf" "$r/etc/nfsmount.conf"
	install -D -m 0644 "$talos_mod/hack/udevd/99-default.link" "$r/usr/lib/systemd/network/99-default.link"
	install -D -m 0644 -t "$r/usr/lib/udev/rules.d" "$talos_mod/hack/udevd/40-vm-hotadd.rules" "$talos_mod/hack/udevd/90-selinux.rules"
	install -D -m 0644 "$talos_mod/hack/lvm.conf" "$r/etc/lvm/lvm.conf"
	mkdir -p "$r/etc/containerd"
	install -m 0644 "$talos_mod/hack/containerd.toml" "$r/etc/containerd/config.toml"
	install -m 0644 "$talos_mod/hack/cri-containerd.toml" "$r/etc/cri/containerd.toml"
	install -m 0644 "$talos_mod/hack/cri-plugin.part" "$r/etc/cri/conf.d/00-base.part"
	install -m 0644 "$(cd "$here" && go list -m -f '{{.Dir}}' github.com/siderolabs/talos/pkg/machinery)/version/os-release" "$r/etc/os-release"
	ln -s /usr/share/zoneinfo/Etc/UTC "$r/etc/localtime"
	touch "$r"/etc/{extensions.yaml,resolv.conf,hosts,hostname,machine-id,cri/conf.d/cri.toml,cri/conf.d/01-registries.part,cri/conf.d/20-customization.part,cri/conf.d/base-spec.json,ssl/certs/ca-certificates.crt,selinux/targeted/contexts/files/file_contexts,iscsi/initiatorname.iscsi}
	touch "$r"/etc/nvme/{hostid,hostnqn}
	ln -s ca-certificates.crt "$r/etc/ssl/certs/ca-certificates"
	ln -s /etc/ssl "$r/etc/pki"
	ln -s /etc/ssl "$r/usr/share/ca-certificates"
	ln -s /etc/ssl "$r/usr/local/share/ca-certificates"
	ln -s /etc/ssl "$r/etc/ca-certificates"
	# Talos's CA bundle comes from pkgs' ca-certificates; the node pulls from a local mirror only.
	cat /etc/ssl/certs/ca-certificates.crt >"$r/etc/ssl/certs/ca-certificates.crt" 2>/dev/null || true
	echo true >"$r/usr/etc/in-container"
	echo "$rootfs_stamp" >"$out/.stamp-rootfs"
fi

# The guest: Debian's kernel (the build machine's root lacks CAP_SYS_RESOURCE, which machined
# needs to lower its services' oom_score_adj; in a VM root has every capability), busybox for
# the guest's init, runc to run the node as the docker provisioner runs it, and the modules
# the node's kernel features come from (networking, overlayfs, bridge/netfilter for pods).
kernel=$(ls /boot/vmlinuz-* | sort -V | tail -1)
kver=${kernel#/boot/vmlinuz-}
guest_stamp=$(stamp "$here/guest/init" "$here/guest/modules" "$out/.stamp-runtime" <(echo "$kver"))
if [[ "$(cat "$out/.stamp-guest" 2>/dev/null)" != "$guest_stamp" ]]; then
	g=$out/guest
	rm -rf "$g"
	mkdir -p "$g/base/bin" "$g/base/mod"
	cp "$kernel" "$g/vmlinuz"
	install -m 0755 /bin/busybox "$g/base/bin/busybox"
	install -m 0755 "$out/bin/runc" "$g/base/bin/runc"
	install -m 0755 "$here/guest/init" "$g/base/init"
	# Each module after those it needs, in load order (modprobe's own resolution).
	: >"$g/base/mod/order"
	grep -v '^#' "$here/guest/modules" | while read -r m; do
		[ -n "$m" ] || continue
		modprobe -S "$kver" --show-depends "$m" | awk '$1 == "insmod" { print $2 }'
	done | awk '!seen[$0]++' | while read -r f; do
		cp "$f" "$g/base/mod/"
		basename "$f" >>"$g/base/mod/order"
	done
	echo "$guest_stamp" >"$out/.stamp-guest"
fi

echo "talos-node: up to date ($((SECONDS - start)) s)" >&2
