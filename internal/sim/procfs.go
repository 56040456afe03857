package sim

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/talos-nvidia/nvidia-driver/pkg/atomicfile"
	gpuinfo "github.com/talos-nvidia/nvidia-driver/pkg/gpu"
)

// Device majors of the simulated node, as a loaded driver lists them in /proc/devices.
const (
	MajorNvidia = 195
	MajorUVM    = 507
	MajorCaps   = 508
)

// The driver numbers its capability minors from one counter over fixed tables
// (kernel-open/nvidia/nv-caps.c nv_cap_tables_init): the NVLink fabric-mgmt capability 0, MIG
// config 1 and monitor 2, then for each of 32 GPUs 15 GPU instances, each followed by its 8
// compute instances. /proc/driver/nvidia-caps/mig-minors lists every entry of those tables,
// whether the GPU or instance exists or not (nv_procfs_read_mig_minors: "config 1",
// "gpu0/gi0/access 3", "gpu0/gi0/ci0/access 4", ...).
const (
	migGPUs      = 32
	migGIsPerGPU = 15
	migCIsPerGI  = 8
)

// MigMinor returns the minor that /proc/driver/nvidia-caps/mig-minors gives a GPU instance
// (ci < 0) or a compute instance.
func MigMinor(gpuMinor, gi, ci int) int {
	base := 3 + gpuMinor*migGIsPerGPU*(1+migCIsPerGI) + gi*(1+migCIsPerGI)
	if ci < 0 {
		return base
	}

	return base + 1 + ci
}

// WriteProcFS writes under hostRoot the /proc and /sys files that a loaded NVIDIA driver
// offers for the GPUs that lib reports: device majors, the driver version and parameters, one information
// file per GPU, the MIG capability minors and a capability file for every MIG instance that
// exists, and for every process that holds GPUs open (a Node's holders, and compute
// processes) the /proc/<pid>/fd links to /dev/nvidiactl and /dev/nvidia<minor> (and its comm
// where the holder has a name). The device-node job and the
// MIG applier read exactly these files, so a simulated node looks to them like a real one.
// NVML must be initialized.
func WriteProcFS(hostRoot string, lib nvml.Interface) error {
	files := map[string]string{
		"proc/devices": fmt.Sprintf("Character devices:\n  1 mem\n%3d nvidia-frontend\n%3d nvidia-uvm\n%3d nvidia-caps\n\nBlock devices:\n  8 sd\n",
			MajorNvidia, MajorUVM, MajorCaps),
		"proc/driver/nvidia/capabilities/mig/config":  capability(1, 0o400),
		"proc/driver/nvidia/capabilities/mig/monitor": capability(2, 0o444),
		// The module's parameters at their defaults, in the driver's order and format
		// (kernel-open/nvidia/nv-procfs.c; the mode in decimal: 438 is 0666).
		"proc/driver/nvidia/params": "ResmanDebugLevel: 4294967295\nRmLogonRC: 1\nModifyDeviceFiles: 1\nDeviceFileUID: 0\n" +
			"DeviceFileGID: 0\nDeviceFileMode: 438\nInitializeSystemMemoryAllocations: 1\n",
	}

	version, ret := lib.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("reading the simulated driver version: %w", ret)
	}

	files["proc/driver/nvidia/version"] = fmt.Sprintf("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  %s  Simulated\nGCC version:  gcc\n", version)

	gpus, err := gpuinfo.List(lib)
	if err != nil {
		return err
	}

	var minors strings.Builder

	minors.WriteString("config 1\nmonitor 2\n")

	for m := range migGPUs {
		for gi := range migGIsPerGPU {
			fmt.Fprintf(&minors, "gpu%d/gi%d/access %d\n", m, gi, MigMinor(m, gi, -1))

			for ci := range migCIsPerGI {
				fmt.Fprintf(&minors, "gpu%d/gi%d/ci%d/access %d\n", m, gi, ci, MigMinor(m, gi, ci))
			}
		}
	}

	files["proc/driver/nvidia-caps/mig-minors"] = minors.String()

	for _, g := range gpus {
		files[filepath.Join("proc/driver/nvidia/gpus", strings.ToLower(g.BusID), "information")] = fmt.Sprintf(
			"Model: \t\t %s\nIRQ:   \t\t 0\nGPU UUID: \t %s\nVideo BIOS: \t 00.00.00.00.00\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t %s\nDevice Minor: \t %d\nGPU Excluded:\t No\n",
			g.Name, g.UUID, g.BusID, g.Minor)

		instances, err := migInstances(lib, g.Index)
		if err != nil {
			return err
		}

		for _, in := range instances {
			files[fmt.Sprintf("proc/driver/nvidia/capabilities/gpu%d/mig/gi%d/access", g.Minor, in.gi)] = capability(MigMinor(g.Minor, in.gi, -1), 0o444)
			files[fmt.Sprintf("proc/driver/nvidia/capabilities/gpu%d/mig/gi%d/ci%d/access", g.Minor, in.gi, in.ci)] = capability(MigMinor(g.Minor, in.gi, in.ci), 0o444)
		}
	}

	// A fresh capabilities tree: instances destroyed since the last write must disappear.
	if err := os.RemoveAll(filepath.Join(hostRoot, "proc/driver/nvidia/capabilities")); err != nil {
		return fmt.Errorf("clearing simulated capabilities: %w", err)
	}

	// Holders, as the kernel shows them: fd links into /dev (the links need not resolve here).
	links := map[string]string{}

	if h, ok := lib.(interface{ Holders() []Holder }); ok {
		minors := map[int]int{}
		for _, g := range gpus {
			minors[g.Index] = g.Minor
		}

		for _, hd := range h.Holders() {
			dir := filepath.Join("proc", strconv.Itoa(hd.PID))
			files[filepath.Join(dir, "comm")] = hd.Name + "\n"
			links[filepath.Join(dir, "fd", "3")] = "/dev/nvidiactl"

			for i, idx := range hd.GPUs {
				links[filepath.Join(dir, "fd", strconv.Itoa(4+i))] = fmt.Sprintf("/dev/nvidia%d", minors[idx])
			}
		}
	}

	// Compute processes have their GPU open too.
	for _, g := range gpus {
		d, ret := lib.DeviceGetHandleByIndex(g.Index)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("GPU %d: %w", g.Index, ret)
		}

		procs, ret := d.GetComputeRunningProcesses()
		if ret != nvml.SUCCESS {
			return fmt.Errorf("GPU %d: compute processes: %w", g.Index, ret)
		}

		for _, p := range procs {
			links[filepath.Join("proc", strconv.Itoa(int(p.Pid)), "fd", strconv.Itoa(100+g.Index))] = fmt.Sprintf("/dev/nvidia%d", g.Minor)
		}
	}

	// Processes that are gone must disappear.
	if err := removePIDDirs(filepath.Join(hostRoot, "proc")); err != nil {
		return err
	}

	// Each file replaced whole (a killed writer must not leave, say, a GPU's information file
	// truncated: every later start would wait on it), and only when it changed.
	for rel, content := range files {
		if _, err := atomicfile.Write(filepath.Join(hostRoot, rel), []byte(content), 0o444); err != nil {
			return fmt.Errorf("writing simulated /proc: %w", err)
		}
	}

	for rel, target := range links {
		p := filepath.Join(hostRoot, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("writing simulated /proc: %w", err)
		}

		if err := os.Symlink(target, p); err != nil {
			return fmt.Errorf("writing simulated /proc: %w", err)
		}
	}

	for _, mod := range []string{"nvidia", "nvidia_uvm", "nvidia_modeset"} {
		if err := os.MkdirAll(filepath.Join(hostRoot, "sys/module", mod), 0o755); err != nil {
			return fmt.Errorf("writing simulated /sys: %w", err)
		}
	}

	return nil
}

