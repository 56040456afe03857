#!/usr/bin/env bash
# A Kubernetes control plane on this machine for the Talos test node as a worker
# (TALOS_NODE_CONTROL_PLANE in hack/talos-node/node.sh; hack/talos-node/test-simgpu.sh): the
# guest then runs machined, containerd and the kubelet, and not etcd and the API server,
# which under qemu's emulated CPUs fell behind their own timeouts (docs/talos-node.md).
#   controlplane.sh start DIR   starts it (state in DIR/controlplane), once the API server is
#                               ready; writes DIR/controlplane/kube.port and DIR/kubeconfig
#   controlplane.sh stop DIR
# What runs, each from what a Talos control plane node runs:
#   - etcd, kube-apiserver, kube-controller-manager and kube-scheduler: hack/k8s-node's kube
#     binary (Kubernetes v1.37.0, Talos v1.14.1's), listening on 127.0.0.1, which the guest
#     reaches as 10.0.2.2 (qemu's user network); the API server advertises 10.0.2.2, so the
#     `kubernetes` EndpointSlice names it;
#   - the secrets: a bundle from `talosctl gen secrets` (DIR/controlplane/secrets.yaml), which
#     node.sh gives `talosctl gen config --with-secrets`; the API server's certificates from
#     the bundle's Kubernetes CA (hack/talos-node/v1.14.1/controlplane);
#   - the objects Talos's control plane applies for a worker's kubelet to join
#     (controllers/k8s/internal/k8stemplates/kubelet.go, csr.go): the bootstrap token's Secret
#     and the three ClusterRoleBindings that let it ask for, and get approved, its certificate;
#   - Talos's own trustd (machined started as "trustd", in a chroot whose
#     /system/run/trustd/runtime.sock serves the two resources it reads from machined:
#     controlplane trustd-state), on 50001, where a worker asks for its apid certificate
#     (controllers/secrets/api.go generateWorker: the endpoints of that EndpointSlice).
# Its API server reaches the node's kubelet (kubectl logs, exec) at the node's hostname, which
# the API server's mount namespace resolves to 127.0.0.1, where node.sh forwards the kubelet's
# port (DIR/kubelet.port).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
. "$here/release.sh"
out=$release_out
kube=${K8S_NODE_BIN:-$top/_out/k8s-node}/bin/kube
cmd=$1 dir=$2
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
cp=$dir/controlplane
node=talos-node
worker_ip=10.0.2.2

log() { echo "controlplane.sh: $*" >&2; }

