#!/usr/bin/env bash
# Boots one Talos node at the release TALOS_NODE_VERSION names (default v1.14.1, or v1.13.9;
# release.sh) (control plane, allowSchedulingOnControlPlanes; or, with TALOS_NODE_CONTROL_PLANE,
# a worker of hack/talos-node/controlplane.sh's control plane) in container mode
# inside a virtual machine, with the given extensions' files in its root filesystem, and waits
# until its API answers talosctl. Everything after that goes through talosctl.
#   node.sh start DIR [EXTENSION_DIR...]   DIR: the node's state (talosconfig, console.log, qemu pid)
#   node.sh restart DIR   the node's container restarted, as `docker restart` restarts a Talos
#                         node in a container (talosctl reboot is refused in container mode),
#                         then waits until apid answers again
#   node.sh stop DIR
# EXTENSION_DIR: an extension image's directory as `make extension` writes it (its rootfs/ goes
# to the node's /, as Talos puts an extension's files on a node).
# Environment: TALOS_NODE_OUT (default _out/talos-node/<version>, from build.sh), TALOS_NODE_PATCHES
# (machine config patch files, space-separated), TALOS_NODE_MEM (MiB, default 6144),
# TALOS_NODE_REGISTRY_PORT (the port of hack/talos-node/registry.sh on 127.0.0.1: every image
# is pulled from it, through a RegistryMirrorConfig "*"; the API server's 6443 is then
# forwarded too, to DIR/kube.port), TALOS_NODE_ACCEL (qemu -accel, default tcg,thread=single;
# this machine's /dev/kvm is PVM, which boots only PVM-enabled guest kernels;
# docs/talos-node.md), TALOS_NODE_BOOT_TIMEOUT (s, default 900), TALOS_NODE_CONTROL_PLANE (the
# state directory of a running controlplane.sh: the node is its worker, from its secrets, with
# k8s_worker_patch instead of k8s_patch; the kubelet's 10250 is forwarded from 127.0.0.1:10250).
# One TCG thread is enough for the checks without Kubernetes; Kubernetes needs both vCPUs at
# once (tcg,thread=multi: the Makefile's targets with Kubernetes set it). The guest boots with
# one CPU online (maxcpus=1) and its init brings the other up once it has made a cgroup that
# holds every controller: guest/init says why (with both vCPUs running, the 6.18 guest kernel
# panicked in multi-threaded TCG, "Oops: int3", when a static key switched).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
. "$here/release.sh"
out=$release_out
mem=${TALOS_NODE_MEM:-6144}
cpus=2
accel=${TALOS_NODE_ACCEL:-tcg,thread=single}
# qemu 7.2's translation buffer is 1 GiB; a run of the simulated GPUs filled it three times
# (its monitor's `info jit`: "TB flush count 3"), and each flush drops every translated block,
# which the guest then translates again. With 2 GiB it filled once (2026-12-06).
[[ $accel != tcg* || $accel == *tb-size=* ]] || accel+=,tb-size=2048
name=talos-node
cmd=$1 dir=$2
shift 2
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
talosctl=$out/bin/talosctl

stop() {
	if [ -f "$dir/qemu.pid" ]; then
		local pid
		pid=$(cat "$dir/qemu.pid")
		kill "$pid" 2>/dev/null || true
		for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
		rm -f "$dir/qemu.pid"
	fi
}

# wait_apid: until talosctl version answers (the guest's console's end if it never does).
wait_apid() {
	local start=$SECONDS timeout=${TALOS_NODE_BOOT_TIMEOUT:-900}
	until "$talosctl" --talosconfig "$dir/talosconfig" version >/dev/null 2>&1; do
		if ! kill -0 "$(cat "$dir/qemu.pid")" 2>/dev/null; then
			echo "node.sh: the guest stopped before apid answered; its console:" >&2
			tail -50 "$dir/console.log" >&2
			cat "$dir/qemu.log" >&2
			return 1
		fi
		if ((SECONDS - start > timeout)); then
			echo "node.sh: apid did not answer in ${timeout} s; the console's end:" >&2
			tail -50 "$dir/console.log" >&2
			return 1
		fi
		sleep 5
	done
	echo "node.sh: apid answered $((SECONDS - start)) s after the guest started the node" >&2
	echo "$((SECONDS - start))" >"$dir/apid.seconds"
}

