#!/usr/bin/env bash
# NVIDIA's GPU Operator, setup 1 (deploy/gpu-operator/values-cdi.yaml: driver and toolkit off,
# CDI on; the chart as hack/gpu-operator/build.sh rendered it), on a real Kubernetes node where
# the extension's service has brought the GPUs up.
# Run inside hack/k8s-node/cluster.sh -gpu: on the simulated GPU node by
# `hack/sim-node/sim-run.sh hack/gpu-operator/test-operator.sh` (make test-k8s-sim-operator), on
# the GPU test host by hack/gpu-host/gpu-operator.sh (gpu-run.sh). Needs _out/gpu-operator
# from hack/gpu-operator/build.sh (the images' root filesystems, the rendered chart).
# Checks, each PASS or FAIL:
#   - the operator's images packed and imported; the chart as rendered applied server-side;
#   - the node found as a GPU node (the operator labels it nvidia.com/gpu.present): on the GPU
#     host from NFD v0.18.2's PCI and OS labels, on the simulated node from those labels set by
#     hand (its GPUs have no PCI functions for NFD to find; no NFD runs there);
#   - the operator's Deployment available; the ClusterPolicy's status.state `ready`;
#   - every pod in the operator's namespace Ready (or Succeeded, for the validator's workload
#     pods);
#   - the validator's driver, toolkit, cuda and plugin init containers passed (their logs and the
#     status files they write in /run/nvidia/validations);
#   - the node reports nvidia.com/gpu allocatable, one per GPU of the service's status;
#   - GPU feature discovery's labels on the Node (nvidia.com/gpu.product, nvidia.com/gfd.timestamp);
#   - on the GPU host: a pod asking for one GPU runs nvidia-smi -L and a CUDA vector add
#     (hack/k8s-node/workload/vecadd.cu, built with the host's nvcc), a second waits for the GPU,
#     and the plugin's CDI spec names only host paths that exist;
#   - once the ClusterPolicy is ready, under the harness: the service restarted, the operator's
#     pods deleted, and the validator started before the driver root is mounted, each followed
#     by what every operand container sees at its driver root (operator-restarts.sh).
# CUDA cannot run on the simulated node (its device nodes have no driver behind them): there the
# chart is rendered with the validator's CUDA workload off (gpu-operator-sim.yaml), which is
# then checked only for its status file. NVIDIA's image carries its CUDA sample vectorAdd
# (built from cuda-samples with CUDA); this project cannot build it, so on the GPU host the
# operator's image gets this project's vecadd as /usr/bin/vectorAdd, a stand-in: same job (add
# two vectors on the GPU, exit non-zero when wrong), not NVIDIA's program.
# GPU_OPERATOR_EXPECT_STOP=toolkit (setup 1, make test-k8s-sim-operator): by the operator's
# source setup 1 stops at the validator's toolkit check on a node without an NVIDIA runtime
# (docs/gpu-operator.md, "Setup 1 cannot reach ready"). Then the checks are that it stops
# there and nowhere earlier: the operator available, the validator's driver check passed on
# the extension's driver root, its toolkit check failing with the error its source gives, the
# device plugin's pod held by its wait for toolkit-ready; and a control, the validator's own
# driver check run with an empty driver root, which must fail. Reaching `ready` fails it.
# The checks from "the ClusterPolicy reached ready" on ran with setup 2 (v26.7.0 in NRI mode,
# built by hand: docs/gpu-operator.md); the module proxy's operator has no NRI mode, and setup 1
# does not get there by the operator's source.
# Prints PASS/FAIL and MEASURE lines; exits non-zero on a failure.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
check_name=k8s-node-operator
# shellcheck source=hack/k8s-node/checks.sh
source "$top/hack/k8s-node/checks.sh"
go_out=${GPU_OPERATOR_OUT:-$top/_out/gpu-operator}
ns=gpu-operator
logs=${K8S_NODE_RESULTS:-$K8S_NODE_DIR/logs}
mkdir -p "$logs"
sim=0
grep -q '^simnvml' /run/nvidia/driver/usr/share/nvidia-driver/source 2>/dev/null && sim=1
echo "  driver root: $(cat /run/nvidia/driver/usr/share/nvidia-driver/source 2>/dev/null); simulated NVML: $sim"
echo "  built: $(tr '\n' ';' <"$go_out/versions" 2>/dev/null)"
ngpu=$(python3 -c 'import json; print(len(json.load(open("/run/nvidia-driver/status.json")).get("gpus") or []))' 2>/dev/null)
echo "  the service's status: ${ngpu:-no} GPUs"
expect_stop=${GPU_OPERATOR_EXPECT_STOP:-}
[[ -z $expect_stop || $expect_stop == toolkit ]] || { echo "GPU_OPERATOR_EXPECT_STOP=$expect_stop: only 'toolkit' is known" >&2; exit 2; }
values=$(sed -n 's/^values //p' "$go_out/versions" 2>/dev/null)
values=${values:-deploy/gpu-operator/values-cdi.yaml}
echo "  values: $values"
. "$top/hack/k8s-node/workload.sh"
collect_logs() { # what to read afterwards, in $logs
	kubectl -n $ns logs deploy/gpu-operator >"$logs/gpu-operator.log" 2>&1
	for p in $(kubectl -n $ns get pods -o name); do
		kubectl -n $ns logs "$p" --all-containers --prefix >"$logs/${p#pod/}.log" 2>&1
	done
	kubectl -n $ns get pods -o yaml >"$logs/operator-pods.yaml" 2>&1
	jp clusterpolicy cluster-policy -o yaml >"$logs/clusterpolicy.yaml"
	kubectl get pods -A -o wide >"$logs/pods.txt" 2>&1
}

