#!/bin/sh
# check-sharing: refuses a device plugin configuration whose GPU sharing the node's MIG layout
# cannot honour, with a message that says which and what to do, instead of a plugin that runs
# and advertises devices no pod can use (docs/sharing.md, "MIG and sharing").
#
#   check-sharing.sh [CONFIG [READY]]
#
# CONFIG is the plugin's configuration as the chart's config-manager wrote it from the node's
# nvidia.com/device-plugin.config label (default /config/config.yaml); READY is the
# ext-nvidia-driver service's readiness file (default
# /run/nvidia/validations/nvidia-driver.ready), whose "gpus" list each GPU's MIG mode
# ("mig": "enabled" while MIG is on; pkg/node readinessGPU). The file names no layout (its
# content is the devices alone): the node's nvidia.com/mig.config label does. Exits 0 when they agree, 1 with
# the reason on stderr when they do not. busybox sh, grep and sed only (the plugin's image).
config=${1:-/config/config.yaml}
ready=${2:-/run/nvidia/validations/nvidia-driver.ready}

[ -f "$config" ] || { echo "check-sharing: no device plugin configuration at $config" >&2; exit 1; }
[ -f "$ready" ] || { echo "check-sharing: no readiness file at $ready (is ext-nvidia-driver ready?)" >&2; exit 1; }

# The sharing section of NVIDIA's config v1 (api/config/v1/sharing.go): mps or timeSlicing.
sharing=none
grep -Eq '^[[:space:]]+timeSlicing:' "$config" && sharing=time-slicing
grep -Eq '^[[:space:]]+mps:' "$config" && sharing=mps
strategy=$(sed -n 's/^[[:space:]]*migStrategy:[[:space:]]*\([a-z]*\).*/\1/p' "$config" | head -1)
[ -n "$strategy" ] || strategy=none
# GPUs in MIG mode: "mig": "enabled" or "enabled (pending disable)".
mig_on=$(grep -c '"mig": "enabled' "$ready")

echo "check-sharing: sharing $sharing, migStrategy $strategy; $mig_on GPU(s) in MIG mode"
[ "$sharing" = none ] || [ "$mig_on" = 0 ] && exit 0

if [ "$sharing" = mps ]; then
	cat >&2 <<MSG
check-sharing: CONFLICT: this node's device plugin configuration shares GPUs through MPS, but
$mig_on GPU(s) are in MIG mode (the node's nvidia.com/mig.config label names the MIG layout). NVIDIA's device
plugin cannot share MIG devices through MPS ("sharing using MPS is not supported for MIG
devices"), and its MPS control daemon does not run on such a node (nvidia.com/mps.capable=false).
Either label the node with a configuration without MPS (nvidia.com/device-plugin.config=
time-slicing-N-single, single or mixed), or choose a MIG layout that leaves MIG off
(NVIDIA_DRIVER_MIG_LAYOUT=all-disabled). See docs/sharing.md.
MSG
	exit 1
fi
if [ "$strategy" = none ]; then
	cat >&2 <<MSG
check-sharing: CONFLICT: this node's device plugin configuration time-slices with migStrategy
none, but $mig_on GPU(s) are in MIG mode (the node's nvidia.com/mig.config label names the MIG layout). With
migStrategy none the plugin would advertise replicas of the whole GPUs, which no container can
use while MIG is on. Label the node with time-slicing-N-single (replicas of each MIG device) or
a MIG strategy without sharing (single, mixed), or leave MIG off. See docs/sharing.md.
MSG
	exit 1
fi
exit 0
