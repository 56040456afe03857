#!/usr/bin/env bash
# deploy/ on a real Kubernetes node without a GPU (run inside hack/k8s-node/cluster.sh; `make
# test-k8s-node` does both). Checks, against the real API server, scheduler, kubelet and
# containerd:
#   - the node runs the versions Talos v1.14.1 ships;
#   - Pod Security is enforced as on Talos ("baseline"), so deploy/'s namespace label matters;
#   - `kubectl apply -k deploy` passes server-side validation (dry run), then applies;
#   - the DaemonSets schedule nowhere while the node lacks the label the docs name, and on it
#     once it has the label (and the taint docs/examples/talos-1.13/gpu-worker.patch.yaml registers);
#   - the device plugin's wait-for-driver init container holds the pod until the readiness
#     file of the service exists, then the chart's config-manager reads the node's label
#     through the API server and the plugin starts with migStrategy none;
#   - Node Feature Discovery v0.18.2 (its own nfd-master and nfd-worker, deployed from its own
#     deployment/ files by hack/k8s-node/nfd.sh) turns the service's feature file into the
#     Node's nvidia.com labels, in a features.d made 0700 as Talos makes it, and follows the
#     file when it changes.
# Prints PASS/FAIL lines; exits non-zero on a failure.
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
check_name=k8s-node
# shellcheck source=hack/k8s-node/checks.sh
source "$(dirname "${BASH_SOURCE[0]}")/checks.sh"

ns=nvidia-gpu
ready_dir=/run/nvidia/validations

# --- versions: Talos v1.14.1's (pkg/machinery/constants DefaultKubernetesVersion, DefaultContainerdVersion)
v=$(jp node "$K8S_NODE" -o 'jsonpath={.status.nodeInfo.kubeletVersion} {.status.nodeInfo.containerRuntimeVersion}')
echo "  node: $v; API server: $(kubectl version -o json | grep -m1 gitVersion | tr -d ' ",')"
check "kubelet v1.37.0 on containerd 2.3.5" test "$v" = "v1.37.0 containerd://2.3.5"

# --- Pod Security as Talos configures it: a privileged pod outside a privileged namespace is refused
out=$(kubectl run psa-probe --image=talos-nvidia/k8s-node-base:test --restart=Never \
	--overrides='{"spec":{"containers":[{"name":"p","image":"talos-nvidia/k8s-node-base:test","securityContext":{"privileged":true}}]}}' \
	--dry-run=server 2>&1)
if echo "$out" | grep -q 'violates PodSecurity "baseline:latest"'; then
	pass "Pod Security baseline refuses a privileged pod in namespace default"
else
	failed "Pod Security baseline in namespace default: $out"
fi

# --- deploy/ against the real API server. A server-side dry run creates nothing, so the
# namespace that the rest goes into must exist first.
check "kubectl apply -k deploy/namespace --server-side" kubectl apply -k "$top/deploy/namespace" --server-side
out=$(kubectl apply -k "$top/deploy" --server-side --dry-run=server 2>&1)
rc=$?
echo "$out" | sed 's/^/  /'
check "kubectl apply -k deploy --server-side --dry-run=server" test $rc = 0
if ! kubectl apply -k "$top/deploy" --server-side >/dev/null; then
	failed "kubectl apply -k deploy --server-side"
fi
for ds in nvidia-device-plugin dcgm-exporter; do
	check "DaemonSet $ns/$ds exists" kubectl -n $ns get ds $ds -o name
done

# --- scheduling: nowhere without the label the docs name (docs/kubernetes.md "Node labels")
synced() { # DS: its controller has seen the current spec
	[ "$(jp -n $ns ds "$1" -o 'jsonpath={.status.observedGeneration}')" = \
		"$(jp -n $ns ds "$1" -o 'jsonpath={.metadata.generation}')" ]
}
scheduled() { jp -n $ns ds "$1" -o 'jsonpath={.status.desiredNumberScheduled}'; }
for ds in nvidia-device-plugin dcgm-exporter; do
	until_true 60 'synced $ds'
	sleep 2 # a pod created now would show in the status of the next sync
	n=$(scheduled $ds)
	check "$ds schedules on no node while the node lacks nvidia.com/gpu.present (desired: $n)" test "$n" = 0
done
grep -q 'nvidia.com/gpu.present: "true"' "$top/docs/examples/talos-1.13/gpu-worker.patch.yaml" ||
	failed "docs/examples/talos-1.13/gpu-worker.patch.yaml no longer sets nvidia.com/gpu.present: \"true\""
kubectl label node "$K8S_NODE" nvidia.com/gpu.present=true >/dev/null
for ds in nvidia-device-plugin dcgm-exporter; do
	until_true 60 'test "$(scheduled $ds)" = 1'
	n=$(scheduled $ds)
	check "$ds schedules on the labelled, tainted node (desired: $n)" test "$n" = 1
