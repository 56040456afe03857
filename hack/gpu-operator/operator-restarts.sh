# The GPU Operator's operands across restarts, sourced by test-operator.sh once the
# ClusterPolicy is ready, under the harness (sim-run.sh, gpu-run.sh), with pass, failed, check,
# until_true, jp, ns and logs from there.
#
# NVIDIA/k8s-test-infra#857: on a node with another /run/nvidia/driver provider, the
# validator's driver check looped for ever after a node restart, its mountinfo showing
# "/nvidia/driver//deleted": its container had bound the directory before the provider
# replaced it, and a mount made on the new directory cannot reach a bind of the old one. The
# extension's service never removes the directory and never unmounts the driver root
# (pkg/driverroot/mount.go); these checks show what the operator's operands see:
#   1. the service restarted (a change of its document, which Talos applies by stopping and
#      starting the service, as `talosctl service ext-nvidia-driver restart` does) while the
#      operands run: it reuses its mount, and no operand container restarts;
#   2. every pod of the operator's namespace deleted: all back, the ClusterPolicy ready again;
#   3. #857's order: the driver root detached from the node (as on a node whose service has not
#      started yet), the validator's pod started then, and only then the service restarted: it
#      mounts on the same directory, and the validator's driver check, waiting in the container
#      that started before the mount, sees the driver through its mount's propagation
#      (HostToContainer) and passes.
# After each: every running container of the namespace that binds the host's /run/nvidia/driver,
# /run/nvidia or / sees the node's driver root at that path (the same source file), and no
# container of the namespace holds a mount of a deleted directory. Binds of a socket file made
# anew since (nvidia-persistenced's, after the service's restart) are counted and shown, not
# failed: NVIDIA's CDI specs bind the socket itself, and no directory of the driver root is
# behind them.

# The document requests and the service's log of the harness (internal/harness EnvDocumentRequests).
if [[ -z ${HARNESS_DOCUMENT_REQUESTS:-} || -z ${HARNESS_SERVICE_LOG:-} ]]; then
	echo "  restart checks not run: not under the harness (no HARNESS_DOCUMENT_REQUESTS)"
	return 0
fi

# live_root WHEN: the live-root check above, one PASS or FAIL line.
live_root() {
	local out
	out=$(python3 - "$ns" <<'EOF'
import json, os, stat, subprocess, sys
ns = sys.argv[1]
marker = "usr/share/nvidia-driver/source"
try:
    want = open("/run/nvidia/driver/" + marker).read()
except OSError as e:
    print("bad node: /run/nvidia/driver has no driver root:", e)
    sys.exit()
ctr = ["ctr", "-n", "k8s.io"]
checked = 0
for line in subprocess.run(ctr + ["task", "ls"], capture_output=True, text=True).stdout.splitlines()[1:]:
    f = line.split()
    if len(f) < 3 or f[2] != "RUNNING":
        continue
    cid, pid = f[0], f[1]
    try:
        info = json.loads(subprocess.run(ctr + ["c", "info", cid], capture_output=True, text=True).stdout)
    except ValueError:
        continue
    labels = info.get("Labels") or {}
    if labels.get("io.kubernetes.pod.namespace") != ns or "io.kubernetes.container.name" not in labels:
        continue
    who = labels.get("io.kubernetes.pod.name", "?") + "/" + labels["io.kubernetes.container.name"]
    for m in open(f"/proc/{pid}/mountinfo"):
        if not m.split()[3].endswith("//deleted"):
            continue
        # A bind of a socket file whose daemon made it anew (nvidia-persistenced's, which the
        # CDI specs bind as a file and which restarts with the service): reported, not a
        # deleted directory.
        try:
            sock = stat.S_ISSOCK(os.stat(f"/proc/{pid}/root{m.split()[4]}").st_mode)
        except OSError:
            sock = False
        print("socket" if sock else "bad", who, "holds a mount of a deleted " + ("socket" if sock else "directory") + ":", m.strip())
    for mnt in (info.get("Spec") or {}).get("mounts") or []:
        suffix = {"/run/nvidia/driver": "", "/run/nvidia": "/driver", "/": "/run/nvidia/driver"}.get(mnt.get("source"))
        if suffix is None:
            continue
        path = mnt["destination"].rstrip("/") + suffix
        checked += 1
        try:
            got = open(f"/proc/{pid}/root{path}/{marker}").read()
        except OSError as e:
            print("bad", who, path + ": no driver root:", e.strerror)
            continue
        print("ok " if got == want else "bad", who, path, "" if got == want else "shows another driver root: " + got.strip())
print("checked", checked)
EOF
)
	echo "$out" >"$logs/live-root-$2.txt"
	grep -v '^ok ' <<<"$out" | sed 's/^/  live root: /'
	local n
	n=$(sed -n 's/^checked //p' <<<"$out")
	check "$1: every operand container that binds the driver root sees the node's ($(grep -c '^ok ' <<<"$out") of ${n:-0} binds; no deleted directory)" \
		test "${n:-0}" -gt 0 -a -z "$(grep -v -e '^ok ' -e '^checked ' -e '^socket ' <<<"$out")"
	echo "  $1: $(grep -c '^socket ' <<<"$out") binds of a socket file made anew since (a measurement; docs/gpu-operator.md)"
}

