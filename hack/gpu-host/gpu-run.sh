#!/usr/bin/env bash
# The Kubernetes GPU test on a GPU host, from this tree with its _out/ already built elsewhere
# (hack/gpu-host/gpu-run-carry.sh packs both and says how to unpack them; nothing is built here but
# the host's own pieces):
#   1. the subroot and the extension from this host's driver (hack/dev/build-subroot.sh host,
#      hack/release/extension), as docs/extension.md "Running it as Talos does" says;
#   2. the service run as Talos runs it (hack/harness), with its NFD feature file on
#      (NVIDIA_DRIVER_NFD_FEATURES_DIR, docs/kubernetes.md "Labels from the host"; off with
#      GPU_RUN_NFD_FEATURES=0, as the GPU Operator's runs have it), and while it is ready
#   3. a one-node cluster (cluster.sh -gpu) running TEST (default hack/gpu-host/test-gpu.sh;
#      hack/gpu-host/gpu-sharing.sh runs test-sharing.sh).
# Output goes to $OUT (default /tmp/k8s-node-out): gpu-run.log and k8s-logs.tar.xz (the
# components' logs and the test's results).
#
#   hack/gpu-host/gpu-run.sh [TEST]
set -uo pipefail
cd "$(dirname "$0")/../.."
top=$PWD
test=$(realpath "${1:-hack/gpu-host/test-gpu.sh}")
out=${OUT:-/tmp/k8s-node-out}
mkdir -p "$out"
logs=$(mktemp -d /tmp/k8s-node-logs.XXXXXX)
chmod 755 "$logs"
run() {
	echo "== host: $(uname -r), cgroup fs $(stat -fc %T /sys/fs/cgroup), $(nproc) cpus"
	nvidia-smi -L
	echo "tools: nvcc $(command -v nvcc || ls /usr/local/cuda/bin/nvcc), python3 $(command -v python3), /sbin/ldconfig: $(file -L /sbin/ldconfig 2>/dev/null | cut -c1-80)"
	echo "filesystems: /tmp $(stat -fc %T /tmp), / $(stat -fc %T /)"
	hack/k8s-node/images.sh pack || return 1
	hack/dev/build-subroot.sh host _out/subroot-host || return 1
	_out/bin/extension -out _out -name nvidia-driver-dev-host -payload _out/subroot-host || return 1
	# NFD's directory as on Talos, where /etc/kubernetes is writable and the features.d mount
	# source of the service does not exist before it starts (the harness makes it 0700, as
	# machined does), in a tmpfs of a mount namespace of its own so that the host's /etc
	# keeps nothing of it.
	local nfd_dir=/etc/kubernetes/node-feature-discovery made nfd_env=()
	[[ ${GPU_RUN_NFD_FEATURES:-1} == 0 ]] || nfd_env=(-env NVIDIA_DRIVER_NFD_FEATURES_DIR=$nfd_dir/features.d)
	made=$(mkdir -pv $nfd_dir | sed -n "s/^mkdir: created directory '\(.*\)'$/\1/p" | sort -r)
	PATH=$top/_out/k8s-node/bin:$PATH unshare --mount --propagation private sh -c 'mount -t tmpfs -o mode=0755 k8s-node-nfd "$0" && exec "$@"' $nfd_dir \
		_out/bin/harness -extension _out/extensions/nvidia-driver-dev-host \
		-env NVIDIA_DRIVER_PERSISTENCE_MODE=false "${nfd_env[@]}" \
		-until ready,failed -wait 120s -runc "$top/_out/k8s-node/bin/runc" \
		-after-ready "K8S_NODE_RESULTS=$logs/results $top/hack/k8s-node/cluster.sh -gpu -logs $logs/components -- $test"
	local rc=$?
	[[ -z $made ]] || rmdir $made
	return $rc
}
t0=$SECONDS
run 2>&1 | tee "$out/gpu-run.log"
rc=${PIPESTATUS[0]}
echo "gpu-run: exit $rc after $((SECONDS - t0)) s" | tee -a "$out/gpu-run.log"
tar -C "$logs" -cJf "$out/k8s-logs.tar.xz" .
exit $rc
