#!/usr/bin/env bash
# Run siderolabs' own extension validator (github.com/siderolabs/extensions-validator, the
# /extensions-validator of siderolabs' base stage) against every flavor's manifest and
# rendered tree, for every platform (linux/amd64, linux/arm64) and Talos release of the
# recipes (hack/release/render-flavors), as the flavors' test step runs it:
# `validate --rootfs=DIR --pkg-name=<flavor>`. Then, as a control, against the same tree
# with the exact constraint "= <release>", which this validator must reject (it checks
# against the Talos version of its own machinery). The validator runs on this machine: the
# arm64 trees are the arm64 build's manifests over this machine's rootfs.
#
#   hack/release/siderolabs-validator.sh VALIDATOR_CHECKOUT [TALOS_CHECKOUT]
#
# VALIDATOR_CHECKOUT: a checkout of siderolabs/extensions-validator at the commit the base
# stage's image is tagged with (84cecb0 for Talos 1.13); the module proxy does not serve it.
# TALOS_CHECKOUT: a checkout of siderolabs/talos at the machinery commit its go.mod pins
# (a pseudo-version, v1.13.0-alpha.2.0.20260405070107-79fa2e300108 at 84cecb0), used through
# a replace in a temporary go.mod when the proxy cannot serve that version. Needs make build's
# outputs (_out). Exits non-zero when any flavor fails or the control passes.
set -euo pipefail
src=${1:?usage: siderolabs-validator.sh VALIDATOR_CHECKOUT [TALOS_CHECKOUT]}
talos=${2:-}
top=$(cd "$(dirname "$0")/../.." && pwd)
src=$(cd "$src" && pwd)

work=$(mktemp -d "${TMPDIR:-/tmp}/siderolabs-validator.XXXXXX")
trap 'rm -rf "$work"' EXIT
bin=$work/extensions-validator

commit=$(git -C "$src" rev-parse HEAD 2>/dev/null || echo unknown)
# from go.mod's text: go list would try to download it
machinery=$(awk '$1 == "github.com/siderolabs/talos/pkg/machinery" {print $2; exit}' "$src/go.mod")
[ -n "$machinery" ] || { echo "siderolabs-validator: $src/go.mod requires no machinery module" >&2; exit 1; }
echo "extensions-validator $commit, machinery $machinery"

if ! (cd "$src" && go mod download github.com/siderolabs/talos/pkg/machinery >/dev/null 2>&1); then
  [ -n "$talos" ] || { echo "siderolabs-validator: the module proxy does not serve machinery $machinery: pass a siderolabs/talos checkout at its commit" >&2; exit 1; }
  want=${machinery##*-}
  have=$(git -C "$talos" rev-parse HEAD)
  case "$have" in
    "$want"*) ;;
    *) echo "siderolabs-validator: $talos is at $have, the validator pins machinery commit $want" >&2; exit 1 ;;
  esac
  cp "$src/go.mod" "$work/go.mod"
  cp "$src/go.sum" "$work/go.sum"
  (cd "$src" && go mod edit -modfile="$work/go.mod" -replace "github.com/siderolabs/talos/pkg/machinery=$(cd "$talos" && pwd)/pkg/machinery")
  echo "machinery from $talos/pkg/machinery ($have)"
  (cd "$src" && GOFLAGS=-mod=mod go build -modfile="$work/go.mod" -o "$bin" ./cmd/extensions-validator)
else
  (cd "$src" && go build -o "$bin" ./cmd/extensions-validator)
fi

(cd "$top" && go run ./hack/release/render-flavors -out "$top/_out" -dir "$work/trees") >"$work/trees.tsv"

fail=0
while IFS=$'\t' read -r dir flavor release constraint platform; do
  id="$platform $release $flavor"
  if out=$("$bin" validate --rootfs="$dir" --pkg-name="$flavor" 2>&1); then
    echo "PASS $id (talos: \"$constraint\")${out:+: $out}"
  else
    echo "FAIL $id (talos: \"$constraint\"): $out"
    fail=1
  fi
  # the control: the exact constraint must fail this validator, else the range is not needed
  sed -i "s/version: \"$constraint\"/version: \"= $release\"/" "$dir/manifest.yaml"
  grep -q "version: \"= $release\"" "$dir/manifest.yaml" || { echo "FAIL $id: control: could not rewrite the constraint"; fail=1; continue; }
  if out=$("$bin" validate --rootfs="$dir" --pkg-name="$flavor" 2>&1); then
    echo "FAIL $id: control \"= $release\" passed: the validator no longer checks against a prerelease"
    fail=1
  else
    echo "ok   $id: control \"= $release\" rejected: $(grep -m1 . <<<"$out")"
  fi
done <"$work/trees.tsv"

[ -s "$work/trees.tsv" ] || { echo "siderolabs-validator: no flavors rendered" >&2; exit 1; }
# every platform's trees, each as many as the other's
counts=$(cut -f5 "$work/trees.tsv" | sort | uniq -c | awk '{print $1}' | sort -u | wc -l)
platforms=$(cut -f5 "$work/trees.tsv" | sort -u | tr '\n' ' ')
if [ "$platforms" != "linux/amd64 linux/arm64 " ] || [ "$counts" -ne 1 ]; then
  echo "FAIL trees of the platforms ${platforms}: want linux/amd64 and linux/arm64, as many of each"
  fail=1
fi
if [ "$fail" -ne 0 ]; then
  echo "siderolabs-validator: FAILED"
  exit 1
fi
echo "siderolabs-validator: PASS ($(wc -l <"$work/trees.tsv") flavor trees: ${platforms% })"