# restart: the guest's init (guest/init, restart-node) stops the node's container and starts
# it again; it answers once the container has stopped.
restart() {
	local reply
	exec 3<>"/dev/tcp/127.0.0.1/$(cat "$dir/control.port")" || return 1
	echo restart >&3
	read -r -t 300 reply <&3 || true
	exec 3>&-
	[ "$reply" = stopping ] || { echo "node.sh: the guest did not restart the node (reply: ${reply:-none})" >&2; return 1; }
	echo "node.sh: the node stopped; the guest starts it again" >&2
	wait_apid
}

case $cmd in
stop) stop; exit 0 ;;
restart) restart; exit ;;
start) ;;
*) echo "node.sh: unknown command $cmd" >&2; exit 2 ;;
esac
stop

# Free ports on 127.0.0.1 for apid, the guest's restart control and the API server,
# forwarded to the guest's 50000, 50900 and 6443.
# (Nothing answering a connect; qemu fails to start if another takes one meanwhile.)
free_port() {
	local p
	for _ in $(seq 50); do
		p=$((40000 + RANDOM % 20000))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return; fi
	done
	echo "node.sh: no free port found" >&2
	return 1
}
port=$(free_port)
echo "$port" >"$dir/apid.port"
cport=$(free_port)
echo "$cport" >"$dir/control.port"
forwards="hostfwd=tcp:127.0.0.1:$port-:50000,hostfwd=tcp:127.0.0.1:$cport-:50900"
# A worker of hack/talos-node/controlplane.sh's control plane (TALOS_NODE_CONTROL_PLANE=DIR, its
# state directory): the API server on this machine reaches the node's kubelet at 127.0.0.1,
# the address its mount namespace gives the node's hostname, on the kubelet's own port.
cp_dir=${TALOS_NODE_CONTROL_PLANE:-}
if [ -n "$cp_dir" ]; then
	[ -s "$cp_dir/controlplane/kube.port" ] || { echo "node.sh: no control plane runs in $cp_dir (controlplane.sh start)" >&2; exit 1; }
	if (exec 3<>/dev/tcp/127.0.0.1/10250) 2>/dev/null; then
		echo "node.sh: 127.0.0.1:10250 (the kubelet's port, forwarded to the worker's) is taken" >&2
		exit 1
	fi
	forwards+=",hostfwd=tcp:127.0.0.1:10250-:10250"
elif [ -n "${TALOS_NODE_REGISTRY_PORT:-}" ]; then
	kport=$(free_port)
	echo "$kport" >"$dir/kube.port"
	forwards+=",hostfwd=tcp:127.0.0.1:$kport-:6443"
fi

# The machine config, from talosctl gen config as a user makes it, with the node's own patch
# (hack/talos-node/node.patch.yaml; v1.14.1: hack/talos-node/v1.14.1/node.patch.yaml) and the
# caller's.
rm -rf "$dir/config"
patches=(--config-patch "@$node_patch")
for p in ${TALOS_NODE_PATCHES:-}; do patches+=(--config-patch "@$p"); done
if [ -n "${TALOS_NODE_REGISTRY_PORT:-}" ]; then
	# Every registry's images from the test's registry, as a node behind a pull-through mirror
	# gets them (machinery config/types/cri/registry_mirror.go: name "*" applies to all).
	printf 'apiVersion: v1alpha1\nkind: RegistryMirrorConfig\nname: "*"\nendpoints:\n  - url: http://10.0.2.2:%s\nskipFallback: true\n' \
		"$TALOS_NODE_REGISTRY_PORT" >"$dir/mirror.patch.yaml"
	patches+=(--config-patch "@$dir/mirror.patch.yaml")
fi
# The control plane's endpoint and, for a worker, the secrets of the control plane it joins.
endpoint=https://10.0.2.15:6443 type=controlplane secrets=()
if [ -n "$cp_dir" ]; then
	endpoint=https://10.0.2.2:$(cat "$cp_dir/controlplane/kube.port") type=worker
	secrets=(--with-secrets "$cp_dir/controlplane/secrets.yaml")
	patches+=(--config-patch "@$k8s_worker_patch")
elif [ -n "${TALOS_NODE_REGISTRY_PORT:-}" ]; then
	patches+=(--config-patch "@$k8s_patch")
