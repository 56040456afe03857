#!/usr/bin/env bash
# NVIDIA's container toolkit in NRI plugin mode beside deploy/'s device plugin, on the
# extension's driver root: the working part of the GPU Operator's setup 2
# (docs/gpu-operator.md), from what the module proxy serves (the toolkit v1.20.x, the device
# plugin v0.19.0). Run inside hack/k8s-node/cluster.sh -gpu (containerd's NRI on, its default):
# on the simulated GPU node by `hack/sim-node/sim-run.sh hack/nri/test-nri.sh`
# (make test-k8s-sim-nri), on the GPU test host by hack/gpu-host/gpu-nri.sh (gpu-run.sh).
# Needs NRI_OUT (default _out/nri) from hack/nri/build.sh. Checks, each PASS or FAIL:
#   - the toolkit's image packed and imported; hack/nri/nri-plugin.yaml names it;
#   - containerd's NRI socket there; the DaemonSet (nri-plugin.yaml) and deploy/ applied;
#   - containerd's log: the toolkit's NRI plugin connected and synchronized (registered);
#   - the installer ignored no error but libnvidia-container's three missing pieces
#     (hack/nri/build.sh says why they are missing and the flag is there);
#   - its management CDI spec written from the driver root, naming host paths under
#     /run/nvidia/driver (none under the container's /driver-root), nvidia-smi and
#     libnvidia-ml among them;
#   - a pod in the plugin's namespace annotated
#     nvidia.cdi.k8s.io/container.work: management.nvidia.com/gpu=all gets the driver injected:
#     every GPU's device node, libnvidia-ml.so.1, nvidia-smi, whose -L lists the GPUs;
#   - the same annotation on a pod of another namespace gets nothing (the plugin's rule), and
#     the plugin says so in its log;
#   - a pod of any namespace annotated with one device of the extension's own spec
#     (/run/cdi/nvidia.yaml, nvidia.com/gpu=N) gets exactly that GPU's device node: with the
#     plugin, a pod's annotation reaches past the device plugin's accounting;
#   - deploy/'s device plugin: the node reports nvidia.com/gpu, one per GPU of the service's
#     status, and a pod asking for one sees exactly one GPU's device node (on the simulated
#     node: the one the kubelet allocated);
#   - a pod with neither annotation nor GPU sees no /dev/nvidia[0-9]*, no libnvidia-ml, no
#     nvidia-smi;
#   - on the GPU host: the annotated pod and the device plugin's pod each run nvidia-smi -L and
#     the CUDA vector add (hack/k8s-node/workload/vecadd.cu, built with the host's nvcc), which
#     must be right. K8S_NODE_CUDA_FAULT=1 is the control: vecadd sees no device, so those
#     checks and the exit code must fail.
# Afterwards the DaemonSet is deleted and its management spec removed from /var/run/cdi (the
# host's /run on both nodes). Prints PASS/FAIL and MEASURE lines; exits non-zero on a failure.
set -uo pipefail
nri_dir=$(cd "$(dirname "$0")" && pwd)
# The simulated node's helpers (checks.sh, deploy/ applied, allocatable, the kubelet's
# allocation), which hold on the GPU host too.
# shellcheck source=hack/sim-node/sim-lib.sh
source "$nri_dir/../sim-node/sim-lib.sh"
check_name=k8s-node-nri
nri_out=${NRI_OUT:-$top/_out/nri}
manifest=$nri_dir/nri-plugin.yaml
nri_ns=nvidia-nri
logs=${K8S_NODE_RESULTS:-$K8S_NODE_DIR/logs}
mkdir -p "$logs"
clog=$K8S_NODE_DIR/logs/containerd.log
sim=0
grep -q '^simnvml' /run/nvidia/driver/usr/share/nvidia-driver/source 2>/dev/null && sim=1
ngpu=$(python3 -c 'import json; print(len(json.load(open("/run/nvidia-driver/status.json")).get("gpus") or []))' 2>/dev/null)
echo "  driver root: $(cat /run/nvidia/driver/usr/share/nvidia-driver/source 2>/dev/null); simulated NVML: $sim; the service's status: ${ngpu:-no} GPUs"
echo "  built: $(tr '\n' ';' <"$nri_out/versions" 2>/dev/null)"

mspecs() { ls /var/run/cdi/management.nvidia.com-gpu.* 2>/dev/null; }
cleanup() {
	kubectl -n $nri_ns delete ds nvidia-container-toolkit-nri --wait=false >/dev/null 2>&1
	until_true 30 'test -z "$(jp -n $nri_ns pod -l app=nvidia-container-toolkit-nri -o name)"'
	rm -f $(mspecs)
}
trap cleanup EXIT
# A spec left by an earlier run would pass the spec's checks for an installer that wrote none.
[[ -z $(mspecs) ]] || { echo "  removed an earlier run's $(mspecs)"; rm -f $(mspecs); }

