#!/usr/bin/env bash
# NVIDIA's DRA driver for GPUs (v0.5.0, built from its Go module by hack/dra/build.sh) in place
# of deploy/'s device plugin, on a real Kubernetes node where the extension's service has
# brought the GPUs up. Run inside hack/k8s-node/cluster.sh
# -gpu: on the GPU test host by hack/gpu-host/gpu-dra.sh (gpu-run.sh), on the simulated GPU
# node by `hack/sim-node/sim-run.sh hack/dra/test-dra.sh` (NVML is hack/sim-node/simnvml there:
# the driver root's usr/share/nvidia-driver/source says simnvml). Needs _out/dra from
# hack/dra/build.sh (the image's root filesystem, the rendered chart, cdi-e2e). Checks:
#   - deploy/dra and the chart as hack/dra/build.sh rendered it with deploy/dra/values.yaml
#     (its CRDs included, as helm install applies them), applied server-side on a node
#     labelled as docs/sharing.md says (the device plugin off);
#   - the kubelet plugin starts (its init container finds nvidia-smi in /run/nvidia/driver) and
#     publishes a ResourceSlice with one gpu device per GPU of the service's status, named as
#     the GPU is (on the GPU host: its card, an H200 or an H100, as its kernel driver names it);
#   - a pod with the ResourceClaim of deploy/dra/examples/gpu.yaml runs once the scheduler has
#     allocated the claim, and sees exactly its GPU's device node (the one the kubelet plugin's
#     CDI spec for the claim names) with the control nodes; on the GPU host its log shows the
#     GPU (nvidia-smi -L) and a CUDA vector add that checks its result;
#   - the kubelet plugin's CDI spec for the claim (/var/run/cdi/k8s.gpu.nvidia.com-claim_*)
#     names only paths that exist on the node (printed with each device's entries);
#   - a second claim for the same device (on a one-GPU node the example's claim again; with
#     more GPUs pinned to the first claim's by its uuid) stays unallocated and its pod Pending
#     while the first pod runs; once that is done the claim is released, the second is
#     allocated the device and its pod runs (and on the GPU host, CUDA again);
#   - times: apply -> ResourceSlice, pod created -> Running, first done -> second Running.
# CUDA cannot run on the simulated node (its device nodes have no driver behind them): the
# CUDA steps run only on a real GPU. Prints PASS/FAIL and MEASURE lines; exits non-zero on a
# failure.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
check_name=k8s-node-dra
# shellcheck source=hack/k8s-node/checks.sh
source "$top/hack/k8s-node/checks.sh"
dra=${DRA_OUT:-$top/_out/dra}
ns=nvidia-dra-driver-gpu
logs=${K8S_NODE_RESULTS:-$K8S_NODE_DIR/logs}
mkdir -p "$logs"
sim=0
grep -q '^simnvml' /run/nvidia/driver/usr/share/nvidia-driver/source 2>/dev/null && sim=1
echo "  driver root: $(cat /run/nvidia/driver/usr/share/nvidia-driver/source 2>/dev/null); simulated NVML: $sim"

# --- the DRA driver's image (packed here from its root filesystem, as images.sh packs) and
# the chart as rendered by hack/dra/build.sh
tar=$K8S_NODE_DIR/dra-driver.tar
mapfile -t flags <"$dra/rootfs/dra-driver.flags"
if "$K8S_NODE_IMAGES/image" -rootfs "$dra/rootfs/dra-driver" -out "$tar" "${flags[@]}" >/dev/null &&
	ctr -n k8s.io images import "$tar" >/dev/null; then
	pass "the DRA driver's image ($(sed -n 2p "$dra/rootfs/dra-driver.flags")) imported"
else
	failed "packing or importing the DRA driver's image from $dra/rootfs"
