package main

import "C"

import (
	"fmt"
	"strconv"
	"strings"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/talos-nvidia/nvidia-driver/internal/sim"
)

// device resolves a device handle: a whole GPU or a MIG device. A GPU reset since the handle
// was taken makes it stale (NVML_ERROR_GPU_IS_LOST, as after a real reset). Callers hold
// the.mu (withNode).
func device(n *sim.Node, h unsafe.Pointer) (nvml.Device, handleKey, C.int) {
	k, ok := keyOf(h)
	if !ok || (k.kind != kindGPU && k.kind != kindMIG) {
		return nil, k, retInvalid
	}

	d, ret := n.DeviceGetHandleByIndex(k.gpu)
	if ret != nvml.SUCCESS {
		return nil, k, C.int(ret)
	}

	if n.Generation(k.gpu) != k.gen {
		return nil, k, retGPULost
	}

	if k.kind == kindGPU {
		return d, k, retSuccess
	}

	md, r := migDevice(d, k.gi, k.ci)

	return md, k, r
}

// migDevice finds the MIG device of GPU instance gi and compute instance ci on d.
func migDevice(d nvml.Device, gi, ci int) (nvml.Device, C.int) {
	count, ret := d.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil, C.int(ret)
	}

	for i := range count {
		md, ret := d.GetMigDeviceHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}

		g, ret1 := md.GetGpuInstanceId()
		c, ret2 := md.GetComputeInstanceId()

		if ret1 == nvml.SUCCESS && ret2 == nvml.SUCCESS && g == gi && c == ci {
			return md, retSuccess
		}
	}

	return nil, retNotFound
}

// onDevice runs f on the device of handle h.
func onDevice(write bool, h unsafe.Pointer, f func(n *sim.Node, d nvml.Device, k handleKey) C.int) C.int {
	return withNode(write, func(n *sim.Node) C.int {
		d, k, ret := device(n, h)
		if ret != retSuccess {
			return ret
		}

		return f(n, d, k)
	})
}

func gpuHandle(n *sim.Node, index int) unsafe.Pointer {
	return handleFor(handleKey{kind: kindGPU, gpu: index, gen: n.Generation(index)})
}

func putHandle(out unsafe.Pointer, h unsafe.Pointer) C.int {
	if out == nil {
		return retInvalid
	}

	*(*unsafe.Pointer)(out) = h

	return retSuccess
}

func deviceCount(count *C.uint) C.int {
	if count == nil {
		return retInvalid
	}

	return withNode(false, func(n *sim.Node) C.int {
		c, ret := n.DeviceGetCount()
		*count = C.uint(c)

		return C.int(ret)
	})
}

//export nvmlDeviceGetCount_v2
func nvmlDeviceGetCount_v2(count *C.uint) C.int { return deviceCount(count) }

//export nvmlDeviceGetCount
func nvmlDeviceGetCount(count *C.uint) C.int { return deviceCount(count) }

func handleByIndex(index C.uint, out unsafe.Pointer) C.int {
	return withNode(false, func(n *sim.Node) C.int {
		if _, ret := n.DeviceGetHandleByIndex(int(index)); ret != nvml.SUCCESS {
			return C.int(ret)
		}

		return putHandle(out, gpuHandle(n, int(index)))
	})
}

//export nvmlDeviceGetHandleByIndex_v2
func nvmlDeviceGetHandleByIndex_v2(index C.uint, out unsafe.Pointer) C.int {
	return handleByIndex(index, out)
}

//export nvmlDeviceGetHandleByIndex
func nvmlDeviceGetHandleByIndex(index C.uint, out unsafe.Pointer) C.int {
	return handleByIndex(index, out)
}

// findDevice returns the handle of the GPU or MIG device that match says is the one.
func findDevice(n *sim.Node, match func(d nvml.Device) bool) (unsafe.Pointer, C.int) {
	count, ret := n.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, C.int(ret)
	}

	for i := range count {
		d, ret := n.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, C.int(ret)
		}

		if match(d) {
			return gpuHandle(n, i), retSuccess
		}

		max, _ := d.GetMaxMigDeviceCount() //nolint:errcheck // 0 without MIG
		for j := range max {
			md, ret := d.GetMigDeviceHandleByIndex(j)
			if ret != nvml.SUCCESS || !match(md) {
				continue
			}

			gi, _ := md.GetGpuInstanceId()     //nolint:errcheck
			ci, _ := md.GetComputeInstanceId() //nolint:errcheck

			return handleFor(handleKey{kind: kindMIG, gpu: i, gen: n.Generation(i), gi: gi, ci: ci}), retSuccess
		}
	}

	return nil, retNotFound
}

