package harness

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// talosRoot replaces the namespace's root with one shaped as a Talos node's, so that what the
// service's YAML asks of it meets what machined would meet:
//
//   - / is read-only and machined's working directory (internal/pkg/mount/switchroot/
//     switchroot.go: Chdir to the new root, Chroot(".")), so a relative mount source fails
//     there as it fails on Talos: "mkdir tmpfs: read-only file system";
//   - /etc is read-only; /etc/kubernetes becomes writable only when cri runs (services/cri.go
//     Volumes: constants.Overlays), see talosNode.startServices;
//   - /system is a writable tmpfs, as on a node; /var is writable (the machine's, as a node's
//     EPHEMERAL volume is; the service's YAML mounts nothing from it).
//
// The new root is a tmpfs holding a bind of each of the build machine's top-level directories
// (so that runc, the extension and the scratch directory are where they were) and its
// symlinks; the machine's own root is detached from the namespace, so nothing the harness or
// the service creates can land on it.
func talosRoot(scratch string) error {
	root := filepath.Join(scratch, "root")
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}

	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "mode=0755"); err != nil {
		return fmt.Errorf("mounting the node's root: %w", err)
	}

	// The machine's root itself, read-only and without its submounts, for commands that make
	// root filesystems of it (HostRootDir); made before /tmp is bound, so that the bind comes
	// with it.
	hostRoot := HostRootDir(scratch)
	if err := os.Mkdir(hostRoot, 0o755); err != nil {
		return err
	}

	if err := unix.Mount("/", hostRoot, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("binding the machine's root: %w", err)
	}

	if err := unix.Mount("", hostRoot, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("making the machine's root read-only: %w", err)
	}

	entries, err := os.ReadDir("/")
	if err != nil {
		return err
	}

	for _, e := range entries {
		name := e.Name()
		target := filepath.Join(root, name)

		switch {
		case e.Type()&os.ModeSymlink != 0:
			dest, err := os.Readlink("/" + name)
			if err != nil {
				return err
			}

			if err := os.Symlink(dest, target); err != nil {
				return err
			}
		case !e.IsDir():
			// /.dockerenv and the like: not part of a node.
		case name == "etc":
			if err := readOnlyEtc(scratch, target); err != nil {
				return err
			}
		case name == "system":
			// Made below, empty.
		default:
			if err := bindDir("/"+name, target); err != nil {
				return err
			}
		}
	}

	system := filepath.Join(root, "system")
	if err := os.MkdirAll(system, 0o755); err != nil {
		return err
	}

	if err := unix.Mount("tmpfs", system, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		return fmt.Errorf("mounting /system: %w", err)
	}

	old := filepath.Join(root, ".old-root")
	if err := os.Mkdir(old, 0o700); err != nil {
		return err
	}

	if err := unix.PivotRoot(root, old); err != nil {
		return fmt.Errorf("pivot_root to the node's root: %w", err)
	}

	if err := os.Chdir("/"); err != nil {
		return err
	}

	if err := unix.Unmount("/.old-root", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detaching the build machine's root: %w", err)
	}

	if err := os.Remove("/.old-root"); err != nil {
		return err
	}

	if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("making / read-only: %w", err)
	}

	return nil
}

// HostRootDir is where, under the harness's scratch directory, the build machine's root is
// bound read-only (without its submounts): the -after-ready command gets it as
// HARNESS_HOST_ROOT, to make container root filesystems of (hack/gpu-host/e2e-lib.sh).
func HostRootDir(scratch string) string { return filepath.Join(scratch, "host-root") }

// bindDir binds the directory src, with its submounts, at target.
func bindDir(src, target string) error {
	if err := os.Mkdir(target, 0o755); err != nil {
		return err
	}

	if err := unix.Mount(src, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("binding %s: %w", src, err)
	}

	return nil
}

// readOnlyEtc mounts the machine's /etc read-only at target, with an empty, read-only
// kubernetes directory on it: the mount point of cri's overlay.
func readOnlyEtc(scratch, target string) error {
	if err := os.Mkdir(target, 0o755); err != nil {
		return err
	}

	if err := overlay(filepath.Join(scratch, "etc"), target, []string{"/etc"}, true); err != nil {
		return err
	}

	kube := filepath.Join(target, "kubernetes")
	if err := os.Mkdir(kube, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}

	if err := unix.Mount("", target, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("making /etc read-only: %w", err)
	}

	// Empty, as in Talos's root filesystem, whatever the machine's /etc/kubernetes holds.
	if err := unix.Mount("tmpfs", kube, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		return fmt.Errorf("emptying /etc/kubernetes: %w", err)
	}

	return nil
}

// criOverlays is what the cri service's volumes do to /etc/kubernetes: a writable directory.
func criOverlays() error {
	if err := unix.Mount("tmpfs", "/etc/kubernetes", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		return fmt.Errorf("mounting cri's /etc/kubernetes: %w", err)
	}

	return nil
}
