# The MIG pause cycle on the simulated GPU node (docs/mig.md, section 5), end to end: a layout
# that changes the MIG mode while NVIDIA's device plugin holds the GPUs open (the simulated
# driver refuses the change then: hack/sim-node/simnvml attach.go), the service's pause through its NFD
# feature file, Node Feature Discovery v0.18.2 turning it into the GPU Operator's labels,
# deploy/'s DaemonSets taking their pods off the node, the layout applied, the pause lifted and
# the pods back, each step timed. The layout is hack/sim-node/sim-mig.yaml's gpu0-mig-on (MIG
# on GPU 0, no instances; the file is in the service's document from the start, sim-run.sh):
# with MIG instances, nvcdi (the service's and the plugin's) reads
# /proc/driver/nvidia-caps/mig-minors from the kernel's /proc, where a simulated driver cannot
# put it (docs/simulated-node.md), and with every GPU in MIG mode and no instance the service
# has no device for its CDI spec and waits, the pause kept (docs/mig.md).
#
# First a control: the same change with the pause off (migPause: false) leaves the layout
# pending and the plugin's pod where it is, which the pause check reports as not done, so that
# check can fail. Sourced by test-sim.sh (pass, failed, check, until_true, jp, ns, top, here);
# the service's document is changed through the harness (HARNESS_DOCUMENT_REQUESTS), its log
# read at HARNESS_SERVICE_LOG.

. "$top/hack/k8s-node/nfd.sh"
status=/run/nvidia-driver/status.json
sim_features=/run/nvidia/sim$nfd_features_d # the service's host root is /run/nvidia/sim
features=$nfd_features_d/nvidia-driver
pause_label=nvidia.com/gpu.deploy.device-plugin=paused-for-mig-change
interval=$(sed -n 's/^ *sleepInterval: *//p' "$top/hack/k8s-node/nfd/nfd-worker.conf")

now() { date +%s.%N; }
took() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; } # FROM TO: seconds

# ask ENTRY...: a change of the service's document (a restart by Talos), applied when it returns.
asks=0
ask() {
	asks=$((asks + 1))
	local r=$HARNESS_DOCUMENT_REQUESTS/$asks
	printf '%s\n' "$@" >"$r.tmp" && mv "$r.tmp" "$r.env"
	until_true 60 "test -e $r.applied"
}

# svc_mig: "PHASE RESULT MODE" from the service's status: its phase, and GPU 0's layout result
# and MIG mode.
svc_mig() {
	python3 - "$status" <<'EOF' 2>/dev/null
import json, sys
s = json.load(open(sys.argv[1]))
res = [m.get("result", "") for m in s.get("mig") or [] if m.get("index") == 0] or ["-"]
mode = [g.get("mig", "") or "-" for g in s.get("gpus") or [] if g.get("index") == 0] or ["-"]
print(s["phase"], res[0], mode[0])
EOF
}
# pods_of DS FIELD: FIELD (name:phase, uid or ready) of each of DS's pods, terminating ones
# included, one a line.
pods_of() {
	kubectl -n $ns get pods -o json 2>/dev/null | python3 -c '
import json, sys
ds, field = sys.argv[1], sys.argv[2]
for p in json.load(sys.stdin)["items"]:
    if not any(o.get("kind") == "DaemonSet" and o.get("name") == ds for o in p["metadata"].get("ownerReferences") or []):
        continue
    ready = all(c.get("ready") for c in p["status"].get("containerStatuses") or [{}])
    print({"name": p["metadata"]["name"] + ":" + p["status"].get("phase", ""), "uid": p["metadata"]["uid"], "ready": str(ready).lower()}[field])
' "$1" "$2"
}
ds_pods() { pods_of "$1" name | tr '\n' ' '; }
plugin_ready() { [ "$(pods_of nvidia-device-plugin ready)" = true ]; }
plugin_uid() { pods_of nvidia-device-plugin uid; }
plugin_pod() { pods_of nvidia-device-plugin name | head -1 | cut -d: -f1; }
paused_label() { [ "$(node_label 'gpu\.deploy\.device-plugin')" = paused-for-mig-change ]; }
svc_log_since() { tail -n +"$1" "$HARNESS_SERVICE_LOG"; } # LINE: the service's log from LINE on

