#!/usr/bin/env bash
# Run bldr's own loaders on this repository's recipe tree: both the one `bldr validate`
# uses and the BuildKit frontend's, then resolve every package as a build target. bldr's
# loaders are internal packages of github.com/siderolabs/bldr, and the module proxy does not
# serve that module, so this builds hack/bldr-check/main.go inside a bldr checkout you give
# (the release the Pkgfile's "# syntax" line names), on a copy of the tracked files.
#
#   git clone -b v0.6.2 https://github.com/siderolabs/bldr /tmp/bldr
#   hack/bldr-check.sh /tmp/bldr [TALOS_VERSION=v1.13.5 ...]
set -euo pipefail
src=${1:?usage: bldr-check.sh BLDR_CHECKOUT [BUILD_ARG=VALUE ...]}
shift
top=$(cd "$(dirname "$0")/.." && pwd)
[ -f "$src/internal/pkg/solver/filesystem_loader.go" ] || { echo "bldr-check: $src is not a bldr checkout" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/bldr-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
cp -a "$src/." "$work/bldr"
mkdir -p "$work/bldr/cmd/nvidia-driver-check" "$work/tree"
sed '/^\/\/go:build ignore$/d' "$top/hack/bldr-check/main.go" >"$work/bldr/cmd/nvidia-driver-check/main.go"
(cd "$work/bldr" && go build -o "$work/check" ./cmd/nvidia-driver-check)
(cd "$top" && git ls-files -z | tar --null -T - -cf -) | tar -xf - -C "$work/tree"
"$work/check" "$work/tree" "$@" 2> >(grep -v '^\[loader\]\|loaded \|attached template' >&2)