fi
kubectl label node "$K8S_NODE" nvidia.com/gpu.present=true nvidia.com/gpu.deploy.device-plugin=false --overwrite >/dev/null
t0=$SECONDS
check "kubectl apply -k deploy/dra --server-side" kubectl apply -k "$top/deploy/dra" --server-side
check "kubectl apply --server-side -f $dra/dra-driver.yaml (the chart rendered with deploy/dra/values.yaml)" \
	kubectl apply --server-side -f "$dra/dra-driver.yaml"
if [[ $sim == 1 ]]; then
	# The chart's init container waits until `nvidia-smi --version` runs from the driver root
	# (kubelet-plugin-prestart.sh). NVIDIA's nvidia-smi refuses the simulated NVML ("Mismatch
	# in versions between nvidia-smi and NVML"): on the simulated node only, the init
	# container makes the script's /driver-root link and skips that check. The GPU host runs
	# the chart as rendered.
	kubectl -n $ns patch daemonset dra-driver-nvidia-gpu-kubelet-plugin --type json -p '[{"op": "replace",
		"path": "/spec/template/spec/initContainers/0/command", "value": ["bash", "-c",
		"ln -s /driver-root-parent/driver /driver-root && ls /driver-root/usr/bin/nvidia-smi /driver-root/usr/lib64/libnvidia-ml.so.1 && echo simulated node: nvidia-smi --version skipped"]}]' >/dev/null &&
		echo "  simulated node: the init container's nvidia-smi check replaced (NVIDIA's nvidia-smi refuses simnvml)"
fi

# --- the kubelet plugin and its ResourceSlice
plugin_pod() { jp -n $ns pod -l dra-driver-nvidia-gpu-component=kubelet-plugin -o 'jsonpath={.items[0].metadata.name}'; }
ready() { jp -n $ns pod "$(plugin_pod)" -o 'jsonpath={.status.containerStatuses[?(@.name=="gpus")].ready}'; }
# slices: one line per device of driver gpu.nvidia.com on this node: NAME TYPE UUID PRODUCT
slices() {
	kubectl get resourceslices -o json 2>/dev/null | python3 -c '
import json, sys
node = sys.argv[1]
for s in json.load(sys.stdin)["items"]:
    if s["spec"].get("driver") != "gpu.nvidia.com" or s["spec"].get("nodeName") != node:
        continue
    for d in s["spec"].get("devices") or []:
        a = {k: list(v.values())[0] for k, v in (d.get("attributes") or {}).items()}
        print(d["name"], a.get("type"), a.get("uuid"), a.get("productName"), s["spec"]["pool"]["name"], sep="\t")
' "$K8S_NODE"
}
gpus_of() { slices | awk -F'\t' '$2 == "gpu"'; }
if until_true 240 'test -n "$(gpus_of)"'; then
	pass "the kubelet plugin published a ResourceSlice with gpu devices ($((SECONDS - t0)) s after apply)"
	echo "MEASURE dra: apply -> ResourceSlice with the GPUs: $((SECONDS - t0)) s"
else
	failed "no ResourceSlice of gpu.nvidia.com for $K8S_NODE"
	kubectl -n $ns get pods -o wide
	kubectl -n $ns describe pod "$(plugin_pod)" | sed -n '/^Events:/,$p' | tail -10
fi
until_true 60 'test "$(ready)" = true'
plugin=$(plugin_pod)
kubectl -n $ns logs "$plugin" -c init-container >"$logs/dra-init.log" 2>&1
kubectl -n $ns logs "$plugin" -c gpus >"$logs/dra-kubelet-plugin.log" 2>&1
sed 's/^/  init-container: /' "$logs/dra-init.log" | tail -8
grep -iE 'error|warn|traverse|publish|slice|cdi' "$logs/dra-kubelet-plugin.log" | head -25 | sed 's/^/  gpus: /'
check "the kubelet plugin's gpus container is ready" test "$(ready)" = true
echo "  ResourceSlice devices (name, type, uuid, productName, pool):"
slices | sed 's/^/    /'
want_n=$(python3 -c 'import json; print(len(json.load(open("/run/nvidia-driver/status.json")).get("gpus") or []))' 2>/dev/null)
check "one gpu device per GPU of the service's status ($(gpus_of | wc -l) of $want_n)" test "$(gpus_of | wc -l)" = "$want_n" -a "${want_n:-0}" -gt 0
if [[ $sim == 0 ]]; then
	model=$(host_gpu_model)
	products=$(gpus_of | cut -f4 | sort -u)
	check "the ResourceSlice shows the host's card, $model (productName $products)" grep -qxF "${model:-?}" <<<"$products"
