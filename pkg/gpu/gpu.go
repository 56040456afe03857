// Package gpu is the narrow NVML layer the node jobs share: loading NVML from the subroot,
// initializing it with errors a person can act on, listing the GPUs (the one GPU model
// every job uses), and naming the processes that hold a GPU open.
package gpu

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVMLLibrary is the NVML library inside a subroot.
const NVMLLibrary = "usr/lib64/libnvidia-ml.so.1"

// FromSubroot returns NVML that will be loaded, on Init, from the subroot: never from the
// service's own root filesystem, which has no driver.
func FromSubroot(subroot string) nvml.Interface {
	return nvml.New(nvml.WithLibraryPath(filepath.Join(subroot, NVMLLibrary)))
}

// ErrNoDriver says that the NVIDIA kernel driver is not there (yet).
var ErrNoDriver = errors.New("the NVIDIA kernel driver is not loaded")

// Init initializes NVML. Its errors say what a person should look at.
func Init(lib nvml.Interface) error {
	ret := lib.Init()

	switch {
	case ret == nvml.SUCCESS:
		return nil
	case errors.Is(ret, nvml.ERROR_LIBRARY_NOT_FOUND):
		return fmt.Errorf("loading NVML (%s) failed: the subroot lacks it or its libraries: %w", NVMLLibrary, ret)
	case errors.Is(ret, nvml.ERROR_DRIVER_NOT_LOADED):
		return fmt.Errorf("%w: NVML: %w", ErrNoDriver, ret)
	case errors.Is(ret, nvml.ERROR_NO_PERMISSION):
		return fmt.Errorf("NVML has no access to /dev/nvidiactl: %w", ret)
	default:
		return fmt.Errorf("initializing NVML: %w", ret)
	}
}

// GPU describes one physical GPU, as every job sees it.
type GPU struct {
	Index     int    `json:"index"`
	UUID      string `json:"uuid"`
	Name      string `json:"name"`
	BusID     string `json:"busId"`
	Minor     int    `json:"minor"`
	MemoryMiB uint64 `json:"memoryMiB"`
	// MIG is "enabled", "disabled", "enabled (pending disable)" and so on, or "" where the
	// GPU has no MIG.
	MIG string `json:"mig,omitempty"`
	// MIGDevices are the GPU's MIG devices (one per compute instance) while MIG is on: what
	// the device plugin enumerates.
	MIGDevices []MIGDevice `json:"migDevices,omitempty"`
	// PciDeviceID is device<<16 | vendor, as mig-parted's device-filter writes it (0x233510DE).
	PciDeviceID uint32 `json:"-"`
	// MemoryBytes is the GPU's whole memory (MIG profile names are fractions of it).
	MemoryBytes uint64 `json:"-"`
}

// MIGDevice is one MIG device of a GPU.
type MIGDevice struct {
	UUID string `json:"uuid"`
	Name string `json:"name"`
}

// MigCapable says whether NVML reports a MIG mode for the GPU.
func (g GPU) MigCapable() bool { return g.MIG != "" }

// MIGOn says whether the GPU is in MIG mode now ("enabled", or "enabled (pending
// disable)" until the reset that finishes the change).
func (g GPU) MIGOn() bool { return strings.HasPrefix(g.MIG, "enabled") }

// MPSCapable says whether NVIDIA's device plugin can share these GPUs through MPS: there
// is at least one, and none is in MIG mode. The plugin refuses MPS on MIG devices
// ("sharing using MPS is not supported for MIG devices", k8s-device-plugin v0.19.0
// internal/plugin/mps.go getMPSOptions), and GPU feature discovery calls a node with a
// MIG-enabled GPU not MPS-capable (internal/lm/nvml.go isMPSCapable). Every GPU that the
// driver branches shipped here drive has the compute capability MPS needs (3.5 or later).
func MPSCapable(gpus []GPU) bool {
	for _, g := range gpus {
		if g.MIGOn() {
			return false
		}
	}

	return len(gpus) > 0
}

// List returns the GPUs NVML sees. NVML must be initialized.
func List(lib nvml.Interface) ([]GPU, error) {
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("counting GPUs: %w", ret)
	}

	gpus := make([]GPU, 0, n)

	for i := range n {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("GPU %d: getting its handle: %w", i, ret)
		}

		g, err := Describe(i, d)
		if err != nil {
			return nil, fmt.Errorf("GPU %d: %w", i, err)
		}

		gpus = append(gpus, g)
	}

	return gpus, nil
}

