#!/usr/bin/env bash
# GPU pods from NVIDIA's device plugin on a real kubelet and containerd, on a simulated GPU
# node (hack/sim-node/sim-run.sh: 8 simulated H100s on an NVSwitch board, the extension's
# service brought them up as on a node, NVML is hack/sim-node/simnvml). Run inside
# hack/k8s-node/cluster.sh -gpu, itself run by the harness while the service is ready.
# Checks:
#   - deploy/ applied server-side; the node labelled as the docs say;
#   - the node reports nvidia.com/gpu: 8 allocatable, from NVIDIA's device plugin v0.19.0
#     (its own binary, loading the simulated NVML from the driver root);
#   - a pod asking for 2 GPUs gets exactly the device nodes of the two GPUs that kubelet
#     allocated to it (its checkpoint), through the plugin's CDI spec and containerd's CDI
#     injection, with the control nodes, and nothing of the other six;
#   - a container that containerd creates with the service's own spec (/run/cdi/nvidia.yaml,
#     nvidia.com/gpu=3) gets /dev/nvidia3 and no other GPU;
#   - a pod given one of that spec's devices by the kubelet (a device plugin's cdi_devices
#     answer: hack/k8s-node/kube/cdiplugin) gets exactly that GPU's device node; a pod's own
#     CDI annotation gets it none;
#   - the MIG pause cycle, each step timed, after its control (hack/sim-node/sim-pause.sh);
#   - deploy/sharing's time-slicing-4 chosen by the node's label: nvidia.com/gpu: 32.
# CUDA cannot run here: the device nodes are real character devices at NVIDIA's majors with
# no driver behind them (opening one fails with ENXIO). Prints PASS/FAIL lines; exits non-zero
# on a failure.
set -uo pipefail
# shellcheck source=hack/sim-node/sim-lib.sh
source "$(dirname "$0")/sim-lib.sh"

check_service_up

# --- the device plugin from deploy/
apply_deploy
wait_alloc nvidia.com/gpu 8 "MIG off, the default configuration: migStrategy none"
plugin_log device-plugin

# --- a pod asking for 2 GPUs, and one asking for none: the device nodes each sees
pod gpu-two nvidia.com/gpu 2
pod gpu-none nvidia.com/gpu 0
wait_pod gpu-two
wait_pod gpu-none
none=$(kubectl logs gpu-none 2>&1)
echo "  gpu-none: phase $(phase gpu-none); its /dev: $none"
check "gpu-none (no GPU asked) Succeeded and saw no nvidia device node" test "$(phase gpu-none)" = Succeeded -a -z "$(tr -d ' ' <<<"$none")"
seen=$(kubectl logs gpu-two 2>&1)
echo "  gpu-two: phase $(phase gpu-two); its /dev: $seen"
# The GPUs kubelet gave the pod; the simulated UUIDs end in the minor (internal/sim).
want=$(allocated gpu-two nvidia.com/gpu | while read -r u; do echo "nvidia$((16#${u: -12}))"; done | sort | tr '\n' ' ' | sed 's/ $//')
got=$(tr ' ' '\n' <<<"$seen" | grep -E '^nvidia[0-9]+$' | sort | tr '\n' ' ' | sed 's/ $//')
echo "  kubelet allocated: $want; the pod saw GPU nodes: $got"
check "gpu-two saw exactly the device nodes of its 2 GPUs ($got)" test -n "$want" -a "$got" = "$want" -a "$(wc -w <<<"$got")" = 2
check "gpu-two saw the control nodes nvidiactl, nvidia-uvm" grep -q 'nvidiactl.*nvidia-uvm\|nvidia-uvm.*nvidiactl' <<<"$seen"

