package main

import "C"

import (
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/talos-nvidia/nvidia-driver/internal/sim"
)

// The MIG calls of nvml.h (nvmlDeviceSetMigMode ... nvmlComputeInstanceDestroy). The ones
// that change the GPUs hold the state directory's lock exclusively and write it back.

//export nvmlDeviceGetMigMode
func nvmlDeviceGetMigMode(h unsafe.Pointer, current, pending *C.uint) C.int {
	if current == nil || pending == nil {
		return retInvalid
	}

	return onDevice(false, h, func(_ *sim.Node, d nvml.Device, _ handleKey) C.int {
		c, p, ret := d.GetMigMode()
		*current, *pending = C.uint(c), C.uint(p)

		return C.int(ret)
	})
}

//export nvmlDeviceSetMigMode
func nvmlDeviceSetMigMode(h unsafe.Pointer, mode C.uint, activation *C.int) C.int {
	if activation == nil {
		return retInvalid
	}

	// Other processes that hold the GPU open keep the driver from unbinding it (attach.go).
	return onDevice(true, h, func(n *sim.Node, d nvml.Device, _ handleKey) C.int {
		return withOthersHolding(n, func() C.int {
			status, ret := d.SetMigMode(int(mode))
			*activation = C.int(status)

			return C.int(ret)
		})
	})
}

//export nvmlDeviceGetMaxMigDeviceCount
func nvmlDeviceGetMaxMigDeviceCount(h unsafe.Pointer, count *C.uint) C.int {
	return deviceUint(h, count, nvml.Device.GetMaxMigDeviceCount)
}

//export nvmlDeviceGetMigDeviceHandleByIndex
func nvmlDeviceGetMigDeviceHandleByIndex(h unsafe.Pointer, index C.uint, out unsafe.Pointer) C.int {
	return onDevice(false, h, func(n *sim.Node, d nvml.Device, k handleKey) C.int {
		if k.kind != kindGPU {
			return retInvalid
		}

		md, ret := d.GetMigDeviceHandleByIndex(int(index))
		if ret != nvml.SUCCESS {
			return C.int(ret)
		}

		gi, ret := md.GetGpuInstanceId()
		if ret != nvml.SUCCESS {
			return C.int(ret)
		}

		ci, ret := md.GetComputeInstanceId()
		if ret != nvml.SUCCESS {
			return C.int(ret)
		}

		return putHandle(out, handleFor(handleKey{kind: kindMIG, gpu: k.gpu, gen: k.gen, gi: gi, ci: ci}))
	})
}

//export nvmlDeviceGetDeviceHandleFromMigDeviceHandle
func nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h unsafe.Pointer, out unsafe.Pointer) C.int {
	return onDevice(false, h, func(n *sim.Node, _ nvml.Device, k handleKey) C.int {
		if k.kind != kindMIG {
			return retInvalid
		}

		return putHandle(out, gpuHandle(n, k.gpu))
	})
}

//export nvmlDeviceGetGpuInstanceId
func nvmlDeviceGetGpuInstanceId(h unsafe.Pointer, id *C.uint) C.int {
	return deviceUint(h, id, nvml.Device.GetGpuInstanceId)
}

//export nvmlDeviceGetComputeInstanceId
func nvmlDeviceGetComputeInstanceId(h unsafe.Pointer, id *C.uint) C.int {
	return deviceUint(h, id, nvml.Device.GetComputeInstanceId)
}

// --- GPU instances

//export nvmlDeviceGetGpuInstanceProfileInfo
func nvmlDeviceGetGpuInstanceProfileInfo(h unsafe.Pointer, profile C.uint, info unsafe.Pointer) C.int {
	if info == nil {
		return retInvalid
	}

	return onDevice(false, h, func(_ *sim.Node, d nvml.Device, _ handleKey) C.int {
		p, ret := d.GetGpuInstanceProfileInfo(int(profile))
		*(*nvml.GpuInstanceProfileInfo)(info) = p

		return C.int(ret)
	})
}

