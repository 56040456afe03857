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
//   - Generation: the PCI device id of a switch says which chip it is: LR10, NVSwitch gen 2
//     of HGX A100 boards, or LS10, gen 3 of HGX H100/H200 (open-gpu-kernel-modules
//     src/common/nvswitch/kernel/nvswitch.c: nvswitch_lr10_device_ids, nvswitch_ls10_device_ids).
//     The fabric manager's restart rules differ between them.
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
	"log/slog"
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
	// Arch is the GPU generation the switches serve: ArchAmpere, ArchHopper, ArchBlackwell,
	// or ArchUnknown for switch device ids this build does not know; "" without switches.
	Arch string `json:"arch,omitempty"`
}

// GPU generations told by the board's switches.
const (
	ArchAmpere    = "ampere"    // LR10, NVSwitch gen 2 (HGX A100)
	ArchHopper    = "hopper"    // LS10, NVSwitch gen 3 (HGX H100, H200)
	ArchBlackwell = "blackwell" // NVLink 5: switches managed through ConnectX-7 ports (HGX B200, B300)
	ArchUnknown   = "unknown"
)

// PCI device ids of NVSwitch chips (open-gpu-kernel-modules src/common/nvswitch/kernel/nvswitch.c).
var (
	lr10DeviceIDs = []uint64{0x1ae8, 0x1af0, 0x1af1, 0x1af2, 0x1af3, 0x1af4, 0x1af5, 0x1af6, 0x1af7,
		0x1af8, 0x1af9, 0x1afa, 0x1afb, 0x1afc, 0x1afd, 0x1afe, 0x1aff}
	ls10DeviceIDs = []uint64{0x22a0, 0x22a1, 0x22a2, 0x22a3, 0x22a4, 0x22a5, 0x22a6, 0x22a7,
		0x22a8, 0x22a9, 0x22aa, 0x22ab, 0x22ac, 0x22ad, 0x22ae, 0x22af}
)

// PreHopper says whether the board is an NVSwitch gen 2 (A100) board, where NVIDIA allows a
// fabric manager to be started again while the GPUs run (with ABORT_CUDA_JOBS_ON_FM_EXIT=0).
// Unknown switches count as later ones: the cautious side.
func (b Board) PreHopper() bool { return b.Arch == ArchAmpere }

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

	var ids []uint64
	if b.PCI, ids, err = pciSwitches(filepath.Join(hostRoot, pciDevices)); err != nil {
		errs = append(errs, err)
	}

	if b.Driver, err = DriverDevices(hostRoot); err != nil {
		errs = append(errs, err)
	}

	if b.NVLink5, err = nvlink5Ports(filepath.Join(hostRoot, infinibandDevs)); err != nil {
		errs = append(errs, err)
	}

	b.Arch = arch(ids, len(b.NVLink5) > 0)

	return b, errors.Join(errs...)
}

// Read is Detect for the services: what could not be read is warned about, and the board
// is what was read.
func Read(log *slog.Logger, hostRoot string) Board {
	b, err := Detect(hostRoot)
	if err != nil {
		log.Warn("cannot read the whole NVSwitch board; going on with what was read", "error", err)
	}

	return b
}

// Log says, at info level, what the board has.
func (b Board) Log(log *slog.Logger) {
	log.Info("NVSwitch board", "board", b.String(), "arch", b.Arch, "pci", b.PCI, "driver", b.Driver, "nvlink5", b.NVLink5)
}

// arch names the generation of the switches' device ids; the oldest wins if they disagree
// (never seen on one board), since its rules are the stricter about CUDA jobs.
func arch(ids []uint64, nvlink5 bool) string {
	switch {
	case len(ids) == 0 && nvlink5:
		return ArchBlackwell
	case len(ids) == 0:
		return ""
	}

	gen := ArchHopper

	for _, id := range ids {
		switch {
		case slices.Contains(lr10DeviceIDs, id):
			return ArchAmpere
		case !slices.Contains(ls10DeviceIDs, id):
			gen = ArchUnknown
		}
	}

	return gen
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

// pciSwitches lists the NVSwitch functions by bus id, sorted, and their device ids.
func pciSwitches(dir string) ([]string, []uint64, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}

	if err != nil {
		return nil, nil, fmt.Errorf("listing PCI devices in %s: %w", dir, err)
	}

	var (
		ids     []string
		devices []uint64
	)

	for _, e := range entries {
		dev := filepath.Join(dir, e.Name())

		vendor, err := readHex(filepath.Join(dev, "vendor"))
		if err != nil || vendor != VendorNVIDIA {
			// A function without a readable vendor is not one we can manage either.
			continue
		}

		class, err := readHex(filepath.Join(dev, "class"))
		if err != nil {
			return nil, nil, fmt.Errorf("PCI device %s: %w", e.Name(), err)
		}

		if class != ClassNVSwitch {
			continue
		}

		ids = append(ids, e.Name())

		// An unreadable device id leaves the generation unknown, which is the cautious side.
		if id, err := readHex(filepath.Join(dev, "device")); err == nil {
			devices = append(devices, id)
		} else {
			devices = append(devices, 0)
		}
	}

	slices.Sort(ids)

	return ids, devices, nil
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
