#!/usr/bin/env bash
# Install what the tests need on a fresh Debian machine: runc (container tests), util-linux
# (unshare), binutils (readelf), and the tools for the rest (dpkg-deb, apt-get already there);
# for the Kubernetes test node (hack/k8s-node): libseccomp's static library (a static runc);
# for arm64, the cross compiler, arm64 glibc and qemu-user.
# The Talos node's (make talos-node) are in hack/talos-node/install-deps.sh, which passes
# the packages it lacks as arguments: they are installed with these.
# Idempotent; quiet when everything is present.
set -euo pipefail
need=("$@")
command -v runc >/dev/null || need+=(runc)
command -v unshare >/dev/null || need+=(util-linux)
command -v readelf >/dev/null || need+=(binutils)
command -v findmnt >/dev/null || need+=(util-linux)
[ -e /usr/lib/x86_64-linux-gnu/libseccomp.a ] || need+=(libseccomp-dev)
# arm64 (make test-arm64): Debian's cross compiler and glibc for cgo, qemu-user to run the tests
command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu)
[ -e /usr/aarch64-linux-gnu/lib/libc.so ] || need+=(libc6-dev-arm64-cross)
command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
command -v file >/dev/null || need+=(file)
if [ ${#need[@]} -gt 0 ]; then
  echo "install-test-deps: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  log=$(mktemp)
  if ! { apt-get update -q && apt-get install -y -q --no-install-recommends "${need[@]}"; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "install-test-deps: apt-get failed" >&2
    exit 1
  fi
  rm -f "$log"
fi
