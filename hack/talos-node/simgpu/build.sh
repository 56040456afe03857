#!/usr/bin/env bash
# The extensions of the simulated GPU node on Talos (hack/talos-node/test-simgpu.sh):
#   _out/extensions/nvidia-driver-dev-sim   the product's service and extension files, its
#       subroot carrying the simulated libnvidia-ml (hack/sim-node/simnvml/build.sh); never a
#       release image
#   _out/extensions/simnvml-driver          test only: the simulated kernel driver as an
#       extension service (simnvml-driver.yaml, driver.sh) and the /proc/driver hook that CRI's
#       base runtime spec names (node.patch.yaml)
#   _out/extensions/bridge-cni              test only: the node's pod network, written at boot
#       (bridge-cni.yaml)
#   _out/extensions/api-relay               test only: the `kubernetes` Service's address for the
#       pods of the node as a worker of a control plane on this machine (api-relay.yaml)
# Each is an extension image directory as make extension writes them (their rootfs/ goes to the
# node's /, hack/talos-node/node.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../../.." && pwd)
cd "$top"
hack/sim-node/simnvml/build.sh _out/subroot-debian _out/subroot-sim
_out/bin/extension -out _out -name nvidia-driver-dev-sim -payload _out/subroot-sim >/dev/null
# Static: the service's root holds nothing else (the node tool links go-nvml, hence cgo; it
# never loads a library).
c=_out/extensions/simnvml-driver/rootfs/usr/local/lib/containers/simnvml-driver
rm -rf _out/extensions/simnvml-driver
mkdir -p "$c/bin" "$c/dev" "$c/host/run" "$c/run/nvidia" "$c/usr/local/glibc" "$c/proc" "$c/sys" "$c/tmp" \
	_out/extensions/simnvml-driver/rootfs/usr/local/etc/containers
# (The linker's warning about dlopen in a static program goes to the log.)
if ! go build -trimpath -ldflags '-s -w -linkmode external -extldflags -static' -o "$c/simnvml-node" \
	./hack/sim-node/simnvml/node 2>_out/extensions/simnvml-driver.build.log; then
	cat _out/extensions/simnvml-driver.build.log >&2
	exit 1
fi
install -m 0755 _out/bin/simnvml-prochook "$c/prochook"
install -m 0755 "${BUSYBOX:-/bin/busybox}" "$c/bin/busybox"
for a in sh mount awk mkdir cat head sleep; do ln -s busybox "$c/bin/$a"; done
install -m 0755 "$here/driver.sh" "$c/driver.sh"
install -m 0644 "$here/simnvml-driver.yaml" _out/extensions/simnvml-driver/rootfs/usr/local/etc/containers/simnvml-driver.yaml
n=_out/extensions/bridge-cni/rootfs/usr/local/lib/containers/bridge-cni
rm -rf _out/extensions/bridge-cni
mkdir -p "$n/bin" "$n/net.d" _out/extensions/bridge-cni/rootfs/usr/local/etc/containers
install -m 0755 "${BUSYBOX:-/bin/busybox}" "$n/bin/busybox"
for a in sh cat mv; do ln -s busybox "$n/bin/$a"; done
install -m 0644 "$here/bridge-cni.yaml" _out/extensions/bridge-cni/rootfs/usr/local/etc/containers/bridge-cni.yaml
a=_out/extensions/api-relay/rootfs/usr/local/lib/containers/api-relay
rm -rf _out/extensions/api-relay
mkdir -p "$a/bin" _out/extensions/api-relay/rootfs/usr/local/etc/containers
install -m 0755 "${BUSYBOX:-/bin/busybox}" "$a/bin/busybox"
for p in sh ip grep nc; do ln -s busybox "$a/bin/$p"; done
install -m 0644 "$here/api-relay.yaml" _out/extensions/api-relay/rootfs/usr/local/etc/containers/api-relay.yaml
echo "simgpu: _out/extensions/nvidia-driver-dev-sim, _out/extensions/simnvml-driver, _out/extensions/bridge-cni, _out/extensions/api-relay" >&2
