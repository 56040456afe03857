# Node Feature Discovery v0.18.2 on the one-node test cluster, as docs/kubernetes.md ("Labels
# from the host") asks of an NFD deployment. Sourced by test-cpu.sh and hack/gpu-host/test-gpu.sh inside
# cluster.sh, which define check, failed and jp; needs K8S_NODE, K8S_NODE_DIR and
# K8S_NODE_IMAGES (cluster.sh) and top (the checkout).
#
# NFD's own kustomize bases and its "common" component (the worker's stock features.d
# hostPath), which images.sh copies from NFD's module into $K8S_NODE_IMAGES/nfd-deployment so
# that a host without Go has them too, with: a namespace of our own (hostPath volumes need
# "privileged" under Pod Security), the configuration the docs ask for
# (hack/k8s-node/nfd/nfd-master.conf: extraLabelNs nvidia.com; nfd-worker.conf: a 2 s rescan),
# a toleration for the GPU taint the node registers with, and the user of NFD's image (its
# Dockerfile: USER 65534:65534; our packing tool sets none). The image is images.sh's nfd.

nfd_ns=nvidia-nfd-test
nfd_features_d=/etc/kubernetes/node-feature-discovery/features.d

# nfd_features_mount [DIR]: NFD's features.d in this mount namespace only, so that the host's
# stays as it was: DIR bound there (the simulated node's, where the service writes), or else a
# new directory made 0700, as Talos makes a missing mount source of an extension service
# (machined's services/extension.go: os.MkdirAll(source, 0o700)) before the service starts.
# The mount point itself is made on the host where it is missing, and removed at exit.
nfd_features_mount() {
	nfd_made=$(mkdir -pv ${nfd_features_d%/*} | sed -n "s/^mkdir: created directory '\(.*\)'$/\1/p" | sort -r)
	trap '[ -z "$nfd_made" ] || { umount -l ${nfd_features_d%/*} 2>/dev/null; rmdir $nfd_made; }' EXIT
	mount -t tmpfs -o mode=0755 k8s-node-nfd ${nfd_features_d%/*}
	if [ -n "${1:-}" ]; then
		mkdir $nfd_features_d && mount --bind "$1" $nfd_features_d
	else
		mkdir -m 0700 $nfd_features_d
	fi
}

# nfd_deploy: applies NFD's deployment (CRDs, RBAC, nfd-master, the nfd-worker DaemonSet).
nfd_deploy() { # [master]: with "master", the CRDs and nfd-master only, no worker (the
	# simulated node: its GPUs have no PCI functions for a worker to find, and a worker's
	# features.d would be the host's; the master turns GFD's NodeFeature object into labels)
	local k=$K8S_NODE_DIR/nfd-kustomize worker="- deployment/base/worker-daemonset"
	[[ ${1:-} == master ]] && worker=""
	mkdir -p "$k"
	cp "$top"/hack/k8s-node/nfd/nfd-{master,worker}.conf "$k/"
	ln -sfn "$K8S_NODE_IMAGES/nfd-deployment" "$k/deployment" # kustomize takes relative paths only
	cat >"$k/kustomization.yaml" <<KUSTOMIZATION
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: $nfd_ns
resources:
- namespace.yaml
- deployment/base/rbac
- deployment/base/nfd-crds
- deployment/base/master
$worker
components:
- deployment/components/common
configMapGenerator:
- {name: nfd-master-conf, files: [nfd-master.conf]}
- {name: nfd-worker-conf, files: [nfd-worker.conf]}
patches:
- target: {labelSelector: app=nfd}
  patch: |
    - {op: add, path: /spec/template/spec/tolerations, value: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]}
    - {op: add, path: /spec/template/spec/securityContext, value: {runAsUser: 65534, runAsGroup: 65534}}
KUSTOMIZATION
	cat >"$k/namespace.yaml" <<NAMESPACE
apiVersion: v1
kind: Namespace
metadata:
  name: $nfd_ns
  labels: {pod-security.kubernetes.io/enforce: privileged}
NAMESPACE
	check "kubectl apply -k (NFD v0.18.2's deployment files)" kubectl apply -k "$k" --server-side
}

# nfd_logs: NFD's pods and the end of their logs, for a failure.
nfd_logs() {
	kubectl -n $nfd_ns get pods -o wide
	kubectl -n $nfd_ns logs deploy/nfd-master --tail=15 2>&1 | sed 's/^/  nfd-master: /'
	kubectl -n $nfd_ns logs ds/nfd-worker --tail=15 2>&1 | sed 's/^/  nfd-worker: /'
}

node_label() { jp node "$K8S_NODE" -o "jsonpath={.metadata.labels.nvidia\.com/$1}"; } # NAME, dots escaped

# nfd_labels_are PRODUCT MIG-CONFIG MIG-STATE [MPS-CAPABLE]: the node's labels from the feature
# file ("" = absent; mps.capable is not compared when MPS-CAPABLE is left out).
nfd_labels_are() {
	[ "$(node_label gpu\\.product)|$(node_label mig\\.config)|$(node_label mig\\.config\\.state)" = "$1|$2|$3" ] &&
		{ [ $# -lt 4 ] || [ "$(node_label mps\\.capable)" = "$4" ]; }
}

# nvidia_labels: the node's nvidia.com labels, one a line.
nvidia_labels() { jp node "$K8S_NODE" -o jsonpath='{.metadata.labels}' | tr -d '{}' | tr ',' '\n' | grep nvidia.com; }
