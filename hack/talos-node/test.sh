#!/usr/bin/env bash
# The extension on a real Talos node (hack/talos-node/node.sh; TALOS_NODE_VERSION: v1.14.1 by
# default, or v1.13.9), without a GPU, driven
# only through talosctl and kubectl. Each check prints what Talos shows (talosctl service /
# logs) and fails the script (exit 1) when its outcome is not the expected one. The node is
# made from the docs' worker patch (docs/examples/talos-1.13/gpu-worker.patch.yaml; v1.14.1:
# docs/examples/talos-1.14/gpu-worker.patch.yaml) and bootstrapped as a user bootstraps one;
# its images come from hack/talos-node/registry.sh.
#   test.sh EXTENSION_DIR [STATE_DIR]
# EXTENSION_DIR: the extension image's directory (make extension: _out/extensions/nvidia-driver-dev).
# TALOS_NODE_KEEP=1 leaves the node running at the end. TALOS_NODE_KUBERNETES=0 leaves out the
# registry, the bootstrap and the Kubernetes checks. TALOS_NODE_FAIL_FAST=1 ends the script at
# the first failed check (the controls, which need only to see the checks fail).
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
ext=$1
dir=${2:-$(mktemp -d /tmp/talos-node.XXXXXX)}
# shellcheck source=hack/talos-node/lib.sh
. "$here/lib.sh"

cleanup() {
	[ "${TALOS_NODE_KEEP:-}" = 1 ] && return
	"$here/node.sh" stop "$dir"
	"$here/registry.sh" stop "$dir"
}
trap cleanup EXIT

kubernetes=${TALOS_NODE_KUBERNETES:-1}
registry_port=
if [ "$kubernetes" = 1 ]; then
	if ! "$here/registry.sh" start "$dir"; then
		echo "FAIL: the image registry did not start"
		exit 1
	fi
	registry_port=$(cat "$dir/registry.port")
fi

say "boot: the node, with the extension $(basename "$ext"), the docs' worker patch, no ExtensionServiceConfig, no NVIDIA module"
boot_start=$SECONDS
if ! TALOS_NODE_REGISTRY_PORT=$registry_port \
	TALOS_NODE_PATCHES="$worker_patch ${TALOS_NODE_PATCHES:-}" \
	"$here/node.sh" start "$dir" "$ext"; then
	echo "FAIL: the node did not come up"
	exit 1
fi
# As a user does once the node has its config: etcd then starts, and the boot goes on to
# the kubelet and the control plane, while the checks below run.
bootstrap() { t bootstrap >/dev/null 2>&1; }
if [ "$kubernetes" != 1 ]; then
	:
elif until_booted "$wait_s" bootstrap; then
	echo "talosctl bootstrap accepted $((SECONDS - boot_start)) s after the guest started"
else
	fail "talosctl bootstrap was not accepted"
fi

say "boot: $svc reaches Running (Talos starts it; no depends that cannot come true)"
if until_booted "$wait_s" running; then
	echo "$svc Running $((SECONDS - boot_start)) s after the guest started"
else
	# The checks after this one need a running service.
	echo "FAIL: $svc is not Running after ${wait_s} s:"
	capture boot-no-document
	echo "machined's last list of services the boot waits for:"
	t logs machined 2>&1 | grep -E "$waits" | tail -1
	echo "talos-node: FAIL"
	exit 1
fi
capture boot-no-document
# The extension's other service, shown as Talos shows it (its own checks are not here).
t service ext-nvidia-fabricmanager >"$dir/outputs/fabricmanager-boot.txt" 2>&1 || true
t service >"$dir/outputs/services.txt" 2>&1
sed 's/^/    /' "$dir/outputs/services.txt"
# machined's boot sequence waits for every loaded service to be up (StartAllServices,
# internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_sequencer_tasks.go), logs "waiting for N
# services", then every 15 s the conditions it still waits for (system/service_events.go:
# v1.13.9 'service "x" to be "up"', v1.14.1 'service "x" to be up/finished', both 'to be
# registered' before the service is). An extension service is among them while it is not yet
# Running: it starts after containerd and cri, and on a slow node (qemu's TCG) that can be the
# last 15 s of the boot, which is no stall. A stall is a boot still waiting for it once it
# runs (a depends that never comes true holds the boot for constants.BootTimeout): the log is
# read after the service is Running (above) and one more report, when the boot must be done
# (MachineStatus stage running, as kubernetes_checks reads it below).
sleep 20 # one more of machined's 15 s reports
t logs machined >"$dir/outputs/machined.log" 2>&1
grep -E 'waiting for [0-9]+ services|sequence: done' "$dir/outputs/machined.log" | sed 's/^/    /'
grep -Eq 'waiting for [0-9]+ services' "$dir/outputs/machined.log" ||
	fail "machined's log does not show its boot's wait for services (StartAllServices)"