// Describe reads one GPU, whose index is i.
func Describe(i int, d nvml.Device) (GPU, error) {
	g := GPU{Index: i}

	var ret nvml.Return

	if g.UUID, ret = d.GetUUID(); ret != nvml.SUCCESS {
		return g, fmt.Errorf("reading UUID: %w", ret)
	}

	if g.Name, ret = d.GetName(); ret != nvml.SUCCESS {
		return g, fmt.Errorf("reading name: %w", ret)
	}

	if g.Minor, ret = d.GetMinorNumber(); ret != nvml.SUCCESS {
		return g, fmt.Errorf("reading minor number: %w", ret)
	}

	pci, ret := d.GetPciInfo()
	if ret != nvml.SUCCESS {
		return g, fmt.Errorf("reading PCI info: %w", ret)
	}

	g.BusID = busID(pci)
	g.PciDeviceID = pci.PciDeviceId

	if mem, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
		g.MemoryMiB = mem.Total >> 20
		g.MemoryBytes = mem.Total
	}

	if g.MIG, ret = migMode(d); ret != nvml.SUCCESS {
		return g, fmt.Errorf("reading MIG mode: %w", ret)
	}

	if g.MIGOn() {
		var err error
		if g.MIGDevices, err = migDevices(d); err != nil {
			return g, err
		}
	}

	return g, nil
}

// migDevices lists the MIG devices of a GPU in MIG mode, in NVML's index order.
func migDevices(d nvml.Device) ([]MIGDevice, error) {
	n, ret := d.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("counting MIG devices: %w", ret)
	}

	var out []MIGDevice

	for i := range n {
		md, ret := d.GetMigDeviceHandleByIndex(i)
		// nvml.h, nvmlDeviceGetMigDeviceHandleByIndex: NOT_FOUND where no MIG device has
		// that index.
		if errors.Is(ret, nvml.ERROR_NOT_FOUND) {
			continue
		}

		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("MIG device %d: getting its handle: %w", i, ret)
		}

		var m MIGDevice

		if m.UUID, ret = md.GetUUID(); ret != nvml.SUCCESS {
			return nil, fmt.Errorf("MIG device %d: reading UUID: %w", i, ret)
		}

		if m.Name, ret = md.GetName(); ret != nvml.SUCCESS {
			return nil, fmt.Errorf("MIG device %d: reading name: %w", i, ret)
		}

		out = append(out, m)
	}

	return out, nil
}

// migMode names the GPU's MIG mode; "" where the GPU has no MIG.
func migMode(d nvml.Device) (string, nvml.Return) {
	current, pending, ret := d.GetMigMode()
	if errors.Is(ret, nvml.ERROR_NOT_SUPPORTED) {
		return "", nvml.SUCCESS
	}

	if ret != nvml.SUCCESS {
		return "", ret
	}

	s := modeName(current)
	if pending != current {
		s += fmt.Sprintf(" (pending %s)", modeName(pending))
	}

	return s, nvml.SUCCESS
}

func modeName(m int) string {
	if m == nvml.DEVICE_MIG_ENABLE {
		return "enabled"
	}

	return "disabled"
}

// busID turns NVML's fixed-size, NUL-padded bus id into a string such as 00000000:0F:00.0.
func busID(p nvml.PciInfo) string {
	b := make([]byte, 0, len(p.BusIdLegacy))

	for _, c := range p.BusId {
		if c == 0 {
			break
		}

		b = append(b, byte(c))
	}

	return string(b)
}

// ModuleWait names the first thing both services wait for: the nvidia module, which the
// machine config loads.
const ModuleWait = "the nvidia kernel module (machine.kernel.modules in the machine config)"

// DriverLoaded returns ErrNoDriver while the nvidia module's /proc/driver/nvidia/version is
// missing under hostRoot.
func DriverLoaded(hostRoot string) error {
	p := filepath.Join(hostRoot, "proc/driver/nvidia/version")
	if _, err := os.Stat(p); err != nil {
		return fmt.Errorf("%w: %s is missing", ErrNoDriver, p)
	}

	return nil
}