// nvmlDeviceGetGpuInstanceProfileInfoV fills version 2 or 3 of the struct, as the caller's
// version field says, with the profile's name as NVML gives it ("MIG 1g.10gb").
//
//export nvmlDeviceGetGpuInstanceProfileInfoV
func nvmlDeviceGetGpuInstanceProfileInfoV(h unsafe.Pointer, profile C.uint, info unsafe.Pointer) C.int {
	if info == nil {
		return retInvalid
	}

	return onDevice(false, h, func(_ *sim.Node, d nvml.Device, _ handleKey) C.int {
		p, ret := d.GetGpuInstanceProfileInfo(int(profile))
		if ret != nvml.SUCCESS {
			return C.int(ret)
		}

		name := "MIG " + giProfileName(d, p.Id)

		switch version := *(*uint32)(info); version >> 24 {
		case 2:
			*(*nvml.GpuInstanceProfileInfo_v2)(info) = nvml.GpuInstanceProfileInfo_v2{
				Version: version, Id: p.Id, IsP2pSupported: p.IsP2pSupported, SliceCount: p.SliceCount,
				InstanceCount: p.InstanceCount, MultiprocessorCount: p.MultiprocessorCount,
				CopyEngineCount: p.CopyEngineCount, DecoderCount: p.DecoderCount, EncoderCount: p.EncoderCount,
				JpegCount: p.JpegCount, OfaCount: p.OfaCount, MemorySizeMB: p.MemorySizeMB, Name: name96(name),
			}
		case 3:
			*(*nvml.GpuInstanceProfileInfo_v3)(info) = nvml.GpuInstanceProfileInfo_v3{
				Version: version, Id: p.Id, SliceCount: p.SliceCount,
				InstanceCount: p.InstanceCount, MultiprocessorCount: p.MultiprocessorCount,
				CopyEngineCount: p.CopyEngineCount, DecoderCount: p.DecoderCount, EncoderCount: p.EncoderCount,
				JpegCount: p.JpegCount, OfaCount: p.OfaCount, MemorySizeMB: p.MemorySizeMB, Name: name96(name),
			}
		default:
			return C.int(nvml.ERROR_ARGUMENT_VERSION_MISMATCH)
		}

		return retSuccess
	})
}

// giProfileName is the name nvidia-smi gives a GPU-instance profile of d's model.
func giProfileName(d nvml.Device, id uint32) string {
	name, _ := d.GetName() //nolint:errcheck // the model is found by name below

	for _, key := range sim.Models() {
		m, err := sim.LookupModel(key)
		if err != nil || m.Name != name {
			continue
		}

		for _, p := range m.Profiles {
			if p.Info.Id == id {
				return p.Name
			}
		}
	}

	return ""
}

func name96(s string) [96]int8 {
	var out [96]int8
	for i := 0; i < len(s) && i < len(out)-1; i++ {
		out[i] = int8(s[i])
	}

	return out
}

func placements[T any](out unsafe.Pointer, count *C.uint, list []T) C.int {
	if count == nil {
		return retInvalid
	}

	if out != nil {
		copy(unsafe.Slice((*T)(out), len(list)), list)
	}

	*count = C.uint(len(list))

	return retSuccess
}

// putInstance answers a call that finds or creates one instance: its handle into out.
func putInstance[T any](out unsafe.Pointer, it T, ret nvml.Return, handle func(T) (unsafe.Pointer, C.int)) C.int {
	if ret != nvml.SUCCESS {
		return C.int(ret)
	}

	h, r := handle(it)
	if r != retSuccess {
		return r
	}

	return putHandle(out, h)
}

// handleList answers a call that lists instances: their handles into out, and how many.
func handleList[T any](out unsafe.Pointer, count *C.uint, items []T, handle func(T) (unsafe.Pointer, C.int)) C.int {
	list := make([]unsafe.Pointer, 0, len(items))

	for _, it := range items {
		h, r := handle(it)
		if r != retSuccess {
			return r
		}

		list = append(list, h)
	}

	return placements(out, count, list)
}