fi

# --- the workload
. "$top/hack/k8s-node/workload.sh"
work='ls /dev | grep nvidia | sort | xargs echo'
if [[ $sim == 1 ]]; then
	img=talos-nvidia/k8s-node-base:test
else
	img=talos-nvidia/k8s-node-cuda:test
	workload_image "$img" || failed "building the workload image"
	work="$work; nvidia-smi -L && vecadd"
fi
# The claim of deploy/dra/examples/gpu.yaml, under NAME, with an optional CEL selector.
claim() { # NAME [CEL]
	python3 - "$top/deploy/dra/examples/gpu.yaml" "$1" "${2:-}" <<'EOF' | kubectl apply -f - >/dev/null
import sys
docs = open(sys.argv[1]).read().split("\n---\n")
doc = next(d for d in docs if "\nkind: ResourceClaim\n" in "\n" + d)
doc = doc.replace("\n  name: gpu\n", "\n  name: %s\n" % sys.argv[2], 1)
if sys.argv[3]:
    doc = doc.rstrip("\n") + '\n          selectors:\n            - cel:\n                expression: "%s"\n' % sys.argv[3].replace('"', '\\"')
print(doc)
EOF
}
phase() { jp pod "$1" -o 'jsonpath={.status.phase}'; }
finished() { case $(phase "$1") in Succeeded | Failed) return 0 ;; esac; return 1; }
allocated() { jp resourceclaim "$1" -o 'jsonpath={.status.allocation.devices.results[0].pool}/{.status.allocation.devices.results[0].device}'; }
explain() { kubectl describe pod "$1" | sed -n '/^Events:/,$p' | tail -6 | sed "s/^/  $1: /"; }
since() { python3 -c 'import sys,time; print("%.1f" % (time.time() - float(sys.argv[1])))' "$1"; }
specs() { ls /var/run/cdi/k8s.gpu.nvidia.com-claim_* 2>/dev/null; }

claim gpu
ta=$(date +%s.%N)
watch_phases dra-a
watch_phases dra-b
sleep 1
pod dra-a 0 "$work; sleep 20" gpu
until_true 90 'test "$(phase dra-a)" = Running || finished dra-a' || explain dra-a
took=$(since "$ta")
check "dra-a Running with claim gpu allocated ($(allocated gpu)), $took s after it was created" \
	test "$(phase dra-a)" = Running -a "$(allocated gpu)" != /
echo "MEASURE dra: pod with a ResourceClaim created -> Running: $took s"
dev=$(allocated gpu)
uuid=$(gpus_of | awk -F'\t' -v d="${dev#*/}" '$1 == d {print $3}')
echo "  claim gpu: device $dev, uuid $uuid"

# The kubelet plugin's CDI spec for the claim, while the pod runs.
cdi=$(specs)
echo "  CDI specs the kubelet plugin wrote: ${cdi:-none}"
check "the kubelet plugin wrote a CDI spec for the claim" test -n "$cdi"
if [[ -n $cdi ]]; then
	for f in $cdi; do cp "$f" "$logs/"; done
	"$dra/bin/cdi-e2e" hostpaths $cdi >"$logs/dra-cdi-hostpaths.txt" 2>&1
	rc=$?
	sed 's/^/    /' "$logs/dra-cdi-hostpaths.txt"
	check "every path the DRA driver's CDI spec names exists on the node" test $rc = 0