# --- the service's own spec (/run/cdi/nvidia.yaml, nvidia.com/gpu=N), through containerd's CDI
# injection: for a containerd client (ctr), and for a pod through the kubelet, whose only
# way to name a CDI device is a device plugin's (or DRA driver's) answer. A pod's own CDI
# annotation reaches no container: the kubelet gives a container the device plugins'
# annotations alone (k8s.io/kubernetes v1.37.0 pkg/kubelet/kuberuntime/labels.go
# newContainerAnnotations), and containerd 2.3.5 reads CDI annotations from the container's
# CRI config only (internal/cri/opts/spec_linux.go WithCDI). The plugin that names the
# service's devices is the test's own (hack/k8s-node/kube/cdiplugin); the simulated GPUs'
# minors are their indices.
spec=/run/cdi/nvidia.yaml
if [[ -f $spec ]]; then
	out=$(ctr -n k8s.io run --rm --device nvidia.com/gpu=3 "docker.io/$img" sim-cdi /bin/sh -c 'ls /dev | grep nvidia | sort | tr "\n" " "' 2>"$K8S_NODE_DIR/logs/ctr-run.log")
	echo "  ctr run --device nvidia.com/gpu=3 (the service's $spec): its /dev: $out"
	got=$(tr ' ' '\n' <<<"$out" | grep -E '^nvidia[0-9]+$' | tr '\n' ' ' | sed 's/ $//')
	check "a container with nvidia.com/gpu=3 from the service's spec saw exactly /dev/nvidia3 ($got)" test "$got" = nvidia3

	res=test.nvidia-driver/cdi-gpu
	"$top/_out/bin/cdiplugin" -spec "$spec" -resource $res >"$K8S_NODE_DIR/logs/cdiplugin.log" 2>&1 &
	wait_alloc $res 8 "the service's spec's GPUs, named by hack/k8s-node/kube/cdiplugin"
	pod svc-cdi $res 1
	kubectl apply -f - >/dev/null 2>&1 <<EOF
apiVersion: v1
kind: Pod
metadata: {name: cdi-annotation, annotations: {cdi.k8s.io/test: nvidia.com/gpu=3}}
spec:
  restartPolicy: Never
  tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
  containers:
  - {name: work, image: $img, imagePullPolicy: Never, command: ["/bin/sh", "-c", "ls /dev | grep nvidia; true"]}
EOF
	wait_pod svc-cdi
	wait_pod cdi-annotation
	seen=$(kubectl logs svc-cdi 2>&1)
	want=$(allocated svc-cdi $res | sed 's/^/nvidia/')
	got=$(tr ' ' '\n' <<<"$seen" | grep -E '^nvidia[0-9]+$' | tr '\n' ' ' | sed 's/ $//')
	echo "  svc-cdi: phase $(phase svc-cdi); kubelet allocated $res ${want#nvidia} ($(grep -o 'cdiDevices=.*' "$K8S_NODE_DIR/logs/cdiplugin.log" | head -1)); its /dev: $seen"
	check "a pod given nvidia.com/gpu=${want#nvidia} of the service's spec by the kubelet saw exactly /dev/$want ($got)" test -n "$want" -a "$got" = "$want"
	check "svc-cdi saw the control nodes nvidiactl, nvidia-uvm" grep -q 'nvidiactl.*nvidia-uvm\|nvidia-uvm.*nvidiactl' <<<"$seen"
	ann=$(kubectl logs cdi-annotation 2>&1 | tr '\n' ' ')
	echo "  cdi-annotation (pod annotation cdi.k8s.io/test: nvidia.com/gpu=3): phase $(phase cdi-annotation); its /dev: $ann"
	check "a pod's own CDI annotation gets it no device (the kubelet does not pass it on)" test "$(phase cdi-annotation)" = Succeeded -a -z "$(tr -d ' ' <<<"$ann")"
else
	failed "the service wrote no $spec"
fi

# --- the MIG pause cycle, with its control (hack/sim-node/sim-pause.sh)
t_pause=$SECONDS
. "$here/sim-pause.sh"
echo "k8s-node-sim: the MIG pause section took $((SECONDS - t_pause)) s"

# --- time-slicing from deploy/sharing, chosen by the node's label (docs/sharing.md): the
# plugin's advertisement, 4 replicas of each of the 8 GPUs (CUDA sharing them needs a GPU).
if kubectl apply -k "$top/deploy/sharing" --server-side >/dev/null; then pass "kubectl apply -k deploy/sharing --server-side"; else failed "kubectl apply -k deploy/sharing"; fi
kubectl label node "$K8S_NODE" --overwrite nvidia.com/device-plugin.config=time-slicing-4 >/dev/null
wait_alloc nvidia.com/gpu 32 "time-slicing-4 from deploy/sharing, after the node's label changed"
exit $fail
