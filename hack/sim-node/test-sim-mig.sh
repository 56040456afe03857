#!/usr/bin/env bash
# MIG devices from NVIDIA's device plugin on a real kubelet and containerd, on the simulated
# GPU node (hack/sim-node/sim-run.sh's second run: the service applied the MIG layout
# SIM_MIG_LAYOUT, default all-1g, from its ExtensionServiceConfig, on 8 simulated H100s).
# Run inside hack/k8s-node/cluster.sh -gpu, itself run by the harness while the service is up.
# The expected values come from NVML and the kernel's files, not from the plugin or the
# service: the MIG devices NVML reports (hack/sim-node/simnvml/migls: go-nvml and go-nvlib, the
# plugin's own libraries, on the driver root's libnvidia-ml) and the capability minors of
# /proc/driver/nvidia-caps/mig-minors (as kernel-open/nvidia/nv-caps.c lists them; the
# simulated driver's file, which hack/sim-node/simnvml/prochook shows in every container's /proc).
# Checks:
#   - the service is up with the layout applied;
#   - migStrategy mixed (node label nvidia.com/device-plugin.config=mixed, deploy/'s named
#     configurations): the node reports nvidia.com/mig-<profile>: N for every profile NVML
#     reports, N its count, and no whole GPU;
#   - a pod asking for one nvidia.com/mig-<profile> sees exactly the device nodes of the MIG
#     device kubelet allocated to it: its parent GPU /dev/nvidia<minor> and the capability
#     nodes /dev/nvidia-caps/nvidia-cap<m> of its GPU and compute instances, besides the
#     control nodes;
#   - migStrategy single (the label changed; the chart's config-manager restarts the plugin):
#     nvidia.com/gpu: N for all N MIG devices, and a pod asking for one nvidia.com/gpu sees
#     the same kind of nodes for its MIG device.
# Prints PASS/FAIL lines; exits non-zero on a failure.
set -uo pipefail
# shellcheck source=hack/sim-node/sim-lib.sh
source "$(dirname "$0")/sim-lib.sh"
layout=${SIM_MIG_LAYOUT:-all-1g}
minors=/run/nvidia/sim/proc/driver/nvidia-caps/mig-minors

check_service_up
check "the service's status names the MIG layout $layout" grep -q "\"$layout\"" <<<"$(service_status)"

# --- what NVML reports
migs=$K8S_NODE_DIR/logs/migls.txt
"$top/_out/bin/simnvml-migls" -lib /run/nvidia/driver/usr/lib64/libnvidia-ml.so.1 >"$migs" 2>&1
total=$(wc -l <"$migs")
profiles=$(awk '{print $2}' "$migs" | sort | uniq -c | awk '{print $2 ":" $1}' | tr '\n' ' ')
echo "  NVML reports $total MIG devices: $profiles"
check "NVML reports MIG devices on every GPU" test "$(awk '{print $3}' "$migs" | sort -u | wc -l)" = 8

# mig_pod NAME RESOURCE: the pod saw exactly the nodes of the one MIG device allocated to it.
mig_pod() {
	local seen uuid line minor gi ci capgi capci want got
	wait_pod "$1"
	seen=$(kubectl logs "$1" 2>&1)
	echo "  $1: phase $(phase "$1"); its /dev: $seen"
	uuid=$(allocated "$1" "$2")
	line=$(grep -F "$uuid " "$migs")
	read -r _ _ minor gi ci <<<"$line"
	capgi=$(awk -v k="gpu$minor/gi$gi/access" '$1 == k {print $2}' "$minors")
	capci=$(awk -v k="gpu$minor/gi$gi/ci$ci/access" '$1 == k {print $2}' "$minors")
	want=$(printf '%s\n' "nvidia$minor" "nvidia-caps/nvidia-cap$capgi" "nvidia-caps/nvidia-cap$capci" | sort | tr '\n' ' ' | sed 's/ $//')
	got=$(tr ' ' '\n' <<<"$seen" | grep -E '^nvidia[0-9]+$|^nvidia-caps/' | sort | tr '\n' ' ' | sed 's/ $//')
	echo "  kubelet allocated $2 $uuid: GPU minor ${minor:-?}, GI ${gi:-?}, CI ${ci:-?} (mig-minors: gi ${capgi:-?}, ci ${capci:-?}); the pod saw: $got"
	check "$1 saw exactly its MIG device's parent GPU and capability nodes ($got)" test -n "$uuid" -a -n "$line" -a -n "$capgi" -a -n "$capci" -a "$got" = "$want"
	check "$1 saw the control nodes nvidiactl, nvidia-uvm" grep -q 'nvidiactl.*nvidia-uvm\|nvidia-uvm.*nvidiactl' <<<"$seen"
}

# --- migStrategy mixed
kubectl label node "$K8S_NODE" nvidia.com/device-plugin.config=mixed >/dev/null
apply_deploy
for pc in $profiles; do
	wait_alloc "nvidia.com/mig-${pc%%:*}" "${pc##*:}" "migStrategy mixed"
done
check "with every GPU in MIG mode, mixed advertises no whole GPU (nvidia.com/gpu: '$(alloc nvidia.com/gpu)')" test "$(alloc nvidia.com/gpu)" = "" -o "$(alloc nvidia.com/gpu)" = 0
plugin_log device-plugin-mixed
first=$(awk 'NR == 1 {print $2}' "$migs")
pod mig-mixed "nvidia.com/mig-$first" 1
mig_pod mig-mixed "nvidia.com/mig-$first"

# --- migStrategy single: all MIG devices of one profile are nvidia.com/gpu
if [[ $(wc -w <<<"$profiles") == 1 ]]; then
	kubectl label node "$K8S_NODE" --overwrite nvidia.com/device-plugin.config=single >/dev/null
	wait_alloc nvidia.com/gpu "$total" "migStrategy single, after the node's label changed"
	plugin_log device-plugin-single
	pod mig-single nvidia.com/gpu 1
	mig_pod mig-single nvidia.com/gpu
else
	failed "migStrategy single needs one MIG profile on every GPU; layout $layout has $profiles"
fi
exit $fail
