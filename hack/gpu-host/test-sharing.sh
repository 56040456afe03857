#!/usr/bin/env bash
# GPU sharing with NVIDIA's device plugin on a real Kubernetes node, on a host where the
# extension's service has brought the GPU up (run inside hack/k8s-node/cluster.sh -gpu by
# hack/gpu-host/gpu-run.sh, as hack/gpu-host/gpu-sharing.sh does), with deploy/sharing as a
# user applies it and the configuration chosen by the node's label (docs/sharing.md):
#   - time-slicing-4: the node reports nvidia.com/gpu: 4 allocatable; four CUDA pods run at
#     once on the one GPU, each checking its own memory on the GPU; one of them allocates
#     80 GiB more, which time-slicing does not stop (no memory isolation);
#   - mps-2: the MPS control daemon (the chart's, patched for the driver root) starts on the
#     node labelled nvidia.com/mps.capable=true by the service's NFD file; the node reports
#     nvidia.com/gpu: 2; two CUDA pods are clients of its one MPS server at once; each sees the
#     limit of half the GPU's memory; the one that then allocates 80 GiB (past the limit) fails,
#     the other keeps running and succeeds;
#   - times: label -> allocatable, pod created -> Running, for each mode.
# Leaves the node as it found it: the label back to none, which stops the MPS daemon, which
# puts the GPU's compute mode back to DEFAULT (checked). Prints PASS/FAIL and MEASURE lines;
# exits non-zero on a failure.
set -uo pipefail
# nvidia-smi from the driver root, with the subroot's loader and libraries: this runs inside
# the harness's Talos-shaped root (gpu-run.sh), where the host's own nvidia-smi is not.
smi() { /run/nvidia/driver/lib64/ld-linux-x86-64.so.2 --library-path /run/nvidia/driver/usr/lib64 /run/nvidia/driver/usr/bin/nvidia-smi "$@"; }
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
check_name=k8s-node-sharing
# shellcheck source=hack/k8s-node/checks.sh
source "$top/hack/k8s-node/checks.sh"
ns=nvidia-gpu
logs=${K8S_NODE_RESULTS:-$K8S_NODE_DIR/logs}
mkdir -p "$logs"
img=talos-nvidia/k8s-node-cuda:test
alloc() { jp node "$K8S_NODE" -o 'jsonpath={.status.allocatable.nvidia\.com/gpu}'; }
phase() { jp pod "$1" -o 'jsonpath={.status.phase}'; }
plugin_pod() { jp -n $ns pod -l app.kubernetes.io/name=nvidia-device-plugin -o name | grep -v mps | head -1; }
mps_pod() { jp -n $ns pod -o name | grep mps-control-daemon | head -1; }
label() { kubectl label node "$K8S_NODE" "nvidia.com/device-plugin.config=$1" --overwrite >/dev/null; }
run_pod() { pod "$1" 1 "$2"; watch_phases "$1"; } # NAME COMMAND: a pod with one nvidia.com/gpu, watched
finished() { case $(phase "$1") in Succeeded | Failed) return 0 ;; esac; return 1; }
keep_logs() { # POD...
	local p
	for p in "$@"; do kubectl logs "$p" >"$logs/$p.log" 2>&1; sed "s/^/  $p: /" "$logs/$p.log"; done
}
explain() { kubectl describe pod "$1" | sed -n '/^Events:/,$p' | tail -6 | sed "s/^/  $1: /"; }

# --- deploy/sharing, as docs/sharing.md applies it; NFD for the service's labels
kubectl label node "$K8S_NODE" nvidia.com/gpu.present=true >/dev/null
label time-slicing-4
t0=$SECONDS
check "kubectl apply -k deploy/sharing --server-side" kubectl apply -k "$top/deploy/sharing" --server-side
. "$top/hack/k8s-node/nfd.sh"
nfd_deploy
. "$top/hack/k8s-node/workload.sh"
workload_image "$img" || failed "building the workload image"

# --- time-slicing-4
if until_true 180 'test "$(alloc)" = 4'; then
	pass "time-slicing-4: the node reports nvidia.com/gpu: 4 allocatable"
	echo "MEASURE time-slicing: label and apply -> 4 allocatable: $((SECONDS - t0)) s"
else
	failed "time-slicing-4: nvidia.com/gpu allocatable '$(alloc)'"
	kubectl -n $ns logs "$(plugin_pod)" -c nvidia-device-plugin-ctr --tail=20 2>&1 | sed 's/^/  plugin: /'
fi
ts=(ts-1 ts-2 ts-3 ts-4)
run_pod ts-1 "memlimit 2 25 80 && vecadd"
for p in ts-2 ts-3 ts-4; do run_pod $p "memlimit 2 25 && vecadd"; done
running() { local n=0 p; for p in "$@"; do [[ $(phase "$p") == Running ]] && n=$((n + 1)); done; echo $n; }
if until_true 90 'test "$(running "${ts[@]}")" = 4'; then
	pass "time-slicing-4: four CUDA pods Running at once on the one GPU"
else
	failed "time-slicing-4: $(running "${ts[@]}") of 4 pods Running at once"
	for p in "${ts[@]}"; do explain $p; done
