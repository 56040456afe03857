# Shared by the Talos test node's checks (hack/talos-node/test.sh, test-simgpu.sh): talosctl
# and kubectl on the node whose state is in $dir, FAIL lines, waits, the service's state and
# log, its documents, and Kubernetes coming up on the node. Sourced once here and dir are set.
# shellcheck shell=bash
. "$here/release.sh"
out=$release_out
mkdir -p "$dir/outputs"
svc=ext-nvidia-driver
report=${report:-talos-node} # the last line's name: "$report: PASS" or FAIL
node=talos-node # the Kubernetes node: node.sh names it so
# Under qemu's TCG a step of machined takes seconds; these bound each wait. Kubernetes's
# (the API server, the node's registration) take longer: on the loaded build machine the API
# server answered /readyz more than 600 s after machined's boot was done.
wait_s=${TALOS_NODE_WAIT:-600}
k8s_wait_s=${TALOS_NODE_K8S_WAIT:-1500}
failed=0

t() { "$out/bin/talosctl" --talosconfig "$dir/talosconfig" "$@"; }
k() { "$k8s_bin/kubectl" --kubeconfig "$dir/kubeconfig" "$@"; }
k8s_bin=${K8S_NODE_BIN:-$here/../../_out/k8s-node}/bin
top=$(cd "$here/../.." && pwd)
say() { printf '\n=== %s\n' "$*"; }
fail() {
	echo "FAIL: $*"
	failed=1
	if [ "${TALOS_NODE_FAIL_FAST:-}" = 1 ]; then
		echo "talos-node: FAIL"
		exit 1
	fi
}
# capture NAME: talosctl service ext-nvidia-driver, saved and printed.
capture() {
	t service "$svc" >"$dir/outputs/$1.txt" 2>&1
	sed 's/^/    /' "$dir/outputs/$1.txt"
}
state() { t service "$svc" 2>/dev/null | awk '$1 == "STATE" { print $2 }'; }
logs() { t logs "$svc" 2>/dev/null; }
count() { logs | grep -c -- "$1"; }
# guest_gone: qemu has exited (node.sh's line in DIR/qemu.log). guest_lost ends the checks
# with why: qemu's exit status and the guest console's panic or end. Every later check would
# only wait out its time against a node that is not there.
guest_gone() { grep -q '^node.sh: qemu exited' "$dir/qemu.log" 2>/dev/null; }
guest_lost() {
	echo "FAIL: the guest is gone ($((SECONDS - boot_start)) s after it started): $(grep '^node.sh: qemu exited' "$dir/qemu.log")"
	grep -v '^node.sh: qemu exited' "$dir/qemu.log" | tail -20 | sed 's/^/    qemu: /'
	if grep -qE 'Kernel panic|Oops|BUG:|Call Trace' "$dir/console.log"; then
		echo "    the guest's console from its kernel's first report:"
		sed -n '/Kernel panic\|Oops\|BUG:\|Call Trace/,$p' "$dir/console.log" | head -60 | sed 's/^/    /'
	else
		echo "    the guest's console's end:"
		tail -30 "$dir/console.log" | sed 's/^/    /'
	fi
	echo "$report: FAIL"
	exit 1
}
# k8s_lost WHAT: a step of Kubernetes that every later check needs (machined's boot, the API
# server's /readyz, the node Ready) did not come. FAIL with what the node shows, and the checks
# end here: each later wait would only run out its time against it (25 minutes each; on
# 2026-12-07 an emulated API server that never got ready, docs/talos-node.md "Over the cliff
# alone", would have held the checks past CI's limit).
k8s_lost() {
	local readyz failing
	echo "FAIL: $* ($((SECONDS - boot_start)) s after the guest started)"
	if [ -s "$dir/kubeconfig" ]; then
		readyz=$(k get --raw '/readyz?verbose' --request-timeout=60s 2>&1)
		failing=$(grep -o '\[-\][^\\]*' <<<"$readyz" | tr '\n' ' ')
		echo "    the API server's /readyz?verbose: ${failing:-$(head -1 <<<"$readyz" | cut -c1-300)}"
	fi
	echo "    the guest's load average: $(timeout 60 "$out/bin/talosctl" --talosconfig "$dir/talosconfig" read /proc/loadavg 2>&1 | head -1)"
	echo "    the kubelet's last log lines:"
	timeout 60 "$out/bin/talosctl" --talosconfig "$dir/talosconfig" logs kubelet 2>&1 | tail -3 | cut -c1-400 | sed 's/^/    /'
	echo "$report: FAIL"
	exit 1
}
# until SECONDS CMD...: CMD until it succeeds or SECONDS pass (or the guest is gone).
until_ok() {
	local limit=$1 start=$SECONDS
	shift
	until "$@"; do
		guest_gone && guest_lost
		((SECONDS - start < limit)) || return 1
		sleep 5
	done
}
running() { [ "$(state)" = Running ]; }