# --- the images, packed from their root filesystems as images.sh packs
if [[ $sim == 0 && -d $go_out/rootfs/gpu-operator ]]; then
	# The CUDA validator's workload runs /usr/bin/vectorAdd of the operator's image: the
	# stand-in, built with the host's nvcc, with the libraries it links at their host paths,
	# the host's glibc included: the host's libstdc++ needs it (on the H200 host, 2026-12-05:
	# "version `GLIBC_2.38' not found", the base's glibc being Debian 12's 2.36). The
	# operator's own programs are static (CGO off) and do not care.
	r=$K8S_NODE_DIR/operator-rootfs
	cp -a "$go_out/rootfs/gpu-operator" "$r"
	nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
	if "$nvcc" -O2 -arch=sm_90 -o "$r/usr/bin/vectorAdd" "$top/hack/k8s-node/workload/vecadd.cu" 2>"$logs/nvcc-vectorAdd.log"; then
		for l in $(ldd "$r/usr/bin/vectorAdd" | grep -o '/[^ ]*' | sort -u); do
			mkdir -p "$r$(dirname "$l")" && cp -L "$l" "$r$l"
		done
		# The rest of that glibc, so that the image holds one version of it (as workload.sh).
		libc=$(ldd "$r/usr/bin/vectorAdd" | grep -o '/[^ ]*/libc\.so\.6')
		for l in libpthread.so.0 libdl.so.2 librt.so.1 libm.so.6; do
			[[ -e $(dirname "$libc")/$l ]] && cp -L "$(dirname "$libc")/$l" "$r$(dirname "$libc")/"
		done
		pass "vectorAdd (the stand-in: hack/k8s-node/workload/vecadd.cu) built with $nvcc into the operator's image"
	else
		failed "nvcc vectorAdd: $(tail -3 "$logs/nvcc-vectorAdd.log")"
	fi
