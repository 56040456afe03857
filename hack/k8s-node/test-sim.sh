#!/usr/bin/env bash
# GPU pods from NVIDIA's device plugin on a real kubelet and containerd, on a simulated GPU
# node (hack/k8s-node/sim-run.sh: 8 simulated H100s on an NVSwitch board, the extension's
# service brought them up as on a node, NVML is hack/simnvml). Run inside
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
#   - the MIG pause cycle, each step timed, after its control (hack/k8s-node/sim-pause.sh).
# CUDA cannot run here: the device nodes are real character devices at NVIDIA's majors with
# no driver behind them (opening one fails with ENXIO). Prints PASS/FAIL lines; exits non-zero
# on a failure.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
fail=0
pass() { echo "k8s-node-sim: $*: PASS"; }
failed() { echo "k8s-node-sim: $*: FAIL"; fail=1; }
check() { local what=$1; shift; if "$@"; then pass "$what"; else failed "$what"; fi; }
until_true() { # SECONDS 'SHELL CONDITION': evaluate the condition until it holds
	local end=$((SECONDS + $1))
	until eval "$2" >/dev/null 2>&1; do ((SECONDS < end)) || return 1; sleep 0.5; done
}
jp() { kubectl get "$@" 2>/dev/null; }
ns=nvidia-gpu
img=talos-nvidia/k8s-node-base:test

# --- the service: up with the 8 GPUs; degraded only for want of a fabric manager, which a
# machine without NVSwitches cannot run (nv-fabricmanager talks to the switches' driver)
st=$(python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print(s["phase"], len(s.get("gpus") or []), s.get("fabric",{}).get("state",""), "|", s["message"])' /run/nvidia-driver/status.json 2>&1)
echo "  service status: $st"
case $st in
"ready 8 registered |"* | "degraded 8 degraded |"*"registered with the NVLink fabric, but no fabric manager runs"*)
	pass "the service is up with 8 GPUs, the NVLink fabric registered (${st%%|*})" ;;
*) failed "the service's status: $st" ;;
esac

# --- the device plugin from deploy/
kubectl label node "$K8S_NODE" nvidia.com/gpu.present=true >/dev/null
if kubectl apply -k "$top/deploy" --server-side >/dev/null; then pass "kubectl apply -k deploy --server-side"; else failed "kubectl apply -k deploy"; fi
alloc() { jp node "$K8S_NODE" -o 'jsonpath={.status.allocatable.nvidia\.com/gpu}'; }
plugin_restarts() { jp -n $ns pod -l app.kubernetes.io/name=nvidia-device-plugin -o 'jsonpath={.items[0].status.containerStatuses[?(@.name=="nvidia-device-plugin-ctr")].restartCount}'; }
t0=$SECONDS
if until_true 180 'test "$(alloc)" = 8 -o "$(plugin_restarts)" -ge 3 2>/dev/null' && test "$(alloc)" = 8; then
	pass "the node reports nvidia.com/gpu: 8 allocatable ($((SECONDS - t0)) s after apply)"
else
	failed "nvidia.com/gpu allocatable: '$(alloc)'"
	kubectl -n $ns get pods -o wide
	for p in $(kubectl -n $ns get pods -o name); do kubectl -n $ns describe "$p" | tail -25; done
fi
echo "  allocatable: $(jp node "$K8S_NODE" -o 'jsonpath={.status.allocatable}')"
plugin=$(jp -n $ns pod -l app.kubernetes.io/name=nvidia-device-plugin -o 'jsonpath={.items[0].metadata.name}')
kubectl -n $ns logs "$plugin" -c nvidia-device-plugin-ctr >"$K8S_NODE_DIR/logs/device-plugin.log" 2>&1
grep -E 'Retrieved|Registered|Starting|simnvml:' "$K8S_NODE_DIR/logs/device-plugin.log" | sed 's/^/  plugin: /' | head -20

