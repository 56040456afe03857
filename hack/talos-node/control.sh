#!/usr/bin/env bash
# The controls of hack/talos-node/test.sh: the same checks against a copy of the extension whose
# service YAML has a known defect back. Exits 0 only when test.sh fails; a test.sh that passes
# is a test that cannot catch the defect.
#   control.sh EXTENSION_DIR [STATE_DIR]
# TALOS_NODE_CONTROL picks the defect:
#   tmpfs    (default) the `source: tmpfs` mount, which stopped the service on every Talos node:
#            machined's extension Runner calls os.MkdirAll on every mount source, relative to `/`
#            on a read-only root;
#   depends  a `depends` that never comes true on a node without the module
#            (path: /proc/driver/nvidia/version): the service waits, and machined's boot with it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ext=$1
dir=${2:-$(mktemp -d /tmp/talos-node-control.XXXXXX)}
mkdir -p "$dir"
copy=$dir/extension
rm -rf "$copy"
cp -a "$ext" "$copy"
yaml=$copy/rootfs/usr/local/etc/containers/nvidia-driver.yaml
control=${TALOS_NODE_CONTROL:-tmpfs}
case $control in
tmpfs)
	# The first of the container's mounts (the YAML's two-space `  mounts:` list).
	if ! grep -q 'source: tmpfs' "$yaml"; then
		awk '{ print } /^  mounts:$/ && !done { print "    - source: tmpfs\n      destination: /tmp\n      type: tmpfs\n      options: [nosuid, nodev, noexec, mode=1777, size=16m]"; done = 1 }' \
			"$yaml" >"$yaml.new"
		mv "$yaml.new" "$yaml"
	fi
	grep -n -A3 'source: tmpfs' "$yaml" || { echo "control.sh: could not add the tmpfs mount to $yaml" >&2; exit 2; }
	;;
depends)
	awk '{ print } /^depends:$/ && !done { print "  - path: /proc/driver/nvidia/version"; done = 1 }' "$yaml" >"$yaml.new"
	mv "$yaml.new" "$yaml"
	grep -n -A3 '^depends:' "$yaml"
	grep -q 'path: /proc/driver/nvidia/version' "$yaml" || { echo "control.sh: could not add the depends to $yaml" >&2; exit 2; }
	;;
*) echo "control.sh: unknown TALOS_NODE_CONTROL $control" >&2; exit 2 ;;
esac
# On a good run the service was Running within seconds of apid answering (81 to 163 s after
# the guest started); 180 s more is ample.
export TALOS_NODE_WAIT=${TALOS_NODE_WAIT:-180}
# The defects stop the checks before Kubernetes: no registry, no bootstrap.
export TALOS_NODE_KUBERNETES=0
# The control holds only when the checks fail on the defect: the node up, the service not
# Running (any other failure, such as a node that never came up, proves nothing).
if "$here/test.sh" "$copy" "$dir/run" 2>&1 | tee "$dir/test.log"; then
	echo "talos-node control ($control): FAIL: test.sh passed with the defect in the service YAML"
	exit 1
fi
if ! grep -q '^FAIL: ext-nvidia-driver is not Running' "$dir/test.log"; then
	echo "talos-node control ($control): FAIL: test.sh failed, but not on the service (see $dir/test.log)"
	exit 1
fi
echo "talos-node control ($control): PASS: test.sh failed with the defect in the service YAML, on the service"
