#!/usr/bin/env bash
# The extension on a real Talos v1.13.9 node (hack/talos-node/node.sh), without a GPU, driven
# only through talosctl. Each check prints what Talos shows (talosctl service / logs) and
# fails the script (exit 1) when its outcome is not the expected one.
#   test.sh EXTENSION_DIR [STATE_DIR]
# EXTENSION_DIR: the extension image's directory (make extension: _out/extensions/nvidia-driver-dev).
# TALOS_NODE_KEEP=1 leaves the node running at the end.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${TALOS_NODE_OUT:-$here/../../_out/talos-node}
ext=$1
dir=${2:-$(mktemp -d /tmp/talos-node.XXXXXX)}
mkdir -p "$dir/outputs"
svc=ext-nvidia-driver
# Under qemu's TCG a step of machined takes seconds; these bound each wait.
wait_s=${TALOS_NODE_WAIT:-600}
failed=0

t() { "$out/bin/talosctl" --talosconfig "$dir/talosconfig" "$@"; }
say() { printf '\n=== %s\n' "$*"; }
fail() { echo "FAIL: $*"; failed=1; }
# capture NAME: talosctl service ext-nvidia-driver, saved and printed.
capture() {
	t service "$svc" >"$dir/outputs/$1.txt" 2>&1
	sed 's/^/    /' "$dir/outputs/$1.txt"
}
state() { t service "$svc" 2>/dev/null | awk '$1 == "STATE" { print $2 }'; }
logs() { t logs "$svc" 2>/dev/null; }
count() { logs | grep -c -- "$1"; }
# until SECONDS CMD...: CMD until it succeeds or SECONDS pass.
until_ok() {
	local limit=$1 start=$SECONDS
	shift
	until "$@"; do
		((SECONDS - start < limit)) || return 1
		sleep 5
	done
}
running() { [ "$(state)" = Running ]; }
logged() { logs | grep -q -- "$1"; }
# apply FILE: the node's machine config with that ExtensionServiceConfig, as a user applies it
# (talosctl apply-config, no reboot): the document replaces the one before.
apply() {
	{ cat "$dir/config/controlplane.yaml"; echo ---; cat "$1"; } >"$dir/applied.yaml"
	t apply-config --mode=no-reboot --file "$dir/applied.yaml" >/dev/null
}
doc() { # doc FILE VAR=VALUE...: an ExtensionServiceConfig for the service with that environment.
	local f=$1
	shift
	{
		printf 'apiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: nvidia-driver\nenvironment:\n'
		for e in "$@"; do printf '  - %s\n' "$e"; done
	} >"$f"
}
# In container mode Talos v1.13.9 writes no document files and so never restarts an extension
# service for a document: ExtensionServiceConfigFilesController.Run returns at once for
# ModeContainer (internal/app/machined/pkg/controllers/runtime/extension_service_config_files.go),
# and ExtensionServiceController restarts services on the ExtensionServiceConfigStatus it
# would write. A document reaches the service here as its environment, when the service's runner
# is made again: talosctl service ext-nvidia-driver restart (docs/talos-node.md).
restart() { t service "$svc" restart >/dev/null; }

cleanup() { [ "${TALOS_NODE_KEEP:-}" = 1 ] || "$here/node.sh" stop "$dir"; }
trap cleanup EXIT

say "boot: the node, with the extension $(basename "$ext"), no ExtensionServiceConfig, no NVIDIA module"
boot_start=$SECONDS
if ! "$here/node.sh" start "$dir" "$ext"; then
	echo "FAIL: the node did not come up"
	exit 1
fi

say "boot: $svc reaches Running (Talos starts it; no depends that cannot come true)"
if until_ok "$wait_s" running; then
	echo "$svc Running $((SECONDS - boot_start)) s after the guest started"
else
	# The checks after this one need a running service.
	echo "FAIL: $svc is not Running after ${wait_s} s:"
	capture boot-no-document
	echo "machined's last list of services the boot waits for:"
	t logs machined 2>&1 | grep 'to be "up"' | tail -1
	echo "talos-node: FAIL"
	exit 1
fi
capture boot-no-document
# The extension's other service, shown as Talos shows it (its own checks are not here).
t service ext-nvidia-fabricmanager >"$dir/outputs/fabricmanager-boot.txt" 2>&1 || true
t service >"$dir/outputs/services.txt" 2>&1
sed 's/^/    /' "$dir/outputs/services.txt"
# machined's boot sequence waits for every loaded service to be up (StartAllServices,
# internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_sequencer_tasks.go) and logs every 15 s
# the conditions it still waits for ('service "x" to be "up"'); no extension service may be
# among them (a depends that never comes true holds the boot for constants.BootTimeout).
sleep 20 # one more of machined's 15 s reports
t logs machined >"$dir/outputs/machined.log" 2>&1
last_wait=$(grep 'to be \"up\"\|to be "up"' "$dir/outputs/machined.log" | tail -1)
echo "machined's last list of services the boot waits for: ${last_wait:-none}"
if grep -q 'ext-' <<<"$last_wait"; then
	fail "machined's boot sequence waits for an extension service"
fi
if ! logged 'waiting for the nvidia kernel module'; then
	fail "the service does not say it waits for the nvidia kernel module"
fi
logs | tail -5 | sed 's/^/    /'

say "first document: added to the running node; Talos keeps the service running; a restart gives it the document"
starts=$(count 'msg=starting')
doc "$dir/doc1.yaml" NVIDIA_DRIVER_LOG_LEVEL=debug
apply "$dir/doc1.yaml" || fail "talosctl apply-config (first document) failed"
until_ok "$wait_s" t get extensionserviceconfigs nvidia-driver >/dev/null 2>&1 || fail "Talos never had the document"
sleep 20
t get extensionserviceconfigs nvidia-driver | sed 's/^/    /'
[ "$(count 'msg=starting')" = "$starts" ] || fail "the service restarted on its first document in container mode"
running || fail "$svc is not Running after its first document (state $(state))"
restart
if until_ok "$wait_s" logged 'msg=setting key=logLevel from=env'; then
	echo "the service started again with the document's environment"
else
	fail "the first document's setting never reached the service"
fi
capture first-document

say "changed document: the service starts with the new setting"
starts=$(count 'msg=starting')
doc "$dir/doc2.yaml" NVIDIA_DRIVER_LOG_LEVEL=debug NVIDIA_DRIVER_PERSISTENCE_MODE=false
apply "$dir/doc2.yaml" || fail "talosctl apply-config (changed document) failed"
sleep 20
restart
if until_ok "$wait_s" logged 'msg=setting key=persistenceMode from=env'; then
	echo "the service started again with the changed document ($starts -> $(count 'msg=starting') starts)"
else
	fail "the changed document did not reach the service"
fi
capture changed-document

say "bad document: reported once, nothing restarts in a loop"
doc "$dir/doc3.yaml" NVIDIA_DRIVER_NO_SUCH_SETTING=1
apply "$dir/doc3.yaml" || fail "talosctl apply-config (bad document) failed"
sleep 20
restart
if until_ok "$wait_s" logged 'configuration is invalid'; then
	starts=$(count 'msg=starting')
	# Talos starts an exited restart: always service again after 5 s; a crash loop would
	# show within a minute as more starts.
	sleep "${TALOS_NODE_LOOP_WINDOW:-60}"
	after=$(count 'msg=starting')
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

echo
echo "talos-node: outputs in $dir/outputs; total $((SECONDS - boot_start)) s"
if [ "$failed" != 0 ]; then
	echo "talos-node: FAIL"
	exit 1
fi
echo "talos-node: PASS"