fi
for f in "$go_out"/rootfs/*.flags; do
	n=$(basename "$f" .flags)
	rootfs=$go_out/rootfs/$n
	[[ $n == gpu-operator && -d ${r:-} ]] && rootfs=$r
	mapfile -t flags <"$f"
	if "$K8S_NODE_IMAGES/image" -rootfs "$rootfs" -out "$K8S_NODE_DIR/$n.tar" "${flags[@]}" >/dev/null &&
		ctr -n k8s.io images import "$K8S_NODE_DIR/$n.tar" >/dev/null; then
		pass "image ${flags[1]} packed and imported"
	else
		failed "packing or importing $n from $rootfs"
	fi
done

# --- the node as a GPU node
if [[ $sim == 1 ]]; then
	# From v26.x the operator also wants NFD's OS labels of every GPU node, even with the driver
	# off ("failed to retrieve GPU node OS info: unable to retrieve OS name from label
	# feature.node.kubernetes.io/system-os_release.ID"): here the values NFD gives a Talos node
	# of the version whose configuration this node copies.
	kubectl label node "$K8S_NODE" --overwrite feature.node.kubernetes.io/pci-10de.present=true \
		feature.node.kubernetes.io/system-os_release.ID=talos feature.node.kubernetes.io/system-os_release.VERSION_ID=v1.13.9 >/dev/null
	echo "  simulated node: NFD's labels pci-10de.present=true (its GPUs have no PCI functions) and system-os_release ID=talos VERSION_ID=v1.13.9 set by hand"
else
	. "$top/hack/k8s-node/nfd.sh"
	nfd_deploy
	# Any of the labels by which the operator knows a GPU node (v26.7.0
	# controllers/state_manager.go gpuNodeLabels): NFD's own deployment files label PCI devices
	# by class and vendor (pci-0302_10de on the H200, seen 2026-12-05); the operator's NFD
	# subchart by vendor alone (pci-10de).
	gpu_label() { jp node "$K8S_NODE" -o jsonpath='{.metadata.labels}' | grep -oE 'feature\.node\.kubernetes\.io/pci-(10de|0302_10de|0300_10de)\.present":"true' | head -1 | cut -d'"' -f1; }
	if until_true 120 'test -n "$(gpu_label)"'; then
		pass "NFD labelled the node $(gpu_label)=true, a label by which the operator knows a GPU node"
	else
		failed "NFD did not label the node with NVIDIA's PCI vendor id (pci-10de, pci-0302_10de or pci-0300_10de)"
	fi
fi

# --- the chart as rendered
manifest=$go_out/gpu-operator.yaml
[[ $sim == 1 ]] && manifest=$go_out/gpu-operator-sim.yaml
# The namespace labelled privileged first, as a Talos user must (Pod Security "baseline"
# there refuses the operator's own pod, which mounts the host's os-release by hostPath).
kubectl create namespace $ns >/dev/null
kubectl label namespace $ns pod-security.kubernetes.io/enforce=privileged >/dev/null
# The CRDs first, established, then the rest, as helm install applies a chart's crds/.
python3 - "$manifest" "$K8S_NODE_DIR/operator-crds.yaml" "$K8S_NODE_DIR/operator-rest.yaml" <<'EOF'
import sys
docs = [d for d in open(sys.argv[1]).read().split("\n---") if d.strip()]
crds = [d for d in docs if "\nkind: CustomResourceDefinition" in "\n" + d]
open(sys.argv[2], "w").write("\n---".join(crds) + "\n")
open(sys.argv[3], "w").write("\n---".join(d for d in docs if d not in crds) + "\n")
EOF
t0=$SECONDS
check "the chart's CRDs applied and established" sh -c "kubectl apply --server-side -f $K8S_NODE_DIR/operator-crds.yaml >/dev/null &&
	kubectl wait --for condition=established --timeout 60s -f $K8S_NODE_DIR/operator-crds.yaml >/dev/null"
# Client-side, as helm install creates objects: the chart renders `validator.plugin:` with no
# fields when validator.plugin.env is empty (its default), a null that the API server prunes
# on create but that server-side apply rejects ("spec.validator.plugin ... must be of type
# object"). -n: helm template leaves namespaced objects without a namespace, which helm install
# gives them from --namespace.
watch_allocatable operator
check "kubectl apply -f $(basename "$manifest") (the chart rendered with $(basename "$values"))" \
	kubectl apply -n $ns -f "$K8S_NODE_DIR/operator-rest.yaml"
if until_true 180 'test "$(jp -n $ns deploy gpu-operator -o "jsonpath={.status.availableReplicas}")" = 1'; then
	pass "the operator's Deployment is available ($((SECONDS - t0)) s)"
else
	failed "the operator's Deployment is not available"
	kubectl -n $ns describe pod -l app=gpu-operator | sed -n '/^Events:/,$p' | tail -8
fi
state() { jp clusterpolicy cluster-policy -o 'jsonpath={.status.state}'; }
# A validator init container that has failed three times will not pass by waiting longer.
vloop() { test "$(jp -n $ns pod -l app=nvidia-operator-validator -o 'jsonpath={range .items[0].status.initContainerStatuses[*]}{.restartCount}{"\n"}{end}' | sort -n | tail -1)" -ge 3; }
wait_s=120 # for what follows the ClusterPolicy: short once it is known not to be ready
if until_true 300 'test "$(state)" = ready || vloop'; [[ $expect_stop == toolkit ]]; then
	check "the ClusterPolicy is '$(state)' after $((SECONDS - t0)) s, not ready, as setup 1 must be without an NVIDIA runtime" \
		test "$(state)" != ready
elif [[ $(state) == ready ]]; then
	pass "the ClusterPolicy reached ready ($((SECONDS - t0)) s after apply)"
	echo "MEASURE operator: apply -> ClusterPolicy ready: $((SECONDS - t0)) s"
else
	failed "the ClusterPolicy is '$(state)' after $((SECONDS - t0)) s, not ready$(vloop && echo ' (a validator init container crash-loops)')"
	wait_s=10
fi
jp clusterpolicy cluster-policy -o 'jsonpath={.status}' | sed 's/^/  ClusterPolicy status: /'
echo
kubectl -n $ns get pods -o wide 2>&1 | sed 's/^/  /'

# --- setup 1's stop (GPU_OPERATOR_EXPECT_STOP=toolkit), then the logs, and no further
if [[ $expect_stop == toolkit ]]; then
	. "$here/setup1-stop.sh"
	collect_logs
	exit $fail
fi

# --- every operand pod Ready (the validator's workload pods: Succeeded)
notready=$(kubectl -n $ns get pods -o json | python3 -c '
import json, sys
for p in json.load(sys.stdin)["items"]:
    st = p["status"]
    if st.get("phase") == "Succeeded":
        continue
    cs = st.get("containerStatuses") or []
    if not cs or not all(c.get("ready") for c in cs):
        print(p["metadata"]["name"], end=" ")
')
check "every pod in $ns is Ready or Succeeded${notready:+ (not: $notready)}" test -z "$notready"

# --- the validator: its init containers' logs and the status files they write
vpod=$(jp -n $ns pod -l app=nvidia-operator-validator -o 'jsonpath={.items[0].metadata.name}')
for c in driver-validation toolkit-validation cuda-validation plugin-validation; do
	kubectl -n $ns logs "$vpod" -c $c >"$logs/validator-$c.log" 2>&1
	code=$(jp -n $ns pod "$vpod" -o "jsonpath={.status.initContainerStatuses[?(@.name==\"$c\")].state.terminated.exitCode}")
	last=$(jp -n $ns pod "$vpod" -o "jsonpath={.status.initContainerStatuses[?(@.name==\"$c\")].lastState.terminated.exitCode}")
	tail -6 "$logs/validator-$c.log" | sed "s/^/  $c: /"
	f=${c%-validation}-ready
	check "the validator's $c passed (exit code ${code:-none}${last:+, an earlier run exited $last}; /run/nvidia/validations/$f $([[ -f /run/nvidia/validations/$f ]] && echo exists || echo missing))" \
		test "$code" = 0 -a -f "/run/nvidia/validations/$f"
done
[[ -f /run/nvidia/validations/driver-ready ]] && sed 's/^/  driver-ready: /' /run/nvidia/validations/driver-ready
[[ $sim == 1 ]] && echo "  (cuda-validation ran without its workload on the simulated node: CUDA cannot run there)"

# --- what the device plugin and GFD give the node
alloc() { jp node "$K8S_NODE" -o 'jsonpath={.status.allocatable.nvidia\.com/gpu}'; }
until_true $wait_s 'test "$(alloc)" = "$ngpu"'
check "the node reports nvidia.com/gpu: $(alloc) allocatable (the service's status: $ngpu GPUs)" test -n "$ngpu" -a "$(alloc)" = "$ngpu"
echo "MEASURE operator: apply -> nvidia.com/gpu allocatable (from a watch of the Node): $(allocatable_seconds operator) s"
labels() { jp node "$K8S_NODE" -o jsonpath='{.metadata.labels}' | python3 -c 'import json,sys; [print(k+"="+v) for k,v in sorted(json.load(sys.stdin).items()) if k.startswith("nvidia.com/")]'; }
until_true $wait_s 'labels | grep -q "^nvidia.com/gfd.timestamp="'
labels >"$logs/node-nvidia-labels.txt"
sed 's/^/  node label: /' "$logs/node-nvidia-labels.txt" | grep -E 'gpu\.(product|count|memory|family|present|deploy)|gfd|cuda\.driver|mig\.' | head -30
product=$(sed -n 's/^nvidia.com\/gpu.product=//p' "$logs/node-nvidia-labels.txt")
check "GFD labelled the node (nvidia.com/gfd.timestamp, nvidia.com/gpu.product=$product)" \
	test -n "$product" -a -n "$(grep '^nvidia.com/gfd.timestamp=' "$logs/node-nvidia-labels.txt")"
[[ $sim == 0 ]] && check "GFD's product label names the host's $(host_gpu_model) ($product)" \
	grep -qF "$(host_gpu_model | tr ' ' -)" <<<"$product"

# --- on the GPU host: CUDA pods through the operator's device plugin (not tried when the
# plugin advertises no GPU: they would only wait)
if [[ $sim == 0 && $(alloc) != "$ngpu" ]]; then
	failed "CUDA pods not run: the operator's device plugin advertises no nvidia.com/gpu"
elif [[ $sim == 0 ]]; then
	spec=$(ls /var/run/cdi/k8s.device-plugin.nvidia.com-gpu.* 2>/dev/null | head -1)
	if [[ -n $spec ]]; then
		cp "$spec" "$logs/"
		missing=$(python3 - "$spec" <<'EOF'
import json, os, sys
import re
text = open(sys.argv[1]).read()
paths = set()
try:
    spec = json.loads(text)
    edits = [spec.get("containerEdits", {})] + [d.get("containerEdits", {}) for d in spec.get("devices", [])]
    for e in edits:
        for n in e.get("deviceNodes", []) or []:
            paths.add(n.get("hostPath") or n["path"])
        for m in e.get("mounts", []) or []:
            paths.add(m["hostPath"])
        for h in e.get("hooks", []) or []:
            paths.add(h["path"])
except ValueError:  # YAML: every hostPath/path value
    paths.update(m.group(1) for m in re.finditer(r'(?:hostPath|path): (/\S+)', text))
print("\n".join(sorted(p for p in paths if not os.path.exists(p))))
EOF
)
		check "the plugin's CDI spec $spec names only host paths that exist${missing:+ (missing: $(echo $missing))}" test -z "$missing"
	else
		failed "the operator's device plugin wrote no CDI spec in /var/run/cdi"
	fi
	img=talos-nvidia/k8s-node-cuda:test
	workload_image "$img" || failed "building the workload image"
	phase() { jp pod "$1" -o 'jsonpath={.status.phase}'; }
	finished() { case $(phase "$1") in Succeeded | Failed) return 0 ;; esac; return 1; }
	work='nvidia-smi -L && vecadd'
	# A control (K8S_NODE_CUDA_FAULT=1): CUDA in the GPU pods sees no device, so that their
	# checks, and this script's exit code, must fail.
	if [[ ${K8S_NODE_CUDA_FAULT:-0} == 1 ]]; then
		work='nvidia-smi -L && CUDA_VISIBLE_DEVICES=none vecadd'
		echo "  control K8S_NODE_CUDA_FAULT=1: the GPU pods run vecadd with CUDA_VISIBLE_DEVICES=none"
	fi
	watch_phases op-a
	sleep 1
	pod op-a 1 "$work && sleep 20"
	until_true 90 'test "$(phase op-a)" = Running || finished op-a'
	pod op-b 1 "$work"
	sleep 5
	reason=$(jp pod op-b -o 'jsonpath={.status.conditions[?(@.type=="PodScheduled")].reason}: {.status.conditions[?(@.type=="PodScheduled")].message}')
	check "a second GPU pod is Pending while the first runs ($reason)" \
		test "$(phase op-b)" = Pending -a "$(phase op-a)" = Running
	until_true 90 'finished op-a'
	until_true 120 'finished op-b'
	for p in op-a op-b; do
		out=$(kubectl logs "$p" 2>&1)
		echo "$out" >"$logs/$p.log"
		echo "$out" | sed "s/^/  $p: /"
		check "$p: nvidia-smi -L lists the host's $(host_gpu_model)" grep -qF "GPU 0: $(host_gpu_model) (UUID" <<<"$out"
		check "$p: the CUDA vector add is right on the GPU" grep -q '^vecadd: 4194304 elements ok' <<<"$out"
		check "$p Succeeded" test "$(phase $p)" = Succeeded
	done
	echo "MEASURE operator: GPU pod created -> Running: $(start_seconds op-a) s"
fi

# --- restarts of the service and of the operator's pods (NVIDIA/k8s-test-infra#857)
# (K8S_NODE_OPERATOR_RESTARTS=0 leaves them out, for a run that repeats another's restarts.)
if [[ ${K8S_NODE_OPERATOR_RESTARTS:-1} == 0 ]]; then
	echo "  restart checks (operator-restarts.sh) left out: K8S_NODE_OPERATOR_RESTARTS=0"
elif [[ $(state) == ready ]]; then
	. "$here/operator-restarts.sh"
else
	echo "  restart checks (operator-restarts.sh) not run: the ClusterPolicy is not ready"
fi

# --- what to read afterwards
collect_logs
exit $fail
