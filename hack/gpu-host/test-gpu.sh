#!/usr/bin/env bash
# GPU pods from NVIDIA's device plugin on a real Kubernetes node, on a host where the
# extension's service has brought the GPU up (run inside hack/k8s-node/cluster.sh -gpu, itself
# run by the harness while the service is ready; hack/gpu-host/gpu-run.sh does all of it):
#   - deploy/ as it renders, applied server-side; the node labelled as the docs say;
#   - the node reports nvidia.com/gpu: 1 allocatable, from the plugin's registration;
#   - the plugin's CDI spec names only host paths that exist;
#   - a pod asking for one GPU runs nvidia-smi -L and a CUDA program that checks its own
#     result (hack/k8s-node/workload/vecadd.cu, built here with the host's nvcc); a second
#     such pod stays Pending (Insufficient nvidia.com/gpu) until the first is done, then runs;
#   - pod start (created -> Running) with and without a GPU, and containerd's StartContainer
#     time (runc create with the CDI hooks, and start) for both;
#   - Node Feature Discovery v0.18.2 (hack/k8s-node/nfd.sh, as test-cpu.sh deploys it) puts the
#     labels of the service's own feature file, written from NVML (gpu-run.sh turns it on), on
#     the Node: nvidia.com/gpu.product, and no mig labels with MIG off;
#   - the GPU Operator's validator, driver component, against /run/nvidia/driver, as a pod
#     (hack/k8s-node/validator.sh).
# Prints PASS/FAIL lines and MEASURE lines; exits non-zero on a failure.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
check_name=k8s-node-gpu
# shellcheck source=hack/k8s-node/checks.sh
source "$top/hack/k8s-node/checks.sh"
ns=nvidia-gpu
model=$(host_gpu_model) # "NVIDIA H200"; GFD and the service's feature file write it as NVIDIA-H200
logs=${K8S_NODE_RESULTS:-$K8S_NODE_DIR/logs}
mkdir -p "$logs"

# --- the device plugin from deploy/
kubectl label node "$K8S_NODE" nvidia.com/gpu.present=true >/dev/null
. "$top/hack/k8s-node/workload.sh"
watch_allocatable deploy
if kubectl apply -k "$top/deploy" --server-side >/dev/null; then pass "kubectl apply -k deploy --server-side"; else failed "kubectl apply -k deploy"; fi
alloc() { jp node "$K8S_NODE" -o 'jsonpath={.status.allocatable.nvidia\.com/gpu}'; }
t0=$SECONDS
# NFD starts while the plugin registers; its labels are checked further down.
. "$top/hack/k8s-node/nfd.sh"
nfd_deploy
t_nfd=$SECONDS
plugin_restarts() { jp -n $ns pod -l app.kubernetes.io/name=nvidia-device-plugin -o 'jsonpath={.items[0].status.containerStatuses[?(@.name=="nvidia-device-plugin-ctr")].restartCount}'; }
# Until the plugin registers, or gives up: a crash loop shows in its restarts.
if until_true 150 'test "$(alloc)" = 1 -o "$(plugin_restarts)" -ge 3 2>/dev/null' && test "$(alloc)" = 1; then
	pass "the node reports nvidia.com/gpu: 1 allocatable ($((SECONDS - t0)) s after apply)"
	echo "MEASURE deploy/: apply -> nvidia.com/gpu allocatable (from a watch of the Node): $(allocatable_seconds deploy) s"
else
	failed "nvidia.com/gpu allocatable: '$(alloc)'"
	kubectl -n $ns get pods -o wide
	for p in $(kubectl -n $ns get pods -o name); do kubectl -n $ns describe "$p" | tail -25; done
fi
plugin=$(jp -n $ns pod -l app.kubernetes.io/name=nvidia-device-plugin -o 'jsonpath={.items[0].metadata.name}')
kubectl -n $ns logs "$plugin" -c nvidia-device-plugin-ctr >"$logs/device-plugin.log" 2>&1

