#!/usr/bin/env bash
# Builds a Talos node for container mode from upstream parts, at the release TALOS_NODE_VERSION
# names (default v1.14.1, or v1.13.9; hack/talos-node/release.sh), into OUT (default
# _out/talos-node/<version>):
#   bin/machined, bin/talosctl   Talos's main module at that release (hack/talos-node/<version>/go.mod),
#                                with the tags and linker flags of that release's Makefile
#   bin/controlplane             v1.14.1: hack/talos-node/v1.14.1/controlplane, for
#                                hack/talos-node/controlplane.sh
#   rootfs/                      the node's root filesystem, laid out as that release's Dockerfile
#                                (rootfs-base, then the container-mode rootfs-base stage) lays it
#                                out: machined at /usr/bin/init, containerd and its shim, runc
#                                (v1.14.1: containerd 2.3.5, runc 1.5.1, from
#                                hack/k8s-node/runtime; v1.13.9: containerd 2.2.7, runc 1.4.3,
#                                from hack/talos-node/v1.13.9/runtime), CNI plugins, Talos's
#                                hack/ config files
#   bin/registry, bin/crane      distribution's registry (its filesystem driver alone,
#                                hack/talos-node/registry/main.go) and go-containerregistry's
#                                crane: the images the node pulls (hack/talos-node/registry.sh)
#   bin/qemu-system-x86_64       the qemu that runs the guest (below: Debian 12's backports')
#   guest/                       the KVM/TCG guest's pieces: the Debian kernel (v1.14.1: 6.18,
#                                below), busybox, the kernel modules the node uses, and the
#                                guest's init
# Rebuilds each part only when its inputs changed. The extension and the machine config are
# not part of it: hack/talos-node/node.sh adds them when it boots a node.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
. "$here/release.sh"
out=${1:-$release_out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
exec 9>"$out/.lock"
flock 9

# go list names a module's directory only once it is in the module cache: on a cold cache the
# config files below would be read from "/hack/...".
(cd "$release_dir" && go mod download github.com/siderolabs/talos github.com/siderolabs/talos/pkg/machinery)
talos_mod=$(cd "$release_dir" && go list -m -f '{{.Dir}}' github.com/siderolabs/talos)
machinery_mod=$(cd "$release_dir" && go list -m -f '{{.Dir}}' github.com/siderolabs/talos/pkg/machinery)
[ -n "$talos_mod" ] || { echo "talos-node: Talos's module is not in the module cache" >&2; exit 1; }
stamp() { cat "$here/build.sh" "$here/release.sh" "$@" | sha256sum | cut -c1-16; }
start=$SECONDS
mkdir -p "$out/bin"

# Talos's Makefile (the same in v1.13.9 and v1.14.1): GO_BUILDTAGS tcell_minimal,grpcnotrace (talosctl: grpcnotrace), GOAMD64 v2,
# -s -w, and for machined the wireguard socket directory (GO_MACHINED_LDFLAGS). The version
# strings come from the machinery module's gendata, as in a release build. Each build here adds
# make's GO_TAGS (the Makefile says why): netgo and osusergo change nothing in a build without
# cgo but one constant of package net.
talos_stamp=$(stamp "$release_dir"/go.{mod,sum})
if [[ "$(cat "$out/.stamp-talos" 2>/dev/null)" != "$talos_stamp" ]]; then
	echo "talos-node: building machined and talosctl (Talos $(cd "$release_dir" && go list -m -f '{{.Version}}' github.com/siderolabs/talos))" >&2
	t=$SECONDS
	(cd "$release_dir" && CGO_ENABLED=0 GOAMD64=v2 go build -trimpath -tags "tcell_minimal,grpcnotrace${GO_TAGS:+,$GO_TAGS}" \
		-ldflags '-s -w -X golang.zx2c4.com/wireguard/ipc.socketDirectory=/system/wireguard-sock' \
		-o "$out/bin/machined" github.com/siderolabs/talos/internal/app/machined)
	# talosctl with machined's GOAMD64 (not Talos's Makefile's): GOAMD64 is in every package's
	# build-cache key, so the packages the two share are compiled once.
	(cd "$release_dir" && CGO_ENABLED=0 GOAMD64=v2 go build -trimpath -tags "grpcnotrace${GO_TAGS:+,$GO_TAGS}" -ldflags '-s -w' \
		-o "$out/bin/talosctl" github.com/siderolabs/talos/cmd/talosctl)
	echo "talos-node: machined and talosctl built in $((SECONDS - t)) s" >&2
	echo "$talos_stamp" >"$out/.stamp-talos"
fi
# v1.14.1: what a control plane on this machine needs to take the node as a worker
# (hack/talos-node/controlplane.sh), with machined's packages, which it shares.
if [ -d "$release_dir/controlplane" ]; then
	(cd "$release_dir" && CGO_ENABLED=0 GOAMD64=v2 go build -trimpath -tags "grpcnotrace${GO_TAGS:+,$GO_TAGS}" -ldflags '-s -w' \
		-o "$out/bin/controlplane" ./controlplane)
fi
# TALOS_NODE_PARTS=programs: machined and talosctl alone (make test builds them in the
# background from its start, before the runtime below exists).
if [[ ${TALOS_NODE_PARTS:-all} == programs ]]; then
	echo "talos-node: machined and talosctl up to date ($((SECONDS - start)) s)" >&2
	exit 0
fi

# containerd, its shim, runc and the CNI plugins at the release's pins. Talos v1.14.1's
# (containerd 2.3.5, runc 1.5.1: machinery constants DefaultContainerdVersion, RuncVersion) and
# both releases' CNI plugins (v1.9.1, the version both Talos go.mods require) are built once, by
# hack/k8s-node/build.sh (their one home, where the Kubernetes node runs them too), and copied
# from there. Talos v1.13.9 pins containerd 2.2.7 and runc 1.4.3: built here from
# hack/talos-node/v1.13.9/runtime, with hack/k8s-node/build.sh's flags (containerd's Makefile: its version, no btrfs; runc's static
# target: cgo, seccomp, static PIE; runc 1.5's Makefile adds the libpathrs tag, a Rust library
# this machine lacks, which Talos's pkgs build leaves out too with BUILDTAGS=seccomp).
k8s_out=${K8S_NODE_OUT:-$here/../../_out/k8s-node}
"$here/../k8s-node/build.sh" "$k8s_out" runtime
k8s_out=$(cd "$k8s_out" && pwd)
runtime_stamp=$(cat "$k8s_out/.stamp-runtime")
if [ -d "$release_dir/runtime" ]; then
	runtime_stamp=$(stamp <(echo "$runtime_stamp") "$release_dir"/runtime/go.{mod,sum})
fi
if [[ "$(cat "$out/.stamp-runtime" 2>/dev/null)" != "$runtime_stamp" ]]; then
	mkdir -p "$out/bin/cni"
	install -m 0755 "$k8s_out"/cni/{bridge,loopback,host-local,firewall,portmap} "$out/bin/cni/"
	if [ -d "$release_dir/runtime" ]; then
		t=$SECONDS
		containerd_version=$(cd "$release_dir/runtime" && go list -m -f '{{.Version}}' github.com/containerd/containerd/v2)
		echo "talos-node: building containerd $containerd_version and runc $(cd "$release_dir/runtime" && go list -m -f '{{.Version}}' github.com/opencontainers/runc)" >&2
		(cd "$release_dir/runtime" && CGO_ENABLED=0 go build -trimpath -tags "no_btrfs,urfave_cli_no_docs${GO_TAGS:+,$GO_TAGS}" -o "$out/bin/" \
			-ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=${containerd_version#v}" \
			github.com/containerd/containerd/v2/cmd/containerd \
			github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2)
		(cd "$release_dir/runtime" && CGO_ENABLED=1 go build -trimpath -buildmode=pie -tags "seccomp,urfave_cli_no_docs,netgo,osusergo${GO_TAGS:+,$GO_TAGS}" \
			-o "$out/bin/runc" -ldflags "-s -w -linkmode external -extldflags -static-pie" \
			github.com/opencontainers/runc)
		echo "talos-node: containerd and runc built in $((SECONDS - t)) s" >&2
	else
		install -m 0755 "$k8s_out"/bin/{containerd,containerd-shim-runc-v2,runc} "$out/bin/"
	fi
	echo "$runtime_stamp" >"$out/.stamp-runtime"
fi

# The registry and crane serve the images of the Kubernetes checks only.
registry_stamp=$(stamp "$here"/registry/go.{mod,sum} "$here"/registry/main.go)
if [[ ${TALOS_NODE_KUBERNETES:-1} != 0 && "$(cat "$out/.stamp-registry" 2>/dev/null)" != "$registry_stamp" ]]; then
	echo "talos-node: building the image registry and crane" >&2
	(cd "$here/registry" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/bin/" \
		. github.com/google/go-containerregistry/cmd/crane)
	echo "$registry_stamp" >"$out/.stamp-registry"
fi

# The root filesystem, as the release's Dockerfile lays it out. rootfs-base-amd64: the FHS
# links (pkgs' fhs), containerd without ctr, runc, the CNI plugins at /opt/cni/bin, machined at
# /usr/bin/init and its links; the directories and empty files its RUN steps make;
# hack/nfsmount.conf (the kubelet's container binds it), hack/containerd.toml,
# hack/cri-containerd.toml, hack/cri-plugin.part, hack/udevd's rules, hack/lvm.conf; then the
# rootfs-base stage for containers: /usr/etc/in-container, an empty /usr/lib/modules. Talos's
# other packages (e2fsprogs, xfsprogs, lvm2, mdadm, cryptsetup, iptables, nftables, udevd, ...)
# are C programs machined does not run in container mode; they are not here
# (docs/talos-node.md). What v1.14.1's Dockerfile does otherwise than v1.13.9's:
#   - /usr/bin/sandboxd, a link to init ("sandboxd is PID 1 of the sandbox PID+mount
#     namespace, re-exec'd by machined");
#   - no /etc/iscsi, /etc/nvme or /usr/libexec/kubernetes, and etc/cni/net.ds (sic) for
#     etc/cni/net.d; hack/selinux's virtual_domain_context and virtual_image_context;
#     hack/udevd's 90-md-raid-arrays, 90-md-raid-assembly and 99-talos rules;
#   - of the empty files only etc/extensions.yaml and the SELinux file_contexts: machined
#     v1.14 makes /etc an overlay on a tmpfs of its own (setupEtcOverlay,
#     internal/app/machined/pkg/runtime/v1alpha2/etc_overlay.go) and writes its files there,
#     where v1.13 bind-mounted each over an empty file of the image;
#   - cri-plugin.part turns NRI on (no `disable = true`) and puts the runc shim in
#     /podruntime/shim.
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
	links="poweroff shutdown reboot dashboard"
	[ "$TALOS_NODE_VERSION" = v1.13.9 ] || links+=" sandboxd"
	for l in $links; do ln -s init "$r/usr/bin/$l"; done
	install -m 0755 "$out/bin/containerd" "$out/bin/containerd-shim-runc-v2" "$out/bin/runc" "$r/usr/bin/"
	mkdir -p "$r/opt/cni/bin"
	install -m 0755 "$out"/bin/cni/* "$r/opt/cni/bin/"
	mkdir -p "$r"/{boot/EFI,etc/cri/conf.d/hosts,usr/lib/firmware,usr/etc,usr/local/share,usr/share/zoneinfo/Etc,mnt,system,opt,.extra}
	mkdir -p "$r"/{etc/kubernetes/manifests,etc/ssl/certs,usr/local/lib/kubelet/credentialproviders,etc/selinux/targeted/contexts/files}
	mkdir -p "$r"/opt/{containerd/bin,containerd/lib} "$r/usr/share/spdx" "$r/usr/lib/modules"
	if [ "$TALOS_NODE_VERSION" = v1.13.9 ]; then
		mkdir -p "$r"/{etc/iscsi,etc/nvme,etc/cni/net.d,usr/libexec/kubernetes}
	else
		mkdir -p "$r/etc/cni/net.ds"
		install -m 0644 -t "$r/etc/selinux/targeted/contexts" "$talos_mod"/hack/selinux/virtual_{domain,image}_context
	fi
	install -m 0644 "$talos_mod/hack/zoneinfo/Etc/UTC" "$r/usr/share/zoneinfo/Etc/UTC"
	install -m 0644 "$talos_mod/hack/nfsmount.conf" "$r/etc/nfsmount.conf"
	install -D -m 0644 "$talos_mod/hack/udevd/99-default.link" "$r/usr/lib/systemd/network/99-default.link"
	rules="40-vm-hotadd.rules 90-selinux.rules"
	[ "$TALOS_NODE_VERSION" = v1.13.9 ] || rules+=" 90-md-raid-arrays.rules 90-md-raid-assembly.rules 99-talos.rules"
	for f in $rules; do install -D -m 0644 "$talos_mod/hack/udevd/$f" "$r/usr/lib/udev/rules.d/$f"; done
	install -D -m 0644 "$talos_mod/hack/lvm.conf" "$r/etc/lvm/lvm.conf"
	mkdir -p "$r/etc/containerd"
	install -m 0644 "$talos_mod/hack/containerd.toml" "$r/etc/containerd/config.toml"
	install -m 0644 "$talos_mod/hack/cri-containerd.toml" "$r/etc/cri/containerd.toml"
	install -m 0644 "$talos_mod/hack/cri-plugin.part" "$r/etc/cri/conf.d/00-base.part"
	install -m 0644 "$machinery_mod/version/os-release" "$r/etc/os-release"
	ln -s /usr/share/zoneinfo/Etc/UTC "$r/etc/localtime"
	touch "$r"/etc/{extensions.yaml,selinux/targeted/contexts/files/file_contexts}
	if [ "$TALOS_NODE_VERSION" = v1.13.9 ]; then
		touch "$r"/etc/{resolv.conf,hosts,hostname,machine-id,cri/conf.d/cri.toml,cri/conf.d/01-registries.part,cri/conf.d/20-customization.part,cri/conf.d/base-spec.json,ssl/certs/ca-certificates.crt,iscsi/initiatorname.iscsi}
		touch "$r"/etc/nvme/{hostid,hostnqn}
		# Talos's CA bundle comes from pkgs' ca-certificates; the node pulls from a local mirror only.
		cat /etc/ssl/certs/ca-certificates.crt >"$r/etc/ssl/certs/ca-certificates.crt" 2>/dev/null || true
	fi
	ln -s ca-certificates.crt "$r/etc/ssl/certs/ca-certificates"
	ln -s /etc/ssl "$r/etc/pki"
	ln -s /etc/ssl "$r/usr/share/ca-certificates"
	ln -s /etc/ssl "$r/usr/local/share/ca-certificates"
	ln -s /etc/ssl "$r/etc/ca-certificates"
	echo true >"$r/usr/etc/in-container"
	echo "$rootfs_stamp" >"$out/.stamp-rootfs"
fi

# unpack_debs DIR SUITE PACKAGE...: Debian's packages from SUITE, unpacked (not installed) into
# DIR, through the machine's own Debian mirror with apt state of DIR's own (the machine's apt
# configuration untouched). Nothing is done when DIR is there.
unpack_debs() {
	local d=$1 suite=$2 a=$1.apt mirror deb
	shift 2
	[ ! -d "$d" ] || return 0
	rm -rf "$a" && mkdir -p "$a/lists/partial" "$a/cache/archives/partial" "$a/deb"
	mirror=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' | awk '$2 == "bookworm" || $2 == "trixie" { print $1; exit }')
	[ -n "$mirror" ] || { echo "talos-node: no Debian mirror in the machine's apt sources" >&2; exit 1; }
	echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite main" >"$a/sources.list"
	local apt_opts=(-o "Dir::Etc::SourceList=$a/sources.list" -o Dir::Etc::SourceParts=/nonexistent
		-o "Dir::State::Lists=$a/lists" -o "Dir::Cache=$a/cache" -o Dir::State::status=/dev/null
		-o APT::Sandbox::User=root)
	apt-get -qq "${apt_opts[@]}" update
	(cd "$a/deb" && apt-get -qq "${apt_opts[@]}" download "$@")
	rm -rf "$d.tmp"
	for deb in "$a"/deb/*.deb; do dpkg-deb -x "$deb" "$d.tmp"; done
	rm -rf "$a" && mv "$d.tmp" "$d"
}

# The guest: Debian's kernel (the build machine's root lacks CAP_SYS_RESOURCE, which machined
# needs to lower its services' oom_score_adj; in a VM root has every capability), busybox for
# the guest's init, runc to run the node as the docker provisioner runs it, and the modules
# the node's kernel features come from (networking, overlayfs, bridge/netfilter for pods).
# v1.13.9: the build machine's own kernel (Debian 12's 6.1). v1.14.1: Debian 13's backported
# 6.18 kernel (guest_kernel, release.sh: Talos v1.14.1's own kernel is 6.18), downloaded from
# the suite it is in through the machine's own Debian mirror, with apt state of its own (the
# machine's apt configuration untouched), and unpacked, not installed: machined v1.14 mounts
# /etc as an overlay whose lower layer it passes as a file descriptor ("lowerdir+",
# internal/pkg/mount/v3/helpers.go NewSecureWritableOverlay), which Debian 12's kernels do not
# take (seen: 6.1 "FSCONFIG_SET_FD failed: operation not supported", 6.12 "bad file
# descriptor"), and machined stops at "failed to set up /etc overlay".
if [ -n "$guest_kernel" ]; then
	kroot=$here/../../.cache/talos-node/$guest_kernel
	if [ ! -d "$kroot/boot" ]; then
		unpack_debs "$kroot.deb" "$guest_kernel_suite" "$guest_kernel"
		# Debian 13 keeps modules in /usr/lib/modules; Debian 12's depmod and modprobe look in /lib.
		[ -e "$kroot.deb/lib" ] || ln -s usr/lib "$kroot.deb/lib"
		depmod -b "$kroot.deb" "${guest_kernel#linux-image-}"
		rm -rf "$kroot" && mv "$kroot.deb" "$kroot"
	fi
	kroot=$(cd "$kroot" && pwd)
	kver=${guest_kernel#linux-image-}
	kernel=$kroot/boot/vmlinuz-$kver
	modprobe=(modprobe -d "$kroot" -S "$kver")
else
	kernel=$(ls /boot/vmlinuz-* | sort -V | tail -1)
	kver=${kernel#/boot/vmlinuz-}
	modprobe=(modprobe -S "$kver")
fi
guest_stamp=$(stamp "$here/guest/init" "$here/guest/modules" "$out/.stamp-runtime" <(echo "$kver"))
if [[ "$(cat "$out/.stamp-guest" 2>/dev/null)" != "$guest_stamp" ]]; then
	g=$out/guest
	rm -rf "$g"
	mkdir -p "$g/base/bin" "$g/base/mod"
	cp "$kernel" "$g/vmlinuz"
	install -m 0755 /bin/busybox "$g/base/bin/busybox"
	install -m 0755 "$out/bin/runc" "$g/base/bin/runc"
	install -m 0755 "$here/guest/init" "$g/base/init"
	# Each module after those it needs, in load order (modprobe's own resolution); the 6.18
	# package's modules are xz-compressed, which busybox's insmod does not read.
	: >"$g/base/mod/order"
	grep -v '^#' "$here/guest/modules" | while read -r m; do
		[ -n "$m" ] || continue
		"${modprobe[@]}" --show-depends "$m" | awk '$1 == "insmod" { print $2 }'
	done | awk '!seen[$0]++' | while read -r f; do
		b=$(basename "$f" .xz)
		if [[ $f == *.xz ]]; then xz -dc "$f" >"$g/base/mod/$b"; else cp "$f" "$g/base/mod/"; fi
		echo "$b" >>"$g/base/mod/order"
	done
	echo "$guest_stamp" >"$out/.stamp-guest"
fi

# qemu, for the guest's TCG: bookworm-backports' (10.0) on a Debian 12 machine, unpacked as the
# guest's kernel is; the machine's own elsewhere. Debian 12's own, 7.2, has the multi-threaded
# TCG bug that oopses a guest kernel on a static key's int3 (fixed in qemu 8.1.0, "accel/tcg:
# Always lock pages before translation"; docs/talos-node.md, "qemu 10").
# bin/qemu-system-x86_64 is the one node.sh runs.
if apt-get indextargets --format '$(RELEASE)' 2>/dev/null | grep -qx bookworm; then
	qroot=$here/../../.cache/talos-node/qemu-bookworm-backports
	unpack_debs "$qroot" bookworm-backports qemu-system-x86 qemu-system-common qemu-system-data seabios
	ln -sfn "$(cd "$qroot" && pwd)/usr/bin/qemu-system-x86_64" "$out/bin/qemu-system-x86_64"
else
	ln -sfn "$(command -v qemu-system-x86_64)" "$out/bin/qemu-system-x86_64"
fi

echo "talos-node: up to date ($((SECONDS - start)) s)" >&2