//export nvmlDeviceGetHandleByUUID
func nvmlDeviceGetHandleByUUID(uuid *C.char, out unsafe.Pointer) C.int {
	if uuid == nil {
		return retInvalid
	}

	want := C.GoString(uuid)

	return withNode(false, func(n *sim.Node) C.int {
		h, ret := findDevice(n, func(d nvml.Device) bool {
			u, ret := d.GetUUID()

			return ret == nvml.SUCCESS && u == want
		})
		if ret != retSuccess {
			return ret
		}

		return putHandle(out, h)
	})
}

func handleByBusID(busID *C.char, out unsafe.Pointer) C.int {
	if busID == nil {
		return retInvalid
	}

	want := normBusID(C.GoString(busID))

	return withNode(false, func(n *sim.Node) C.int {
		h, ret := findDevice(n, func(d nvml.Device) bool {
			if is, _ := d.IsMigDeviceHandle(); is { //nolint:errcheck
				return false
			}

			pci, ret := d.GetPciInfo()

			return ret == nvml.SUCCESS && normBusID(cString(pci.BusId[:])) == want
		})
		if ret != retSuccess {
			return ret
		}

		return putHandle(out, h)
	})
}

//export nvmlDeviceGetHandleByPciBusId_v2
func nvmlDeviceGetHandleByPciBusId_v2(busID *C.char, out unsafe.Pointer) C.int {
	return handleByBusID(busID, out)
}

//export nvmlDeviceGetHandleByPciBusId
func nvmlDeviceGetHandleByPciBusId(busID *C.char, out unsafe.Pointer) C.int {
	return handleByBusID(busID, out)
}

// normBusID: NVML takes "domain:bus:device.function" in either case, with a 4- or 8-digit
// domain.
func normBusID(s string) string {
	domain, rest, ok := strings.Cut(strings.ToLower(s), ":")
	if !ok {
		return s
	}

	d, err := strconv.ParseUint(domain, 16, 32)
	if err != nil {
		return s
	}

	return fmt.Sprintf("%08x:%s", d, rest)
}

func cString(b []int8) string {
	var s strings.Builder

	for _, c := range b {
		if c == 0 {
			break
		}

		s.WriteByte(byte(c))
	}

	return s.String()
}

//export nvmlDeviceGetIndex
func nvmlDeviceGetIndex(h unsafe.Pointer, index *C.uint) C.int {
	if index == nil {
		return retInvalid
	}

	return onDevice(false, h, func(_ *sim.Node, d nvml.Device, k handleKey) C.int {
		if k.kind == kindMIG {
			// nvml.h: a MIG device handle has no index of its own; NVML gives its GPU's.
			*index = C.uint(k.gpu)

			return retSuccess
		}

		i, ret := d.GetIndex()
		*index = C.uint(i)

		return C.int(ret)
	})
}

func deviceString(h unsafe.Pointer, dst *C.char, length C.uint, get func(d nvml.Device) (string, nvml.Return)) C.int {
	return onDevice(false, h, func(_ *sim.Node, d nvml.Device, _ handleKey) C.int {
		s, ret := get(d)
		if ret != nvml.SUCCESS {
			return C.int(ret)
		}

		return putString(dst, length, s)
	})
}

//export nvmlDeviceGetName
func nvmlDeviceGetName(h unsafe.Pointer, name *C.char, length C.uint) C.int {
	return deviceString(h, name, length, nvml.Device.GetName)
}

//export nvmlDeviceGetUUID
func nvmlDeviceGetUUID(h unsafe.Pointer, uuid *C.char, length C.uint) C.int {
	return deviceString(h, uuid, length, nvml.Device.GetUUID)
}

// nvmlDeviceGetSerial: NVML's board serial; the simulated one is made of the UUID's tail.
//
//export nvmlDeviceGetSerial
func nvmlDeviceGetSerial(h unsafe.Pointer, serial *C.char, length C.uint) C.int {
	return deviceString(h, serial, length, func(d nvml.Device) (string, nvml.Return) {
		u, ret := d.GetUUID()

		return "1650" + u[len(u)-9:], ret
	})
}

// deviceUint answers a call that reads one number of a device.
func deviceUint[T ~int | ~int32 | ~uint32](h unsafe.Pointer, out *C.uint, get func(d nvml.Device) (T, nvml.Return)) C.int {
	if out == nil {
		return retInvalid
	}

	return onDevice(false, h, func(_ *sim.Node, d nvml.Device, _ handleKey) C.int {
		v, ret := get(d)
		*out = C.uint(v)

		return C.int(ret)
	})
}