# --- the plugin's own CDI spec names only host paths that exist
spec=/var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json
if [[ -f $spec ]]; then
	cp "$spec" "$logs/"
	missing=$(python3 - "$spec" <<'EOF'
import json, os, sys
spec = json.load(open(sys.argv[1]))
edits = [spec.get("containerEdits", {})] + [d.get("containerEdits", {}) for d in spec.get("devices", [])]
paths = set()
for e in edits:
    for n in e.get("deviceNodes", []) or []:
        paths.add(n.get("hostPath") or n["path"])
    for m in e.get("mounts", []) or []:
        paths.add(m["hostPath"])
    for h in e.get("hooks", []) or []:
        paths.add(h["path"])
print("\n".join(sorted(p for p in paths if not os.path.exists(p))))
print("# %d paths" % len(paths), file=sys.stderr)
EOF
)
	check "the plugin's spec $spec names only host paths that exist${missing:+ (missing: $(echo $missing))}" test -z "$missing"
else
	failed "the plugin wrote no spec at $spec"
fi

# --- the workload image: vecadd (and memlimit) built with the host's nvcc
img=talos-nvidia/k8s-node-cuda:test
workload_image "$img" || failed "building the workload image"

phase() { jp pod "$1" -o 'jsonpath={.status.phase}'; }
# state POD: the phase, or the reason its container waits when that is an error.
state() {
	local w
	w=$(jp pod "$1" -o 'jsonpath={.status.containerStatuses[0].state.waiting.reason}')
	case $w in *Err* | *BackOff*) echo "$w" ;; *) phase "$1" ;; esac
}
done_or_failed() { case $(state "$1") in Succeeded | Failed | *Err* | *BackOff*) return 0 ;; esac; return 1; }
explain() { # POD: why it is not where the test wanted it
	echo "  $1: $(state "$1")"
	kubectl describe pod "$1" | sed -n '/^Events:/,$p' | tail -8 | sed 's/^/    /'
}

work='nvidia-smi -L && vecadd'
# gpu-a holds its GPU a while so that gpu-b must wait.
watch_phases gpu-a
watch_phases gpu-b
watch_phases cpu-a
sleep 1
pod gpu-a 1 "$work && sleep 20"
until_true 60 'test "$(phase gpu-a)" = Running || done_or_failed gpu-a' || explain gpu-a
pod gpu-b 1 "$work"
sleep 5
reason=$(jp pod gpu-b -o 'jsonpath={.status.conditions[?(@.type=="PodScheduled")].reason}: {.status.conditions[?(@.type=="PodScheduled")].message}')
check "the second GPU pod is Pending while the first runs ($reason)" \
	test "$(phase gpu-b)" = Pending -a "$(phase gpu-a)" = Running -a -n "$(echo "$reason" | grep 'Insufficient nvidia.com/gpu')"
until_true 90 'done_or_failed gpu-a'
until_true 90 'done_or_failed gpu-b'
for p in gpu-a gpu-b; do [[ $(phase $p) == Succeeded ]] || explain $p; done
for p in gpu-a gpu-b; do
	out=$(kubectl logs "$p" 2>&1)
	echo "$out" | sed "s/^/  $p: /"
	echo "$out" >"$logs/$p.log"
	check "$p: nvidia-smi -L lists the host's $model" grep -qF "GPU 0: $model (UUID" <<<"$out"
	check "$p: the CUDA vector add is right on the GPU" grep -q '^vecadd: 4194304 elements ok' <<<"$out"
	check "$p Succeeded" test "$(phase $p)" = Succeeded
done
# The same image and command shape without a GPU.
pod cpu-a 0 "echo no gpu && sleep 2"
until_true 60 'done_or_failed cpu-a'
check "cpu-a (no GPU) Succeeded" test "$(phase cpu-a)" = Succeeded
sleep 1
echo "MEASURE pod start (created -> Running, from a watch): with one GPU $(start_seconds gpu-a) s, without a GPU $(start_seconds cpu-a) s"
cat "$K8S_NODE_DIR"/{gpu-a,gpu-b,cpu-a}.phases >"$logs/phases.txt" 2>/dev/null

# containerd's StartContainer (task create: runc create with the OCI hooks, then start) per container.
python3 - "$K8S_NODE_DIR/logs/containerd.log" <<'EOF' | tee "$logs/start-container.txt"
import json, re, sys
from datetime import datetime
def ts(t):
    t = re.sub(r"(\.\d{6})\d*", r"\1", t)
    return datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp()