# --- NFD on the node, reading the service's features.d
nfd_features_mount "$sim_features"
nfd_deploy
t=$(now)
if until_true 120 'nfd_labels_are NVIDIA-H100-80GB-HBM3 "" "" true'; then
	pass "NFD labelled the node from the service's feature file (gpu.product=NVIDIA-H100-80GB-HBM3, mps.capable=true) $(took "$t" "$(now)") s after its apply; worker rescan every $interval"
else
	failed "NFD did not label the node from the service's feature file: $(nvidia_labels | tr '\n' ' ')"
	nfd_logs
fi
until_true 60 plugin_ready
uid=$(plugin_uid)

# --- the control: the layout asked for with the pause off
registrations() { kubectl -n $ns logs "$(plugin_pod)" -c nvidia-device-plugin-ctr 2>/dev/null | grep -c "Registered device plugin for 'nvidia.com/gpu'"; }
regs=$(registrations) watch_lines=$(kubectl -n $ns logs "$(plugin_pod)" -c driver-watch 2>/dev/null | grep -c "driver readiness changed")
mark=$(($(wc -l <"$HARNESS_SERVICE_LOG") + 1))
ask NVIDIA_DRIVER_MIG_LAYOUT=gpu0-mig-on NVIDIA_DRIVER_MIG_PAUSE=false
if until_true 90 '[[ $(svc_mig) == "degraded pending "* || $(svc_mig) == "ready pending "* ]] && nfd_labels_are NVIDIA-H100-80GB-HBM3 gpu0-mig-on pending'; then
	pass "control (migPause=false): gpu0-mig-on is pending on GPU 0, which the plugin holds ($(svc_mig)), the node labelled mig.config.state=pending"
else
	failed "control (migPause=false): the service's status '$(svc_mig)', the node's labels $(nvidia_labels | tr '\n' ' ')"
fi
# The pending layout changes no device, so the readiness file stays byte-identical and
# driver-watch leaves the plugin alone (checked after the 20 s below: four of its polls).
until_true 60 plugin_ready
# The check of the real cycle below, given as long: it must not see the pause.
if until_true 20 '[ -z "$(ds_pods nvidia-device-plugin)" ] || paused_label'; then
	failed "control (migPause=false): the pause happened anyway: plugin pods '$(ds_pods nvidia-device-plugin)', labels $(nvidia_labels | tr '\n' ' ')"
else
	pass "control (migPause=false): no pause label and the device plugin's pod was not removed within 20 s (the pause check fails here, as it must): the same pod $([ "$(plugin_uid)" = "$uid" ] && echo kept || echo REPLACED), $(ds_pods nvidia-device-plugin)"
fi
check "control (migPause=false): the service said it does not retry, and the GPUs stayed out of MIG mode ($(svc_mig))" \
	eval 'svc_log_since $mark | grep -q "not retried" && [[ $(svc_mig) == *" pending disabled"* ]]'
[ "$(plugin_uid)" = "$uid" ] || failed "control (migPause=false): the plugin's pod was replaced"
check "control (migPause=false): the pending layout left the readiness file as it was: driver-watch did not restart the plugin ($(registrations) registration(s), $regs before)" \
	eval '[ "$(kubectl -n $ns logs "$(plugin_pod)" -c driver-watch 2>/dev/null | grep -c "driver readiness changed")" = "$watch_lines" ] && [ "$(registrations)" = "$regs" ]'

