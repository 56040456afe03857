#!/usr/bin/env bash
# Install what the Talos node (hack/talos-node, make talos-node) needs besides the tests' own
# (hack/dev/install-test-deps.sh): qemu, a Debian kernel for its guest (the v1.14.1 node's 6.12
# kernel is unpacked by hack/talos-node/build.sh, not installed), the static busybox its init
# runs (no libraries in the guest), cpio, kmod and xz for the guest's initramfs. Part of
# make deps: make test runs the node (make test-talos-node).
# Idempotent; quiet when everything is present.
set -euo pipefail
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
compgen -G '/boot/vmlinuz-*' >/dev/null || need+=(linux-image-amd64)
{ [ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1; } || need+=(busybox-static)
command -v cpio >/dev/null || need+=(cpio)
command -v modprobe >/dev/null || need+=(kmod)
command -v xz >/dev/null || need+=(xz-utils)
exec "$(dirname "$0")/../dev/install-test-deps.sh" "${need[@]}"