fi
"$talosctl" gen config "$name" "$endpoint" --output "$dir/config" "${secrets[@]}" \
	--with-docs=false --with-examples=false "${patches[@]}" >/dev/null
cp "$dir/config/$type.yaml" "$dir/config/machine.yaml" # the node's own, for the checks
"$talosctl" --talosconfig "$dir/config/talosconfig" config endpoint "127.0.0.1:$port"
"$talosctl" --talosconfig "$dir/config/talosconfig" config node 10.0.2.15
cp "$dir/config/talosconfig" "$dir/talosconfig"

# The initramfs: the guest (busybox, runc, modules, init), the node's rootfs, the extensions'
# files over it, and the bundle. The kernel unpacks concatenated archives in order.
stage=$dir/initramfs
rm -rf "$stage" && mkdir -p "$stage/talos/rootfs"
for e in "$@"; do
	[ -d "$e/rootfs" ] || { echo "node.sh: $e has no rootfs/ (an extension image directory?)" >&2; exit 2; }
	cp -a "$e/rootfs/." "$stage/talos/rootfs/"
done
echo "$name" >"$stage/talos/hostname"
echo "$talos_volumes" >"$stage/talos/volumes"
"$here/spec.sh" "$name" "$dir/config/machine.yaml" "$cpus" "$mem" "$talos_volumes" >"$stage/talos/config.json"
cpio_of() { (cd "$1" && find . | LC_ALL=C sort | cpio --quiet -o -H newc); }
if [ ! -f "$out/guest/rootfs.cpio" ] || [ "$out/.stamp-rootfs" -nt "$out/guest/rootfs.cpio" ]; then
	mkdir -p "$out/guest/rootfs-stage/talos"
	rm -rf "$out/guest/rootfs-stage/talos/rootfs"
	cp -al "$out/rootfs" "$out/guest/rootfs-stage/talos/rootfs"
	cpio_of "$out/guest/rootfs-stage" >"$out/guest/rootfs.cpio"
fi
{ cpio_of "$out/guest/base"; cat "$out/guest/rootfs.cpio"; cpio_of "$stage"; } >"$dir/initramfs.cpio"

: >"$dir/console.log"
# qemu in the background of its own session rather than -daemonize, which sends its stderr to
# /dev/null: its messages and its exit status go to DIR/qemu.log, so a guest that is gone says
# why, there (a signal: 128+N) or on its console (the guest's kernel panicked: panic=-1 and
# -no-reboot end qemu).
rm -f "$dir/qemu.pid"
# build.sh's qemu, with the firmware of its own packages (-L; the guest boots with -kernel, so
# the network card needs no option ROM). bookworm-backports' qemu also tries the machine's 7.2
# display and audio modules, and says it cannot load them (qemu.log); it needs none.
qemu=$out/bin/qemu-system-x86_64
share=$(dirname "$(readlink -f "$qemu")")/../share
setsid bash -c '"$@"; echo "node.sh: qemu exited with status $?"' qemu \
	"$qemu" -L "$share/seabios" -L "$share/qemu" -accel "$accel" -cpu max -smp "$cpus" -m "$mem" \
	-kernel "$out/guest/vmlinuz" -initrd "$dir/initramfs.cpio" \
	-append "console=ttyS0 rdinit=/init panic=-1 quiet maxcpus=1" \
	-netdev "user,id=n0,$forwards" -device virtio-net-pci,netdev=n0,romfile= \
	-display none -serial "file:$dir/console.log" -no-reboot \
	-pidfile "$dir/qemu.pid" </dev/null >"$dir/qemu.log" 2>&1 &
for _ in $(seq 100); do
	[ -s "$dir/qemu.pid" ] && kill -0 "$(cat "$dir/qemu.pid")" 2>/dev/null && break
	grep -q "qemu exited" "$dir/qemu.log" && break
	sleep 0.1
done
if ! { [ -s "$dir/qemu.pid" ] && kill -0 "$(cat "$dir/qemu.pid")" 2>/dev/null; }; then
	echo "node.sh: qemu did not start:" >&2
	cat "$dir/qemu.log" >&2
	exit 1
fi
echo "node.sh: guest started (qemu $(cat "$dir/qemu.pid"), apid at 127.0.0.1:$port, console $dir/console.log)" >&2

wait_apid
