# The PASS/FAIL helpers of the test node's check scripts (test-cpu.sh here,
# hack/gpu-host/test-gpu.sh and test-sharing.sh, hack/dra/test-dra.sh,
# hack/gpu-operator/test-operator.sh, hack/sim-node/sim-lib.sh), sourced after setting check_name (the prefix of each line, e.g.
# k8s-node-sim). A script exits with $fail: 1 once any check failed.
fail=0
pass() { echo "$check_name: $*: PASS"; }
failed() { echo "$check_name: $*: FAIL"; fail=1; }
check() { # DESCRIPTION COMMAND...: PASS if COMMAND succeeds
	local what=$1
	shift
	if "$@"; then pass "$what"; else failed "$what"; fi
}
until_true() { # SECONDS 'SHELL CONDITION': evaluate the condition until it holds
	local end=$((SECONDS + $1))
	until eval "$2" >/dev/null 2>&1; do
		((SECONDS < end)) || return 1
		sleep 0.5
	done
}
jp() { kubectl get "$@" 2>/dev/null; } # jp KIND/NAME -o jsonpath=...
# The GPU host's card as its kernel driver names it ("Model: NVIDIA H200" in
# /proc/driver/nvidia/gpus/*/information; NVML and nvidia-smi give the same name): the checks
# expect the card they run on, an H200 or an H100.
host_gpu_model() { awk -F':[ \t]*' '/^Model:/ { print $2; exit }' /proc/driver/nvidia/gpus/*/information 2>/dev/null; }
