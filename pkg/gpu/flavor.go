package gpu

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Flavor is which of NVIDIA's two kernel module builds is loaded.
type Flavor string

// The kernel module flavors.
const (
	FlavorOpen        Flavor = "open"
	FlavorProprietary Flavor = "proprietary"
)

// LoadedFlavor reads which flavor of nvidia.ko is loaded from /proc/driver/nvidia/version
// under hostRoot: the open build says "NVRM version: NVIDIA UNIX Open Kernel Module for
// x86_64 ...", the proprietary one "NVRM version: NVIDIA UNIX x86_64 Kernel Module ..."
// (NVIDIA's driver README, "Open Linux Kernel Modules").
func LoadedFlavor(hostRoot string) (Flavor, string, error) {
	path := filepath.Join(hostRoot, "proc/driver/nvidia/version")

	data, err := os.ReadFile(path)
	if err != nil {
		return "", "", fmt.Errorf("reading the kernel module's version: %w", err)
	}

	first, _, _ := strings.Cut(string(data), "\n")

	switch {
	case !strings.HasPrefix(first, "NVRM version:"):
		return "", "", fmt.Errorf("%s: no \"NVRM version:\" line", path)
	case strings.Contains(first, "Open Kernel Module"):
		return FlavorOpen, strings.TrimSpace(first), nil
	default:
		return FlavorProprietary, strings.TrimSpace(first), nil
	}
}

// PCIGPU is an NVIDIA display or 3D controller on the PCI bus.
type PCIGPU struct {
	Address string // 0000:17:00.0
	ID      string // vendor:device, 10de:2901
	Driver  string // the driver bound to it, "" if none
	// Resettable: the kernel offers a reset of the function (sysfs reset), which mig-parted
	// requires before it resets GPUs (deployments/systemd/utils.sh assert_gpu_reset_available).
	Resettable bool
}

// PCIGPUs lists the NVIDIA GPUs in /sys/bus/pci/devices under hostRoot: vendor 0x10de,
// class 0x0300 (VGA) or 0x0302 (3D controller), the classes nvidia.ko binds
// (kernel-open/nvidia/nv-pci-table.c); NVSwitches (0x0680) and audio functions are not
// GPUs.
func PCIGPUs(hostRoot string) ([]PCIGPU, error) {
	dir := filepath.Join(hostRoot, "sys/bus/pci/devices")

	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}

	if err != nil {
		return nil, fmt.Errorf("listing PCI devices: %w", err)
	}

	var gpus []PCIGPU

	for _, e := range entries {
		read := func(name string) string {
			b, err := os.ReadFile(filepath.Join(dir, e.Name(), name))
			if err != nil {
				return ""
			}

			return strings.TrimSpace(string(b))
		}

		class := read("class")
		if read("vendor") != "0x10de" || (!strings.HasPrefix(class, "0x0300") && !strings.HasPrefix(class, "0x0302")) {
			continue
		}

		g := PCIGPU{Address: e.Name(), ID: "10de:" + strings.TrimPrefix(read("device"), "0x")}
		if target, err := os.Readlink(filepath.Join(dir, e.Name(), "driver")); err == nil {
			g.Driver = filepath.Base(target)
		}

		if _, err := os.Stat(filepath.Join(dir, e.Name(), "reset")); err == nil {
			g.Resettable = true
		}

		gpus = append(gpus, g)
	}

	return gpus, nil
}

// Unresettable lists the NVIDIA GPUs under hostRoot that the kernel offers no reset for (no
// sysfs reset file), by PCI address: mig-parted resets no GPU then
// (deployments/systemd/utils.sh assert_gpu_reset_available).
func Unresettable(hostRoot string) ([]string, error) {
	pci, err := PCIGPUs(hostRoot)
	if err != nil {
		return nil, err
	}

	var out []string

	for _, p := range pci {
		if !p.Resettable {
			out = append(out, p.Address)
		}
	}

	return out, nil
}

// UndrivenError says that the loaded kernel module drives none of the node's NVIDIA GPUs
// because they need the other flavor: the proprietary module refuses GPUs that need the
// open one (Blackwell and later: B200, GB200, RTX PRO 6000 Blackwell), the open module
// GPUs before Turing (Maxwell, Pascal, Volta). NVML then sees no GPU ("No devices were
// found") and says nothing more (cozystack/cozystack#3571).
type UndrivenError struct {
	Loaded  Flavor
	Version string // the module's version line
	GPUs    []PCIGPU
}

// Need is the flavor the GPUs need.
func (e *UndrivenError) Need() Flavor {
	if e.Loaded == FlavorOpen {
		return FlavorProprietary
	}

	return FlavorOpen
}

func (e *UndrivenError) Error() string {
	var list []string
	for _, g := range e.GPUs {
		list = append(list, g.Address+" ("+g.ID+")")
	}

	// The extension's flavors (flavors/ and vars.yaml): nvidia-driver-<lts|production>,
	// -open for the open kernel modules.
	why, install := "GPUs of the Blackwell generation and later need the open kernel modules",
		"nvidia-driver-lts-open or nvidia-driver-production-open"
	if e.Loaded == FlavorOpen {
		why, install = "GPUs before Turing (Maxwell, Pascal, Volta) need the proprietary kernel modules",
			"nvidia-driver-lts or nvidia-driver-production"
	}

	return fmt.Sprintf("the loaded %s NVIDIA kernel module drives none of the %d NVIDIA GPU(s) on the PCI bus (%s; no driver bound): %s. "+
		"Install the extension's %s flavor, %s (the branch this node uses), in place of this one, and upgrade the node; "+
		"the kernel log (talosctl dmesg) has the module's own message. Loaded: %s",
		e.Loaded, len(e.GPUs), strings.Join(list, ", "), why, e.Need(), install, e.Version)
}

// CheckDriven returns an *UndrivenError when NVIDIA GPUs on the PCI bus have no driver
// bound and the nvidia module lists no GPU in /proc/driver/nvidia/gpus: it probed them and
// refused them. A GPU bound to another driver (vfio-pci for a VM, nouveau) is not the
// module's to drive, and is left out. It returns nil where the module drives a GPU, or no
// GPU waits for one.
func CheckDriven(hostRoot string) error {
	if entries, err := os.ReadDir(filepath.Join(hostRoot, "proc/driver/nvidia/gpus")); err == nil && len(entries) > 0 {
		return nil
	}

	pci, err := PCIGPUs(hostRoot)
	if err != nil {
		return err
	}

	var undriven []PCIGPU

	for _, g := range pci {
		if g.Driver == "" {
			undriven = append(undriven, g)
		}
	}

	if len(undriven) == 0 {
		return nil
	}

	flavor, version, err := LoadedFlavor(hostRoot)
	if err != nil {
		return err
	}

	return &UndrivenError{Loaded: flavor, Version: version, GPUs: undriven}
}