# --- the toolkit's image, packed from its root filesystem as images.sh packs
mapfile -t flags <"$nri_out/rootfs/container-toolkit.flags" 2>/dev/null
ref=${flags[1]:-}
if [[ -n $ref ]] && "$K8S_NODE_IMAGES/image" -rootfs "$nri_out/rootfs/container-toolkit" -out "$K8S_NODE_DIR/container-toolkit.tar" "${flags[@]}" >/dev/null &&
	ctr -n k8s.io images import "$K8S_NODE_DIR/container-toolkit.tar" >/dev/null; then
	pass "image $ref packed and imported"
else
	failed "packing or importing $nri_out/rootfs/container-toolkit (run hack/nri/build.sh)"
fi
named=$(sed -n 's/^ *image: *//p' "$manifest")
check "hack/nri/nri-plugin.yaml names the image built ($named)" test -n "$ref" -a "$named" = "$ref"

# --- the NRI plugin's DaemonSet and deploy/'s device plugin
check "containerd's NRI socket /var/run/nri/nri.sock is there" test -S /var/run/nri/nri.sock
t0=$SECONDS
check "kubectl apply -f hack/nri/nri-plugin.yaml" kubectl apply -f "$manifest"
apply_deploy
registered() { grep -E 'plugin \\?"[0-9]+-nvidia-ctk-installer\\?" connected and synchronized' "$clog" | tail -1; }
if until_true 120 'test -n "$(registered)"'; then
	pass "containerd: the toolkit's NRI plugin connected and synchronized ($((SECONDS - t0)) s after apply)"
	echo "MEASURE nri: apply -> the toolkit's NRI plugin registered with containerd: $((SECONDS - t0)) s"
	grep -E 'nvidia-ctk-installer' "$clog" | python3 -c '
import json, sys
for l in sys.stdin:
    try: print("  containerd: " + json.loads(l)["msg"])
    except ValueError: print("  containerd: " + l.rstrip())' | head -5
else
	failed "containerd's log has no NRI plugin nvidia-ctk-installer connected ($((SECONDS - t0)) s after apply)"
	kubectl -n $nri_ns get pods -o wide
	kubectl -n $nri_ns describe pods | sed -n '/^Events:/,$p' | tail -10
fi
tpod=$(jp -n $nri_ns pod -l app=nvidia-container-toolkit-nri -o 'jsonpath={.items[0].metadata.name}')
tlog=$logs/container-toolkit.log
kubectl -n $nri_ns logs "$tpod" >"$tlog" 2>&1
grep -E 'Installing|Generating|NRI|plugin|Ignoring' "$tlog" | head -20 | sed 's/^/  toolkit: /'
# The errors --ignore-errors let pass (the installer's "Ignoring error:" at level error; the
# CDI library's own "Ignoring error in locating ..." warnings for optional libraries are not
# the flag's doing).
ignored=$(grep 'level=error msg="Ignoring error: ' "$tlog")
unexpected=$(grep -v -e 'libnvidia-container\.so\.1' -e 'libnvidia-container-go\.so\.1' -e 'nvidia-container-cli' <<<"$ignored")
check "the installer ignored no error but libnvidia-container's three missing pieces ($(grep -c . <<<"$ignored") ignored)${unexpected:+: $unexpected}" \
	test -z "$unexpected"

# --- the management CDI spec, from the extension's driver root
mspec=$(mspecs | head -1)
check "the toolkit wrote its management CDI spec ${mspec:-(none in /var/run/cdi)}" test -n "$mspec"
if [[ -n $mspec ]]; then
	cp "$mspec" "$logs/"
	echo "  management spec: $(grep -cE 'hostPath|path:' "$mspec") paths; $(grep -oE '(hostPath|path): /[^ ]*(nvidia-smi|libnvidia-ml\.so[^ ]*|nvidia-cdi-hook|/dev/nvidia0)$' "$mspec" | sort -u | tr '\n' ' ')"
fi
spec_paths() { grep -q 'Path: /run/nvidia/driver/' "${mspec:-/dev/null}" && ! grep -q '/driver-root' "${mspec:-/dev/null}"; }
spec_driver() { grep -q 'nvidia-smi' "${mspec:-/dev/null}" && grep -q 'libnvidia-ml\.so' "${mspec:-/dev/null}"; }
check "the management spec names host paths under /run/nvidia/driver, none under /driver-root" spec_paths
check "the management spec names nvidia-smi and libnvidia-ml" spec_driver