stop() {
	local f pid
	for f in "$cp"/*.pid; do
		[ -e "$f" ] || continue
		pid=$(cat "$f")
		kill "$pid" 2>/dev/null || true
		for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
		kill -9 "$pid" 2>/dev/null || true
		rm -f "$f"
	done
}
case $cmd in
stop) stop; exit 0 ;;
start) ;;
*) echo "controlplane.sh: unknown command $cmd" >&2; exit 2 ;;
esac
stop
[ "$TALOS_NODE_VERSION" = v1.14.1 ] || { log "a host control plane is made for v1.14.1's worker only (TALOS_NODE_VERSION=$TALOS_NODE_VERSION)"; exit 2; }
for f in "$kube" "$out/bin/machined" "$out/bin/talosctl" "$out/bin/controlplane"; do
	[ -x "$f" ] || { log "$f is missing (make talos-node-build)"; exit 1; }
done

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() {
	local p
	for _ in $(seq 50); do
		p=$((40000 + RANDOM % 20000))
		listening "$p" || { echo "$p"; return; }
	done
	log "no free port found"
	return 1
}
# trustd's port is Talos's constants.TrustdPort: the worker dials no other.
if listening 50001; then
	log "127.0.0.1:50001 (trustd's port) is taken: another test node's control plane?"
	exit 1
fi

rm -rf "$cp" && mkdir -p "$cp/logs"
"$out/bin/talosctl" gen secrets -o "$cp/secrets.yaml" >/dev/null
kport=$(free_port) eport=$(free_port) pport=$(free_port)
echo "$kport" >"$cp/kube.port"
"$out/bin/controlplane" pki -secrets "$cp/secrets.yaml" -address "$worker_ip" -out "$cp/pki" \
	-server "https://127.0.0.1:$kport"
cp "$cp/pki/kubeconfig" "$dir/kubeconfig"
sed -i "s|certificate-authority: |certificate-authority: $cp/pki/|; s|client-certificate: |client-certificate: $cp/pki/|; s|client-key: |client-key: $cp/pki/|" "$dir/kubeconfig"

# start NAME PROGRAM ARGS...: in a session of its own, its output in logs/NAME.log.
start() {
	local name=$1
	shift
	setsid "$@" >"$cp/logs/$name.log" 2>&1 </dev/null &
	echo $! >"$cp/$name.pid"
}
# kube PROGRAM ARGS...: the kube binary started as PROGRAM (it chooses by its name).
kube() { local p=$1; shift; start "$p" bash -c 'exec -a "$0" "$@"' "$p" "$kube" "$@"; }

kube etcd --name cp --data-dir "$cp/etcd" --unsafe-no-fsync \
	--listen-client-urls "http://127.0.0.1:$eport" --advertise-client-urls "http://127.0.0.1:$eport" \
	--listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
	--initial-cluster "cp=http://127.0.0.1:$pport" --listen-metrics-urls "http://127.0.0.1:$(free_port)"

# The node's hostname, for the API server alone: its own mount namespace, with a hosts file of
# its own (the kube binary resolves names in Go, from /etc/hosts).
printf '127.0.0.1 localhost %s\n' "$node" >"$cp/hosts"
pki=$cp/pki
start kube-apiserver unshare --mount --propagation private bash -c \
	'mount --bind "$1" /etc/hosts && shift && exec -a kube-apiserver "$@"' apiserver "$cp/hosts" "$kube" \
	--etcd-servers="http://127.0.0.1:$eport" \
	--bind-address=127.0.0.1 --secure-port="$kport" --advertise-address="$worker_ip" \
	--tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
	--client-ca-file="$pki/ca.crt" --enable-bootstrap-token-auth=true \
	--kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" \
	--kubelet-client-key="$pki/apiserver-kubelet-client.key" \
	--kubelet-preferred-address-types=Hostname \
	--service-account-issuer=https://kubernetes.default.svc.cluster.local \
	--service-account-key-file="$pki/service-account.key" --service-account-signing-key-file="$pki/service-account.key" \
	--service-cluster-ip-range=10.96.0.0/12 --authorization-mode=Node,RBAC \
	--enable-admission-plugins=NodeRestriction --allow-privileged=true \
	--admission-control-config-file="$top/hack/k8s-node/admission.yaml" --profiling=false
k() { "${K8S_NODE_BIN:-$top/_out/k8s-node}/bin/kubectl" --kubeconfig "$dir/kubeconfig" "$@"; }
for i in $(seq 120); do
	k get --raw /readyz >/dev/null 2>&1 && break
	if ! kill -0 "$(cat "$cp/kube-apiserver.pid")" 2>/dev/null || [ "$i" = 120 ]; then
		log "the API server did not get ready; its log's end, and etcd's:"
		tail -20 "$cp/logs/kube-apiserver.log" >&2
		tail -5 "$cp/logs/etcd.log" >&2
		stop
		exit 1
	fi
	sleep 1
done
# The controller manager gives up if the API server is not ready when it starts. It signs the
# kubelet's certificate requests with the bundle's CA, and approves its client certificate's.
kube kube-controller-manager --kubeconfig="$dir/kubeconfig" \
	--authentication-kubeconfig="$dir/kubeconfig" --authorization-kubeconfig="$dir/kubeconfig" \
	--cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
	--service-account-private-key-file="$pki/service-account.key" --root-ca-file="$pki/ca.crt" \
	--controllers='*,tokencleaner' \
	--use-service-account-credentials=true --leader-elect=false --bind-address=127.0.0.1 \
	--secure-port=0 --profiling=false
kube kube-scheduler --kubeconfig="$dir/kubeconfig" \
	--authentication-kubeconfig="$dir/kubeconfig" --authorization-kubeconfig="$dir/kubeconfig" \
	--leader-elect=false --bind-address=127.0.0.1 --secure-port=0 --profiling=false

# What Talos's control plane applies for a worker's kubelet (k8stemplates/kubelet.go, csr.go).
token=$(cat "$pki/bootstrap-token")
k apply --server-side -f - >/dev/null <<EOF
apiVersion: v1
kind: Secret
metadata: {name: bootstrap-token-${token%%.*}, namespace: kube-system}
type: bootstrap.kubernetes.io/token
stringData:
  token-id: "${token%%.*}"
  token-secret: "${token#*.}"
  usage-bootstrap-authentication: "true"
  auth-extra-groups: system:bootstrappers:nodes
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: system-bootstrap-node-bootstrapper}
subjects:
- {kind: Group, name: "system:bootstrappers:nodes", apiGroup: rbac.authorization.k8s.io}
- {kind: Group, name: "system:nodes", apiGroup: rbac.authorization.k8s.io}
roleRef: {kind: ClusterRole, name: "system:node-bootstrapper", apiGroup: rbac.authorization.k8s.io}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: system-bootstrap-approve-node-client-csr}
subjects:
- {kind: Group, name: "system:bootstrappers:nodes", apiGroup: rbac.authorization.k8s.io}
roleRef: {kind: ClusterRole, name: "system:certificates.k8s.io:certificatesigningrequests:nodeclient", apiGroup: rbac.authorization.k8s.io}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: system-bootstrap-node-renewal}
subjects:
- {kind: Group, name: "system:nodes", apiGroup: rbac.authorization.k8s.io}
roleRef: {kind: ClusterRole, name: "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient", apiGroup: rbac.authorization.k8s.io}
EOF

# Talos's trustd, in a chroot of its own: its runtime socket is a fixed path
# (constants.TrustdRuntimeSocketPath).
root=$cp/trustd-root
mkdir -p "$root/system/run/trustd"
cp "$out/bin/machined" "$root/trustd"
start trustd-state "$out/bin/controlplane" trustd-state -secrets "$cp/secrets.yaml" -address "$worker_ip" \
	-socket "$root/system/run/trustd/runtime.sock"
for _ in $(seq 50); do [ -S "$root/system/run/trustd/runtime.sock" ] && break; sleep 0.2; done
start trustd chroot "$root" /trustd
for i in $(seq 50); do
	listening 50001 && break
	if [ "$i" = 50 ]; then
		log "trustd is not listening on 50001; its log:"
		cat "$cp/logs/trustd.log" "$cp/logs/trustd-state.log" >&2
		stop
		exit 1
	fi
	sleep 0.2
done
log "the API server answers at https://127.0.0.1:$kport (the guest: https://$worker_ip:$kport), trustd at :50001"