fi
until_true 120 'finished ts-1 && finished ts-2 && finished ts-3 && finished ts-4'
keep_logs "${ts[@]}"
for p in "${ts[@]}"; do
	check "$p Succeeded, its 2 GiB checked on the GPU and the vector add right" \
		sh -c "test $(phase $p) = Succeeded && grep -q 'holding 2 GiB: ok' $logs/$p.log && grep -q '^vecadd: 4194304 elements ok' $logs/$p.log"
done
check "time-slicing has no memory isolation: ts-1 allocated 80 GiB more beside three other pods" grep -q 'cudaMalloc 80 GiB: ok' "$logs/ts-1.log"
echo "MEASURE time-slicing pod start (created -> Running): $(for p in "${ts[@]}"; do printf '%s %s s, ' $p "$(start_seconds $p)"; done)"
kubectl delete pod "${ts[@]}" --wait=true >/dev/null

# --- mps-2
t0=$SECONDS
label mps-2
model=$(host_gpu_model)
if until_true 60 'nfd_labels_are "${model// /-}" "" "" true'; then
	pass "the node is labelled nvidia.com/mps.capable=true from the service's NFD file"
else
	failed "nvidia.com/mps.capable on the node: '$(node_label mps\\.capable)'"
fi
if until_true 240 'test "$(alloc)" = 2'; then
	pass "mps-2: the node reports nvidia.com/gpu: 2 allocatable"
	echo "MEASURE mps: label -> 2 allocatable (MPS daemon up, plugin registered): $((SECONDS - t0)) s"
else
	failed "mps-2: nvidia.com/gpu allocatable '$(alloc)'"
fi
mpsd=$(mps_pod)
kubectl -n $ns logs "$mpsd" -c mps-control-daemon-ctr >"$logs/mps-control-daemon.log" 2>&1
sed 's/^/  mps-control-daemon: /' "$logs/mps-control-daemon.log" | head -40
kubectl -n $ns logs "$(plugin_pod)" -c nvidia-device-plugin-ctr >"$logs/device-plugin-mps.log" 2>&1
check "the plugin found the MPS daemon healthy" grep -q 'MPS daemon is healthy' "$logs/device-plugin-mps.log"
run_pod mps-a "memlimit 4 30 80"
run_pod mps-b "memlimit 4 50 && vecadd"
until_true 90 'test "$(running mps-a mps-b)" = 2' || { explain mps-a; explain mps-b; }
sleep 5
mpsctl() { kubectl -n $ns exec "$mpsd" -c mps-control-daemon-ctr -- sh -c "echo $1 | CUDA_MPS_PIPE_DIRECTORY=/mps/nvidia.com/gpu/pipe nvidia-cuda-mps-control" 2>&1; }
servers=$(mpsctl get_server_list)
clients=""
for s in $servers; do clients+="$(mpsctl "get_client_list $s") "; done
echo "  MPS servers: $servers; clients: $clients"
check "mps-a and mps-b are two clients of one MPS server of the one control daemon" \
	test "$(echo "$servers" | wc -w)" = 1 -a "$(echo "$clients" | wc -w)" = 2
until_true 90 'finished mps-a'
b_then=$(phase mps-b)
until_true 120 'finished mps-b'
keep_logs mps-a mps-b
limit=$(sed -n 's/^memlimit: cudaMemGetInfo free [0-9]* MiB of \([0-9]*\) MiB$/\1/p' "$logs/mps-b.log")
echo "MEASURE mps: memory a client sees: ${limit:-?} MiB (the GPU: $(smi --query-gpu=memory.total --format=csv,noheader 2>/dev/null))"
check "mps-a, past its limit (80 GiB on top of 4 GiB, the limit half the GPU), failed the allocation and the pod" \
	sh -c "grep -q 'cudaMalloc 80 GiB: failed' $logs/mps-a.log && test $(phase mps-a) = Failed"
check "mps-b kept running while mps-a failed ($b_then), then Succeeded with its memory and vector add right" \
	sh -c "test $b_then = Running && test $(phase mps-b) = Succeeded && grep -q 'holding 4 GiB: ok' $logs/mps-b.log && grep -q '^vecadd: 4194304 elements ok' $logs/mps-b.log"
echo "MEASURE mps pod start (created -> Running): mps-a $(start_seconds mps-a) s, mps-b $(start_seconds mps-b) s"
kubectl delete pod mps-a mps-b --wait=true >/dev/null

# --- back to none: the MPS daemon stops and gives the GPU its DEFAULT compute mode back
label none
until_true 180 'test "$(alloc)" = 1'
check "back to config none: nvidia.com/gpu: 1 allocatable" test "$(alloc)" = 1
mode() { smi --query-gpu=compute_mode --format=csv,noheader 2>/dev/null; }
until_true 60 'test "$(mode)" = Default'
check "the GPU's compute mode is Default again ($(mode))" test "$(mode)" = Default
kubectl get pods -A -o wide >"$logs/pods.txt" 2>&1
cp /var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json "$logs/" 2>/dev/null
exit $fail