func giPlacements(h unsafe.Pointer, profileID C.uint, out unsafe.Pointer, count *C.uint) C.int {
	return onDevice(false, h, func(_ *sim.Node, d nvml.Device, _ handleKey) C.int {
		list, ret := d.GetGpuInstancePossiblePlacements(&nvml.GpuInstanceProfileInfo{Id: uint32(profileID)})
		if ret != nvml.SUCCESS {
			return C.int(ret)
		}

		return placements(out, count, list)
	})
}

//export nvmlDeviceGetGpuInstancePossiblePlacements_v2
func nvmlDeviceGetGpuInstancePossiblePlacements_v2(h unsafe.Pointer, profileID C.uint, out unsafe.Pointer, count *C.uint) C.int {
	return giPlacements(h, profileID, out, count)
}

//export nvmlDeviceGetGpuInstancePossiblePlacements
func nvmlDeviceGetGpuInstancePossiblePlacements(h unsafe.Pointer, profileID C.uint, out unsafe.Pointer, count *C.uint) C.int {
	return giPlacements(h, profileID, out, count)
}

//export nvmlDeviceGetGpuInstanceRemainingCapacity
func nvmlDeviceGetGpuInstanceRemainingCapacity(h unsafe.Pointer, profileID C.uint, count *C.uint) C.int {
	return deviceUint(h, count, func(d nvml.Device) (uint32, nvml.Return) {
		c, ret := d.GetGpuInstanceRemainingCapacity(&nvml.GpuInstanceProfileInfo{Id: uint32(profileID)})

		return uint32(c), ret
	})
}

func giHandle(k handleKey, gi nvml.GpuInstance) (unsafe.Pointer, C.int) {
	info, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return nil, C.int(ret)
	}

	return handleFor(handleKey{kind: kindGI, gpu: k.gpu, gen: k.gen, gi: int(info.Id)}), retSuccess
}

func createGI(h unsafe.Pointer, out unsafe.Pointer, create func(d nvml.Device) (nvml.GpuInstance, nvml.Return)) C.int {
	return onDevice(true, h, func(_ *sim.Node, d nvml.Device, k handleKey) C.int {
		gi, ret := create(d)

		return putInstance(out, gi, ret, func(gi nvml.GpuInstance) (unsafe.Pointer, C.int) { return giHandle(k, gi) })
	})
}

//export nvmlDeviceCreateGpuInstance
func nvmlDeviceCreateGpuInstance(h unsafe.Pointer, profileID C.uint, out unsafe.Pointer) C.int {
	return createGI(h, out, func(d nvml.Device) (nvml.GpuInstance, nvml.Return) {
		return d.CreateGpuInstance(&nvml.GpuInstanceProfileInfo{Id: uint32(profileID)})
	})
}

//export nvmlDeviceCreateGpuInstanceWithPlacement
func nvmlDeviceCreateGpuInstanceWithPlacement(h unsafe.Pointer, profileID C.uint, placement unsafe.Pointer, out unsafe.Pointer) C.int {
	if placement == nil {
		return retInvalid
	}

	return createGI(h, out, func(d nvml.Device) (nvml.GpuInstance, nvml.Return) {
		return d.CreateGpuInstanceWithPlacement(&nvml.GpuInstanceProfileInfo{Id: uint32(profileID)}, (*nvml.GpuInstancePlacement)(placement))
	})
}

//export nvmlDeviceGetGpuInstances
func nvmlDeviceGetGpuInstances(h unsafe.Pointer, profileID C.uint, out unsafe.Pointer, count *C.uint) C.int {
	if count == nil {
		return retInvalid
	}

	return onDevice(false, h, func(_ *sim.Node, d nvml.Device, k handleKey) C.int {
		gis, ret := d.GetGpuInstances(&nvml.GpuInstanceProfileInfo{Id: uint32(profileID)})
		if ret != nvml.SUCCESS {
			return C.int(ret)
		}

		return handleList(out, count, gis, func(gi nvml.GpuInstance) (unsafe.Pointer, C.int) { return giHandle(k, gi) })
	})
}

