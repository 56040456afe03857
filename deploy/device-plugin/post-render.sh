#!/bin/sh
# Helm post-renderer: applies this directory's kustomize patches to the chart's output,
# for those who install the chart with helm rather than `kubectl apply -k deploy/`:
#
#   helm install nvidia-device-plugin <chart> --version 0.19.0 -n nvidia-gpu \
#     -f deploy/device-plugin/values.yaml --post-renderer deploy/device-plugin/post-render.sh
#
# Uses `kubectl kustomize`, or the kustomize binary named by $KUSTOMIZE.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/nvidia-device-plugin.rendered.yaml"
cp -r "$here/kustomization.yaml" "$here"/patch-*.yaml "$here/scripts" "$tmp/"
if [ -n "${KUSTOMIZE:-}" ]; then
	"$KUSTOMIZE" build "$tmp"
else
	kubectl kustomize "$tmp"
fi