# --- the cycle: the pause on (the default), the same layout
mark=$(($(wc -l <"$HARNESS_SERVICE_LOG") + 1))
t0=$(now)
ask NVIDIA_DRIVER_MIG_PAUSE=true
t_restart=$(now)
step() { # NAME SECONDS CONDITION: wait for CONDITION, time it from the previous step
	local name=$1 limit=$2 cond=$3
	if until_true "$limit" "$cond"; then
		local t1
		t1=$(now)
		pass "pause cycle: $name ($(took "$t_prev" "$t1") s after the previous step, $(took "$t0" "$t1") s in all)"
		steps+=("$(took "$t_prev" "$t1") s  $name")
		t_prev=$t1
	else
		failed "pause cycle: $name: not within $limit s (service '$(svc_mig)', plugin pods '$(ds_pods nvidia-device-plugin)', dcgm-exporter pods '$(ds_pods dcgm-exporter)', labels $(nvidia_labels | tr '\n' ' '))"
		cycle_failed=1
	fi
}
cycle_failed=0 steps=()
t_prev=$t0
echo "  the document changed (migPause=true); Talos restarted the service in $(took "$t0" "$t_restart") s"
step "the service wrote the pause into its feature file" 60 'grep -qx "$pause_label" $features'
sed 's|^|  features.d/nvidia-driver: |' $features
step "NFD labelled the node $pause_label (worker rescan every $interval)" 60 paused_label
step "the device plugin's pods are gone" 90 '[ -z "$(ds_pods nvidia-device-plugin)" ]'
step "the DCGM exporter's pods are gone" 30 '[ -z "$(ds_pods dcgm-exporter)" ]'
step "the service applied gpu0-mig-on on the simulated GPU 0 (retry every 10 s, the default)" 60 '[[ $(svc_mig) == *" success enabled" ]]'
step "the service lifted the pause from its feature file" 30 '! grep -q paused-for-mig-change $features'
step "NFD removed the pause labels from the node" 60 '! nvidia_labels | grep -q paused-for-mig-change'
step "the DCGM exporter's pod is back" 60 '[ -n "$(ds_pods dcgm-exporter)" ]'
step "the device plugin's pod is back and ready" 120 plugin_ready
# Strategy none (deploy/'s default) counts a GPU in MIG mode as a whole GPU (k8s-device-plugin
# v0.19.0 internal/rm/device_map.go, buildGPUDeviceMap).
step "the node reports nvidia.com/gpu: 8 allocatable again" 90 'test "$(alloc nvidia.com/gpu)" = 8'
kubectl -n $ns logs "$(plugin_pod)" -c nvidia-device-plugin-ctr 2>&1 | grep -E 'Retrieved|Registered|simnvml:' | head -4 | sed 's/^/  plugin: /'
echo "  the service's own account (its log):"
svc_log_since $mark | grep -E 'mig layout|pause|mig retry' | sed 's/^/    /'
nvidia_labels | sed 's/^/  label: /'
echo "  allocatable: $(jp node "$K8S_NODE" -o 'jsonpath={.status.allocatable}')"
check "pause cycle: the plugin pod is a new one ($(ds_pods nvidia-device-plugin))" test "$(plugin_uid)" != "$uid" -a -n "$(plugin_uid)"
check "pause cycle: the node's labels say gpu0-mig-on success" nfd_labels_are NVIDIA-H100-80GB-HBM3 gpu0-mig-on success false
check "pause cycle: the service's log has the pause asked for, the layout applied once the GPUs were free, the pause lifted" \
	eval 'l=$(svc_log_since $mark); grep -q "asked for the operands. pause" <<<"$l" && grep -q "applied once the GPUs were free" <<<"$l" && grep -q "pause is lifted" <<<"$l"'
echo "  pause cycle, each step's time (NFD worker rescan every $interval; the service's retry every 10 s):"
printf '    %s\n' "${steps[@]}"
echo "  pause cycle: $(took "$t0" "$t_prev") s from the document's change to the last step (every step: $([ $cycle_failed = 0 ] && echo PASS || echo FAIL))"