//export nvmlDeviceGetMinorNumber
func nvmlDeviceGetMinorNumber(h unsafe.Pointer, minor *C.uint) C.int {
	return deviceUint(h, minor, nvml.Device.GetMinorNumber)
}

//export nvmlDeviceGetArchitecture
func nvmlDeviceGetArchitecture(h unsafe.Pointer, arch *C.uint) C.int {
	return deviceUint(h, arch, nvml.Device.GetArchitecture)
}

//export nvmlDeviceGetBrand
func nvmlDeviceGetBrand(h unsafe.Pointer, brand *C.uint) C.int {
	return deviceUint(h, brand, nvml.Device.GetBrand)
}

//export nvmlDeviceIsMigDeviceHandle
func nvmlDeviceIsMigDeviceHandle(h unsafe.Pointer, is *C.uint) C.int {
	return deviceUint(h, is, func(d nvml.Device) (uint32, nvml.Return) {
		b, ret := d.IsMigDeviceHandle()
		if b {
			return 1, ret
		}

		return 0, ret
	})
}

//export nvmlDeviceGetCudaComputeCapability
func nvmlDeviceGetCudaComputeCapability(h unsafe.Pointer, major, minor *C.int) C.int {
	if major == nil || minor == nil {
		return retInvalid
	}

	return onDevice(false, h, func(_ *sim.Node, d nvml.Device, _ handleKey) C.int {
		a, b, ret := d.GetCudaComputeCapability()
		*major, *minor = C.int(a), C.int(b)

		return C.int(ret)
	})
}

// nvmlDeviceGetPciInfo_v3 fills nvmlPciInfo_t, whose layout go-nvml's PciInfo has (cgo
// -godefs of nvml.h).
//
//export nvmlDeviceGetPciInfo_v3
func nvmlDeviceGetPciInfo_v3(h unsafe.Pointer, pci unsafe.Pointer) C.int {
	if pci == nil {
		return retInvalid
	}

	return onDevice(false, h, func(_ *sim.Node, d nvml.Device, _ handleKey) C.int {
		info, ret := d.GetPciInfo()
		*(*nvml.PciInfo)(pci) = info

		return C.int(ret)
	})
}

//export nvmlDeviceGetMemoryInfo
func nvmlDeviceGetMemoryInfo(h unsafe.Pointer, mem unsafe.Pointer) C.int {
	if mem == nil {
		return retInvalid
	}

	return onDevice(false, h, func(_ *sim.Node, d nvml.Device, _ handleKey) C.int {
		m, ret := d.GetMemoryInfo()
		*(*nvml.Memory)(mem) = m

		return C.int(ret)
	})
}

// nvmlDeviceGetMemoryInfo_v2: the caller sets the version; memory reserved by the driver is
// not simulated (0).
//
//export nvmlDeviceGetMemoryInfo_v2
func nvmlDeviceGetMemoryInfo_v2(h unsafe.Pointer, mem unsafe.Pointer) C.int {
	if mem == nil {
		return retInvalid
	}

	return onDevice(false, h, func(_ *sim.Node, d nvml.Device, _ handleKey) C.int {
		m, ret := d.GetMemoryInfo()
		out := (*nvml.Memory_v2)(mem)
		out.Total, out.Free, out.Used, out.Reserved = m.Total, m.Free, m.Used, 0

		return C.int(ret)
	})
}

func attributes(h unsafe.Pointer, attrs unsafe.Pointer) C.int {
	if attrs == nil {
		return retInvalid
	}

	return onDevice(false, h, func(_ *sim.Node, d nvml.Device, _ handleKey) C.int {
		a, ret := d.GetAttributes()
		*(*nvml.DeviceAttributes)(attrs) = a

		return C.int(ret)
	})
}

//export nvmlDeviceGetAttributes_v2
func nvmlDeviceGetAttributes_v2(h unsafe.Pointer, attrs unsafe.Pointer) C.int {
	return attributes(h, attrs)
}

//export nvmlDeviceGetAttributes
func nvmlDeviceGetAttributes(h unsafe.Pointer, attrs unsafe.Pointer) C.int {
	return attributes(h, attrs)
}