# restarts: "POD/CONTAINER COUNT" for every container of the namespace, init containers too.
restarts() {
	kubectl -n $ns get pods -o json | python3 -c '
import json, sys
for p in json.load(sys.stdin)["items"]:
    for c in (p["status"].get("initContainerStatuses") or []) + (p["status"].get("containerStatuses") or []):
        print(p["metadata"]["name"] + "/" + c["name"], c.get("restartCount", 0))' | sort
}
# ask ENTRY...: a change of the service's document (a restart by Talos), applied when it returns.
asks=0
ask() {
	asks=$((asks + 1))
	local r=$HARNESS_DOCUMENT_REQUESTS/operator-$asks
	printf '%s\n' "$@" >"$r.tmp" && mv "$r.tmp" "$r.env"
	until_true 60 "test -e $r.applied"
}
svc_log_since() { tail -n +"$1" "$HARNESS_SERVICE_LOG"; } # LINE: the service's log from LINE on
svc_up() { python3 -c 'import json,sys; sys.exit(json.load(open("/run/nvidia-driver/status.json"))["phase"] not in ("ready", "degraded"))' 2>/dev/null; }
all_ready() { # every pod of the namespace Ready or Succeeded, none terminating
	kubectl -n $ns get pods -o json | python3 -c '
import json, sys
ps = json.load(sys.stdin)["items"]
sys.exit(not ps or any(p["metadata"].get("deletionTimestamp") or (p["status"].get("phase") != "Succeeded" and not all(c.get("ready") for c in p["status"].get("containerStatuses") or [{}])) for p in ps))'
}
vpod() { jp -n $ns pod -l app=nvidia-operator-validator -o 'jsonpath={.items[0].metadata.name}'; }
dv() { jp -n $ns pod "$1" -o "jsonpath={.status.initContainerStatuses[?(@.name==\"driver-validation\")].$2}"; } # POD FIELD

live_root "before any restart" before

# --- 1. the service restarted while the operands run
before=$(restarts)
mark=$(($(wc -l <"$HARNESS_SERVICE_LOG") + 1))
t0=$SECONDS
ask NVIDIA_DRIVER_LOG_LEVEL=debug
until_true 120 'svc_log_since $mark | grep -q "driver root already mounted by an earlier run, reusing it" && svc_up'
check "restart 1: the service restarted by a change of its document reused its driver root mount ($((SECONDS - t0)) s)" \
	grep -q "driver root already mounted by an earlier run, reusing it" <<<"$(svc_log_since $mark)"
sleep 15 # long enough for an operand that lost the driver to fail its probe or exit
after=$(restarts)
echo "$before" >"$logs/restarts-before.txt" && echo "$after" >"$logs/restarts-after-1.txt"
check "restart 1: no container of $ns restarted$(diff "$logs/restarts-before.txt" "$logs/restarts-after-1.txt" | sed -n 's/^> / now: /p' | tr '\n' ' ')" \
	test "$before" = "$after"
check "restart 1: the ClusterPolicy stays ready ($(state))" test "$(state)" = ready
live_root "restart 1" restart-1

