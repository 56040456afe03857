#!/bin/sh
# The nvidia-driver-glibc stage's install step (stages/glibc/pkg.yaml): the glibc of the
# subroot $SUBROOT (/rootfs/usr/local/glibc) from the build root's own glibc (Wolfi, by
# digest, of the build's platform): the loader at $GLIBC_LOADER (the architecture's standard
# interpreter path: lib64/ld-linux-x86-64.so.2, lib/ld-linux-aarch64.so.1) with a link to it
# in usr/lib64, glibc's libraries and libz (nv-fabricmanager needs it) in usr/lib64, and
# glibc's static ldconfig. POSIX sh: Wolfi's /bin/sh is busybox.
set -eu
: "${SUBROOT:?SUBROOT is not set}" "${ARCH:?ARCH is not set}" "${GLIBC_LOADER:?GLIBC_LOADER is not set}"

# first existing path of a file in the image's library (or program) directories
find_in() {
  name=$1; shift
  for d in "$@"; do [ -e "$d/$name" ] && { echo "$d/$name"; return 0; }; done
  echo "glibc.sh: the build image has no $name in $*" >&2
  return 1
}
# Wolfi's (merged: /lib and /lib64 lead to /usr/lib), then a multiarch distribution's (the
# test image's) directories of the build's architecture
libdirs="/usr/lib64 /lib64 /usr/lib /lib /usr/lib/$ARCH-linux-gnu /lib/$ARCH-linux-gnu"
loader=${GLIBC_LOADER##*/}

mkdir -p "$SUBROOT/${GLIBC_LOADER%/*}" "$SUBROOT/usr/lib64" "$SUBROOT/sbin" "$SUBROOT/etc"
# (a failed $(find_in) in an argument would not stop set -e; in an assignment it does)
src=$(find_in "$loader" $libdirs)
cp -L "$src" "$SUBROOT/$GLIBC_LOADER"
ln -s "../../$GLIBC_LOADER" "$SUBROOT/usr/lib64/$loader"
for lib in libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libresolv.so.2 libz.so.1; do
  src=$(find_in $lib $libdirs)
  cp -L "$src" "$SUBROOT/usr/lib64/$lib"
done
ldconfig=$(find_in ldconfig /sbin /usr/sbin /usr/bin)
cp -L "$ldconfig" "$SUBROOT/sbin/ldconfig"
chmod 0755 "$SUBROOT/sbin/ldconfig"
