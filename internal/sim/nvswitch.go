package sim

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Device majors of the simulated board's NVSwitch and NVLink drivers in /proc/devices.
const (
	MajorNVSwitch = 509
	MajorNVLink   = 510
)

// nvlinkFabricMgmtMinor is the nvidia-caps minor of the fabric-mgmt capability: the nvlink
// table is the first the driver numbers (kernel-open/nvidia/nv-caps.c nv_cap_tables_init),
// so it gets 0, before MIG's config 1 and monitor 2.
const nvlinkFabricMgmtMinor = 0

// NVSwitches is the switch side of a simulated HGX board.
type NVSwitches struct {
	// Count is how many NVSwitch PCI functions sysfs shows (4 on an HGX H100 or H200).
	Count int
	// Unmanaged: the nvidia-nvswitch driver initialized none of them and lists no devices,
	// as in a VM that got the GPUs and switches but not the board's topology
	// (siderolabs/talos#14015).
	Unmanaged bool
	// DeviceID is the switches' PCI device id: 0 is 0x22a3, the LS10 (NVSwitch gen 3) of an
	// HGX H100 or H200; 0x1af1 is the LR10 (gen 2) of an HGX A100.
	DeviceID uint16
}

// WriteNVSwitchFS writes under hostRoot the sysfs and procfs files of an NVSwitch board, in
// the formats of the files the real drivers write: PCI functions with NVIDIA's vendor id and
// class 0x068000 (go-nvlib pkg/nvpci), /proc/driver/nvidia-nvswitch/{permissions,devices/
// <bus id>/information} (kernel-open/nvidia/procfs_nvswitch.c), /proc/driver/nvidia-nvlink/
// {permissions,capabilities/fabric-mgmt} (nvlink_linux.c, nvlink_caps.c, nv-caps.c),
// /proc/driver/nvidia-caps/nvlink-minors (nv-caps.c) and the nvidia-nvswitch and nvidia-nvlink
// majors in /proc/devices. Call it after WriteProcFS, which rewrites /proc/devices.
func WriteNVSwitchFS(hostRoot string, b NVSwitches) error {
	files := map[string]string{
		// 438 = 0666, as both drivers print it (procfs_nvswitch.c, nvlink_linux.c).
		"proc/driver/nvidia-nvswitch/permissions":            "DeviceFileMode: 438\n",
		"proc/driver/nvidia-nvlink/permissions":              "DeviceFileMode: 438\n",
		"proc/driver/nvidia-nvlink/capabilities/fabric-mgmt": capability(nvlinkFabricMgmtMinor, 0o400),
		"proc/driver/nvidia-caps/nvlink-minors":              fmt.Sprintf("fabric-mgmt %d\n", nvlinkFabricMgmtMinor),
	}

	if err := os.MkdirAll(filepath.Join(hostRoot, "proc/driver/nvidia-nvswitch/devices"), 0o755); err != nil {
		return fmt.Errorf("writing simulated NVSwitch files: %w", err)
	}

	for i := range b.Count {
		bus := fmt.Sprintf("0000:%02x:00.0", 0xc1+i)
		pci := filepath.Join("sys/bus/pci/devices", bus)
		files[filepath.Join(pci, "vendor")] = "0x10de\n"
		files[filepath.Join(pci, "class")] = "0x068000\n"
		device := b.DeviceID
		if device == 0 {
			device = 0x22a3 // the HGX H100 NVSwitch in NVIDIA's user guide
		}

		files[filepath.Join(pci, "device")] = fmt.Sprintf("0x%04x\n", device)

		if !b.Unmanaged {
			files[filepath.Join("proc/driver/nvidia-nvswitch/devices", bus, "information")] = "BIOS Version: 96.10.55.00.01\n"
		}
	}

	for rel, content := range files {
		p := filepath.Join(hostRoot, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("writing simulated NVSwitch files: %w", err)
		}

		if err := os.WriteFile(p, []byte(content), 0o444); err != nil {
			return fmt.Errorf("writing simulated NVSwitch files: %w", err)
		}
	}

	return addCharMajors(filepath.Join(hostRoot, "proc/devices"),
		fmt.Sprintf("%3d nvidia-nvswitch", MajorNVSwitch), fmt.Sprintf("%3d nvidia-nvlink", MajorNVLink))
}

// addCharMajors adds lines to the character devices of a /proc/devices file.
func addCharMajors(path string, lines ...string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading simulated %s: %w", path, err)
	}

	head, tail, ok := strings.Cut(string(data), "\nBlock devices:")
	if !ok {
		return fmt.Errorf("simulated %s has no block devices section", path)
	}

	head = strings.TrimRight(head, "\n") + "\n" + strings.Join(lines, "\n") + "\n"

	if err := os.WriteFile(path, []byte(head+"\nBlock devices:"+tail), 0o444); err != nil {
		return fmt.Errorf("writing simulated %s: %w", path, err)
	}

	return nil
}
