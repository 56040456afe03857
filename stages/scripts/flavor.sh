#!/usr/bin/env bash
# The steps of the flavors' final stages (flavors/<flavor>/pkg.yaml, made by hack/release/gen-flavors),
# in the base stage's build root (the tools image and siderolabs' extensions-validator), with
# the subroot, the binaries and the release's kernel modules image merged in.
#
#   flavor.sh install|test-modules|validate
set -euo pipefail
for v in NVIDIA_DRIVER_VERSION NVIDIA_MODULES_LICENSE NVIDIA_KERNEL_MODULES MODULES_IMAGE GLIBC_ROOT TALOS_VERSION KERNEL_VERSION; do
  [ -n "${!v:-}" ] || { echo "flavor.sh: $v is not set" >&2; exit 2; }
done

step_install() {
  mkdir -p /rootfs/usr/lib/modules /rootfs/usr/bin
  cp -R /usr/lib/modules/* /rootfs/usr/lib/modules/
  # the static ldconfig that the CDI hook's update-ldcache runs as /sbin/ldconfig
  install -m 0755 "/rootfs${GLIBC_ROOT}/sbin/ldconfig" /rootfs/usr/bin/ldconfig
}

# Every nvidia*.ko is the userspace's version; nvidia.ko's license says the kind
# (nvidia-peermem.ko declares Linux-OpenIB in the open build too).
step_test_modules() {
  local ko v l
  for ko in $(find /rootfs/usr/lib/modules -name 'nvidia*.ko'); do
    v=$(tr '\0' '\n' < "$ko" | grep -m1 '^version=' | cut -d= -f2)
    [ "$v" = "$NVIDIA_DRIVER_VERSION" ] || { echo "$ko: version $v, want $NVIDIA_DRIVER_VERSION"; exit 1; }
  done
  ko=$(find /rootfs/usr/lib/modules -name nvidia.ko | head -1)
  [ -n "$ko" ] || { echo "no nvidia.ko in $MODULES_IMAGE"; exit 1; }
  l=$(tr '\0' '\n' < "$ko" | grep -m1 '^license=' | cut -d= -f2)
  [ "$l" = "$NVIDIA_MODULES_LICENSE" ] || { echo "$ko: license $l, not $NVIDIA_KERNEL_MODULES modules ($NVIDIA_MODULES_LICENSE)"; exit 1; }
}

step_validate() {
  rm -rf /tmp/extension && mkdir -p /tmp/extension
  cp -a /rootfs /tmp/extension/rootfs
  cp /pkg/manifest.yaml /tmp/extension/manifest.yaml
  # Talos's validator, as siderolabs runs it
  /extensions-validator validate --rootfs=/tmp/extension --pkg-name="${PKG_NAME:?}"
  # the project's (internal/extension): Talos's checks for this release, the service YAML,
  # every program's interpreter and libraries, the subroot (pkg/driverroot), the modules,
  # and that the image is this one release's (its version, the kernel of its modules)
  /opt/nvidia-driver/bin/extension -validate /tmp/extension -talos-version "$TALOS_VERSION" \
    -module-kind "$NVIDIA_KERNEL_MODULES" -driver-version "$NVIDIA_DRIVER_VERSION" -kernel-version "$KERNEL_VERSION"
}

case ${1:-} in
  install) step_install ;;
  test-modules) step_test_modules ;;
  validate) step_validate ;;
  *) echo "usage: flavor.sh install|test-modules|validate" >&2; exit 2 ;;
esac
