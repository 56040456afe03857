#!/usr/bin/env bash
# Assemble a Talos-shaped glibc subroot: a self-contained FHS tree holding the NVIDIA
# userspace driver, its glibc and a static ldconfig. The layout is what pkg.yaml makes from
# NVIDIA's installer and what pkg/driverroot checks:
#
#   lib64/ld-linux-x86-64.so.2   the glibc loader at the architecture's standard interpreter
#                                path (lib/ld-linux-aarch64.so.1 on arm64)
#   usr/lib64/                   glibc and NVIDIA libraries: a directory that the GPU Operator
#                                validator, the device plugin and nvcdi all search (/usr/lib is
#                                in none of their lists)
#   usr/bin/                     nvidia-smi, nvidia-persistenced (and the rest of NVIDIA's tools)
#   sbin/ldconfig                a static ldconfig
#   etc/ld.so.conf, etc/ld.so.cache   the cache made with `ldconfig -r`
#   run/nvidia-persistenced/     empty: the daemon's socket directory is bind-mounted here
#   run/nvidia-fabricmanager/    empty: likewise for nvidia-fabricmanager
#   dev/                         empty: the service binds the host's /dev here (docs/driver-root.md)
#
# Usage:
#   hack/dev/build-subroot.sh debian OUTDIR        from Debian's non-free packages (tests, demo)
#   hack/dev/build-subroot.sh host OUTDIR [TREE]   from an installed driver tree (default /usr/local/nvidia)
#
# Debian mode keeps its downloads in .cache/ (CACHE_DIR) and needs apt-get and dpkg-deb.
# SUBROOT_ARCH=arm64 assembles the arm64 subroot from Debian's arm64 packages (without
# adding the architecture to the machine's dpkg); its ldconfig runs under qemu-aarch64-static
# on another machine.
set -euo pipefail

mode=${1:?usage: build-subroot.sh debian|host OUTDIR [TREE]}
out=${2:?usage: build-subroot.sh debian|host OUTDIR [TREE]}
top=$(cd "$(dirname "$0")/../.." && pwd)
cache=${CACHE_DIR:-$top/.cache}
arch=${SUBROOT_ARCH:-amd64}
case $arch in
  # Debian's multiarch triplet, the loader at its standard interpreter path (pkg/driverroot
  # layout_<arch>.go), and how this machine runs the subroot's static ldconfig
  amd64) triplet=x86_64-linux-gnu loader=lib64/ld-linux-x86-64.so.2 ;;
  arm64) triplet=aarch64-linux-gnu loader=lib/ld-linux-aarch64.so.1 ;;
  *) echo "build-subroot: SUBROOT_ARCH=$arch: want amd64 or arm64" >&2; exit 2 ;;
esac
run_native=()
if [ "$arch" = arm64 ] && [ "$(uname -m)" != aarch64 ]; then
  command -v qemu-aarch64-static >/dev/null || { echo "build-subroot: an arm64 subroot on $(uname -m) needs qemu-aarch64-static (Debian's qemu-user-static)" >&2; exit 1; }
  run_native=(qemu-aarch64-static)
fi
# amd64 keeps the cache directories it always had
suffix=; [ "$arch" = amd64 ] || suffix=-$arch

# Packages of the development subroot: NVIDIA's userspace from non-free/contrib, glibc, and
# what nvidia-persistenced links against (libtirpc and its Kerberos chain).
debian_packages=(
  libc6 libc-bin
  libnvidia-ml1 nvidia-smi libcuda1 libnvidia-cfg1 libnvidia-ptxjitcompiler1 nvidia-persistenced
  libtirpc3 libgssapi-krb5-2 libkrb5-3 libk5crypto3 libcom-err2 libkrb5support0 libkeyutils1
)

log() { echo "build-subroot: $*" >&2; }

