package driverroot

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// BindDev makes the driver root look like a driver container's root: the host's /dev
// (hostDev) bind-mounted at <driverMount>/dev, on the empty DevDir the subroot ships.
//
// NVIDIA's consumers take a driver root with a dev/ directory as their dev root too, and
// name its device nodes in their CDI specs under the driver root's host path:
//   - device plugin v0.19.0: cmd/nvidia-device-plugin/root.go (getDevRoot: <root>/dev if it
//     is a directory, else /) and api/config/v1/config.go (nvidiaDevRoot defaults to
//     nvidiaDriverRoot), so its spec says /run/nvidia/driver/dev/nvidia0;
//   - the DRA driver: cmd/gpu-kubelet-plugin/root.go, the same getDevRoot;
//   - the GPU Operator validator: validator/driver.go (getDriverInfo: devRoot is the
//     driver install dir when it has dev/), written to driver-ready for its operands.
//
// The bind is read-only (nothing may create files in the host's /dev through the driver
// root) but not nodev: device nodes must open through it. It is one mount of /dev's own
// filesystem, not recursive: the NVIDIA nodes, nvidia-caps/ and char/ are all on it; the
// host's /dev/pts, /dev/shm and the like stay out. Made under the driver root's shared
// mount, it propagates to the host's /run/nvidia/driver and into containers that mount
// that with HostToContainer. Like the driver root, it is never unmounted: a right bind
// from an earlier run is reused, wrong or stacked ones are replaced.
func BindDev(log *slog.Logger, hostDev, driverMount string) (MountResult, error) {
	target := filepath.Join(driverMount, DevDir)
	log = log.With("source", hostDev, "target", target)

	st, err := os.Lstat(target)
	if err != nil || !st.IsDir() {
		return "", fmt.Errorf("binding %s at %s: the driver root has no %s/ directory to mount on (the subroot must ship an empty one; run check-root on it): %w",
			hostDev, target, DevDir, orNotDir(err))
	}

	return placeMount(log, hostDev, target, placement{
		right:    isDevBindOptions,
		what:     "binding " + hostDev,
		attach:   func(dst *os.File) error { return attachDev(hostDev, dst) },
		reused:   "host /dev already bound under the driver root by an earlier run, reusing it",
		replaced: "replacing an earlier mount at the driver root's dev/",
		wrong:    "expected one read-only mount without nodev",
		done:     "host /dev bound under the driver root",
	})
}

// attachDev clones hostDev's own mount, detached, sets its attributes there (a remount in
// this namespace would not reach the host's copy), and attaches it at target.
func attachDev(hostDev string, dst *os.File) error {
	fd, err := unix.OpenTree(unix.AT_FDCWD, hostDev, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("cloning %s for a bind mount: %w", hostDev, err)
	}
	defer unix.Close(fd) //nolint:errcheck

	// Private first: a clone of a shared or slave /dev would stay in /dev's peer group, and
	// mounts under the host's /dev would start appearing under the driver root. Attached
	// below a shared mount, it becomes shared in a group of its own with the host's copy.
	attr := unix.MountAttr{
		Attr_set:    unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NOEXEC,
		Attr_clr:    unix.MOUNT_ATTR_NODEV,
		Propagation: unix.MS_PRIVATE,
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		return fmt.Errorf("setting the attributes of the clone of %s: %w", hostDev, err)
	}

	if err := unix.MoveMount(fd, "", int(dst.Fd()), "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("attaching %s at %s: %w", hostDev, dst.Name(), err)
	}

	return nil
}

// isDevBindOptions: read-only, and device nodes open through it.
func isDevBindOptions(info *mountinfo.Info) bool {
	opts := strings.Split(info.Options, ",")

	return slices.Contains(opts, "ro") && !slices.Contains(opts, "nodev")
}

func orNotDir(err error) error {
	if err != nil {
		return err
	}

	return unix.ENOTDIR
}
