package driverroot

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// MountResult says what Mount did.
type MountResult string

const (
	// Mounted: a new mount was made.
	Mounted MountResult = "mounted"
	// Reused: an earlier run's mount was already right.
	Reused MountResult = "reused"
	// Replaced: an earlier mount was wrong (another tree, or writable) and was replaced.
	Replaced MountResult = "replaced"
)

// Mount bind-mounts the subroot at target, read-only as every mount namespace sees it, and
// shared so that a mount made later below it (the persistenced socket) reaches the host too.
//
// A remount to read-only inside the service's own namespace would stay there: the host's
// copy of the mount would remain writable. So the tree is cloned detached (open_tree), made
// read-only and shared while still detached (mount_setattr), and only then attached at the
// target (move_mount), from where it propagates with those attributes.
//
// Mount never stacks: a right mount left by an earlier run is reused, wrong ones are
// detached first. The caller never unmounts it: specs and running containers point into it.
func Mount(log *slog.Logger, subroot, target string) (MountResult, error) {
	log = log.With("subroot", subroot, "target", target)

	existing, err := mountsAt(target)
	if err != nil {
		return "", err
	}

	result := Mounted

	if len(existing) > 0 {
		top := existing[len(existing)-1]

		same, err := sameTree(subroot, target)
		if err != nil {
			return "", err
		}

		if same && isReadOnly(top) && len(existing) == 1 {
			log.Info("driver root already mounted by an earlier run, reusing it")

			return Reused, nil
		}

		log.Warn("replacing an earlier mount at the driver root", "mounts", len(existing), "sameTree", same, "options", top.Options)

		for range existing {
			if err := unix.Unmount(target, unix.MNT_DETACH); err != nil {
				return "", fmt.Errorf("detaching the earlier mount at %s: %w", target, err)
			}
		}

		result = Replaced
	}

	if err := os.MkdirAll(target, 0o755); err != nil {
		return "", fmt.Errorf("creating mount point %s: %w", target, err)
	}

	if err := attachReadOnly(subroot, target); err != nil {
		return "", err
	}

	// Verify what every later reader will see.
	after, err := mountsAt(target)
	if err != nil {
		return "", err
	}

	if len(after) != 1 || !isReadOnly(after[0]) {
		return "", fmt.Errorf("after mounting %s at %s: expected one read-only mount, found %d", subroot, target, len(after))
	}

	log.Info("driver root mounted read-only", "result", result)

	return result, nil
}

func attachReadOnly(subroot, target string) error {
	fd, err := unix.OpenTree(unix.AT_FDCWD, subroot, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		if errors.Is(err, unix.ENOSYS) {
			return fmt.Errorf("cloning %s: the kernel lacks open_tree (Linux 5.2+ and mount_setattr 5.12+ are needed): %w", subroot, err)
		}

		return fmt.Errorf("cloning %s for a bind mount: %w", subroot, err)
	}
	defer unix.Close(fd) //nolint:errcheck

	attr := unix.MountAttr{
		Attr_set:    unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV,
		Propagation: unix.MS_SHARED,
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		return fmt.Errorf("making the clone of %s read-only: %w", subroot, err)
	}

	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attaching %s at %s: %w", subroot, target, err)
	}

	return nil
}

// mountsAt lists the mounts whose mount point is target, bottom first.
func mountsAt(target string) ([]*mountinfo.Info, error) {
	clean := filepath.Clean(target)
	if resolved, err := filepath.EvalSymlinks(clean); err == nil {
		clean = resolved
	}

	// Not mountinfo.SingleEntryFilter: it stops at the first entry, and stacked mounts at
	// one mount point are exactly what this must see.
	infos, err := mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) { return m.Mountpoint != clean, false })
	if err != nil {
		return nil, fmt.Errorf("reading the mount table: %w", err)
	}

	// The mount table lists mounts in the order they were stacked.
	slices.SortStableFunc(infos, func(a, b *mountinfo.Info) int { return a.ID - b.ID })

	return infos, nil
}

// IsMounted reports whether a read-only mount of subroot sits at target.
func IsMounted(subroot, target string) (bool, error) {
	infos, err := mountsAt(target)
	if err != nil || len(infos) == 0 {
		return false, err
	}

	same, err := sameTree(subroot, target)

	return same && isReadOnly(infos[len(infos)-1]), err
}

func isReadOnly(info *mountinfo.Info) bool {
	return slices.Contains(splitOptions(info.Options), "ro")
}

func splitOptions(s string) []string {
	var out []string

	start := 0

	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == ',' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}

	return out
}

// sameTree reports whether target shows the subroot's root directory: a bind mount shows
// the same device and inode as its source.
func sameTree(subroot, target string) (bool, error) {
	var a, b unix.Stat_t
	if err := unix.Stat(subroot, &a); err != nil {
		return false, fmt.Errorf("stat %s: %w", subroot, err)
	}

	if err := unix.Stat(target, &b); err != nil {
		return false, fmt.Errorf("stat %s: %w", target, err)
	}

	return a.Dev == b.Dev && a.Ino == b.Ino, nil
}