//export nvmlDeviceGetGpuInstanceById
func nvmlDeviceGetGpuInstanceById(h unsafe.Pointer, id C.uint, out unsafe.Pointer) C.int {
	return onDevice(false, h, func(_ *sim.Node, d nvml.Device, k handleKey) C.int {
		gi, ret := d.GetGpuInstanceById(int(id))

		return putInstance(out, gi, ret, func(gi nvml.GpuInstance) (unsafe.Pointer, C.int) { return giHandle(k, gi) })
	})
}

// onGI runs f on the GPU instance of handle h.
func onGI(write bool, h unsafe.Pointer, f func(n *sim.Node, gi nvml.GpuInstance, k handleKey) C.int) C.int {
	return withNode(write, func(n *sim.Node) C.int {
		k, ok := keyOf(h)
		if !ok || k.kind != kindGI {
			return retInvalid
		}

		d, _, ret := device(n, handleFor(handleKey{kind: kindGPU, gpu: k.gpu, gen: k.gen}))
		if ret != retSuccess {
			return ret
		}

		gi, r := d.GetGpuInstanceById(k.gi)
		if r != nvml.SUCCESS {
			return C.int(r)
		}

		return f(n, gi, k)
	})
}

// giInfo is nvmlGpuInstanceInfo_t.
type giInfo struct {
	Device    unsafe.Pointer
	ID        uint32
	ProfileID uint32
	Placement nvml.GpuInstancePlacement
}

//export nvmlGpuInstanceGetInfo
func nvmlGpuInstanceGetInfo(h unsafe.Pointer, info unsafe.Pointer) C.int {
	if info == nil {
		return retInvalid
	}

	return onGI(false, h, func(n *sim.Node, gi nvml.GpuInstance, k handleKey) C.int {
		in, ret := gi.GetInfo()
		*(*giInfo)(info) = giInfo{Device: gpuHandle(n, k.gpu), ID: in.Id, ProfileID: in.ProfileId, Placement: in.Placement}

		return C.int(ret)
	})
}

//export nvmlGpuInstanceDestroy
func nvmlGpuInstanceDestroy(h unsafe.Pointer) C.int {
	return onGI(true, h, func(_ *sim.Node, gi nvml.GpuInstance, _ handleKey) C.int {
		return C.int(gi.Destroy())
	})
}

// --- compute instances

//export nvmlGpuInstanceGetComputeInstanceProfileInfo
func nvmlGpuInstanceGetComputeInstanceProfileInfo(h unsafe.Pointer, profile, engine C.uint, info unsafe.Pointer) C.int {
	if info == nil {
		return retInvalid
	}

	return onGI(false, h, func(_ *sim.Node, gi nvml.GpuInstance, _ handleKey) C.int {
		p, ret := gi.GetComputeInstanceProfileInfo(int(profile), int(engine))
		*(*nvml.ComputeInstanceProfileInfo)(info) = p

		return C.int(ret)
	})
}

//export nvmlGpuInstanceGetComputeInstanceProfileInfoV
func nvmlGpuInstanceGetComputeInstanceProfileInfoV(h unsafe.Pointer, profile, engine C.uint, info unsafe.Pointer) C.int {
	if info == nil {
		return retInvalid
	}

	return onGI(false, h, func(_ *sim.Node, gi nvml.GpuInstance, _ handleKey) C.int {
		p, ret := gi.GetComputeInstanceProfileInfo(int(profile), int(engine))
		if ret != nvml.SUCCESS {
			return C.int(ret)
		}

		version := *(*uint32)(info)
		if version>>24 != 2 && version>>24 != 3 {
			return C.int(nvml.ERROR_ARGUMENT_VERSION_MISMATCH)
		}

		// Versions 2 and 3 agree up to the name (3 adds capabilities after it).
		*(*nvml.ComputeInstanceProfileInfo_v2)(info) = nvml.ComputeInstanceProfileInfo_v2{
			Version: version, Id: p.Id, SliceCount: p.SliceCount, InstanceCount: p.InstanceCount,
			MultiprocessorCount: p.MultiprocessorCount, SharedCopyEngineCount: p.SharedCopyEngineCount,
			SharedDecoderCount: p.SharedDecoderCount, SharedEncoderCount: p.SharedEncoderCount,
			SharedJpegCount: p.SharedJpegCount, SharedOfaCount: p.SharedOfaCount,
		}

		return retSuccess
	})
}