# --- deploy/'s device plugin
wait_alloc nvidia.com/gpu "${ngpu:-none}" "deploy/'s device plugin beside the NRI plugin"

# --- pods: what each container sees
# A probe prints its nvidia device nodes, libnvidia-ml.so.1 where the loader looks, and
# nvidia-smi with its -L.
probe='echo "dev: $(ls /dev | grep ^nvidia | sort | tr "\n" " ")"
for d in /usr/lib64 /usr/lib/x86_64-linux-gnu /lib64 /lib/x86_64-linux-gnu /usr/lib /lib; do [ -e $d/libnvidia-ml.so.1 ] && echo "nvml: $d/libnvidia-ml.so.1"; done
echo "smi: $(command -v nvidia-smi)"
command -v nvidia-smi >/dev/null && nvidia-smi -L 2>&1 | sed "s/^/smi: /"
true'
nri_pod() { # NAME NAMESPACE IMAGE ANNOTATION GPUS SCRIPT: a pod of one container, work
	local res="" ann=""
	[[ $5 -gt 0 ]] && res="resources: {limits: {nvidia.com/gpu: $5}}"
	[[ -n $4 ]] && ann="nvidia.cdi.k8s.io/container.work: $4"
	kubectl apply -f - 2>&1 >/dev/null <<EOF | grep -v '^Warning: would violate PodSecurity'
apiVersion: v1
kind: Pod
metadata:
  name: $1
  namespace: $2
  annotations: {$ann}
spec:
  restartPolicy: Never
  tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
  containers:
  - name: work
    image: $3
    imagePullPolicy: Never
    command:
    - /bin/sh
    - -c
    - |
$(sed 's/^/      /' <<<"$6")
    $res
EOF
}
nphase() { jp -n "$1" pod "$2" -o 'jsonpath={.status.phase}'; }
finished() { case $(nphase "$1" "$2") in Succeeded | Failed) return 0 ;; esac; return 1; }
mgmt=management.nvidia.com/gpu=all
# One GPU of the extension's spec: its devices are named by index (pkg/cdi), the simulated
# GPUs' minors are their indices.
one=0
[[ $sim == 1 ]] && one=3
pods=("$nri_ns nri-gpu" "default nri-elsewhere" "default nri-one" "default plugin-gpu" "default no-gpu")
nri_pod nri-gpu $nri_ns "$img" $mgmt 0 "$probe"
nri_pod nri-elsewhere default "$img" $mgmt 0 "$probe"
nri_pod nri-one default "$img" nvidia.com/gpu=$one 0 "$probe"
nri_pod plugin-gpu default "$img" "" 1 "$probe"
nri_pod no-gpu default "$img" "" 0 "$probe"
if [[ $sim == 0 ]]; then
	# The CUDA pods: the annotated one and the device plugin's, each running vecadd.
	. "$top/hack/k8s-node/workload.sh"
	cimg=talos-nvidia/k8s-node-cuda:test
	workload_image "$cimg" || failed "building the workload image"
	work='nvidia-smi -L && vecadd'
	if [[ ${K8S_NODE_CUDA_FAULT:-0} == 1 ]]; then
		work='nvidia-smi -L && CUDA_VISIBLE_DEVICES=none vecadd'
		echo "  control K8S_NODE_CUDA_FAULT=1: the CUDA pods run vecadd with CUDA_VISIBLE_DEVICES=none"
	fi
	# After plugin-gpu, which holds the only GPU of a one-GPU host until it is done.
	until_true 120 'finished default plugin-gpu'
	nri_pod nri-cuda $nri_ns "$cimg" $mgmt 0 "$work"
	nri_pod plugin-cuda default "$cimg" "" 1 "$work"
	pods+=("$nri_ns nri-cuda" "default plugin-cuda")