# --- a pod asking for 2 GPUs, and one asking for none: the device nodes each sees
pod() { # NAME GPUS
	kubectl apply -f - 2>&1 >/dev/null <<EOF | grep -v '^Warning: would violate PodSecurity'
apiVersion: v1
kind: Pod
metadata: {name: $1}
spec:
  restartPolicy: Never
  tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
  containers:
  - name: work
    image: $img
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "ls /dev | grep nvidia | sort | tr '\\\\n' ' '; echo"]
    resources: {limits: {nvidia.com/gpu: $2}}
EOF
}
phase() { jp pod "$1" -o 'jsonpath={.status.phase}'; }
pod gpu-two 2
pod gpu-none 0
until_true 90 'case $(phase gpu-two) in Succeeded|Failed) true;; *) false;; esac'
until_true 60 'case $(phase gpu-none) in Succeeded|Failed) true;; *) false;; esac'
none=$(kubectl logs gpu-none 2>&1)
echo "  gpu-none: phase $(phase gpu-none); its /dev: $none"
check "gpu-none (no GPU asked) Succeeded and saw no nvidia device node" test "$(phase gpu-none)" = Succeeded -a -z "$(tr -d ' ' <<<"$none")"
seen=$(kubectl logs gpu-two 2>&1)
echo "  gpu-two: phase $(phase gpu-two); its /dev: $seen"
[[ $(phase gpu-two) == Succeeded ]] || kubectl describe pod gpu-two | sed -n '/^Events:/,$p' | tail -8
# The GPUs kubelet gave the pod, from its checkpoint; the simulated UUIDs end in the minor.
uid=$(jp pod gpu-two -o 'jsonpath={.metadata.uid}')
want=$(python3 - "$uid" <<'EOF'
import json, sys
cp = json.load(open("/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"))
ids = []
for e in cp["Data"]["PodDeviceEntries"] or []:
    if e["PodUID"] == sys.argv[1] and e["ResourceName"] == "nvidia.com/gpu":
        for numa, devs in (e.get("DeviceIDs") or {}).items():
            ids += devs
print(" ".join(sorted("nvidia%d" % int(u[-12:], 16) for u in ids)))
EOF
)
got=$(tr ' ' '\n' <<<"$seen" | grep -E '^nvidia[0-9]+$' | sort | tr '\n' ' ' | sed 's/ $//')
echo "  kubelet allocated: $want; the pod saw GPU nodes: $got"
check "gpu-two saw exactly the device nodes of its 2 GPUs ($got)" test -n "$want" -a "$got" = "$want" -a "$(wc -w <<<"$got")" = 2
check "gpu-two saw the control nodes nvidiactl, nvidia-uvm" grep -q 'nvidiactl.*nvidia-uvm\|nvidia-uvm.*nvidiactl' <<<"$seen"

# --- the service's own spec, through containerd's CDI injection
spec=/run/cdi/nvidia.yaml
if [[ -f $spec ]]; then
	out=$(ctr -n k8s.io run --rm --device nvidia.com/gpu=3 "docker.io/$img" sim-cdi /bin/sh -c 'ls /dev | grep nvidia | sort | tr "\n" " "' 2>"$K8S_NODE_DIR/logs/ctr-run.log")
	echo "  ctr run --device nvidia.com/gpu=3 (the service's $spec): its /dev: $out"
	got=$(tr ' ' '\n' <<<"$out" | grep -E '^nvidia[0-9]+$' | tr '\n' ' ' | sed 's/ $//')
	check "a container with nvidia.com/gpu=3 from the service's spec saw exactly /dev/nvidia3 ($got)" test "$got" = nvidia3
else
	failed "the service wrote no $spec"
fi

# --- the MIG pause cycle, with its control (hack/k8s-node/sim-pause.sh)
t_pause=$SECONDS
. "$here/sim-pause.sh"
echo "k8s-node-sim: the MIG pause section took $((SECONDS - t_pause)) s"
exit $fail
