#!/bin/sh
# The nvidia-driver-glibc stage's install step (stages/glibc/pkg.yaml): the glibc of the
# subroot $SUBROOT (/rootfs/usr/local/glibc) from the build root's own glibc (Wolfi, by
# digest): the loader at the standard interpreter path, glibc's libraries and libz
# (nv-fabricmanager needs it) in usr/lib64, and glibc's static ldconfig. POSIX sh: Wolfi's
# /bin/sh is busybox.
set -eu
: "${SUBROOT:?SUBROOT is not set}"

# first existing path of a file in the image's library (or program) directories
find_in() {
  name=$1; shift
  for d in "$@"; do [ -e "$d/$name" ] && { echo "$d/$name"; return 0; }; done
  echo "glibc.sh: the build image has no $name in $*" >&2
  return 1
}
# Wolfi's, then a multiarch distribution's (the test image's) directories
libdirs="/usr/lib64 /lib64 /usr/lib /lib /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu"

mkdir -p "$SUBROOT/lib64" "$SUBROOT/usr/lib64" "$SUBROOT/sbin" "$SUBROOT/etc"
# (a failed $(find_in) in an argument would not stop set -e; in an assignment it does)
src=$(find_in ld-linux-x86-64.so.2 $libdirs)
cp -L "$src" "$SUBROOT/lib64/ld-linux-x86-64.so.2"
ln -s ../../lib64/ld-linux-x86-64.so.2 "$SUBROOT/usr/lib64/ld-linux-x86-64.so.2"
for lib in libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libresolv.so.2 libz.so.1; do
  src=$(find_in $lib $libdirs)
  cp -L "$src" "$SUBROOT/usr/lib64/$lib"
done
ldconfig=$(find_in ldconfig /sbin /usr/sbin /usr/bin)
cp -L "$ldconfig" "$SUBROOT/sbin/ldconfig"
chmod 0755 "$SUBROOT/sbin/ldconfig"
