package driverroot

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/talos-nvidia/nvidia-driver/pkg/atomicfile"
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
// shared in a peer group of its own (see ownPeerGroup) so that a mount made later below it
// (the persistenced socket) reaches the host too, and nothing else does.
//
// A remount to read-only inside the service's own namespace would stay there: the host's
// copy of the mount would remain writable. So the tree is cloned detached (open_tree), made
// read-only and shared while still detached (mount_setattr), and only then attached at the
// target (move_mount), from where it propagates with those attributes.
//
// Mount never stacks: a right mount left by an earlier run is reused, wrong ones are
// detached first. The caller never unmounts it: specs and running containers point into it.
//
// No component of target may be a symbolic link (<host>/run/nvidia, the target itself): the
// mount point is made and the mount attached without following one
// (atomicfile.OpenDirNoSymlinks), and the error names the link.
func Mount(log *slog.Logger, subroot, target string) (MountResult, error) {
	log = log.With("subroot", subroot, "target", target)

	return placeMount(log, subroot, target, placement{
		right:    isReadOnly,
		create:   true,
		what:     "mount point of the driver root",
		attach:   func(dst *os.File) error { return attachReadOnly(subroot, dst) },
		reused:   "driver root already mounted by an earlier run, reusing it",
		replaced: "replacing an earlier mount at the driver root",
		wrong:    "expected one read-only mount",
		done:     "driver root mounted read-only",
	})
}

// placement says how placeMount makes one kind of mount.
type placement struct {
	right func(*mountinfo.Info) bool // the options a right mount has
	// create makes the mount point where it is missing; what names it in an error.
	create bool
	what   string
	attach func(dst *os.File) error // makes the mount on the open mount point
	// Log lines and the error's wording.
	reused, replaced, wrong, done string
}

// placeMount leaves exactly one right mount of source at target: an earlier run's is reused
// when it shows source with the right options and nothing is stacked on it; otherwise every
// mount there is detached (containers keep their copies) and a new one is attached and
// checked. The mount point is opened first, which refuses a link on its path; so mountsAt can
// take target as it is written.
func placeMount(log *slog.Logger, source, target string, p placement) (MountResult, error) {
	// The mount point, opened without following a link on its path.
	open := func() (*os.File, error) {
		dir, err := atomicfile.OpenDirNoSymlinks(target, p.create, 0o755)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.what, err)
		}

		return dir, nil
	}

	dst, err := open()
	if err != nil {
		return "", err
	}

	dst.Close() //nolint:errcheck // opened again below, once the earlier mounts are gone

	existing, err := mountsAt(target)
	if err != nil {
		return "", err
	}

	result := Mounted

	if len(existing) > 0 {
		top := existing[len(existing)-1]

		same, err := sameTree(source, target)
		if err != nil {
			return "", err
		}

		if same && p.right(top) && len(existing) == 1 {
			log.Info(p.reused, "result", Reused)

			return Reused, nil
		}

		log.Warn(p.replaced, "mounts", len(existing), "sameTree", same, "options", top.Options)

		for range existing {
			if err := unix.Unmount(target, unix.MNT_DETACH); err != nil {
				return "", fmt.Errorf("detaching the earlier mount at %s: %w", target, err)
			}
		}

		result = Replaced
	}

	// Opened now: a descriptor of a mount point opened before the detach would be the
	// detached mount's root.
	dst, err = open()
	if err != nil {
		return "", err
	}
	defer dst.Close() //nolint:errcheck

	if err := p.attach(dst); err != nil {
		return "", err
	}

	// Verify what every later reader will see.
	after, err := mountsAt(target)
	if err != nil {
		return "", err
	}

	if len(after) != 1 || !p.right(after[0]) {
		return "", fmt.Errorf("after mounting %s at %s: %s, found %d", source, target, p.wrong, len(after))
	}

	log.Info(p.done, "result", result)

	return result, nil
}

func attachReadOnly(subroot string, dst *os.File) error {
	fd, err := unix.OpenTree(unix.AT_FDCWD, subroot, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		if errors.Is(err, unix.ENOSYS) {
			return fmt.Errorf("cloning %s: the kernel lacks open_tree (Linux 5.2+ and mount_setattr 5.12+ are needed): %w", subroot, err)
		}

		return fmt.Errorf("cloning %s for a bind mount: %w", subroot, err)
	}
	defer unix.Close(fd) //nolint:errcheck

	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		return fmt.Errorf("making the clone of %s read-only: %w", subroot, err)
	}

	if err := ownPeerGroup(fd); err != nil {
		return fmt.Errorf("giving the clone of %s its own peer group: %w", subroot, err)
	}

	if err := unix.MoveMount(fd, "", int(dst.Fd()), "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("attaching %s at %s: %w", subroot, dst.Name(), err)
	}

	return nil
}

// ownPeerGroup puts a detached tree in a peer group of its own. A clone of a shared mount
// is a peer of its source: on Talos the subroot lies on the shared root filesystem, so a
// clone that was merely marked shared would stay a peer of the host's / and of
// /usr/local/glibc, and mounts would propagate between them and the driver root. Private
// first leaves every group; shared then starts a new one, through which the driver root
// still propagates to the host's /run and into containers.
func ownPeerGroup(fd int) error {
	for _, p := range []uint64{unix.MS_PRIVATE, unix.MS_SHARED} {
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &unix.MountAttr{Propagation: p}); err != nil {
			return err
		}
	}

	return nil
}

// mountsAt lists the mounts whose mount point is target, bottom first. target is taken as
// written, not resolved: a link on its path is no mount of the service's (placeMount refuses
// one before it looks).
func mountsAt(target string) ([]*mountinfo.Info, error) {
	clean := filepath.Clean(target)

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
	return slices.Contains(strings.Split(info.Options, ","), "ro")
}

// sameTree reports whether target shows the subroot's root directory: a bind mount shows
// the same device and inode as its source.
func sameTree(subroot, target string) (bool, error) {
	a, err := os.Stat(subroot)
	if err != nil {
		return false, err
	}

	b, err := os.Stat(target)
	if err != nil {
		return false, err
	}

	return os.SameFile(a, b), nil
}