fi
spec_gpus=$(cat $cdi 2>/dev/null | grep -E '[pP]ath: [^ ]*/dev/nvidia[0-9]+$' | grep -oE 'nvidia[0-9]+$' | sort -u | tr '\n' ' ' | sed 's/ $//')

# The second claim, for the same device, while the first pod holds it.
if [[ $(gpus_of | wc -l) == 1 ]]; then claim gpu-second; else claim gpu-second "device.attributes['gpu.nvidia.com'].uuid == '$uuid'"; fi
pod dra-b 0 "$work; sleep 5" gpu-second
sleep 10
reason=$(jp pod dra-b -o 'jsonpath={.status.conditions[?(@.type=="PodScheduled")].reason}: {.status.conditions[?(@.type=="PodScheduled")].message}')
check "the second claim for the same device stays unallocated and its pod Pending while dra-a runs ($reason)" \
	test "$(phase dra-b)" = Pending -a "$(allocated gpu-second)" = / -a "$(phase dra-a)" = Running
until_true 90 'finished dra-a'
td=$(date +%s.%N)
until_true 120 'test "$(phase dra-b)" = Running || finished dra-b' || explain dra-b
echo "MEASURE dra: first pod done -> second pod Running (the claim released and allocated again): $(since "$td") s"
# (read while dra-b runs: once it is done, its claim is released too)
devb=$(allocated gpu-second)
check "claim gpu-second was allocated the same device ($devb)" test "$devb" = "$dev"
until_true 90 'finished dra-b'
for p in dra-a dra-b; do
	out=$(kubectl logs "$p" 2>&1)
	echo "$out" >"$logs/$p.log"
	echo "$out" | sed "s/^/  $p: /"
	[[ $(phase $p) == Succeeded ]] || explain $p
	check "$p Succeeded" test "$(phase $p)" = Succeeded
	seen=$(head -1 <<<"$out")
	got=$(tr ' ' '\n' <<<"$seen" | grep -E '^nvidia[0-9]+$' | sort | tr '\n' ' ' | sed 's/ $//')
	check "$p saw exactly its GPU's device node ($got; the claim's CDI spec: $spec_gpus)" test -n "$got" -a "$got" = "$spec_gpus" -a "$(wc -w <<<"$got")" = 1
	check "$p saw the control nodes nvidiactl, nvidia-uvm" grep -q 'nvidia-uvm .*nvidiactl\|nvidiactl.*nvidia-uvm' <<<"$seen"
	if [[ $sim == 1 ]]; then
		# The simulated UUIDs end in the GPU's minor (hack/sim-node/simnvml).
		check "$p: that node is the allocated GPU's (uuid $uuid)" test "$got" = "nvidia$((16#${uuid: -12}))"
	else
		check "$p: nvidia-smi -L lists the host's $model, the claim's GPU" grep -qF "GPU 0: $model (UUID: $uuid)" <<<"$out"
		check "$p: the CUDA vector add is right on the GPU" grep -q '^vecadd: 4194304 elements ok' <<<"$out"
	fi
done
[[ $sim == 1 ]] && echo "  (CUDA not run: the simulated node's device nodes have no driver behind them)"
kubectl delete pod dra-a dra-b --wait=true >/dev/null
until_true 60 'test -z "$(specs)"'
check "the kubelet plugin removed its CDI specs once the pods were gone ($(specs | wc -l) left)" test -z "$(specs)"
kubectl delete resourceclaim gpu gpu-second >/dev/null
kubectl get resourceslices -o yaml >"$logs/resourceslices.yaml" 2>&1
kubectl get pods -A -o wide >"$logs/pods.txt" 2>&1
kubectl -n $ns logs "$plugin" -c gpus >"$logs/dra-kubelet-plugin.log" 2>&1
exit $fail
