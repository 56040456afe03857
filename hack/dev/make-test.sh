#!/usr/bin/env bash
# The recipe of `make test` (what CI runs), after make deps: two lines of work at once, because
# the 2-core machine is CPU-bound in neither alone.
#   background  machined and talosctl (most of a cold run's compiling) at nice 19 from the start,
#               on the CPU the foreground leaves idle while it downloads and waits on its
#               nodes; then, once the foreground has built the node runtime, the rest of the
#               Talos node; once the foreground's Kubernetes nodes start (whose checks leave
#               about half the CPU idle, where the modules' tests leave none), the Talos
#               node's document and reboot checks (test-talos-node, one guest CPU);
#               then, once the foreground is done, simulated GPUs on the Talos node's kubelet
#               (test-talos-simgpu's core checks; the node a worker of a control plane on this
#               machine, controlplane.sh). Their guest takes both cores; beside the foreground,
#               with the control plane on the node, they took 1195 s against 804 s alone (warm,
#               the same machine, 2026-12-05): its emulated control plane fell behind its own
#               timeouts.
#   foreground  build, lint and the extension; the node runtime (the tests' runc is its); every
#               module's tests; the Kubernetes node, the simulated GPU node, the GPU Operator's
#               setup 1 on it and the container toolkit's NRI plugin there; last, the simulated
#               GPU extensions for the Talos node.
# The background's logs are printed at the end, and make test fails when either line failed.
# A failure in the foreground stops the background (the node scripts' traps stop their guests).
# From the Makefile: MAKE, OUT, TEST_MODULES, GO_TEST, TALOS_NODE_EXTENSION, TALOS_NODE_RUN.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${MAKE:?}" "${OUT:?}" "${TEST_MODULES:?}" "${GO_TEST:?}" "${TALOS_NODE_EXTENSION:?}" "${TALOS_NODE_RUN:?}"
bg=$OUT/test-background
rm -rf "$bg" && mkdir -p "$bg"

# wait_for MARKER: until the foreground writes $bg/MARKER; false if it stopped first.
wait_for() {
	until [ -e "$bg/$1" ]; do
		[ -e "$bg/stop" ] && return 1
		sleep 5
	done
}

background() {
	if ! { TALOS_NODE_PARTS=programs nice -n 19 hack/talos-node/build.sh && wait_for runtime.built &&
		nice -n 19 "$MAKE" --no-print-directory talos-node-build; } >"$bg/talos-node-build.log" 2>&1; then
		echo "talos-node-build: FAIL" >>"$bg/talos-node-build.log"
		echo 1 >"$bg/talos-node.rc"
		echo 1 >"$bg/talos-simgpu.rc"
		return
	fi
	if ! wait_for k8s.started; then
		echo 1 >"$bg/talos-node.rc"
		echo 1 >"$bg/talos-simgpu.rc"
		return
	fi
	TALOS_NODE_KUBERNETES=0 hack/talos-node/test.sh "$TALOS_NODE_EXTENSION" "$TALOS_NODE_RUN/run" >"$bg/test-talos-node.log" 2>&1
	echo $? >"$bg/talos-node.rc"
	if ! wait_for foreground.done; then
		echo 1 >"$bg/talos-simgpu.rc"
		return
	fi
	TALOS_NODE_ACCEL=tcg,thread=multi TALOS_SIMGPU_CHECKS=core \
		hack/talos-node/test-simgpu.sh "$TALOS_NODE_RUN/simgpu" >"$bg/test-talos-simgpu.log" 2>&1
	echo $? >"$bg/talos-simgpu.rc"
}
# Its own process group (job control), so that a failure here can stop all of it.
set -m
background &
bg_pid=$!
set +m

show_background() {
	local f
	for f in talos-node-build test-talos-node test-talos-simgpu; do
		[ -e "$bg/$f.log" ] || continue
		echo "=== make test, in the background: $f ($bg/$f.log)"
		cat "$bg/$f.log"
	done
}
# background_runs: a process of the background's group still runs (zombies aside), from
# /proc/PID/stat: "PID (COMM) STATE PPID PGRP ...", COMM may hold spaces.
background_runs() {
	local f stat state pgrp
	for f in /proc/[0-9]*/stat; do
		{ read -r stat <"$f"; } 2>/dev/null || continue
		read -r state _ pgrp _ <<<"${stat##*) }"
		[[ $pgrp == "$bg_pid" && $state != Z ]] && return 0
	done
	return 1
}
fail() {
	echo "make test: FAIL: $*" >&2
	touch "$bg/stop"
	kill -TERM -- "-$bg_pid" 2>/dev/null
	wait "$bg_pid" 2>/dev/null
	# The node scripts stop their guests on the way out (their EXIT traps).
	for _ in $(seq 120); do background_runs || break; sleep 0.5; done
	show_background
	exit 1
}
trap 'fail "interrupted"' INT TERM

"$MAKE" --no-print-directory build lint extension || fail "build, lint or extension"
hack/k8s-node/build.sh "$OUT/k8s-node" runtime || fail "the node runtime"
touch "$bg/runtime.built"
for m in $TEST_MODULES; do
	(cd "$m" && $GO_TEST ./...) || fail "go test in $m"
done
touch "$bg/k8s.started"
"$MAKE" --no-print-directory test-k8s-node || fail "test-k8s-node"
"$MAKE" --no-print-directory test-k8s-sim || fail "test-k8s-sim"
"$MAKE" --no-print-directory test-k8s-sim-operator || fail "test-k8s-sim-operator"
"$MAKE" --no-print-directory test-k8s-sim-nri || fail "test-k8s-sim-nri"
hack/talos-node/simgpu/build.sh || fail "the simulated GPU extensions for the Talos node"
touch "$bg/foreground.done"

echo "make test: the foreground passed; waiting for the Talos node ($bg)"
wait "$bg_pid"
show_background
rc=0
for c in talos-node talos-simgpu; do
	r=$(cat "$bg/$c.rc" 2>/dev/null || echo "none")
	echo "make test: test-$c exit $r"
	[ "$r" = 0 ] || rc=1
done
[ $rc = 0 ] && echo "make test: PASS" || echo "make test: FAIL"
exit $rc