# cri_volumes_held: cri held at boot by its own volume mounts, as seen on 2026-12-05 on this
# node (Talos v1.14.1; docs/talos-node.md, "cri held by its volumes at boot"). Talos restarts
# cri whenever cri.toml or base-spec.json gets a new version
# (internal/app/machined/pkg/controllers/cri/service.go), twice in this node's boots. When a
# restart came while cri's volumes were being mounted, the MountRequest of /var/lib stayed
# tearingDown (finalizer block.MountController), and cri, etcd and the kubelet waited for
# /var/lib from then on.
cri_volumes_held() {
	t get mountrequests /var/lib -o yaml 2>/dev/null | grep -q '^ *phase: tearingDown$' &&
		[ "$(t service cri 2>/dev/null | awk '$1 == "STATE" { print $2 }')" = Waiting ]
}
# until_booted SECONDS CMD...: until_ok for the first wait after the node's start. Once
# cri_volumes_held has held for 60 s, the node is restarted (node.sh restart), once, with a
# line that says so; held again, the wait runs out and its check fails.
until_booted() {
	local limit=$1 start=$SECONDS held= restarted=0
	shift
	until "$@"; do
		guest_gone && guest_lost
		((SECONDS - start < limit)) || return 1
		if [ "$restarted" = 0 ] && cri_volumes_held; then
			held=${held:-$SECONDS}
			if ((SECONDS - held >= 60)); then
				echo "cri held at boot: the MountRequest of /var/lib tearingDown and cri Waiting for its volumes for 60 s ($((SECONDS - boot_start)) s after the guest started); the node restarted once (docs/talos-node.md)"
				t get mountrequests -o yaml >"$dir/outputs/mountrequests-held.yaml" 2>&1
				"$here/node.sh" restart "$dir" || return 1
				restarted=1
			fi
		else
			held=
		fi
		sleep 5
	done
}
# machined's log of the services its boot still waits for (both releases' wording, below): the
# lines of its startAllServices task, not a service's own "Waiting for service ..." events.
waits='startAllServices.* service "[^"]+" to be ("up"|up/finished|registered)'

