# Setup 1's stop, sourced by test-operator.sh with GPU_OPERATOR_EXPECT_STOP=toolkit once the
# ClusterPolicy has been waited for. By the operator's source (docs/gpu-operator.md, "Setup 1
# cannot reach ready") the validator's toolkit check runs nvidia-smi from its own container's
# PATH, which only an NVIDIA runtime or the toolkit's NRI plugin fills, and the device plugin
# and GFD wait for the file that check writes. So on this extension without either, setup 1
# must get this far and no further:
#   - the validator's driver check passed on the extension's driver root (driver-ready);
#   - its toolkit check failed with "error validating toolkit installation", no toolkit-ready;
#   - the operator's device plugin pod created, held in its init container toolkit-validation;
#   - no nvidia.com/gpu on the node.
# And the driver check is shown able to fail: the validator pod's own driver-validation
# container, run as a pod of its own with WITH_WAIT=false (the validator then exits instead of
# retrying), once with the node's driver root and host root (it must pass) and once with both
# empty (it must fail). Both write their status file and /dev/char links into volumes of their
# own, not the node's.
# Uses test-operator.sh's ns, logs, K8S_NODE, state, and checks.sh's helpers.

vpod=$(jp -n $ns pod -l app=nvidia-operator-validator -o 'jsonpath={.items[0].metadata.name}')
init_status() { # CONTAINER JSONPATH-TAIL: a field of an init container's status in the validator pod
	jp -n $ns pod "$vpod" -o "jsonpath={.status.initContainerStatuses[?(@.name==\"$1\")].$2}"
}
for c in driver-validation toolkit-validation; do
	kubectl -n $ns logs "$vpod" -c $c >"$logs/validator-$c.log" 2>&1
	tail -4 "$logs/validator-$c.log" | sed "s/^/  $c: /"
done
code=$(init_status driver-validation state.terminated.exitCode)
check "the validator's driver-validation passed on the driver root (exit code ${code:-none}; /run/nvidia/validations/driver-ready $([[ -f /run/nvidia/validations/driver-ready ]] && echo exists || echo missing))" \
	test "$code" = 0 -a -f /run/nvidia/validations/driver-ready
[[ -f /run/nvidia/validations/driver-ready ]] && sed 's/^/  driver-ready: /' /run/nvidia/validations/driver-ready
# The container may be running its next try: its last finished run says how it ended.
tcode=$(init_status toolkit-validation lastState.terminated.exitCode)
[[ -n $tcode ]] || tcode=$(init_status toolkit-validation state.terminated.exitCode)
kubectl -n $ns logs "$vpod" -c toolkit-validation --previous >>"$logs/validator-toolkit-validation.log" 2>/dev/null
check "the validator's toolkit-validation failed where the operator's source says it must (exit code ${tcode:-none}, restarts $(init_status toolkit-validation restartCount)): 'error validating toolkit installation'" \
	sh -c "test -n '$tcode' -a '$tcode' != 0 && grep -q 'error validating toolkit installation' '$logs/validator-toolkit-validation.log'"
check "no /run/nvidia/validations/toolkit-ready was written" test ! -e /run/nvidia/validations/toolkit-ready

dpod=$(jp -n $ns pod -l app=nvidia-device-plugin-daemonset -o 'jsonpath={.items[0].metadata.name}')
held=$([[ -n $dpod ]] && jp -n $ns pod "$dpod" -o 'jsonpath={.status.initContainerStatuses[?(@.name=="toolkit-validation")].state.running.startedAt}')
check "the operator's device plugin pod ${dpod:-(none)} is held in its init container toolkit-validation (running since ${held:-never})" \
	test -n "$held"
gpus=$(jp node "$K8S_NODE" -o 'jsonpath={.status.allocatable.nvidia\.com/gpu}')
check "the node reports no nvidia.com/gpu (${gpus:-none})" test -z "$gpus" -o "$gpus" = 0

# --- the control: the validator's driver-validation container in a pod of its own
driver_pod() { # NAME EMPTY(0|1): the pod's manifest, from the validator pod's own spec
	jp -n $ns pod "$vpod" -o json | python3 -c '
import json, sys
name, empty = sys.argv[1], sys.argv[2] == "1"
pod = json.load(sys.stdin)
spec = pod["spec"]
c = next(c for c in spec["initContainers"] if c["name"] == "driver-validation")
c["env"] = [e for e in c.get("env", []) if e["name"] != "WITH_WAIT"] + [{"name": "WITH_WAIT", "value": "false"}]
names = {m["name"] for m in c.get("volumeMounts", [])}
vols = []
for v in spec["volumes"]:
    if v["name"] not in names:
        continue
    if v["name"] in ("run-nvidia-validations", "host-dev-char") or (empty and v["name"] in ("driver-install-dir", "host-root")):
        v = {"name": v["name"], "emptyDir": {}}
    vols.append(v)
for m in c.get("volumeMounts", []):
    m.pop("mountPropagation", None)  # Bidirectional needs a shared mount; an emptyDir is not
    if not empty and m["name"] in ("driver-install-dir", "host-root"):
        m["mountPropagation"] = "HostToContainer"
print(json.dumps({"apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": name, "namespace": pod["metadata"]["namespace"]},
    "spec": {"nodeName": spec["nodeName"], "serviceAccountName": spec.get("serviceAccountName"),
             "tolerations": spec.get("tolerations", []), "restartPolicy": "Never",
             "containers": [c], "volumes": vols}}))
' "$1" "$2"
}
for run in live:0 empty:1; do
	name=driver-check-${run%:*}
	driver_pod $name "${run#*:}" | kubectl apply -f - >/dev/null
done
for name in driver-check-live driver-check-empty; do
	until_true 90 "case \$(jp -n $ns pod $name -o 'jsonpath={.status.phase}') in Succeeded|Failed) true;; *) false;; esac"
	kubectl -n $ns logs $name >"$logs/$name.log" 2>&1
	tail -2 "$logs/$name.log" | sed "s/^/  $name: /"
done
live=$(jp -n $ns pod driver-check-live -o 'jsonpath={.status.containerStatuses[0].state.terminated.exitCode}')
empty=$(jp -n $ns pod driver-check-empty -o 'jsonpath={.status.containerStatuses[0].state.terminated.exitCode}')
check "the validator's driver check in a pod of its own passes with the node's driver root (exit code ${live:-none})" test "$live" = 0
check "control: the same with an empty driver root and host root fails (exit code ${empty:-none}): 'failed to locate driver libraries'" \
	sh -c "test -n '$empty' -a '$empty' != 0 && grep -q 'error validating driver: failed to locate driver libraries' '$logs/driver-check-empty.log'"
kubectl -n $ns delete pod driver-check-live driver-check-empty --wait=false >/dev/null 2>&1