done
plugin_pod() { jp -n $ns pod -l app.kubernetes.io/name=nvidia-device-plugin -o 'jsonpath={.items[0].metadata.name}'; }
until_true 60 'test -n "$(plugin_pod)"'
pod=$(plugin_pod)
check "device plugin pod $pod is bound to $K8S_NODE" test "$(jp -n $ns pod "$pod" -o 'jsonpath={.spec.nodeName}')" = "$K8S_NODE"

# --- the wait-for-driver init container holds the plugin until the service's readiness file
init_state() { # NAME: running, terminated:<code> or waiting
	local s
	s=$(jp -n $ns pod "$pod" -o "jsonpath={.status.initContainerStatuses[?(@.name==\"$1\")].state}")
	case $s in
	*'"running"'*) echo running ;;
	*'"terminated"'*) echo "terminated:$(jp -n $ns pod "$pod" -o "jsonpath={.status.initContainerStatuses[?(@.name==\"$1\")].state.terminated.exitCode}")" ;;
	*) echo waiting ;;
	esac
}
if until_true 120 'test "$(init_state wait-for-driver)" = running'; then
	pass "wait-for-driver is running"
else
	failed "wait-for-driver never ran: $(jp -n $ns pod "$pod" -o 'jsonpath={.status}')"
	kubectl -n $ns describe pod "$pod" | tail -20
fi
sleep 10
s=$(init_state wait-for-driver) main=$(jp -n $ns pod "$pod" -o 'jsonpath={.status.containerStatuses[*].state}')
check "after 10 s without $ready_dir/nvidia-driver.ready the pod is still held (wait-for-driver $s, no container started)" \
	test "$s" = running -a -z "$(echo "$main" | grep -e running -e terminated)"
kubectl -n $ns logs "$pod" -c wait-for-driver | sed 's/^/  wait-for-driver: /'

mkdir -p $ready_dir
printf '{"node":"%s","simulated":"by test-cpu.sh"}\n' "$K8S_NODE" >$ready_dir/nvidia-driver.ready.tmp
mv $ready_dir/nvidia-driver.ready.tmp $ready_dir/nvidia-driver.ready
if until_true 60 'test "$(init_state wait-for-driver)" = terminated:0'; then
	pass "wait-for-driver exits 0 once the readiness file exists"
else
	failed "wait-for-driver after the readiness file: $(init_state wait-for-driver)"
fi
# The chart's config-manager (ONESHOT) reads the node's nvidia.com/device-plugin.config label
# from the API server (in-cluster config, the kubernetes Service) and writes the config.
if until_true 90 'test "$(init_state nvidia-device-plugin-init)" = terminated:0' &&
	kubectl -n $ns logs "$pod" -c nvidia-device-plugin-init | grep -q 'Successfully updated to config: none'; then
	pass "the chart's config-manager read the node's labels through the API server and chose config none"
else
	failed "config-manager init: $(init_state nvidia-device-plugin-init)"
	kubectl -n $ns logs "$pod" -c nvidia-device-plugin-init | tail -10
fi
# Then the plugin itself starts, loads that configuration, and, on a machine without NVIDIA's
# driver, stops there: its CDI strategy needs NVML.
plugin_logs() { kubectl -n $ns logs "$pod" -c nvidia-device-plugin-ctr 2>&1; kubectl -n $ns logs "$pod" -c nvidia-device-plugin-ctr --previous 2>/dev/null; }
until_true 60 'plugin_logs | grep -q "Loading configuration"'
logs=$(plugin_logs)
echo "$logs" | head -12 | sed 's/^/  plugin: /'
if echo "$logs" | grep -q 'Loading configuration' && echo "$logs" | grep -q 'only supported on NVML-based systems'; then
	pass "the device plugin started, loaded its configuration, and stopped for want of NVML (no GPU here)"
else
	failed "the device plugin's start"
fi

kubectl -n $ns get pods -o wide

# --- Node Feature Discovery: the service's feature file becomes the Node's labels
# (docs/kubernetes.md "Labels from the host"), NFD deployed by hack/k8s-node/nfd.sh.
. "$top/hack/k8s-node/nfd.sh"
nfd_features_mount # features.d made 0700, as Talos makes it
nfd_deploy
t0=$SECONDS
"$K8S_NODE_IMAGES/nfd-features" $nfd_features_d all-balanced success "NVIDIA H200" false
sed 's|^|  features.d/nvidia-driver: |' $nfd_features_d/nvidia-driver
m=$(stat -c %a $nfd_features_d)
check "the writer opened features.d (made 0700) to NFD's unprivileged worker (now $m)" test "$m" = 755
if until_true 180 'nfd_labels_are NVIDIA-H200 all-balanced success false'; then
	pass "NFD labelled the node from the feature file within $((SECONDS - t0)) s of the pods' creation (nvidia.com/gpu.product=NVIDIA-H200, mig.config=all-balanced, mig.config.state=success, mps.capable=false)"
