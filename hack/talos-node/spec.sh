#!/usr/bin/env bash
# Prints the runc bundle config.json of a Talos node container, the settings Talos's docker
# provisioner gives it (pkg/provision/providers/docker/node.go, createNode; the same in v1.13.9
# and v1.14.1 but for its volumes): privileged (every capability, every device, no seccomp, no
# masked or read-only paths), a read-only root filesystem, tmpfs at /run, /system and /tmp,
# volumes at /var, /system/state and each path of constants.Overlays (VOLUMES, from
# release.sh), and the environment PLATFORM=container, TALOSSKU and USERDATA (the machine
# config, base64). The
# volumes and Docker's /etc/hostname, /etc/hosts, /etc/resolv.conf binds are directories of the
# guest (hack/talos-node/guest/init makes them). The entrypoint is the image's: /sbin/init
# (Talos's Dockerfile, target talos).
#   spec.sh HOSTNAME MACHINE_CONFIG_FILE CPUS MEMORY_MIB VOLUMES
# VOLUMES: the volumes' paths without the leading /, space-separated ("var system/state opt").
set -euo pipefail
name=$1 config=$2 cpus=$3 mem=$4 volumes=$5
userdata=$(base64 -w0 "$config")

caps=$(for c in CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP \
	LINUX_IMMUTABLE NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER SYS_MODULE \
	SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE SYS_RESOURCE SYS_TIME \
	SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP MAC_OVERRIDE MAC_ADMIN SYSLOG \
	WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF CHECKPOINT_RESTORE; do printf '"CAP_%s",' "$c"; done)
caps="[${caps%,}]"

bind() { printf '{"destination":"%s","type":"bind","source":"%s","options":["rbind","rw"]},' "$1" "$2"; }
mounts=$(
	printf '{"destination":"/proc","type":"proc","source":"proc"},'
	# Docker's privileged /dev: every device of the host (here the guest's devtmpfs).
	bind /dev /dev
	printf '{"destination":"/sys","type":"sysfs","source":"sysfs","options":["nosuid","noexec","nodev","rw"]},'
	printf '{"destination":"/sys/fs/cgroup","type":"cgroup","source":"cgroup","options":["nosuid","noexec","nodev","rw"]},'
	for p in /run /system /tmp; do
		printf '{"destination":"%s","type":"tmpfs","source":"tmpfs","options":["rw","nosuid","nodev","mode=755"]},' "$p"
	done
	for v in $volumes; do
		bind "/$v" "/vol/${v//\//-}"
	done
	for f in hostname hosts resolv.conf; do bind "/etc/$f" "/vol/etc-files/$f"; done
)
mounts="[${mounts%,}]"

cat <<EOF
{
  "ociVersion": "1.2.0",
  "process": {
    "terminal": false,
    "user": {"uid": 0, "gid": 0},
    "args": ["/sbin/init"],
    "env": [
      "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
      "HOSTNAME=$name",
      "PLATFORM=container",
      "TALOSSKU=${cpus}CPU-${mem}RAM",
      "USERDATA=$userdata"
    ],
    "cwd": "/",
    "capabilities": {"bounding": $caps, "effective": $caps, "permitted": $caps},
    "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1048576, "soft": 1048576}],
    "noNewPrivileges": false
  },
  "root": {"path": "rootfs", "readonly": true},
  "hostname": "$name",
  "mounts": $mounts,
  "linux": {
    "namespaces": [{"type": "pid"}, {"type": "mount"}, {"type": "ipc"}, {"type": "uts"}, {"type": "cgroup"}],
    "cgroupsPath": "/talos-node",
    "resources": {"devices": [{"allow": true, "access": "rwm"}]}
  }
}
EOF
