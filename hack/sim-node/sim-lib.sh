# Shared by the simulated node's checks (test-sim.sh, test-sim-mig.sh; hack/nri/test-nri.sh,
# on the GPU host too), sourced inside
# hack/k8s-node/cluster.sh -gpu: PASS/FAIL lines, waits, the device plugin from deploy/, pods
# asking for a resource, and what the kubelet allocated to them.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
top=$(cd "$here/../.." && pwd)
check_name=k8s-node-sim
# shellcheck source=hack/k8s-node/checks.sh
source "$top/hack/k8s-node/checks.sh"
ns=nvidia-gpu
img=talos-nvidia/k8s-node-base:test

# service_status: phase, GPU count, fabric state and message of the service's status file.
service_status() {
	python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print(s["phase"], len(s.get("gpus") or []), s.get("fabric",{}).get("state",""), "|", s["message"])' /run/nvidia-driver/status.json 2>&1
}

# check_service_up: the service is up with the 8 GPUs; degraded only for want of a fabric
# manager, which cannot run without the NVSwitches' kernel driver (docs/simulated-node.md).
check_service_up() {
	local st
	st=$(service_status)
	echo "  service status: $st"
	case $st in
	"ready 8 registered |"* | "degraded 8 degraded |"*"registered with the NVLink fabric, but no fabric manager runs"*)
		pass "the service is up with 8 GPUs, the NVLink fabric registered (${st%%|*})" ;;
	*) failed "the service's status: $st" ;;
	esac
}

alloc() { # RESOURCE: the node's allocatable count of it
	jp node "$K8S_NODE" -o "jsonpath={.status.allocatable.${1//./\\.}}"
}
plugin_pod() { jp -n $ns pod -l app.kubernetes.io/name=nvidia-device-plugin -o 'jsonpath={.items[0].metadata.name}'; }
plugin_restarts() { jp -n $ns pod -l app.kubernetes.io/name=nvidia-device-plugin -o 'jsonpath={.items[0].status.containerStatuses[?(@.name=="nvidia-device-plugin-ctr")].restartCount}'; }

# apply_deploy: deploy/ applied server-side, on a node labelled as the docs say.
apply_deploy() {
	kubectl label node "$K8S_NODE" nvidia.com/gpu.present=true >/dev/null
	if kubectl apply -k "$top/deploy" --server-side >/dev/null; then pass "kubectl apply -k deploy --server-side"; else failed "kubectl apply -k deploy"; fi
}

# wait_alloc RESOURCE COUNT WHAT: the node reports COUNT of RESOURCE allocatable within 180 s
# (or the plugin restarted 3 times); the plugin's pods are described where it does not.
wait_alloc() {
	local t0=$SECONDS
	if until_true 180 "test \"\$(alloc $1)\" = $2 -o \"\$(plugin_restarts)\" -ge 3 2>/dev/null" && test "$(alloc "$1")" = "$2"; then
		pass "the node reports $1: $2 allocatable ($3, $((SECONDS - t0)) s)"
	else
		failed "$1 allocatable: '$(alloc "$1")', want $2 ($3)"
		kubectl -n $ns get pods -o wide
		for p in $(kubectl -n $ns get pods -o name); do kubectl -n $ns describe "$p" | tail -25; done
	fi
	echo "  allocatable: $(jp node "$K8S_NODE" -o 'jsonpath={.status.allocatable}')"
}

# plugin_log NAME: the plugin container's log into the node's logs, its main lines printed.
plugin_log() {
	kubectl -n $ns logs "$(plugin_pod)" -c nvidia-device-plugin-ctr >"$K8S_NODE_DIR/logs/$1.log" 2>&1
	grep -E 'Retrieved|Registered|Starting|simnvml:|rror' "$K8S_NODE_DIR/logs/$1.log" | sed 's/^/  plugin: /' | head -20
}

# pod NAME RESOURCE COUNT: a pod asking for COUNT of RESOURCE that lists the nvidia device
# nodes it sees (/dev and /dev/nvidia-caps) and exits.
pod() {
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
    command: ["/bin/sh", "-c", "{ ls /dev | grep nvidia; ls /dev/nvidia-caps 2>/dev/null | sed 's,^,nvidia-caps/,'; } | sort | tr '\\\\n' ' '; echo"]
    resources: {limits: {$2: $3}}
EOF
}
phase() { jp pod "$1" -o 'jsonpath={.status.phase}'; }
# wait_pod NAME: until it Succeeded or Failed (90 s), its events shown when it did not succeed.
wait_pod() {
	until_true 90 "case \$(phase $1) in Succeeded|Failed) true;; *) false;; esac"
	[[ $(phase "$1") == Succeeded ]] || kubectl describe pod "$1" | sed -n '/^Events:/,$p' | tail -8
}

# allocated NAME RESOURCE: the device ids the kubelet gave the pod for RESOURCE, from its
# checkpoint (pkg/kubelet/cm/devicemanager/checkpoint), one a line.
allocated() {
	python3 - "$(jp pod "$1" -o 'jsonpath={.metadata.uid}')" "$2" <<'EOF'
import json, sys
cp = json.load(open("/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"))
for e in cp["Data"]["PodDeviceEntries"] or []:
    if e["PodUID"] == sys.argv[1] and e["ResourceName"] == sys.argv[2]:
        for numa, devs in (e.get("DeviceIDs") or {}).items():
            print("\n".join(devs))
EOF
}