last_wait=$(grep -E "$waits" "$dir/outputs/machined.log" | tail -1)
echo "machined's last list of services the boot waits for: ${last_wait:-none}"
if grep -q 'ext-' <<<"$last_wait" && ! t get machinestatus -o yaml 2>/dev/null | grep -q '^ *stage: running$'; then
	fail "machined's boot sequence still waits for an extension service that is Running"
fi
if ! logged 'waiting for the nvidia kernel module'; then
	fail "the service does not say it waits for the nvidia kernel module"
fi
logs | tail -5 | sed 's/^/    /'

[ "$TALOS_NODE_VERSION" = v1.13.9 ] || workload_isolation_check

say "first document: added to the running node; Talos keeps the service running; a restart gives it the document"
starts=$(count 'msg=starting version=')
doc "$dir/doc1.yaml" NVIDIA_DRIVER_LOG_LEVEL=debug
apply "$dir/doc1.yaml" || fail "talosctl apply-config (first document) failed"
until_ok "$wait_s" t get extensionserviceconfigs nvidia-driver >/dev/null 2>&1 || fail "Talos never had the document"
sleep 20
t get extensionserviceconfigs nvidia-driver | sed 's/^/    /'
[ "$(count 'msg=starting version=')" = "$starts" ] || fail "the service restarted on its first document in container mode"
running || fail "$svc is not Running after its first document (state $(state))"
restart
if until_ok "$wait_s" logged 'msg=setting key=logLevel from=env'; then
	echo "the service started again with the document's environment"
else
	fail "the first document's setting never reached the service"
fi
capture first-document

say "changed document: the service starts with the new setting"
starts=$(count 'msg=starting version=')
doc "$dir/doc2.yaml" NVIDIA_DRIVER_LOG_LEVEL=debug NVIDIA_DRIVER_PERSISTENCE_MODE=false
apply "$dir/doc2.yaml" || fail "talosctl apply-config (changed document) failed"
sleep 20
restart
if until_ok "$wait_s" logged 'msg=setting key=persistenceMode from=env'; then
	echo "the service started again with the changed document ($starts -> $(count 'msg=starting version=') starts)"
else
	fail "the changed document did not reach the service"
fi
capture changed-document

say "removed document: the service starts with the defaults"
starts=$(count 'msg=starting version=')
apply "" || fail "talosctl apply-config (no document) failed"
gone() { ! t get extensionserviceconfigs nvidia-driver >/dev/null 2>&1; }
until_ok "$wait_s" gone || fail "Talos still has the document after a machine config without it"
restart
started_again() { [ "$(count 'msg=starting version=')" -gt "$starts" ]; }
if until_ok "$wait_s" started_again && until_ok "$wait_s" running; then
	sleep 5
	# The document's settings (the YAML's own environment, NVIDIA_DRIVER_SUBROOT, stays).
	if last_run | grep -E -q 'key=(logLevel|persistenceMode) from=env'; then
		fail "the service still has a setting of the removed document: $(last_run | grep -E 'key=(logLevel|persistenceMode) from=env')"
	else
		echo "the service started again with no document's setting"
	fi
else
	fail "$svc did not start again without the document (state $(state))"
fi
capture removed-document

say "bad document: reported once, nothing restarts in a loop"
doc "$dir/doc3.yaml" NVIDIA_DRIVER_NO_SUCH_SETTING=1
apply "$dir/doc3.yaml" || fail "talosctl apply-config (bad document) failed"
sleep 20
restart
if until_ok "$wait_s" logged 'configuration is invalid'; then
	starts=$(count 'msg=starting version=')
	# Talos starts an exited restart: always service again after 5 s; a crash loop would
	# show within a minute as more starts.
	sleep "${TALOS_NODE_LOOP_WINDOW:-60}"
	after=$(count 'msg=starting version=')
	reports=$(count 'configuration is invalid')
	echo "starts: $starts, a minute later: $after; reports of the bad document: $reports"
	[ "$after" = "$starts" ] || fail "the service restarted $((after - starts)) times on a bad document"
	[ "$reports" = 1 ] || fail "the bad document was reported $reports times, not once"
	running || fail "$svc is not Running on a bad document (state $(state))"
else
	fail "the bad document was never reported"
fi
capture bad-document
logs | grep 'configuration is invalid' | sed 's/^/    /'