fi
for p in "${pods[@]}"; do
	# shellcheck disable=SC2086 # namespace and name
	until_true 120 "finished $p" || { echo "  $p: $(nphase $p)"; kubectl -n ${p% *} describe pod ${p#* } | sed -n '/^Events:/,$p' | tail -8; }
done

# What a pod saw (its log, kept in $logs): OUT, and its GPU device nodes from OUT.
out() { # NAMESPACE NAME
	local o
	o=$(kubectl -n "$1" logs "$2" 2>&1)
	echo "$o" >"$logs/$2.log"
	sed "s/^/  $2: /" <<<"$o" >&2
	echo "$o"
}
gpu_nodes() { sed -n 's/^dev: //p' <<<"$1" | tr ' ' '\n' | grep -E '^nvidia[0-9]+$' | sort -V | tr '\n' ' ' | sed 's/ $//'; }
sees_driver() { [[ -n $want_all && $(gpu_nodes "$1") == "$want_all" ]] && grep -q '^dev: .*nvidiactl' <<<"$1"; }
sees_nothing() { [[ -z $(gpu_nodes "$1") ]] && ! grep -q '^nvml: ' <<<"$1" && grep -qx 'smi: ' <<<"$1"; }
refused() { kubectl -n $nri_ns logs "$tpod" 2>&1 | grep -q "pod $1 is requesting one or more management CDI devices, but it is not in one of the allowed namespaces"; }
want_all=$(for ((i = 0; i < ${ngpu:-0}; i++)); do printf 'nvidia%d ' $i; done | sed 's/ $//')

o=$(out $nri_ns nri-gpu)
check "nri-gpu ($mgmt, namespace $nri_ns) Succeeded" test "$(nphase $nri_ns nri-gpu)" = Succeeded
check "nri-gpu got every GPU's device node and nvidiactl from the NRI plugin ($(gpu_nodes "$o"))" sees_driver "$o"
check "nri-gpu got libnvidia-ml.so.1 ($(sed -n 's/^nvml: //p' <<<"$o" | tr '\n' ' ' | sed 's/ $//'))" grep -q '^nvml: ' <<<"$o"
check "nri-gpu's nvidia-smi -L lists the service's ${ngpu:-no} GPUs ($(grep -c '^smi: GPU [0-9]*: ' <<<"$o"))" \
	test "$(grep -c '^smi: GPU [0-9]*: ' <<<"$o")" = "${ngpu:-none}"

o=$(out default nri-elsewhere)
check "nri-elsewhere ($mgmt, namespace default) got no GPU device node, no libnvidia-ml, no nvidia-smi" \
	sees_nothing "$o"
check "the NRI plugin's log says it refused management devices to default/nri-elsewhere" refused default/nri-elsewhere

o=$(out default nri-one)
check "nri-one (nvidia.com/gpu=$one of the extension's spec, namespace default) saw exactly /dev/nvidia$one ($(gpu_nodes "$o"))" \
	test "$(nphase default nri-one)" = Succeeded -a "$(gpu_nodes "$o")" = nvidia$one

o=$(out default plugin-gpu)
got=$(gpu_nodes "$o")
if [[ $sim == 1 ]]; then
	# The GPU the kubelet allocated: the simulated GPUs' UUIDs end in their minor (internal/sim).
	want=$(allocated plugin-gpu nvidia.com/gpu | while read -r u; do echo "nvidia$((16#${u: -12}))"; done | tr '\n' ' ' | sed 's/ $//')
	check "plugin-gpu (nvidia.com/gpu: 1 from deploy/'s device plugin) saw exactly the device node of the GPU allocated to it, $want ($got)" \
		test "$(nphase default plugin-gpu)" = Succeeded -a -n "$want" -a "$got" = "$want"
else
	check "plugin-gpu (nvidia.com/gpu: 1 from deploy/'s device plugin) saw exactly one GPU's device node ($got)" \
		test "$(nphase default plugin-gpu)" = Succeeded -a "$(wc -w <<<"$got")" = 1
fi

o=$(out default no-gpu)
check "no-gpu (no annotation, no GPU) saw no GPU device node, no libnvidia-ml, no nvidia-smi" \
	sees_nothing "$o"
# (sees_nothing does not look at the phase; a pod that did not run printed nothing at all)
check "no-gpu and nri-elsewhere ran their probe (phase $(nphase default no-gpu), $(nphase default nri-elsewhere))" \
	test "$(nphase default no-gpu)" = Succeeded -a "$(nphase default nri-elsewhere)" = Succeeded

if [[ $sim == 0 ]]; then
	model=$(host_gpu_model)
	for p in "$nri_ns nri-cuda" "default plugin-cuda"; do
		# shellcheck disable=SC2086 # namespace and name
		o=$(out $p)
		check "${p#* }: nvidia-smi -L lists the host's $model" grep -qF "GPU 0: $model (UUID" <<<"$o"
		check "${p#* }: the CUDA vector add is right on the GPU" grep -q '^vecadd: 4194304 elements ok' <<<"$o"
		# shellcheck disable=SC2086
		check "${p#* } Succeeded" test "$(nphase $p)" = Succeeded
	done
fi

kubectl get pods -A -o wide >"$logs/pods.txt" 2>&1
exit $fail