// nvmlDeviceGetGpuFabricInfo fills nvmlGpuFabricInfo_t (deprecated in 13.0, what go-nvml's
// GetGpuFabricInfo calls).
//
//export nvmlDeviceGetGpuFabricInfo
func nvmlDeviceGetGpuFabricInfo(h unsafe.Pointer, info unsafe.Pointer) C.int {
	if info == nil {
		return retInvalid
	}

	return onDevice(false, h, func(_ *sim.Node, d nvml.Device, _ handleKey) C.int {
		fi, ret := d.GetGpuFabricInfo()
		*(*nvml.GpuFabricInfo)(info) = fi

		return C.int(ret)
	})
}

// nvmlDeviceGetGpuFabricInfoV fills the versioned struct; the fields up to the state are
// laid out alike in every version (nvmlGpuFabricInfo_v2_t, _v3_t).
//
//export nvmlDeviceGetGpuFabricInfoV
func nvmlDeviceGetGpuFabricInfoV(h unsafe.Pointer, info unsafe.Pointer) C.int {
	if info == nil {
		return retInvalid
	}

	return onDevice(false, h, func(_ *sim.Node, d nvml.Device, _ handleKey) C.int {
		fi, ret := d.GetGpuFabricInfo()
		out := (*nvml.GpuFabricInfo_v2)(info)
		out.ClusterUuid, out.Status, out.CliqueId, out.State = fi.ClusterUuid, fi.Status, fi.CliqueId, fi.State

		return C.int(ret)
	})
}

// processes answers the nvmlDevice*RunningProcesses_v3 calls: infoCount in and out; with too
// small a buffer, NVML_ERROR_INSUFFICIENT_SIZE and the count needed.
func processes(h unsafe.Pointer, count *C.uint, infos unsafe.Pointer, get func(d nvml.Device) ([]nvml.ProcessInfo, nvml.Return)) C.int {
	if count == nil {
		return retInvalid
	}

	return onDevice(false, h, func(_ *sim.Node, d nvml.Device, _ handleKey) C.int {
		procs, ret := get(d)
		if ret != nvml.SUCCESS {
			return C.int(ret)
		}

		room := int(*count)
		*count = C.uint(len(procs))

		if len(procs) == 0 {
			return retSuccess
		}

		if infos == nil || room < len(procs) {
			return retInsufficient
		}

		copy(unsafe.Slice((*nvml.ProcessInfo)(infos), room), procs)

		return retSuccess
	})
}

//export nvmlDeviceGetComputeRunningProcesses_v3
func nvmlDeviceGetComputeRunningProcesses_v3(h unsafe.Pointer, count *C.uint, infos unsafe.Pointer) C.int {
	return processes(h, count, infos, nvml.Device.GetComputeRunningProcesses)
}

// The simulator runs no graphics or MPS processes.
func none(nvml.Device) ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }

//export nvmlDeviceGetGraphicsRunningProcesses_v3
func nvmlDeviceGetGraphicsRunningProcesses_v3(h unsafe.Pointer, count *C.uint, infos unsafe.Pointer) C.int {
	return processes(h, count, infos, none)
}

//export nvmlDeviceGetMPSComputeRunningProcesses_v3
func nvmlDeviceGetMPSComputeRunningProcesses_v3(h unsafe.Pointer, count *C.uint, infos unsafe.Pointer) C.int {
	return processes(h, count, infos, none)
}

// nvmlDeviceGetTopologyCommonAncestor: NVIDIA's device plugin asks it of every pair of GPUs
// for its preferred allocation (go-gpuallocator internal/links). The simulated board's PCIe
// tree is a simple one, not read from a real board: GPUs 0-3 under one CPU socket and 4-7
// under the other (NODE within a socket, SYSTEM across); NVLink is not reported (the
// allocator takes NVML_ERROR_NOT_SUPPORTED there as no link).
//
//export nvmlDeviceGetTopologyCommonAncestor
func nvmlDeviceGetTopologyCommonAncestor(h1, h2 unsafe.Pointer, level *C.uint) C.int {
	if level == nil {
		return retInvalid
	}

	return withNode(false, func(n *sim.Node) C.int {
		_, k1, ret := device(n, h1)
		if ret != retSuccess {
			return ret
		}

		_, k2, ret := device(n, h2)
		if ret != retSuccess {
			return ret
		}

		switch {
		case k1.gpu == k2.gpu:
			*level = C.uint(nvml.TOPOLOGY_INTERNAL)
		case k1.gpu/4 == k2.gpu/4:
			*level = C.uint(nvml.TOPOLOGY_NODE)
		default:
			*level = C.uint(nvml.TOPOLOGY_SYSTEM)
		}

		return retSuccess
	})
}
