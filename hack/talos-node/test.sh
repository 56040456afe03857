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
patch() { t patch machineconfig --mode=no-reboot --patch "@$1" >/dev/null; }

doc() { # doc FILE LINE...: an ExtensionServiceConfig for the service whose config file has those lines.
	local f=$1
	shift
	{
		printf 'apiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: nvidia-driver\nconfigFiles:\n'
		printf '  - mountPath: /etc/nvidia-driver/config.yaml\n    content: |\n      version: v1alpha1\n'
		for l in "$@"; do printf '      %s\n' "$l"; done
	} >"$f"
}

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
	fail "$svc is not Running after ${wait_s} s"
fi
capture boot-no-document
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

say "first document: added to the running node, it reaches the service"
starts=$(count 'msg=starting')
doc "$dir/doc1.yaml" "logLevel: debug"
patch "$dir/doc1.yaml" || fail "talosctl patch (first document) failed"
if until_ok "$wait_s" logged 'msg=setting key=logLevel'; then
	echo "the service logged the document's setting"
else
	fail "the first document's setting never reached the service"
fi
capture first-document

say "changed document: Talos restarts the service with it"
starts=$(count 'msg=starting')
doc "$dir/doc2.yaml" "logLevel: debug" "persistenceMode: false"
patch "$dir/doc2.yaml" || fail "talosctl patch (changed document) failed"
if until_ok "$wait_s" logged 'msg=setting key=persistenceMode'; then
	echo "the service started again with the changed document ($starts -> $(count 'msg=starting') starts)"
else
	fail "the changed document did not restart the service with its settings"
fi
capture changed-document

say "bad document: reported once, nothing restarts in a loop"
doc "$dir/doc3.yaml" "noSuchSetting: 1"
patch "$dir/doc3.yaml" || fail "talosctl patch (bad document) failed"
if until_ok "$wait_s" logged 'configuration is invalid'; then
	starts=$(count 'msg=starting')
	# Talos restarts an exited restart: always service after 5 s; a crash loop would show
	# within a minute as more starts.
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