else
	failed "NFD did not label the node from the feature file; the node's nvidia.com labels: $(nvidia_labels | tr "\n" " ")"
	nfd_logs
fi
# The service replaces the file whole: a new product, and no MIG layout any more.
t0=$SECONDS
"$K8S_NODE_IMAGES/nfd-features" $nfd_features_d "" "" "NVIDIA A100-SXM4-80GB" true
if until_true 60 'nfd_labels_are NVIDIA-A100-SXM4-80GB "" "" true'; then
	pass "a changed feature file changed the labels (mps.capable=true without MIG) and removed the mig labels it no longer has, within $((SECONDS - t0)) s"
else
	failed "the node's labels after the feature file changed: $(nvidia_labels | tr "\n" " ")"
	nfd_logs
fi
nvidia_labels | sed 's/^/  /'

# --- GPU sharing (docs/sharing.md): deploy/sharing over deploy/, configurations chosen by label
out=$(kubectl apply -k "$top/deploy/sharing" --server-side --dry-run=server 2>&1)
rc=$?
echo "$out" | sed 's/^/  /'
check "kubectl apply -k deploy/sharing --server-side --dry-run=server" test $rc = 0
kubectl apply -k "$top/deploy/sharing" --server-side >/dev/null || failed "kubectl apply -k deploy/sharing --server-side"
kubectl label node "$K8S_NODE" nvidia.com/device-plugin.config=time-slicing-4 --overwrite >/dev/null
# The chart's config-manager sidecar follows the label and restarts the plugin on the new
# configuration (the ConfigMap's new entries reach its volume within the kubelet's sync).
# ($pod is still the plugin's: the chart gives the MPS control daemon's pods the same labels.)
sidecar_logs() { kubectl -n $ns logs "$pod" -c nvidia-device-plugin-sidecar 2>&1; }
if until_true 150 '[[ $(sidecar_logs) == *"Successfully updated to config: time-slicing-4"* ]]'; then
	pass "the label nvidia.com/device-plugin.config=time-slicing-4 reached the plugin through the config-manager sidecar"
else
	failed "the config-manager sidecar did not switch to time-slicing-4"
	kubectl -n $ns logs "$pod" -c nvidia-device-plugin-sidecar --tail=10 | sed 's/^/  sidecar: /'
fi
out=$(kubectl -n $ns logs "$pod" -c check-sharing 2>&1)
echo "$out" | sed 's/^/  /'
check "check-sharing passed for the plugin's first configuration (no GPU in MIG mode)" \
	test "${out#check-sharing: sharing none, migStrategy none; 0 GPU}" != "$out"
# The MPS control daemon schedules by the service's mps.capable label (true since the feature
# file's last change) and, without a driver here, stops with the reason.
mps_pod() { jp -n $ns pod -o name | grep mps-control-daemon; }
mps_logs() { kubectl -n $ns logs "$(mps_pod)" -c mps-control-daemon-ctr 2>&1; kubectl -n $ns logs "$(mps_pod)" -c mps-control-daemon-ctr --previous 2>/dev/null; }
if until_true 120 '[[ $(mps_logs) == *"nvidia-cuda-mps-control is missing"* ]]'; then
	pass "the MPS control daemon scheduled on the node labelled nvidia.com/mps.capable=true and, without a driver root, said what is missing"
else
	failed "the MPS control daemon on the mps.capable node: $(mps_pod) $(mps_logs | tail -3)"
	kubectl -n $ns describe "$(mps_pod)" 2>&1 | tail -15
fi
# A conflict: MPS chosen while the service reports a GPU in MIG mode. driver-watch exits with
# the reason (and restarts while it lasts).
kubectl label node "$K8S_NODE" nvidia.com/device-plugin.config=mps-2 --overwrite >/dev/null
until_true 150 '[[ $(sidecar_logs) == *"Successfully updated to config: mps-2"* ]]'
printf '{\n  "driverVersion": "0",\n  "gpus": [\n    {"index": 0, "uuid": "GPU-0", "name": "NVIDIA H200", "mig": "enabled"}\n  ]\n}\n' >$ready_dir/nvidia-driver.ready.tmp
mv $ready_dir/nvidia-driver.ready.tmp $ready_dir/nvidia-driver.ready
watch_logs() { kubectl -n $ns logs "$pod" -c driver-watch 2>&1; kubectl -n $ns logs "$pod" -c driver-watch --previous 2>/dev/null; }
if until_true 90 '[[ $(watch_logs) == *"CONFLICT: this node"?"s device plugin configuration shares GPUs through MPS"* ]]'; then
	pass "driver-watch reported the conflict of mps-2 with a GPU in MIG mode (layout all-balanced)"
	watch_logs | grep -m1 -A2 CONFLICT | sed 's/^/  driver-watch: /'
else
	failed "no conflict reported for mps-2 with MIG on: $(watch_logs | tail -3)"
fi
exit $fail