# apt_sources writes the project's own sources file: the machine's Debian sources with the
# contrib and non-free components added, so nothing on the machine itself is changed.
apt_sources() {
  local dir=$1 src
  mkdir -p "$dir/sources.list.d"
  : >"$dir/sources.list.d/nvidia-driver.sources"
  for src in /etc/apt/sources.list.d/*.sources; do
    [ -f "$src" ] || continue
    grep -q debian "$src" || continue
    sed -E 's/^(Components:).*/\1 main contrib non-free non-free-firmware/' "$src" \
      >>"$dir/sources.list.d/nvidia-driver.sources"
    echo >>"$dir/sources.list.d/nvidia-driver.sources"
  done
  if [ -f /etc/apt/sources.list ]; then
    grep -E '^deb .*debian' /etc/apt/sources.list |
      sed -E 's/ main( .*)?$/ main contrib non-free non-free-firmware/' >"$dir/sources.list.d/nvidia-driver.list" || true
  fi
  if ! grep -q . "$dir"/sources.list.d/*; then
    log "no Debian apt sources found in /etc/apt: cannot fetch the NVIDIA packages"
    exit 1
  fi
}

fetch_debian() {
  local apt=$cache/apt$suffix debs=$cache/debs$suffix
  mkdir -p "$apt/lists/partial" "$apt/archives/partial" "$debs"
  apt_sources "$apt"
  local opts=(-q -o "Dir::Etc::sourcelist=/dev/null" -o "Dir::Etc::sourceparts=$apt/sources.list.d"
    -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt" -o "APT::Sandbox::User=root"
    -o "APT::Architecture=$arch" -o "APT::Architectures=$arch")
  # Refresh the index at most once a day: the downloads are what the tests pin to.
  if [ -z "$(find "$apt/lists" -maxdepth 1 -name '*Packages*' -mtime -1 2>/dev/null | head -1)" ]; then
    log "updating the apt index (contrib, non-free) in $apt"
    apt-get "${opts[@]}" update >&2
  fi
  local missing=()
  for p in "${debian_packages[@]}"; do
    compgen -G "$debs/${p}_*.deb" >/dev/null || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "downloading ${missing[*]}"
    (cd "$debs" && apt-get "${opts[@]}" download "${missing[@]}" >&2)
  fi
  DEBS=$debs
}

# first_match prints the first existing path of a glob, or fails naming it.
first_match() {
  local f
  for f in "$@"; do [ -e "$f" ] && { echo "$f"; return 0; }; done
  log "not found: $*"
  return 1
}

assemble_debian() {
  local stage=$1
  fetch_debian
  for p in "${debian_packages[@]}"; do
    dpkg-deb -x "$(first_match "$DEBS/${p}"_*.deb)" "$stage/pkgs"
  done
  local multi=$stage/pkgs/lib/$triplet nv=$stage/pkgs/usr/lib/$triplet/nvidia/current
  cp -a "$(first_match "$multi/${loader##*/}")" "$stage/root/$loader"
  cp -a "$multi"/lib*.so* "$stage/root/usr/lib64/"
  cp -a "$stage"/pkgs/usr/lib/$triplet/lib*.so* "$stage/root/usr/lib64/" 2>/dev/null || true
  cp -a "$nv"/lib*.so* "$stage/root/usr/lib64/"
  cp -a "$stage/pkgs/usr/lib/nvidia/current/nvidia-smi" "$stage/root/usr/bin/"
  cp -a "$stage/pkgs/usr/bin/nvidia-persistenced" "$stage/root/usr/bin/"
  cp -a "$stage/pkgs/sbin/ldconfig" "$stage/root/sbin/ldconfig"
  echo "debian $(dpkg-deb -f "$(first_match "$DEBS"/libnvidia-ml1_*.deb)" Version) $arch" >"$stage/root/usr/share/nvidia-driver/source"
}

assemble_host() {
  local stage=$1 tree=${2:-/usr/local/nvidia}
  [ "$arch" = amd64 ] || { log "host mode assembles the machine's own (amd64) driver tree only"; exit 2; }
  [ -d "$tree" ] || { log "driver tree $tree does not exist"; exit 1; }
  local loader
  loader=$(find "$tree/glibc" -name 'ld-linux-x86-64.so.2' | head -1)
  [ -n "$loader" ] || { log "no glibc loader (ld-linux-x86-64.so.2) under $tree/glibc"; exit 1; }
  cp -L "$loader" "$stage/root/lib64/ld-linux-x86-64.so.2"
  # glibc first, then the driver's libraries: the driver's own copies win on a name clash.
  find "$tree/glibc" \( -type f -o -type l \) -name '*.so*' -exec cp -a {} "$stage/root/usr/lib64/" \;
  cp -a "$tree"/lib64/*.so* "$stage/root/usr/lib64/"
  cp -a "$tree"/bin/. "$stage/root/usr/bin/"
  # NVIDIA's installer has no ldconfig; take the static one staged by `make build`.
  local ldc=${LDCONFIG:-$top/_out/bin/ldconfig}
  [ -x "$ldc" ] || { log "no static ldconfig at $ldc (run make build, or set LDCONFIG)"; exit 1; }
  cp "$ldc" "$stage/root/sbin/ldconfig"
  echo "host $tree" >"$stage/root/usr/share/nvidia-driver/source"
}

stage=$(mktemp -d "${TMPDIR:-/tmp}/subroot.XXXXXX")
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/root"/{"${loader%/*}",usr/lib64,usr/bin,sbin,etc,run/nvidia-persistenced,run/nvidia-fabricmanager,dev,usr/share/nvidia-driver}

case $mode in
  debian) assemble_debian "$stage" ;;
  host) assemble_host "$stage" "${3:-}" ;;
  *) log "unknown mode $mode (want debian or host)"; exit 2 ;;
esac

root=$stage/root
ln -sf "../../$loader" "$root/usr/lib64/${loader##*/}" 2>/dev/null || true
echo /usr/lib64 >"$root/etc/ld.so.conf"
# -X: keep the symlinks the packages made; the cache is what consumers read. The subroot's
# own ldconfig writes it: the cache's flags name its architecture (ld.so ignores entries of
# another).
"${run_native[@]}" "$root/sbin/ldconfig" -X -r "$root" -f /etc/ld.so.conf -C /etc/ld.so.cache
chmod -R go-w "$root"

# Replace the output whole: a reader never sees a half-built subroot.
mkdir -p "$(dirname "$out")"
rm -rf "$out.new"
mv "$root" "$out.new"
rm -rf "$out"
mv "$out.new" "$out"
log "subroot ready at $out ($(cat "$out/usr/share/nvidia-driver/source"))"