func removePIDDirs(proc string) error {
	entries, err := os.ReadDir(proc)
	if err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("clearing simulated processes: %w", err)
	}

	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			if err := os.RemoveAll(filepath.Join(proc, e.Name())); err != nil {
				return fmt.Errorf("clearing simulated processes: %w", err)
			}
		}
	}

	return nil
}

func capability(minor int, mode os.FileMode) string {
	return fmt.Sprintf("DeviceFileMinor: %d\nDeviceFileMode: %d\nDeviceFileModify: 1\n", minor, mode)
}

type instance struct{ gi, ci int }

// migInstances lists the (GPU instance, compute instance) pairs of a GPU in MIG mode.
func migInstances(lib nvml.Interface, index int) ([]instance, error) {
	d, ret := lib.DeviceGetHandleByIndex(index)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("GPU %d: %w", index, ret)
	}

	if current, _, ret := d.GetMigMode(); ret != nvml.SUCCESS || current != nvml.DEVICE_MIG_ENABLE {
		return nil, nil
	}

	n, ret := d.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("GPU %d: counting MIG devices: %w", index, ret)
	}

	var out []instance

	for i := range n {
		mig, ret := d.GetMigDeviceHandleByIndex(i)
		if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}

		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("GPU %d: MIG device %d: %w", index, i, ret)
		}

		gi, ret := mig.GetGpuInstanceId()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("GPU %d: MIG device %d: GPU instance id: %w", index, i, ret)
		}

		ci, ret := mig.GetComputeInstanceId()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("GPU %d: MIG device %d: compute instance id: %w", index, i, ret)
		}

		out = append(out, instance{gi: gi, ci: ci})
	}

	return out, nil
}
