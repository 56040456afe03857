#!/usr/bin/env bash
# A one-node Kubernetes cluster on this machine, for as long as a command runs:
#
#   hack/k8s-node/cluster.sh [-gpu] [-logs DIR] -- COMMAND [ARGS...]
#
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd (with runc and the
# bridge CNI) and the kubelet, built by hack/k8s-node/build.sh at Talos v1.14.1's versions, run
# in their own PID, mount and network namespaces; the pause, device plugin and test images
# (hack/k8s-node/images.sh) are imported into containerd, nothing is pulled. COMMAND runs in
# those namespaces once the node is Ready, with KUBECONFIG (cluster-admin), K8S_NODE (the node's
# name), K8S_NODE_DIR (the scratch directory), K8S_NODE_HOST_MNTNS (the mount namespace this
# script was started in, for nsenter) and PATH (kubectl, ctr) set; its exit code is
# this script's. Before the node starts, the kernel settings the kubelet requires are set (as
# Talos sets them at boot); afterwards every process is gone (the PID namespace ends), the
# kubelet's cgroups are removed and those settings are put back. One node runs at a time on a
# machine: a second refuses to start while the first runs.
#
# Talos's configuration, where it matters to a GPU node (sources named where used):
# containerd's CRI config is Talos v1.14.1's (hack/cri-containerd.toml, hack/cri-plugin.part:
# CDI on, spec dir /run/cdi, which is also /var/run/cdi where the device plugin writes, since
# /var/run links to /run on Talos as on these hosts; runc with Talos's base runtime spec; NRI on,
# containerd 2.x's default, as v1.14.1's part has no NRI section); the kubelet's is
# what Talos's k8s.KubeletSpecController writes (cgroupfs, RuntimeDefault seccomp, webhook
# authn/authz, protectKernelDefaults, ...); the API server enforces Pod Security "baseline"
# outside kube-system as Talos's generated config does. What differs, for a test node:
#   - no kube-proxy or CNI DaemonSet: the `kubernetes` Service's address (10.96.0.1) is an
#     address of the node itself and the API server listens on 443, so pods reach it without
#     service routing; pods get addresses from the bridge plugin (10.244.0.0/24);
#   - paths: the CNI binaries and config, and the certificates, live in the scratch directory;
#   - without -gpu, /run is a private tmpfs too (the readiness file, /run/cdi); with -gpu the
#     host's /run is shared, so the pods see what the extension's service put there
#     (/run/nvidia/driver, /run/cdi, /run/nvidia/validations);
#   - on machines that need it: restrict_oom_score_adj in containerd (VMs that refuse to lower
#     OOM scores) and failCgroupV1: false in the kubelet (cgroup v1);
#   - the runc shim's cgroup: v1.14.1's part puts it in /podruntime/shim (ShimCgroup), a
#     cgroup that machined makes; here the shims stay in containerd's cgroup;
#   - K8S_NODE_NRI=0: containerd's NRI off (no /var/run/nri/nri.sock), as v1.13.9's part has it
#     ([plugins."io.containerd.nri.v1.nri"] disable = true);
#   - K8S_NODE_CONTAINERD_PART: extra containerd config (20-customization.part);
#     K8S_NODE_KUBELET_EXTRA: extra kubelet config lines;
#   - K8S_NODE_OCI_HOOK ("PROGRAM ARGS..."): an OCI createContainer hook added to the base
#     runtime spec, so that runc runs it for every container the kubelet asks for (containerd's
#     CRI starts each spec from the base spec and changes no hooks: internal/cri/server/
#     container_create.go runtimeSpec). The simulated node's /proc/driver (sim-run.sh,
#     hack/sim-node/simnvml/prochook); Talos's base spec has none.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
bin=${K8S_NODE_BIN:-$top/_out/k8s-node}
images=${K8S_NODE_IMAGES:-$top/_out/k8s-node/images}
node=${K8S_NODE:-talos-gpu-node}
node_ip=10.250.0.10
service_ip=10.96.0.1

log() { echo "[k8s-node $(date +%T.%N | cut -c1-12)] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# Kernel settings the kubelet requires (k8s.io/kubernetes pkg/kubelet/cm/container_manager_linux.go
# setupKernelTunables; Talos sets the same at boot, hence its protectKernelDefaults: true).
sysctls=(vm.overcommit_memory=1 vm.panic_on_oom=0 kernel.panic=10 kernel.panic_on_oops=1
	kernel.keys.root_maxkeys=1000000 kernel.keys.root_maxbytes=25000000)

sysctl_path() { local k=${1%%=*}; echo "/proc/sys/${k//.//}"; }
set_sysctls() { # KEY=VALUE...
	local s
	for s in "$@"; do echo "${s#*=}" >"$(sysctl_path "$s")" || return 1; done
}

outer() {
	local gpu=0 logs=""
	while [[ $# -gt 0 ]]; do
		case $1 in
		-gpu) gpu=1; shift ;;
		-logs) logs=$2; shift 2 ;;
		--) shift; break ;;
		*) die "unknown argument $1 (usage: cluster.sh [-gpu] [-logs DIR] -- COMMAND...)" ;;
		esac
	done
	[[ $# -gt 0 ]] || die "no command given (usage: cluster.sh [-gpu] [-logs DIR] -- COMMAND...)"
	for f in "$bin/bin/kube" "$bin/bin/containerd" "$bin/bin/runc" "$bin/cni/bridge" "$images/pause.tar"; do
		[[ -e $f ]] || die "$f is missing: run make k8s-node"
	done
	[[ $(id -u) == 0 ]] || die "needs root"
	# One test node per machine: two would undo each other's kernel settings and remove each
	# other's kubepods cgroups. The lock goes with the last process of this one (fd 9).
	local lock=/run/nvidia-driver-k8s-node.lock
	exec 9>"$lock"
	flock -n 9 || die "another test node runs on this machine ($lock is held); run one at a time"

	local W
	W=$(mktemp -d /tmp/k8s-node.XXXXXX)
	chmod 755 "$W"
	local saved=() s
	for s in "${sysctls[@]}"; do saved+=("${s%%=*}=$(<"$(sysctl_path "$s")")"); done
	local created_run_containerd=0
	if [[ $gpu == 1 && ! -d /run/containerd ]]; then
		mkdir /run/containerd
		created_run_containerd=1
	fi

	local rc=0
	set_sysctls "${sysctls[@]}"
	# The node's mount namespace is a slave of this one: an unmount made inside stays inside.
	# This one stays open as fd 7 (K8S_NODE_HOST_MNTNS) for a check that must change the
	# host's mounts (nsenter --mount=$K8S_NODE_HOST_MNTNS).
	exec 7</proc/self/ns/mnt
	unshare --pid --mount --net --fork --kill-child --mount-proc --propagation slave \
		env K8S_NODE_INNER=1 K8S_NODE_GPU=$gpu K8S_NODE_DIR="$W" K8S_NODE_HOST_MNTNS=/proc/self/fd/7 "$0" "$@" || rc=$?
	exec 7<&-

	# The PID namespace is gone, and with it every process; what is left is host state.
	set_sysctls "${saved[@]}" || log "could not restore ${saved[*]}"
	remove_cgroups
	# containerd's state there (sockets, task directories) outlives it; its mounts do not.
	if [[ $created_run_containerd == 1 ]]; then rm -rf /run/containerd; fi
	if [[ -n $logs ]]; then
		mkdir -p "$logs"
		cp -r "$W/logs/." "$logs/" 2>/dev/null || true
	fi
	if [[ -n ${K8S_NODE_KEEP:-} ]]; then
		log "kept $W"
	else
		rm -rf "$W"
	fi
	return $rc
}

# remove_cgroups removes the kubelet's pod cgroups (cgroupfs driver: kubepods/ in every v1
# hierarchy, or in the v2 root), deepest first, once their processes are gone.
remove_cgroups() {
	local d i
	for d in /sys/fs/cgroup/kubepods /sys/fs/cgroup/*/kubepods; do
		[[ -d $d ]] || continue
		for i in $(seq 50); do
			find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
			[[ -d $d ]] || break
			sleep 0.2
		done
		[[ -d $d ]] && log "could not remove $d"
	done
	return 0
}

# --- inside the namespaces ----------------------------------------------------------------

W=${K8S_NODE_DIR:-}
pids=()

start() { # NAME ARGS...: run ARGS in the background, output in logs/NAME.log
	local name=$1; shift
	"$@" >"$W/logs/$name.log" 2>&1 &
	pids+=($!)
	log "started $name (pid $!)"
}

wait_for() { # SECONDS WHAT COMMAND...: poll COMMAND until it succeeds
	local limit=$1 what=$2; shift 2
	local end=$((SECONDS + limit))
	until "$@" >/dev/null 2>&1; do
		if ((SECONDS >= end)); then
			log "timed out after ${limit}s waiting for $what"
			return 1
		fi
		sleep 0.2
	done
}

kubeconfig() { # NAME CERT: a kubeconfig for the API server with the client certificate CERT
	cat >"$W/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: https://$node_ip:443
    certificate-authority: $W/pki/ca.crt
users:
- name: $1
  user:
    client-certificate: $W/pki/$2.crt
    client-key: $W/pki/$2.key
contexts:
- name: local
  context: {cluster: local, user: $1}
current-context: local
EOF
}

setup_network() {
	node-setup net $node_ip/32 $service_ip
}

setup_mounts() {
	# / shared, as on Talos: pods mount host paths with HostToContainer propagation (the
	# validator mounts / itself), which needs a shared or slave source. Made in this
	# namespace only; whatever it is a slave of stays untouched.
	mount --make-rshared /
	# The node's state directories, private to this namespace.
	local d
	for d in /var/lib /var/log; do
		mkdir -p "$W/root$d"
		# containerd's overlayfs snapshotter cannot put its layers on an overlay filesystem
		# (a container's root, as on some CI and GPU hosts): use memory there.
		[[ $(stat -fc %T "$W/root$d") == overlayfs ]] && mount -t tmpfs -o size=16g k8s-node-state "$W/root$d"
		mount --bind "$W/root$d" "$d"
	done
	if [[ ${K8S_NODE_GPU:-0} == 0 ]]; then
		# Shared, as Talos's /run: pods mount parts of it with HostToContainer propagation.
		mount -t tmpfs -o mode=0755,nosuid,nodev k8s-node-run /run
		mount --make-shared /run
	fi
	mkdir -p /run/containerd /run/cdi
	# The kubelet's OOM watcher reads the kernel log; a harness's throwaway /dev lacks it.
	[[ -e /dev/kmsg ]] || mknod -m 0600 /dev/kmsg c 1 11
}

setup_pki() {
	node-setup pki "$W/pki" "$node" $node_ip $service_ip
	kubeconfig admin admin
	kubeconfig kubelet kubelet
	kubeconfig controller-manager controller-manager
	kubeconfig scheduler scheduler
}

start_control_plane() {
	start etcd etcd --name node --data-dir "$W/etcd" --unsafe-no-fsync \
		--listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
		--listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
		--initial-cluster node=http://127.0.0.1:2380 --listen-metrics-urls http://127.0.0.1:2381

	start kube-apiserver kube-apiserver --etcd-servers=http://127.0.0.1:2379 \
		--bind-address=0.0.0.0 --secure-port=443 --advertise-address=$node_ip \
		--tls-cert-file="$W/pki/apiserver.crt" --tls-private-key-file="$W/pki/apiserver.key" \
		--client-ca-file="$W/pki/ca.crt" \
		--kubelet-client-certificate="$W/pki/apiserver-kubelet-client.crt" \
		--kubelet-client-key="$W/pki/apiserver-kubelet-client.key" \
		--kubelet-preferred-address-types=InternalIP \
		--service-account-issuer=https://kubernetes.default.svc.cluster.local \
		--service-account-key-file="$W/pki/sa.pub" --service-account-signing-key-file="$W/pki/sa.key" \
		--service-cluster-ip-range=10.96.0.0/12 --authorization-mode=Node,RBAC \
		--enable-admission-plugins=NodeRestriction --allow-privileged=true \
		--admission-control-config-file="$here/admission.yaml" --profiling=false
	wait_for 120 "the API server's /readyz" kubectl get --raw /readyz || return 1
	log "API server ready"
	# The controller manager gives up if the API server is not ready when it starts.
	start kube-controller-manager kube-controller-manager --kubeconfig="$W/controller-manager.kubeconfig" \
		--authentication-kubeconfig="$W/controller-manager.kubeconfig" \
		--authorization-kubeconfig="$W/controller-manager.kubeconfig" \
		--service-account-private-key-file="$W/pki/sa.key" --root-ca-file="$W/pki/ca.crt" \
		--use-service-account-credentials=true --leader-elect=false --bind-address=127.0.0.1 --profiling=false
	start kube-scheduler kube-scheduler --kubeconfig="$W/scheduler.kubeconfig" \
		--authentication-kubeconfig="$W/scheduler.kubeconfig" --authorization-kubeconfig="$W/scheduler.kubeconfig" \
		--leader-elect=false --bind-address=127.0.0.1 --profiling=false
}

# vm_containerd_part: where this machine refuses to lower an OOM score (some VMs), containerd
# must not pass the kubelet's negative scores on to runc, or every critical pod fails to start.
vm_containerd_part() {
	if ! sh -c 'echo -1 >/proc/self/oom_score_adj' 2>/dev/null; then
		log "this machine does not allow lowering OOM scores: restrict_oom_score_adj = true"
		printf '[plugins."io.containerd.cri.v1.runtime"]\n  restrict_oom_score_adj = true\n'
	fi
}

# vm_kubelet_config: a kubelet (1.36 and later) refuses cgroup v1 unless told otherwise.
vm_kubelet_config() {
	if [[ $(stat -fc %T /sys/fs/cgroup) != cgroup2fs ]]; then
		log "cgroup v1 on this machine: failCgroupV1: false"
		echo "failCgroupV1: false"
	fi
}

start_containerd() {
	mkdir -p "$W/cri/conf.d" "$W/cni/bin" "$W/cni/net.d"
	cp "$bin"/cni/* "$W/cni/bin/"
	# Talos v1.14.1 hack/cri-containerd.toml (the CRI containerd's main config; v1.13.9's is the same).
	cat >"$W/cri/containerd.toml" <<EOF
version = 3

disabled_plugins = [
    "io.containerd.differ.v1.erofs",
    "io.containerd.internal.v1.tracing",
    "io.containerd.snapshotter.v1.blockfile",
    "io.containerd.snapshotter.v1.erofs",
    "io.containerd.ttrpc.v1.otelttrpc",
    "io.containerd.tracing.processor.v1.otlp",
]

imports = [
    "$W/cri/conf.d/00-base.part",
    "$W/cri/conf.d/20-customization.part",
]

[debug]
level = "info"
format = "json"
EOF
	# Talos v1.14.1 hack/cri-plugin.part (/etc/cri/conf.d/00-base.part), the base spec path
	# moved into the scratch directory, without its ShimCgroup (above); with K8S_NODE_NRI=0,
	# v1.13.9's NRI section.
	cat >"$W/cri/conf.d/00-base.part" <<EOF
version = 3

[plugins."io.containerd.cri.v1.images"]
  discard_unpacked_layers = true
  use_local_image_pull = true

[plugins."io.containerd.cri.v1.runtime"]
  enable_cdi = true
  cdi_spec_dirs = ["/run/cdi"]

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  base_runtime_spec = "$W/cri/conf.d/base-spec.json"

$([[ ${K8S_NODE_NRI:-1} == 0 ]] && printf '\n[plugins."io.containerd.nri.v1.nri"]\n  disable = true\n')
EOF
	if [[ -n ${K8S_NODE_OCI_HOOK:-} ]]; then
		# shellcheck disable=SC2086 # the program and its arguments
		python3 - "$bin/base-spec.json" "$W/cri/conf.d/base-spec.json" $K8S_NODE_OCI_HOOK <<'EOF'
import json, sys
spec = json.load(open(sys.argv[1]))
spec.setdefault("hooks", {}).setdefault("createContainer", []).append({"path": sys.argv[3], "args": sys.argv[3:]})
json.dump(spec, open(sys.argv[2], "w"), indent=2)
EOF
	else
		cp "$bin/base-spec.json" "$W/cri/conf.d/base-spec.json"
	fi
	# What a user would put in /etc/cri/conf.d/20-customization.part, plus the test node's
	# CNI paths (Talos: /opt/cni/bin and /etc/cni/net.d).
	cat >"$W/cri/conf.d/20-customization.part" <<EOF
version = 3

[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = ["$W/cni/bin"]
  conf_dir = "$W/cni/net.d"

$(vm_containerd_part)
${K8S_NODE_CONTAINERD_PART:-}
EOF
	cat >"$W/cni/net.d/10-bridge.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "k8s-node",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$W/cni/ipam",
        "ranges": [[{"subnet": "10.244.0.0/24"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
EOF
	start containerd containerd --config "$W/cri/containerd.toml"
	wait_for 60 "containerd's socket" ctr version || return 1
	local t
	for t in "$images"/*.tar; do
		ctr -n k8s.io images import "$t" >>"$W/logs/ctr-import.log" 2>&1 || { cat "$W/logs/ctr-import.log" >&2; return 1; }
	done
	log "containerd ready, images: $(ctr -n k8s.io images ls -q | grep -v '^sha256:' | tr '\n' ' ')"
}

start_kubelet() {
	mkdir -p "$W/kubelet-pki"
	echo "nameserver 127.0.0.1" >"$W/resolv.conf"
	# As Talos's k8s.KubeletSpecController (internal/app/machined/pkg/controllers/k8s/
	# kubelet_spec.go, NewKubeletConfiguration) with Talos v1.14.1's constants; left out:
	# kubeletCgroups/systemCgroups (Talos's own cgroup tree) and the static pod directory.
	cat >"$W/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
port: 10250
address: 0.0.0.0
authentication:
  x509: {clientCAFile: $W/pki/ca.crt}
  webhook: {enabled: true}
  anonymous: {enabled: false}
authorization: {mode: Webhook}
cgroupRoot: /
rotateCertificates: false
protectKernelDefaults: true
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
seccompDefault: true
oomScoreAdj: -450
clusterDomain: cluster.local
clusterDNS: [10.96.0.10]
serializeImagePulls: false
failSwapOn: false
systemReserved: {cpu: 50m, pid: "100", ephemeral-storage: 256Mi, memory: 384Mi}
shutdownGracePeriod: 0s
shutdownGracePeriodCriticalPods: 0s
streamingConnectionIdleTimeout: 5m
tlsMinVersion: VersionTLS13
resolvConf: $W/resolv.conf
# A GPU worker as docs/examples/talos-1.13/gpu-worker.patch.yaml configures it.
registerWithTaints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]
# The build machine's disk holds Go's caches and every build's outputs: at the kubelet's default
# thresholds (image fs 15%, node fs 10%) it evicts the test's pods for what the machine holds,
# not for anything a check does (seen: nfd-worker Evicted with 9% of the disk free).
evictionHard: {imagefs.available: "2%", nodefs.available: "2%", memory.available: "100Mi"}
$(vm_kubelet_config)
${K8S_NODE_KUBELET_EXTRA:-}
EOF
	start kubelet kubelet --config="$W/kubelet.yaml" --kubeconfig="$W/kubelet.kubeconfig" \
		--cert-dir="$W/kubelet-pki" --hostname-override="$node" --node-ip=$node_ip
}

node_ready() {
	[[ $(kubectl get node "$node" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}

inner() {
	mkdir -p "$W/logs"
	export PATH="$bin/bin:$PATH" KUBECONFIG="$W/admin.kubeconfig" CONTAINERD_ADDRESS=/run/containerd/containerd.sock
	export K8S_NODE=$node K8S_NODE_BIN=$bin K8S_NODE_IMAGES=$images
	local t0=$SECONDS
	setup_network
	setup_mounts
	setup_pki
	start_control_plane
	start_containerd
	start_kubelet
	if ! wait_for 180 "node $node to be Ready" node_ready; then
		tail -20 "$W/logs/kubelet.log" >&2
		return 1
	fi
	log "node $node Ready $((SECONDS - t0)) s after the first component started"
	# Pods can be created once the service account controller has made the default accounts.
	wait_for 60 "the default service account" kubectl -n default get serviceaccount default || return 1
	local rc=0
	"$@" || rc=$?
	log "command exited $rc; stopping the node"
	# The kubelet first, so that it restarts nothing; PID 1 of this namespace exiting kills the rest.
	kill "${pids[@]}" 2>/dev/null || true
	return $rc
}

if [[ -n ${K8S_NODE_INNER:-} ]]; then
	inner "$@"
else
	outer "$@"
fi
