package sim

import (
	"fmt"
	"sort"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// MemorySlices is the number of memory slices a placement is counted in on
// every model simulated here; ComputeSlices is how many compute slices exist.
const (
	MemorySlices  = 8
	ComputeSlices = 7
)

// GIProfile is one GPU-instance profile of a model: what
// GetGpuInstanceProfileInfo(Index) returns, and its possible placements.
type GIProfile struct {
	Index      int // NVML profile index (nvml.GPU_INSTANCE_PROFILE_*)
	Info       nvml.GpuInstanceProfileInfo
	Placements []nvml.GpuInstancePlacement
}

// ModelSpec describes one simulated GPU model.
type ModelSpec struct {
	Key            string // CLI name: a100-40gb, a100-80gb, h100-80gb, h200
	Name           string // what GetName returns
	Architecture   nvml.DeviceArchitecture
	CudaMajor      int
	CudaMinor      int
	PciDeviceID    uint32
	PciSubsystemID uint32
	MemoryBytes    uint64
	// ModeChangeNeedsReset: SetMigMode only makes the mode pending, a GPU
	// reset activates it (Ampere, or any GPU passed through to a VM).
	ModeChangeNeedsReset bool
	Profiles             []GIProfile
}

// Profile returns the profile with NVML index idx.
func (m *ModelSpec) Profile(idx int) (GIProfile, bool) {
	for _, p := range m.Profiles {
		if p.Index == idx {
			return p, true
		}
	}

	return GIProfile{}, false
}

func (m *ModelSpec) profileByID(id uint32) (GIProfile, bool) {
	for _, p := range m.Profiles {
		if p.Info.Id == id {
			return p, true
		}
	}

	return GIProfile{}, false
}

func placements(size uint32, starts ...uint32) []nvml.GpuInstancePlacement {
	out := make([]nvml.GpuInstancePlacement, 0, len(starts))
	for _, s := range starts {
		out = append(out, nvml.GpuInstancePlacement{Start: s, Size: size})
	}

	return out
}

// gi builds a profile; engines are copy engines, decoders, encoders, jpegs, ofas.
func gi(idx int, id, slices, count, sms uint32, memMB uint64, ce, dec, enc, jpg, ofa uint32, p []nvml.GpuInstancePlacement) GIProfile {
	return GIProfile{
		Index: idx,
		Info: nvml.GpuInstanceProfileInfo{
			Id: id, SliceCount: slices, InstanceCount: count, MultiprocessorCount: sms,
			CopyEngineCount: ce, DecoderCount: dec, EncoderCount: enc, JpegCount: jpg, OfaCount: ofa,
			MemorySizeMB: memMB,
		},
		Placements: p,
	}
}

// All four models share the GA100/GH100 slice geometry (NVIDIA MIG user
// guide, "Supported MIG Profiles"; the H200 one is read from a real GPU).
var (
	p1  = placements(1, 0, 1, 2, 3, 4, 5, 6)
	p1w = placements(2, 0, 2, 4, 6) // 1g with two memory slices
	p2  = placements(2, 0, 2, 4)
	p3  = placements(4, 0, 4)
	p4  = placements(4, 0)
	p7  = placements(8, 0)
)

const mib = 1024 * 1024

func models() []ModelSpec {
	return []ModelSpec{
		{
			Key: "a100-40gb", Name: "NVIDIA A100-SXM4-40GB", Architecture: nvml.DEVICE_ARCH_AMPERE,
			CudaMajor: 8, CudaMinor: 0, PciDeviceID: 0x20B010DE, PciSubsystemID: 0x134F10DE,
			MemoryBytes: 40960 * mib, ModeChangeNeedsReset: true,
			Profiles: []GIProfile{
				gi(nvml.GPU_INSTANCE_PROFILE_1_SLICE, 19, 1, 7, 14, 4864, 1, 0, 0, 0, 0, p1),
				gi(nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, 1, 1, 14, 4864, 1, 1, 0, 1, 1, p1),
				gi(nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, 1, 4, 14, 9856, 1, 1, 0, 0, 0, p1w),
				gi(nvml.GPU_INSTANCE_PROFILE_2_SLICE, 14, 2, 3, 28, 9856, 2, 1, 0, 0, 0, p2),
				gi(nvml.GPU_INSTANCE_PROFILE_3_SLICE, 9, 3, 2, 42, 19968, 3, 2, 0, 0, 0, p3),
				gi(nvml.GPU_INSTANCE_PROFILE_4_SLICE, 5, 4, 1, 56, 19968, 4, 2, 0, 0, 0, p4),
				gi(nvml.GPU_INSTANCE_PROFILE_7_SLICE, 0, 7, 1, 98, 40192, 7, 5, 0, 1, 1, p7),
			},
		},
		{
			Key: "a100-80gb", Name: "NVIDIA A100-SXM4-80GB", Architecture: nvml.DEVICE_ARCH_AMPERE,
			CudaMajor: 8, CudaMinor: 0, PciDeviceID: 0x20B210DE, PciSubsystemID: 0x147F10DE,
			MemoryBytes: 81920 * mib, ModeChangeNeedsReset: true,
			Profiles: []GIProfile{
				gi(nvml.GPU_INSTANCE_PROFILE_1_SLICE, 19, 1, 7, 14, 9856, 1, 0, 0, 0, 0, p1),
				gi(nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, 1, 1, 14, 9856, 1, 1, 0, 1, 1, p1),
				gi(nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, 1, 4, 14, 19968, 1, 1, 0, 0, 0, p1w),
				gi(nvml.GPU_INSTANCE_PROFILE_2_SLICE, 14, 2, 3, 28, 19968, 2, 1, 0, 0, 0, p2),
				gi(nvml.GPU_INSTANCE_PROFILE_3_SLICE, 9, 3, 2, 42, 40192, 3, 2, 0, 0, 0, p3),
				gi(nvml.GPU_INSTANCE_PROFILE_4_SLICE, 5, 4, 1, 56, 40192, 4, 2, 0, 0, 0, p4),
				gi(nvml.GPU_INSTANCE_PROFILE_7_SLICE, 0, 7, 1, 98, 80384, 7, 5, 0, 1, 1, p7),
			},
		},
		{
			Key: "h100-80gb", Name: "NVIDIA H100 80GB HBM3", Architecture: nvml.DEVICE_ARCH_HOPPER,
			CudaMajor: 9, CudaMinor: 0, PciDeviceID: 0x233010DE, PciSubsystemID: 0x16C110DE,
			MemoryBytes: 81920 * mib,
			Profiles: []GIProfile{
				gi(nvml.GPU_INSTANCE_PROFILE_1_SLICE, 19, 1, 7, 16, 10240, 1, 1, 0, 1, 0, p1),
				gi(nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, 1, 1, 16, 10240, 1, 1, 0, 1, 1, p1),
				gi(nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, 1, 4, 26, 20480, 1, 1, 0, 1, 0, p1w),
				gi(nvml.GPU_INSTANCE_PROFILE_2_SLICE, 14, 2, 3, 32, 20480, 2, 2, 0, 2, 0, p2),
				gi(nvml.GPU_INSTANCE_PROFILE_3_SLICE, 9, 3, 2, 60, 40960, 3, 3, 0, 3, 0, p3),
				gi(nvml.GPU_INSTANCE_PROFILE_4_SLICE, 5, 4, 1, 64, 40960, 4, 4, 0, 4, 0, p4),
				gi(nvml.GPU_INSTANCE_PROFILE_7_SLICE, 0, 7, 1, 132, 81920, 8, 7, 0, 7, 1, p7),
			},
		},
		{
			// Read from a real H200 (fixtures/h200-mig.json, driver 580.159.04).
			Key: "h200", Name: "NVIDIA H200", Architecture: nvml.DEVICE_ARCH_HOPPER,
			CudaMajor: 9, CudaMinor: 0, PciDeviceID: 0x233510DE, PciSubsystemID: 0x18BF10DE,
			MemoryBytes: 150754820096,
			Profiles: []GIProfile{
				gi(nvml.GPU_INSTANCE_PROFILE_1_SLICE, 19, 1, 7, 16, 16384, 1, 1, 0, 1, 0, p1),
				gi(nvml.GPU_INSTANCE_PROFILE_2_SLICE, 14, 2, 3, 32, 33280, 2, 2, 0, 2, 0, p2),
				gi(nvml.GPU_INSTANCE_PROFILE_3_SLICE, 9, 3, 2, 60, 71424, 3, 3, 0, 3, 0, p3),
				gi(nvml.GPU_INSTANCE_PROFILE_4_SLICE, 5, 4, 1, 64, 71424, 4, 4, 0, 4, 0, p4),
				gi(nvml.GPU_INSTANCE_PROFILE_7_SLICE, 0, 7, 1, 132, 143360, 8, 7, 0, 7, 1, p7),
				gi(nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, 1, 1, 16, 16384, 1, 1, 0, 1, 1, p1),
				gi(nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, 1, 4, 26, 33280, 1, 1, 0, 1, 0, p1w),
			},
		},
	}
}

// Models lists the keys of the simulated models, sorted.
func Models() []string {
	var keys []string
	for _, m := range models() {
		keys = append(keys, m.Key)
	}

	sort.Strings(keys)

	return keys
}

// LookupModel returns the spec of a model by key.
func LookupModel(key string) (ModelSpec, error) {
	for _, m := range models() {
		if m.Key == key {
			return m, nil
		}
	}

	return ModelSpec{}, fmt.Errorf("unknown GPU model %q (known: %v)", key, Models())
}

// ciSizes are the compute-instance sizes a GPU instance of g slices offers
// (MIG user guide; go-nvml mock/gpus agrees).
func ciSizes(g uint32) []uint32 {
	switch g {
	case 1:
		return []uint32{1}
	case 2:
		return []uint32{1, 2}
	case 3:
		return []uint32{1, 2, 3}
	case 4:
		return []uint32{1, 2, 4}
	case 7:
		return []uint32{1, 2, 3, 4, 7}
	}

	return nil
}

// ciIndexForSize maps a compute-slice count to its NVML CI profile index.
func ciIndexForSize(s uint32) int {
	switch s {
	case 1:
		return nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE
	case 2:
		return nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE
	case 3:
		return nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE
	case 4:
		return nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE
	case 7:
		return nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE
	}

	return -1
}

func ciSizeForIndex(idx int) uint32 {
	switch idx {
	case nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE:
		return 1
	case nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE:
		return 2
	case nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE:
		return 3
	case nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE:
		return 4
	case nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE:
		return 7
	}

	return 0
}