// ciProfile is the full compute profile of an id: the simulator matches instances by size.
func ciProfile(gi nvml.GpuInstance, profileID C.uint) (*nvml.ComputeInstanceProfileInfo, C.int) {
	p, ret := gi.GetComputeInstanceProfileInfo(int(profileID), nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		return nil, C.int(ret)
	}

	return &p, retSuccess
}

//export nvmlGpuInstanceGetComputeInstancePossiblePlacements
func nvmlGpuInstanceGetComputeInstancePossiblePlacements(h unsafe.Pointer, profileID C.uint, out unsafe.Pointer, count *C.uint) C.int {
	return onGI(false, h, func(_ *sim.Node, gi nvml.GpuInstance, _ handleKey) C.int {
		p, r := ciProfile(gi, profileID)
		if r != retSuccess {
			return r
		}

		list, ret := gi.GetComputeInstancePossiblePlacements(p)
		if ret != nvml.SUCCESS {
			return C.int(ret)
		}

		return placements(out, count, list)
	})
}

//export nvmlGpuInstanceGetComputeInstanceRemainingCapacity
func nvmlGpuInstanceGetComputeInstanceRemainingCapacity(h unsafe.Pointer, profileID C.uint, count *C.uint) C.int {
	if count == nil {
		return retInvalid
	}

	return onGI(false, h, func(_ *sim.Node, gi nvml.GpuInstance, _ handleKey) C.int {
		p, r := ciProfile(gi, profileID)
		if r != retSuccess {
			return r
		}

		c, ret := gi.GetComputeInstanceRemainingCapacity(p)
		*count = C.uint(c)

		return C.int(ret)
	})
}

func ciHandle(k handleKey, ci nvml.ComputeInstance) (unsafe.Pointer, C.int) {
	info, ret := ci.GetInfo()
	if ret != nvml.SUCCESS {
		return nil, C.int(ret)
	}

	return handleFor(handleKey{kind: kindCI, gpu: k.gpu, gen: k.gen, gi: k.gi, ci: int(info.Id)}), retSuccess
}

func createCI(h unsafe.Pointer, profileID C.uint, out unsafe.Pointer, create func(gi nvml.GpuInstance, p *nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return)) C.int {
	return onGI(true, h, func(_ *sim.Node, gi nvml.GpuInstance, k handleKey) C.int {
		p, r := ciProfile(gi, profileID)
		if r != retSuccess {
			return r
		}

		ci, ret := create(gi, p)

		return putInstance(out, ci, ret, func(ci nvml.ComputeInstance) (unsafe.Pointer, C.int) { return ciHandle(k, ci) })
	})
}

//export nvmlGpuInstanceCreateComputeInstance
func nvmlGpuInstanceCreateComputeInstance(h unsafe.Pointer, profileID C.uint, out unsafe.Pointer) C.int {
	return createCI(h, profileID, out, nvml.GpuInstance.CreateComputeInstance)
}

//export nvmlGpuInstanceCreateComputeInstanceWithPlacement
func nvmlGpuInstanceCreateComputeInstanceWithPlacement(h unsafe.Pointer, profileID C.uint, placement unsafe.Pointer, out unsafe.Pointer) C.int {
	if placement == nil {
		return retInvalid
	}

	return createCI(h, profileID, out, func(gi nvml.GpuInstance, p *nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return) {
		return gi.CreateComputeInstanceWithPlacement(p, (*nvml.ComputeInstancePlacement)(placement))
	})
}

