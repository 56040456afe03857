#!/usr/bin/env bash
# The nvidia-driver-binaries stage's install step (pkg.yaml), run from the repository root
# after `make binaries OUT=OUT`: every extension service of extension/*.yaml with its
# container root filesystem (OUT/containers/<name>, which make binaries stages), the CDI
# hook, the rootfs overlay; and the project's validator (static; not part of any image) in
# TOOLS/bin for the flavors' test steps.
#
#   stages/scripts/binaries-install.sh OUT ROOTFS TOOLS
set -euo pipefail
out=${1:?usage: binaries-install.sh OUT ROOTFS TOOLS}
rootfs=${2:?usage: binaries-install.sh OUT ROOTFS TOOLS}
tools=${3:?usage: binaries-install.sh OUT ROOTFS TOOLS}

mkdir -p "$rootfs/usr/local/lib/containers" "$rootfs/usr/local/etc/containers" "$rootfs/usr/bin"
n=0
for spec in extension/*.yaml; do
  [ -e "$spec" ] || break
  name=$(basename "$spec" .yaml)
  # Talos runs each /usr/local/etc/containers/<name>.yaml in /usr/local/lib/containers/<name>/
  [ -d "$out/containers/$name" ] || { echo "binaries-install: $spec has no container rootfs $out/containers/$name (make binaries stages it)" >&2; exit 1; }
  cp -a "$out/containers/$name" "$rootfs/usr/local/lib/containers/"
  install -m 0644 "$spec" "$rootfs/usr/local/etc/containers/$name.yaml"
  n=$((n + 1))
done
[ "$n" -gt 0 ] || { echo "binaries-install: no extension/*.yaml service" >&2; exit 1; }
install -m 0755 "$out/bin/nvidia-cdi-hook" "$rootfs/usr/bin/nvidia-cdi-hook"
cp -a extension/rootfs/. "$rootfs/"
chmod -R go-w "$rootfs"
install -D -m 0755 "$out/bin/extension" "$tools/bin/extension"