kubernetes_checks() {
	say "kubernetes: the boot finishes; the node registers Ready with the patch's label and taint"
	kubernetes_up
	k get node "$node" -o wide 2>&1 | sed 's/^/    /'
	k get node "$node" -o jsonpath='{.metadata.labels.nvidia\.com/gpu\.present}' | grep -qx true ||
		fail "the node lacks the label gpu-worker.patch.yaml gives it (nvidia.com/gpu.present=true)"
	k get node "$node" -o jsonpath='{range .spec.taints[*]}{.key}={.value}:{.effect}{"\n"}{end}' | grep -qx 'nvidia.com/gpu=present:NoSchedule' ||
		fail "the node lacks the taint gpu-worker.patch.yaml registers it with"

	say "kubernetes: kubectl apply -k deploy/; its DaemonSets run on the node"
	k apply -k "$top/deploy/namespace" --server-side >/dev/null || fail "kubectl apply -k deploy/namespace failed"
	k apply -k "$top/deploy" --server-side >"$dir/outputs/deploy-apply.txt" 2>&1 || fail "kubectl apply -k deploy failed: $(cat "$dir/outputs/deploy-apply.txt")"
	scheduled() { k -n nvidia-gpu get "$1" -o jsonpath='{.status.desiredNumberScheduled}' 2>/dev/null | grep -qx "$2"; }
	# deploy/'s device plugin and DCGM exporter run on every labelled GPU node; the chart's MPS
	# control daemon only where nvidia.com/mps.capable=true, which comes from the service's
	# NFD file through NFD (docs/sharing.md): none here, no GPU and no NFD.
	for ds in daemonset.apps/nvidia-device-plugin daemonset.apps/dcgm-exporter; do
		if until_ok 120 scheduled "$ds" 1; then
			echo "$ds: scheduled on the node"
		else
			fail "$ds is not scheduled on the labelled node"
		fi
	done
	if scheduled daemonset.apps/nvidia-device-plugin-mps-control-daemon 0; then
		echo "daemonset.apps/nvidia-device-plugin-mps-control-daemon: not scheduled (no nvidia.com/mps.capable label)"
	else
		fail "the MPS control daemon is scheduled on a node without nvidia.com/mps.capable=true"
	fi
	k -n nvidia-gpu get pods -o wide 2>&1 | tee "$dir/outputs/deploy-pods.txt" | sed 's/^/    /'
	# Without a GPU the service never writes its readiness file: the device plugin's pod must be
	# held by its wait-for-driver init container (running), not failing.
	plugin_init() { k -n nvidia-gpu get pods -l app.kubernetes.io/name=nvidia-device-plugin -o jsonpath='{.items[0].status.initContainerStatuses[0].state}' 2>/dev/null; }
	plugin_held() { plugin_init | grep -q running; }
	if until_ok "$wait_s" plugin_held; then
		echo "the device plugin's pod waits for the driver: $(plugin_init)"
	else
		fail "the device plugin's pod is not held by its wait for the driver: $(plugin_init)"
	fi
}
[ "$kubernetes" != 1 ] || kubernetes_checks

say "reboot: the node restarted; the service comes back with the document it had"
# A document applied to the running node (no service restart in container mode, above), then
# the node restarted as a Talos node in a container is (node.sh restart): machined loads the
# applied machine config from the STATE volume (AcquireController, stateDisk,
# internal/app/machined/pkg/controllers/config/acquire.go) and the service starts with the
# document's setting, which it has never had before.
doc "$dir/doc4.yaml" NVIDIA_DRIVER_FABRIC_WAIT=3m
apply "$dir/doc4.yaml" || fail "talosctl apply-config (document before the reboot) failed"
until_ok "$wait_s" t get extensionserviceconfigs nvidia-driver >/dev/null 2>&1 || fail "Talos never had the document"
reboot_start=$SECONDS
if "$here/node.sh" restart "$dir"; then
	if until_ok "$wait_s" running; then
		echo "$svc Running $((SECONDS - reboot_start)) s after the restart was asked for"
	else
		fail "$svc is not Running after the reboot (state $(state))"
	fi
	t get extensionserviceconfigs nvidia-driver | sed 's/^/    /'
	if until_ok "$wait_s" logged 'msg=setting key=fabricWait from=env'; then
		echo "the service came back with the document's setting"
	else
		fail "the service came back without the document's setting"
	fi
else
	fail "the node did not come back after its restart"
fi
capture reboot

echo
echo "talos-node: outputs in $dir/outputs; total $((SECONDS - boot_start)) s"
if [ "$failed" != 0 ]; then
	echo "talos-node: FAIL"
	exit 1
fi
echo "talos-node: PASS"