//export nvmlGpuInstanceGetComputeInstances
func nvmlGpuInstanceGetComputeInstances(h unsafe.Pointer, profileID C.uint, out unsafe.Pointer, count *C.uint) C.int {
	if count == nil {
		return retInvalid
	}

	return onGI(false, h, func(_ *sim.Node, gi nvml.GpuInstance, k handleKey) C.int {
		p, r := ciProfile(gi, profileID)
		if r != retSuccess {
			return r
		}

		cis, ret := gi.GetComputeInstances(p)
		if ret != nvml.SUCCESS {
			return C.int(ret)
		}

		return handleList(out, count, cis, func(ci nvml.ComputeInstance) (unsafe.Pointer, C.int) { return ciHandle(k, ci) })
	})
}

//export nvmlGpuInstanceGetComputeInstanceById
func nvmlGpuInstanceGetComputeInstanceById(h unsafe.Pointer, id C.uint, out unsafe.Pointer) C.int {
	return onGI(false, h, func(_ *sim.Node, gi nvml.GpuInstance, k handleKey) C.int {
		ci, ret := gi.GetComputeInstanceById(int(id))

		return putInstance(out, ci, ret, func(ci nvml.ComputeInstance) (unsafe.Pointer, C.int) { return ciHandle(k, ci) })
	})
}

// onCI runs f on the compute instance of handle h.
func onCI(write bool, h unsafe.Pointer, f func(n *sim.Node, ci nvml.ComputeInstance, k handleKey) C.int) C.int {
	the.mu.Lock()
	k, ok := keyOf(h)
	gih := handleFor(handleKey{kind: kindGI, gpu: k.gpu, gen: k.gen, gi: k.gi})
	the.mu.Unlock()

	if !ok || k.kind != kindCI {
		return retInvalid
	}

	return onGI(write, gih, func(n *sim.Node, gi nvml.GpuInstance, _ handleKey) C.int {
		ci, ret := gi.GetComputeInstanceById(k.ci)
		if ret != nvml.SUCCESS {
			return C.int(ret)
		}

		return f(n, ci, k)
	})
}

// ciInfo is nvmlComputeInstanceInfo_t.
type ciInfo struct {
	Device      unsafe.Pointer
	GpuInstance unsafe.Pointer
	ID          uint32
	ProfileID   uint32
	Placement   nvml.ComputeInstancePlacement
}

func computeInstanceInfo(h unsafe.Pointer, info unsafe.Pointer) C.int {
	if info == nil {
		return retInvalid
	}

	return onCI(false, h, func(n *sim.Node, ci nvml.ComputeInstance, k handleKey) C.int {
		in, ret := ci.GetInfo()
		*(*ciInfo)(info) = ciInfo{
			Device: gpuHandle(n, k.gpu), GpuInstance: handleFor(handleKey{kind: kindGI, gpu: k.gpu, gen: k.gen, gi: k.gi}),
			ID: in.Id, ProfileID: in.ProfileId, Placement: in.Placement,
		}

		return C.int(ret)
	})
}

//export nvmlComputeInstanceGetInfo_v2
func nvmlComputeInstanceGetInfo_v2(h unsafe.Pointer, info unsafe.Pointer) C.int {
	return computeInstanceInfo(h, info)
}

//export nvmlComputeInstanceGetInfo
func nvmlComputeInstanceGetInfo(h unsafe.Pointer, info unsafe.Pointer) C.int {
	return computeInstanceInfo(h, info)
}

//export nvmlComputeInstanceDestroy
func nvmlComputeInstanceDestroy(h unsafe.Pointer) C.int {
	return onCI(true, h, func(_ *sim.Node, ci nvml.ComputeInstance, _ handleKey) C.int {
		return C.int(ci.Destroy())
	})
}
