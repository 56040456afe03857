#!/usr/bin/env bash
# The controls of hack/talos-node/test.sh: the same checks against a copy of the extension with
# a known defect back. Exits 0 only when test.sh fails on it; a test.sh that passes
# is a test that cannot catch the defect.
#   control.sh EXTENSION_DIR [STATE_DIR]
# TALOS_NODE_CONTROL picks the defect:
#   tmpfs    (default) the `source: tmpfs` mount, which stopped the service on every Talos node:
#            machined's extension Runner calls os.MkdirAll on every mount source, relative to `/`
#            on a read-only root;
#   depends  a `depends` that never comes true on a node without the module
#            (path: /proc/driver/nvidia/version): the service waits, and machined's boot with it;
#   exit     a service that exits when its document is bad (hack/talos-node/exit-on-bad-document in place
#            of its binary): under restart: always, a crash loop.
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
exit)
	bin=$copy/rootfs/usr/local/lib/containers/nvidia-driver/usr/bin/nvidia-driver
	[ -x "$bin" ] || { echo "control.sh: $bin is missing" >&2; exit 2; }
	mv "$bin" "$bin.real"
	(cd "$here/../.." && CGO_ENABLED=0 go build -trimpath -o "$bin" ./hack/talos-node/exit-on-bad-document)
	;;
*) echo "control.sh: unknown TALOS_NODE_CONTROL $control" >&2; exit 2 ;;
esac
# On a good run the service was Running within seconds of apid answering (81 to 163 s after
# the guest started); 180 s more is ample.
export TALOS_NODE_WAIT=${TALOS_NODE_WAIT:-180}
# The defects stop the checks before Kubernetes: no registry, no bootstrap; and test.sh stops at
# its first failed check.
export TALOS_NODE_KUBERNETES=0 TALOS_NODE_FAIL_FAST=1
# The control holds only when the checks fail on the defect (any other failure, such as a node
# that never came up, proves nothing): the service not Running, or restarting on the bad
# document.
case $control in
exit) expected='^FAIL: the service restarted [0-9]* times on a bad document' ;;
*) expected='^FAIL: ext-nvidia-driver is not Running' ;;
esac
if "$here/test.sh" "$copy" "$dir/run" 2>&1 | tee "$dir/test.log"; then
	echo "talos-node control ($control): FAIL: test.sh passed with the defect"
	exit 1
fi
if ! grep -q "$expected" "$dir/test.log"; then
	echo "talos-node control ($control): FAIL: test.sh failed, but not on the defect (see $dir/test.log)"
	exit 1
fi
echo "talos-node control ($control): PASS: test.sh failed with the defect, on it: $(grep "$expected" "$dir/test.log")"
