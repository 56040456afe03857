#!/usr/bin/env bash
# Stage the service's container root filesystem: its binary plus the loader and libc it was
# linked against. Talos has no glibc, and the service must start even when the subroot is
# missing or broken, so that it can say so: it cannot borrow the subroot's libc.
#
#   hack/dev/stage-service-rootfs.sh BINARY OUTDIR
#
# A binary of another architecture (make extension-arm64) takes its glibc from a sysroot
# and runs the target's programs under an emulator:
#   STAGE_SYSROOT=/usr/aarch64-linux-gnu (Debian's libc6-arm64-cross: the glibc it was linked with)
#   STAGE_RUN=qemu-aarch64-static        (runs the sysroot's loader for its --list)
#   STAGE_LDCONFIG="qemu-aarch64-static SUBROOT/sbin/ldconfig" (the target's ldconfig: a cache's
#                                        entries carry their architecture's flags)
set -euo pipefail
sysroot=${STAGE_SYSROOT:-}
read -r -a run <<<"${STAGE_RUN:-}"
read -r -a ldconfig <<<"${STAGE_LDCONFIG:-ldconfig}"
bin=${1:?usage: stage-service-rootfs.sh BINARY OUTDIR}
out=${2:?usage: stage-service-rootfs.sh BINARY OUTDIR}

# glibc's library directory of the binary's architecture (the release recipe builds it on
# linux/amd64 or linux/arm64)
case $(readelf -h "$bin" | sed -n 's/^ *Machine: *//p') in
  "Advanced Micro Devices X86-64") multiarch=x86_64-linux-gnu ;;
  AArch64) multiarch=aarch64-linux-gnu ;;
  *) echo "stage-service-rootfs: $bin is neither an x86-64 nor an AArch64 program" >&2; exit 1 ;;
esac

stage=$(mktemp -d "${TMPDIR:-/tmp}/service-rootfs.XXXXXX")
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/usr/bin" "$stage/lib/$multiarch" "$stage/etc"
install -m 0755 "$bin" "$stage/usr/bin/nvidia-driver"
# nvidia-persistenced's /var/run/nvidia-persistenced is compiled in; the service's /run is
# the host's (see extension/nvidia-driver.yaml).
mkdir -p "$stage/var" && ln -s ../run "$stage/var/run"
# nv-fabricmanager, run from the subroot without a chroot, still reads some files from the
# compiled-in /usr/share/nvidia/nvswitch whatever its config says (siderolabs/extensions
# nvidia-gpu/nvidia-fabricmanager/production/nvidia-fabricmanager.yaml mounts it there for
# that reason): point that path at the subroot's copy. It dangles where the subroot has none.
mkdir -p "$stage/usr/share/nvidia" && ln -s /usr/local/glibc/usr/share/nvidia/nvswitch "$stage/usr/share/nvidia/nvswitch"

interp=$(readelf -l "$bin" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
[ -n "$interp" ] || { echo "stage-service-rootfs: $bin has no ELF interpreter" >&2; exit 1; }
# at the path the binary asks for (/lib64/ld-linux-x86-64.so.2, /lib/ld-linux-aarch64.so.1)
mkdir -p "$stage$(dirname "$interp")"
cp -L "$sysroot$interp" "$stage$interp"

# Every library the binary needs, as the build machine's loader resolves it (the loader's
# --list is what ldd runs; the release build installs no ldd).
list() {
  if [ -n "$sysroot" ]; then
    "${run[@]}" "$sysroot$interp" --library-path "$sysroot/lib" --list "$1"
  else
    "$interp" --list "$1"
  fi
}
list "$bin" | awk '/=> \//{print $3}' | while read -r lib; do
  cp -L "$lib" "$stage/lib/$multiarch/"
done
# And the rest of the same glibc: the service dlopens the subroot's libnvidia-ml.so.1, which
# needs libm, libdl, libpthread and librt. They must come from the glibc of the service's own
# libc, never from the subroot's (another glibc version).
libc=$(list "$bin" | awk '/libc\.so\.6 => \//{print $3}')
for lib in libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libresolv.so.2; do
  cp -L "$(dirname "$libc")/$lib" "$stage/lib/$multiarch/"
done
echo "/lib/$multiarch" >"$stage/etc/ld.so.conf"
"${ldconfig[@]}" -r "$stage"
chmod -R go-w "$stage"
chmod 0755 "$stage"

rm -rf "$out"
mkdir -p "$(dirname "$out")"
mv "$stage" "$out"
trap - EXIT
echo "stage-service-rootfs: $out ($(du -sh "$out" | cut -f1))"