pods, names, begin, took = {}, {}, {}, {}
for line in open(sys.argv[1]):
    try:
        e = json.loads(line)
    except ValueError:
        continue
    m = e.get("msg", "")
    r = re.search(r'RunPodSandbox for name:"([^"]+)".* returns sandbox id "([0-9a-f]+)"', m)
    if r:
        pods[r.group(2)] = r.group(1)
    r = re.search(r'CreateContainer within sandbox "([0-9a-f]+)" for name:"([^"]+)" returns container id "([0-9a-f]+)"', m)
    if r:
        names[r.group(3)] = pods.get(r.group(1), "?") + "/" + r.group(2)
    r = re.match(r'StartContainer for "([0-9a-f]+)"$', m)
    if r:
        begin[r.group(1)] = ts(e["time"])
    r = re.match(r'StartContainer for "([0-9a-f]+)" returns successfully', m)
    if r and r.group(1) in begin:
        n = names.get(r.group(1), r.group(1)[:12])
        ms = 1000 * (ts(e["time"]) - begin[r.group(1)])
        print("StartContainer %-45s %7.1f ms" % (n, ms))
        took[n] = ms
if "gpu-a/work" in took and "cpu-a/work" in took:
    print("MEASURE containerd StartContainer (runc create with the OCI hooks, then start): with one GPU %.1f ms (gpu-a), %s without %.1f ms (cpu-a): CDI injection and hooks add %.1f ms"
          % (took["gpu-a/work"], "gpu-b %.1f ms," % took["gpu-b/work"] if "gpu-b/work" in took else "", took["cpu-a/work"], took["gpu-a/work"] - took["cpu-a/work"]))
EOF

# --- NFD: the labels of the service's feature file on the Node
f=$nfd_features_d/nvidia-driver
if [[ -f $f ]]; then
	sed 's|^|  features.d/nvidia-driver: |' "$f"
	cp "$f" "$logs/nfd-features-nvidia-driver"
	echo "  features.d: mode $(stat -c %a "$nfd_features_d"), file mode $(stat -c %a "$f")"
	check "the service wrote nvidia.com/gpu.product=${model// /-} and nvidia.com/mps.capable=true from NVML into $f, and no mig label (MIG off)" \
		test "$(grep -v '^#' "$f" | tr '\n' ' ')" = "nvidia.com/gpu.product=${model// /-} nvidia.com/mps.capable=true "
else
	failed "the service wrote no feature file at $f"
fi
if until_true 120 'nfd_labels_are "${model// /-}" "" "" true'; then
	pass "NFD put nvidia.com/gpu.product=${model// /-} and mps.capable=true on the Node from the service's file, no mig.config or mig.config.state (checked $((SECONDS - t_nfd)) s after NFD's apply)"
else
	failed "NFD did not label the node from the service's file; its nvidia.com labels: $(nvidia_labels | tr "\n" " ")"
	nfd_logs
fi
nvidia_labels | sed 's/^/  node label: /'
jp node "$K8S_NODE" -o jsonpath='{.metadata.labels}' | tr -d '{}' | tr ',' '\n' >"$logs/node-labels.txt"
echo "  NFD's own labels (feature.node.kubernetes.io): $(grep -c feature.node.kubernetes.io "$logs/node-labels.txt"), of them for NVIDIA's PCI vendor id: $(grep -E 'feature.node.kubernetes.io/pci-([0-9a-f]{4}_)?10de' "$logs/node-labels.txt" | tr '\n' ' ')"
kubectl -n $nfd_ns logs ds/nfd-worker >"$logs/nfd-worker.log" 2>&1
kubectl -n $nfd_ns logs deploy/nfd-master >"$logs/nfd-master.log" 2>&1

# --- the GPU Operator's validator, driver component, against the driver root
. "$top/hack/k8s-node/validator.sh"

kubectl get pods -A -o wide >"$logs/pods.txt" 2>&1
kubectl get node "$K8S_NODE" -o yaml >"$logs/node.yaml" 2>&1
exit $fail
