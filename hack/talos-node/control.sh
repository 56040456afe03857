#!/usr/bin/env bash
# The control of hack/talos-node/test.sh: the same checks against a copy of the extension whose
# service YAML has the `source: tmpfs` mount back (the defect that stopped the service on every
# Talos node: machined's extension Runner calls os.MkdirAll on every mount source, relative to
# `/` on a read-only root). Exits 0 only when test.sh fails; a test.sh that passes it is a
# test that cannot catch the defect.
#   control.sh EXTENSION_DIR [STATE_DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ext=$1
dir=${2:-$(mktemp -d /tmp/talos-node-control.XXXXXX)}
mkdir -p "$dir"
copy=$dir/extension
rm -rf "$copy"
cp -a "$ext" "$copy"
yaml=$copy/rootfs/usr/local/etc/containers/nvidia-driver.yaml
if ! grep -q 'source: tmpfs' "$yaml"; then
	# The first of the container's mounts (the YAML's two-space `  mounts:` list).
	awk '{ print } /^  mounts:$/ && !done { print "    - source: tmpfs\n      destination: /tmp\n      type: tmpfs\n      options: [nosuid, nodev, noexec, mode=1777, size=16m]"; done = 1 }' \
		"$yaml" >"$yaml.new"
	mv "$yaml.new" "$yaml"
fi
grep -q 'source: tmpfs' "$yaml" || { echo "control.sh: could not add the tmpfs mount to $yaml" >&2; exit 2; }
grep -n -A3 "source: tmpfs" "$yaml"
# The real node had the service Running 25 s after its guest started; 180 s is ample.
export TALOS_NODE_WAIT=${TALOS_NODE_WAIT:-180}
if "$here/test.sh" "$copy" "$dir/run"; then
	echo "talos-node control: FAIL: test.sh passed with source: tmpfs in the service YAML"
	exit 1
fi
echo "talos-node control: PASS: test.sh failed with source: tmpfs in the service YAML"