# --- 2. every pod of the operator's namespace deleted
old=$(kubectl -n $ns get pods -o jsonpath='{.items[*].metadata.uid}')
t0=$SECONDS
kubectl -n $ns delete pods --all --wait=false >/dev/null
new_pods() { local u; for u in $(kubectl -n $ns get pods -o jsonpath='{.items[*].metadata.uid}'); do [[ " $old " != *" $u "* ]] || return 1; done; }
if until_true 300 'new_pods && all_ready && test "$(state)" = ready'; then
	pass "restart 2: every pod of $ns deleted: all back Ready or Succeeded, the ClusterPolicy ready ($((SECONDS - t0)) s)"
else
	failed "restart 2: after deleting the pods of $ns: ClusterPolicy '$(state)'; pods: $(kubectl -n $ns get pods --no-headers 2>&1 | awk '{print $1":"$3}' | tr '\n' ' ')"
fi
live_root "restart 2" restart-2

# --- 3. #857's order: the validator starts before the driver root is there. The driver root
# is detached where the service mounted it, the mount namespace cluster.sh was started in
# (K8S_NODE_HOST_MNTNS), whose unmount reaches the service's namespace and this node's.
if nsenter --mount="${K8S_NODE_HOST_MNTNS:-/nonexistent}" umount -l /run/nvidia/driver && ! mountpoint -q /run/nvidia/driver; then
	pass "restart 3: the driver root detached from the node (/run/nvidia/driver left as an empty directory)"
else
	failed "restart 3: could not detach /run/nvidia/driver on the host (K8S_NODE_HOST_MNTNS=${K8S_NODE_HOST_MNTNS:-})"
fi
vold=$(vpod)
kubectl -n $ns delete pod "$vold" --wait=false >/dev/null
vnew() { jp -n $ns pod -l app=nvidia-operator-validator -o 'jsonpath={range .items[*]}{.metadata.name}{"\n"}{end}' | grep -vx "$vold" | head -1; }
until_true 120 '[[ -n $(vnew) && -n $(dv "$(vnew)" state.running.startedAt) ]] && kubectl -n $ns logs "$(vnew)" -c driver-validation 2>/dev/null | grep -q "failed to validate the driver, retrying"'
v=$(vnew)
check "restart 3: the new validator's driver check waits for the driver (pod $v: running, 'failed to validate the driver, retrying')" \
	grep -q "failed to validate the driver, retrying" <<<"$(kubectl -n $ns logs "$v" -c driver-validation 2>/dev/null)"
mark=$(($(wc -l <"$HARNESS_SERVICE_LOG") + 1))
t0=$SECONDS
ask NVIDIA_DRIVER_LOG_LEVEL=info
until_true 120 'svc_log_since $mark | grep -q "driver root mounted read-only" && svc_up'
check "restart 3: the restarted service mounted the driver root anew ($((SECONDS - t0)) s)" \
	grep -q "driver root mounted read-only" <<<"$(svc_log_since $mark)"
until_true 180 'test "$(dv "$v" state.terminated.exitCode)" = 0'
kubectl -n $ns logs "$v" -c driver-validation >"$logs/validator-driver-validation-restart-3.log" 2>&1
check "restart 3: the validator's driver check passed in the container that started before the mount (exit code $(dv "$v" state.terminated.exitCode), restarts $(dv "$v" restartCount))" \
	test "$(dv "$v" state.terminated.exitCode)" = 0 -a "$(dv "$v" restartCount)" = 0
if until_true 300 'all_ready && test "$(state)" = ready'; then
	pass "restart 3: every pod of $ns Ready or Succeeded, the ClusterPolicy ready ($((SECONDS - t0)) s after the service's restart)"
else
	failed "restart 3: ClusterPolicy '$(state)'; pods: $(kubectl -n $ns get pods --no-headers 2>&1 | awk '{print $1":"$2":"$3}' | tr '\n' ' ')"
fi
live_root "restart 3" restart-3
until_true 120 'test "$(alloc)" = "$ngpu"'
check "after the restarts the node reports nvidia.com/gpu: $(alloc) allocatable (the service's status: $ngpu GPUs)" test "$(alloc)" = "$ngpu"
