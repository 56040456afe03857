// Package nvswitch finds a board's NVSwitches from sysfs and procfs, reading what NVIDIA's own
// code reads, so that the node knows whether it needs the fabric manager. It changes nothing.
//
//   - PCI functions: an NVSwitch is a PCI function with NVIDIA's vendor id 0x10de and class
//     0x068000, "bridge, other" (go-nvlib pkg/nvpci/nvpci.go: PCINvSwitchClass and
//     IsNVSwitch; the nvidia-nvswitch driver's PCI id table in open-gpu-kernel-modules
//     kernel-open/nvidia/linux_nvswitch.c matches PCI_CLASS_BRIDGE_OTHER << 8 with vendor
//     NVIDIA). This is what the hardware offers, whether or not a driver took it.
//   - Driver devices: the nvidia-nvswitch driver lists every switch it initialized as
//     /proc/driver/nvidia-nvswitch/devices/<domain:bus:slot.fn>/ (kernel-open/nvidia/
//     procfs_nvswitch.c, nvswitch_procfs_device_add). NVIDIA's driver container starts the
//     fabric manager when that directory is not empty (gpu-driver-container
//     ubuntu22.04/nvidia-driver: _assert_nvswitch_system).
//   - NVLink 5 boards (HGX B200/B300, B100): their NVSwitches are not PCI devices; the fabric
//     is managed through a ConnectX-7 bridge whose VPD carries "SW_MNG" (NVIDIA Fabric Manager
//     User Guide, "NVIDIA HGX B200/B300 GPU Baseboard"; gpu-driver-container:
//     _assert_nvlink5_system reads /sys/class/infiniband/*/device/vpd).
package nvswitch

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// PCI identity of an NVSwitch function (go-nvlib pkg/nvpci).
const (
	VendorNVIDIA  = 0x10de
	ClassNVSwitch = 0x068000
)

// Paths under the host root.
const (
	pciDevices     = "sys/bus/pci/devices"
	driverDevices  = "proc/driver/nvidia-nvswitch/devices"
	infinibandDevs = "sys/class/infiniband"
)

// Board is what the node's sysfs and procfs say about its NVSwitches.
type Board struct {
	// PCI lists the NVSwitch PCI functions in sysfs, by bus id (0000:07:00.0), sorted.
	PCI []string `json:"pci,omitempty"`
	// Driver lists the switches the nvidia-nvswitch driver initialized, by bus id, sorted.
	Driver []string `json:"driver,omitempty"`
	// NVLink5 lists the InfiniBand devices whose VPD marks them as NVLink management ports.
	NVLink5 []string `json:"nvlink5,omitempty"`
}

// HasNVSwitch says whether anything on the board is an NVSwitch or manages one.
func (b Board) HasNVSwitch() bool {
	return len(b.PCI) > 0 || len(b.Driver) > 0 || len(b.NVLink5) > 0
}

// String sums the board up for the log.
func (b Board) String() string {
	return fmt.Sprintf("%d NVSwitch PCI function(s), %d managed by the nvidia-nvswitch driver, %d NVLink 5 management port(s)",
		len(b.PCI), len(b.Driver), len(b.NVLink5))
}

// Detect reads the board under hostRoot ("/" on a node).
func Detect(hostRoot string) (Board, error) {
	var (
		b    Board
		errs []error
		err  error
	)

	if b.PCI, err = pciSwitches(filepath.Join(hostRoot, pciDevices)); err != nil {
		errs = append(errs, err)
	}

	if b.Driver, err = DriverDevices(hostRoot); err != nil {
		errs = append(errs, err)
	}

	if b.NVLink5, err = nvlink5Ports(filepath.Join(hostRoot, infinibandDevs)); err != nil {
		errs = append(errs, err)
	}

	return b, errors.Join(errs...)
}

// DriverDevices lists the switches the nvidia-nvswitch driver initialized, by bus id, sorted;
// none when the driver is not loaded.
func DriverDevices(hostRoot string) ([]string, error) {
	dir := filepath.Join(hostRoot, driverDevices)

	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}

	if err != nil {
		return nil, fmt.Errorf("listing NVSwitches in %s: %w", dir, err)
	}

	var ids []string

	for _, e := range entries {
		ids = append(ids, e.Name())
	}

	slices.Sort(ids)

	return ids, nil
}

func pciSwitches(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}

	if err != nil {
		return nil, fmt.Errorf("listing PCI devices in %s: %w", dir, err)
	}

	var ids []string

	for _, e := range entries {
		dev := filepath.Join(dir, e.Name())

		vendor, err := readHex(filepath.Join(dev, "vendor"))
		if err != nil || vendor != VendorNVIDIA {
			// A function without a readable vendor is not one we can manage either.
			continue
		}

		class, err := readHex(filepath.Join(dev, "class"))
		if err != nil {
			return nil, fmt.Errorf("PCI device %s: %w", e.Name(), err)
		}

		if class == ClassNVSwitch {
			ids = append(ids, e.Name())
		}
	}

	slices.Sort(ids)

	return ids, nil
}

func readHex(path string) (uint64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("reading %s: %w", path, err)
	}

	v, err := strconv.ParseUint(strings.TrimSpace(string(data)), 0, 32)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}

	return v, nil
}

// nvlink5Ports lists InfiniBand devices whose VPD has the SW_MNG mark of an NVLink management
// port. A VPD that cannot be read (it needs root) is skipped: the board then looks like one
// without NVLink 5, which is what it looked like before this check existed.
func nvlink5Ports(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}

	if err != nil {
		return nil, fmt.Errorf("listing InfiniBand devices in %s: %w", dir, err)
	}

	var ports []string

	for _, e := range entries {
		vpd, err := os.ReadFile(filepath.Join(dir, e.Name(), "device/vpd"))
		if err == nil && bytes.Contains(vpd, []byte("SW_MNG")) {
			ports = append(ports, e.Name())
		}
	}

	slices.Sort(ports)

	return ports, nil
}