logged() { logs | grep -q -- "$1"; }
# The service's log since its last start.
last_run() { logs | awk '/msg=starting version=/ { run = "" } { run = run $0 "\n" } END { printf "%s", run }'; }
# apply FILE: the node's machine config with that ExtensionServiceConfig, as a user applies it
# (talosctl apply-config, no reboot): the document replaces the one before; with FILE "", the
# machine config without one.
apply() {
	{
		cat "$dir/config/machine.yaml"
		[ -z "$1" ] || { echo ---; cat "$1"; }
	} >"$dir/applied.yaml"
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
# In container mode Talos (v1.13.9 and v1.14.1 alike) writes no document files and so never
# restarts an extension service for a document: ExtensionServiceConfigFilesController.Run
# returns at once for ModeContainer
# (internal/app/machined/pkg/controllers/runtime/extension_service_config_files.go),
# and ExtensionServiceController restarts services on the ExtensionServiceConfigStatus it
# would write. A document reaches the service here as its environment, when the service's runner
# is made again: talosctl service ext-nvidia-driver restart (docs/talos-node.md).
restart() { t service "$svc" restart >/dev/null; }

# kubernetes_up: api_up, the bridge CNI applied (cni.yaml) and node_up.
kubernetes_up() {
	api_up
	k apply -f "$here/cni.yaml" >/dev/null || fail "kubectl apply -f cni.yaml failed"
	node_up
}

# api_up: machined's boot done and the API server answering (boot_start: when the guest
# started); $dir/kubeconfig reaches it.
api_up() {
	# MachineStatus's stage turns running when the boot sequence stops without an error
	# (internal/app/machined/pkg/controllers/runtime/machine_status.go). machined's own
	# 'boot sequence: done' line is no proof either way: its log is a 1 MiB ring
	# (internal/app/machined/pkg/runtime/logging/circular.go) that a slow node fills
	# before these checks run.
	boot_done() { t get machinestatus -o yaml 2>/dev/null | grep -q '^ *stage: running$'; }
	if until_ok "$wait_s" boot_done; then
		echo "machined's boot sequence done (MachineStatus stage running) $((SECONDS - boot_start)) s after the guest started"
		t logs machined 2>/dev/null | grep 'boot sequence: done' | sed 's/^/    /'
	else
		k8s_lost "machined's boot sequence did not finish: MachineStatus $(t get machinestatus -o yaml 2>&1 | grep -E 'stage:|ready:' | tr -s ' \n' ' ')"
	fi
	# A worker's control plane on this machine (controlplane.sh) wrote $dir/kubeconfig.
	if [ ! -s "$dir/controlplane/kube.port" ]; then
		t kubeconfig --force "$dir/kubeconfig.talos" >/dev/null 2>&1 || fail "talosctl kubeconfig failed"
		# talosctl's kubeconfig names the cluster endpoint (10.0.2.15, inside the guest); kubectl
		# reaches the same API server through the guest's forward of 6443 (in its certificate, k8s.patch.yaml).
		sed "s#server: https://10.0.2.15:6443#server: https://127.0.0.1:$(cat "$dir/kube.port")#" \
			"$dir/kubeconfig.talos" >"$dir/kubeconfig"
	fi
	api_ready() { k get --raw /readyz >/dev/null 2>&1; }
	if until_ok "$k8s_wait_s" api_ready; then
		echo "the API server answered /readyz $((SECONDS - boot_start)) s after the guest started"
	else
		k8s_lost "the API server never answered /readyz"
	fi
}

# node_up: the node Ready, the kubelet's client certificate request approved where it waits.
node_up() {
	node_ready() { k get node "$node" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null | grep -qx True; }
	# Under emulation the kubelet asks for its client certificate minutes before Talos binds
	# the bootstrap group to automatic approval (the ClusterRoleBinding
	# system-bootstrap-approve-node-client-csr, applied once the API server answers). Seen on
	# 2026-12-05: that request stayed Pending, and the kubelet exited after 5 min without a
	# certificate (client-go util/certificate transport.go, "shutdownThreshold":"5m0s") before
	# its restart registered the node. The harness approves such a request as an operator
	# would, and says so.
	approve_kubelet_csrs() {
		local csr
		for csr in $(k get csr -o jsonpath='{range .items[?(@.spec.signerName=="kubernetes.io/kube-apiserver-client-kubelet")]}{.metadata.name}{"="}{.status.conditions[*].type}{"\n"}{end}' 2>/dev/null | sed -n 's/=$//p'); do
			k certificate approve "$csr" >/dev/null 2>&1 && echo "approved the kubelet's pending client certificate request $csr ($((SECONDS - boot_start)) s after the guest started)"
		done
	}
	node_ready_or_approve() { node_ready || { approve_kubelet_csrs; false; }; }
	if until_ok "$k8s_wait_s" node_ready_or_approve; then
		echo "node $node Ready $((SECONDS - boot_start)) s after the guest started"
	else
		k8s_lost "node $node is not Ready"
	fi
}

# workload_isolation_check (v1.14): what the node shows of workload isolation in container mode.
workload_isolation_check() {
	say "workload isolation: the machine config asks for it; container mode runs no sandboxd"
	# talosctl gen config v1.14 writes SecurityProfileConfig workloadIsolation: true for a new
	# cluster (machinery config/generate/security_profile.go). machined starts sandboxd, and
	# cri inside its namespaces, only when sandboxd.Enabled: false in container mode whatever
	# the document says (internal/app/machined/pkg/sandboxd/enabled.go: InContainer). So here
	# the node must have the document, no sandboxd service and cri Running; a sandboxd on this
	# node means that premise changed and the check must be revisited.
	t get machineconfig -o yaml >"$dir/outputs/machineconfig.yaml" 2>&1
	if grep -A6 '^ *kind: SecurityProfileConfig$' "$dir/outputs/machineconfig.yaml" | grep -q 'workloadIsolation: true'; then
		echo "the node's machine config: SecurityProfileConfig workloadIsolation: true"
	else
		fail "the node's machine config has no SecurityProfileConfig with workloadIsolation: true"
	fi
	if t service sandboxd >"$dir/outputs/sandboxd.txt" 2>&1; then
		sed 's/^/    /' "$dir/outputs/sandboxd.txt"
		fail "sandboxd is registered in container mode"
	elif grep -q 'service "sandboxd" is not registered' "$dir/outputs/sandboxd.txt"; then
		echo "talosctl service sandboxd: $(cat "$dir/outputs/sandboxd.txt")"
	else
		fail "talosctl service sandboxd failed otherwise than not registered: $(cat "$dir/outputs/sandboxd.txt")"
	fi
	if t service cri 2>/dev/null | awk '$1 == "STATE" { print $2 }' | grep -qx Running; then
		echo "cri Running, without sandboxd (the host's PID and mount namespaces)"
	else
		fail "cri is not Running: $(t service cri 2>&1 | tr -s ' \n' ' ')"
	fi
}
