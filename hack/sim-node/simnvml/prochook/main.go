// Command prochook is the simulated node's stand-in for what a loaded NVIDIA kernel module
// adds to every procfs: /proc/driver/nvidia, /proc/driver/nvidia-caps (mig-minors,
// nvlink-minors) and /proc/driver/nvidia-nvlink. A kernel module registers those entries in
// the kernel (kernel-open/nvidia/nv-procfs.c, nv-caps.c), so every container's fresh procfs
// shows them; no process can add an entry to a procfs, and runc refuses an OCI mount under
// /proc (libcontainer/rootfs_linux.go checkProcMount). So the test node gives its
// containers these files through an OCI createContainer hook: runc runs such a hook in the
// container's mount namespace after it has mounted the container's /proc and before
// pivot_root (libcontainer/rootfs_linux.go prepareRootfs), which is where this binds the
// simulated driver's proc/driver directory, read-only, over <rootfs>/proc/driver.
//
// NVIDIA's programs read these paths from the kernel with no root prefix: the device plugin
// (internal/mig/mig-dp.go GetMigCapabilityDevicePaths) and nvcdi (internal/nvcaps/nvcaps.go
// NewMigCaps, from internal/platform-support/dgpu) open /proc/driver/nvidia-caps/mig-minors.
//
//	prochook -source /run/nvidia/sim/proc/driver [-state /dev/.simnvml]    (the OCI state on standard input)
//
// With -state, a container given /dev/nvidiactl (linux.devices of its config) also gets the
// simulated NVML's state directory bound at its /dev/.simnvml: on a real node the kernel
// driver behind /dev/nvidiactl answers NVML in any container that has the device node; here
// the state directory is that driver (hack/sim-node/simnvml/main.go). A container whose devices come
// from a CDI spec that mounts no driver root (the toolkit's management spec, injected by its
// NRI plugin) would otherwise find no simulated GPUs.
//
// It is a test tool, never part of the product: the harness gives it to the service's
// container (hack/harness -oci-hook), the test node's containerd to every container through
// its base runtime spec (hack/k8s-node/cluster.sh, K8S_NODE_OCI_HOOK).
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

func main() {
	if err := run(os.Args[1:], os.Stdin); err != nil {
		fmt.Fprintln(os.Stderr, "simnvml prochook:", err)
		os.Exit(1)
	}
}

func run(args []string, stdin io.Reader) error {
	fs := flag.NewFlagSet("prochook", flag.ContinueOnError)
	source := fs.String("source", "/run/nvidia/sim/proc/driver", "the simulated driver's proc/driver directory")
	state := fs.String("state", "", "the simulated NVML's state directory, bound at /dev/.simnvml in containers given /dev/nvidiactl (none: off)")

	if err := fs.Parse(args); err != nil {
		return err
	}

	// The OCI state (runtime-spec config.md "State"): the bundle holds config.json.
	var st struct {
		Bundle string `json:"bundle"`
	}
	if err := json.NewDecoder(stdin).Decode(&st); err != nil {
		return fmt.Errorf("reading the OCI state on standard input: %w", err)
	}

	if st.Bundle == "" {
		return errors.New("the OCI state names no bundle")
	}

	data, err := os.ReadFile(filepath.Join(st.Bundle, "config.json"))
	if err != nil {
		return fmt.Errorf("reading the bundle's config: %w", err)
	}

	var cfg struct {
		Root struct {
			Path string `json:"path"`
		} `json:"root"`
		Linux struct {
			Devices []struct {
				Path string `json:"path"`
			} `json:"devices"`
		} `json:"linux"`
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		return fmt.Errorf("%s/config.json: %w", st.Bundle, err)
	}

	root := cfg.Root.Path
	if !filepath.IsAbs(root) {
		root = filepath.Join(st.Bundle, root)
	}

	if err := bindDriverDir(*source, filepath.Join(root, "proc", "driver")); err != nil {
		return err
	}

	if *state == "" {
		return nil
	}

	for _, d := range cfg.Linux.Devices {
		if d.Path == "/dev/nvidiactl" {
			return bindState(*state, filepath.Join(root, "dev", ".simnvml"))
		}
	}

	return nil
}

// bindState binds the simulated NVML's state directory at target (the container's
// /dev/.simnvml), read-write: NVML clients take its lock.
func bindState(source, target string) error {
	if fi, err := os.Stat(source); err != nil || !fi.IsDir() {
		return fmt.Errorf("the simulated NVML's state %s: not a directory (%v)", source, err)
	}

	if err := os.MkdirAll(target, 0o755); err != nil {
		return fmt.Errorf("the container's %s: %w", target, err)
	}

	if err := unix.Mount(source, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("binding %s at %s: %w", source, target, err)
	}

	return nil
}

// bindDriverDir binds source over target, read-only, once target is the container's procfs.
func bindDriverDir(source, target string) error {
	if fi, err := os.Stat(source); err != nil || !fi.IsDir() {
		return fmt.Errorf("the simulated driver's directory %s: not a directory (%v)", source, err)
	}

	var sfs unix.Statfs_t
	if err := unix.Statfs(target, &sfs); err != nil {
		return fmt.Errorf("the container's %s: %w (a procfs without /proc/driver?)", target, err)
	}

	if sfs.Type != unix.PROC_SUPER_MAGIC {
		return fmt.Errorf("the container's %s is not on a procfs (type %#x)", target, sfs.Type)
	}

	if err := unix.Mount(source, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("binding %s over %s: %w", source, target, err)
	}

	if err := unix.Mount("", target, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("making %s read-only: %w", target, err)
	}

	return nil
}
