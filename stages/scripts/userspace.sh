#!/usr/bin/env bash
# The steps of the nvidia-userspace-<branch> stages (stages/nvidia-userspace-*/pkg.yaml, made
# by hack/release/gen-flavors): NVIDIA's userspace driver and fabric manager as the glibc subroot
# $SUBROOT (/rootfs/usr/local/glibc), the GSP firmware in /rootfs/usr/lib/firmware/nvidia/
# $NVIDIA_DRIVER_VERSION. Layout: pkg/driverroot (layout.go). Run from bldr's step directory
# (/tmp/build), which holds the sources nvidia.tar.xz and fabricmanager.tar.xz.
#
#   userspace.sh prepare|install|fabricmanager|finish|test
set -euo pipefail
: "${SUBROOT:?SUBROOT is not set}" "${NVIDIA_DRIVER_VERSION:?NVIDIA_DRIVER_VERSION is not set}"
: "${ARCH:?ARCH is not set}" "${GLIBC_LOADER:?GLIBC_LOADER is not set}"
firmware=/rootfs/usr/lib/firmware/nvidia/${NVIDIA_DRIVER_VERSION}

step_prepare() {
  # the installer checks that these exist; nothing is loaded at build time
  for t in modprobe rmmod lsmod depmod; do ln -sf /bin/true /bin/$t; done

  mkdir archive fm assets
  tar -xf nvidia.tar.xz --strip-components=1 -C archive
  tar -xf fabricmanager.tar.xz --strip-components=1 -C fm

  # the archive holds the .run's files sorted by kind; the installer wants them in one
  # directory, as the .run unpacks them (siderolabs' nvidia-pkgs stage does the same)
  cd archive
  mkdir -p ../assets/html ../assets/libglvnd_install_checker
  cp -r bin/* etc/* firmware lib/* sbin/* share/* supported-gpus systemd LICENSE ../assets/
  cp -r man/man1/* ../assets/
  cp -r docs/* ../assets/html/
  cp -r tests/glvnd/* ../assets/libglvnd_install_checker/
  cp CHANGELOG ../assets/NVIDIA_Changelog
  cp MANIFEST ../assets/.manifest
  cp README ../assets/README.txt
  # listed in the installer's manifest, skipped by --no-wine-files
  if [ -d wine ]; then cp -r wine/* ../assets/; fi
}

step_install() {
  cd assets
  touch /tmp/before-install

  # Options that only the installer's x86_64 build has (option_table.h, #if
  # defined(NV_X86_64)): its aarch64 build rejects them. siderolabs passes this one on
  # x86_64 only (nvidia-gpu/nvidia-container-toolkit/nvidia-pkgs/<branch>/pkg.yaml).
  local x86_64_opts=()
  if [ "$ARCH" = x86_64 ]; then x86_64_opts=(--no-install-compat32-libs); fi

  # Every file type of the installer's MANIFEST table (manifest.c) that it would put
  # outside the prefixes below, by a path it hard-codes (files.c set_destinations), is
  # overridden into the subroot; EXPLICIT_PATH files (the MANIFEST's own absolute
  # directory) land flattened in usr/share/nvidia/explicit-path, where nothing reads them.
  # internal/recipes (installer.go, TestInstallerFilesStayInTheSubroot) checks it type by type.
  # Every destination inside the subroot (usr/lib64: the library directory that the GPU
  # Operator validator, the device plugin and nvcdi all search), the firmware where the
  # kernel loads it, no 32-bit libraries (x86_64_opts), nothing for X, systemd or a kernel build.
  ./nvidia-installer --silent \
    --installer-prefix=${SUBROOT}/usr \
    --x-prefix=${SUBROOT}/usr \
    --x-module-path=${SUBROOT}/usr/lib64/xorg/modules \
    --x-library-path=${SUBROOT}/usr/lib64 \
    --x-sysconfig-path=${SUBROOT}/usr/share/X11/xorg.conf.d \
    --opengl-prefix=${SUBROOT}/usr --opengl-libdir=lib64 \
    --utility-prefix=${SUBROOT}/usr --utility-libdir=lib64 \
    --documentation-prefix=${SUBROOT}/usr \
    --xdg-data-dir=${SUBROOT}/usr/share \
    --application-profile-path=${SUBROOT}/usr/share/nvidia \
    --glvnd-egl-config-path=${SUBROOT}/usr/share/glvnd/egl_vendor.d \
    --egl-external-platform-config-path=${SUBROOT}/usr/share/egl/egl_external_platform.d \
    --override-file-type-destination=OPENGL_DATA:${SUBROOT}/usr/share/nvidia \
    --override-file-type-destination=VULKAN_ICD_JSON:${SUBROOT}/etc/vulkan/icd.d \
    --override-file-type-destination=VULKANSC_ICD_JSON:${SUBROOT}/etc/vulkansc/icd.d \
    --override-file-type-destination=CUDA_ICD:${SUBROOT}/etc/OpenCL/vendors \
    --override-file-type-destination=NVIDIA_MODPROBE:${SUBROOT}/usr/bin \
    --override-file-type-destination=FIRMWARE:${firmware} \
    --override-file-type-destination=INTERNAL_UTILITY_BINARY:${SUBROOT}/usr/lib/nvidia \
    --override-file-type-destination=INTERNAL_UTILITY_LIB:${SUBROOT}/usr/lib/nvidia \
    --override-file-type-destination=INTERNAL_UTILITY_DATA:${SUBROOT}/usr/lib/nvidia \
    --override-file-type-destination=SANDBOXUTILS_FILELIST_JSON:${SUBROOT}/usr/share/nvidia/files.d \
    --override-file-type-destination=EXPLICIT_PATH:${SUBROOT}/usr/share/nvidia/explicit-path \
    "${x86_64_opts[@]}" \
    --no-kernel-modules --no-kernel-module-source \
    --no-rpms --no-backup --no-distro-scripts --no-wine-files --no-systemd \
    --no-x-check --no-nouveau-check --no-check-for-alternate-installs \
    --allow-installation-with-running-driver \
    --log-file-name=/tmp/nvidia-installer.log

  # Prove it: nothing the installer wrote outside the subroot and the firmware directory,
  # but its own bookkeeping (its log, the cache of the build image's ldconfig run).
  local escaped
  escaped=$(find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /tmp \
      -o -path "${SUBROOT}" -o -path /rootfs/usr/lib/firmware/nvidia \
      -o -path /var/lib/nvidia -o -path /etc/ld.so.cache \) -prune \
    -o -newer /tmp/before-install \( -type f -o -type l \) -print)
  if [ -n "$escaped" ]; then
    echo "nvidia-installer wrote outside the subroot:"; echo "$escaped"; exit 1
  fi
}

step_fabricmanager() {
  # nv-fabricmanager, its library, topology files and default configuration, where the
  # service runs it from (pkg/daemons FabricManager: <subroot>/usr/bin/nv-fabricmanager,
  # <subroot>/usr/share/nvidia/nvswitch/fabricmanager.cfg)
  install -m 0755 fm/bin/nv-fabricmanager fm/bin/nvswitch-audit ${SUBROOT}/usr/bin/
  cp -a fm/lib/libnvfm.so* ${SUBROOT}/usr/lib64/
  mkdir -p ${SUBROOT}/usr/share/nvidia/nvswitch
  cp -a fm/share/nvidia/nvswitch/. ${SUBROOT}/usr/share/nvidia/nvswitch/
  install -m 0644 fm/etc/fabricmanager.cfg ${SUBROOT}/usr/share/nvidia/nvswitch/fabricmanager.cfg
}

step_finish() {
  # symlinks the installer rooted at the build path point inside the subroot instead
  find /rootfs -type l | while read -r link; do
    target=$(readlink "$link")
    case "$target" in
      "${SUBROOT}"/*) ln -sfn "${target#"${SUBROOT}"}" "$link" ;;
    esac
  done

  # the sockets of nvidia-persistenced and nv-fabricmanager are bind-mounted here
  mkdir -p ${SUBROOT}/run/nvidia-persistenced ${SUBROOT}/run/nvidia-fabricmanager
  # the service binds the host's /dev here, as a driver container's root has it
  # (docs/driver-root.md): an empty directory, the mount point
  rm -rf ${SUBROOT}/dev && mkdir -m 0755 ${SUBROOT}/dev
  echo /usr/lib64 > ${SUBROOT}/etc/ld.so.conf
  ${SUBROOT}/sbin/ldconfig -X -r ${SUBROOT} -f /etc/ld.so.conf -C /etc/ld.so.cache
  chmod -R go-w /rootfs
}

step_test() {
  test -f ${SUBROOT}/usr/lib64/libnvidia-ml.so.${NVIDIA_DRIVER_VERSION}
  test -f ${SUBROOT}/usr/lib64/libcuda.so.${NVIDIA_DRIVER_VERSION}
  test -d ${firmware}
  # every program finds its libraries in the subroot, with the subroot's own loader
  for p in nvidia-smi nvidia-persistenced nv-fabricmanager; do
    out=$(${SUBROOT}/${GLIBC_LOADER} --library-path ${SUBROOT}/usr/lib64 --list ${SUBROOT}/usr/bin/$p)
    if grep -q 'not found' <<<"$out"; then echo "$p: $out"; exit 1; fi
  done
}

case ${1:-} in
  prepare) step_prepare ;;
  install) step_install ;;
  fabricmanager) step_fabricmanager ;;
  finish) step_finish ;;
  test) step_test ;;
  *) echo "usage: userspace.sh prepare|install|fabricmanager|finish|test" >&2; exit 2 ;;
esac
