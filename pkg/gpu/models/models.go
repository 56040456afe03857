// Package models holds the MIG data of the GPU models this project knows offline, one JSON
// file per model under data/, each naming where its numbers come from. The offline planner
// (`mig plan`) and the simulated NVML both read these files, so they cannot disagree; on a
// node the planner asks NVML instead.
package models

import (
	"embed"
	"encoding/json"
	"fmt"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

//go:embed data/*.json
var files embed.FS

// How a model activates a new MIG mode (nvml.h, nvmlDeviceSetMigMode).
const (
	// ModeResetByNVML: SetMigMode resets an idle GPU itself (Hopper and later).
	ModeResetByNVML = "reset-by-nvml"
	// ModePendingUntilReset: the new mode stays pending until the GPU is reset (Ampere).
	ModePendingUntilReset = "pending-until-reset"
)

// GIProfile is one GPU-instance profile: what GetGpuInstanceProfileInfo(Index) and
// GetGpuInstancePossiblePlacements return, and the name nvidia-smi gives it.
type GIProfile struct {
	Index      int
	Name       string
	Info       nvml.GpuInstanceProfileInfo
	Placements []nvml.GpuInstancePlacement
}

// CIProfile is one compute-instance profile of a GPU instance of a given size.
type CIProfile struct {
	Index         int // nvml.COMPUTE_INSTANCE_PROFILE_*
	SliceCount    uint32
	InstanceCount uint32
	Starts        []uint32 // possible placements: start slice; the size is SliceCount
}

// Model is one GPU model's identity and MIG tables.
type Model struct {
	Key            string
	Name           string
	Source         string
	Architecture   nvml.DeviceArchitecture
	CudaMajor      int
	CudaMinor      int
	PciDeviceID    uint32
	PciSubsystemID uint32
	// AlsoPciDeviceIDs are other device ids that the sources give the same table (the GPU
	// Operator's file groups them so); the simulator reports PciDeviceID.
	AlsoPciDeviceIDs []uint32
	MemoryBytes      uint64
	// Unverified names each fact of the file that no source states for this product.
	Unverified []string
	// ModeChangeNeedsReset: SetMigMode only makes the mode pending and a GPU reset activates
	// it (Ampere).
	ModeChangeNeedsReset bool
	Profiles             []GIProfile
	// ComputeProfiles maps a GPU instance's slice count to the compute profiles it offers,
	// smallest first.
	ComputeProfiles map[uint32][]CIProfile
}

// ComputeSlices is the number of compute slices of the GPU: the slice count of its largest
// profile (7 on A100, H100, B200; 4 on A30 and RTX PRO 6000).
func (m *Model) ComputeSlices() uint32 {
	var n uint32
	for _, p := range m.Profiles {
		n = max(n, p.Info.SliceCount)
	}

	return n
}

// Profile returns the GPU-instance profile with NVML index idx.
func (m *Model) Profile(idx int) (GIProfile, bool) {
	for _, p := range m.Profiles {
		if p.Index == idx {
			return p, true
		}
	}

	return GIProfile{}, false
}

// file is the JSON form of a model.
type file struct {
	Key            string   `json:"key"`
	Name           string   `json:"name"`
	Architecture   string   `json:"architecture"`
	CudaCapability string   `json:"cudaComputeCapability"`
	PciDeviceID    string   `json:"pciDeviceId"`
	PciSubsystemID string   `json:"pciSubsystemId,omitempty"`
	AlsoPciDevices []string `json:"alsoPciDeviceIds,omitempty"`
	MemoryBytes    uint64   `json:"memoryBytes"`
	MigModeChange  string   `json:"migModeChange"`
	Source         string   `json:"source"`
	Unverified     []string `json:"unverified,omitempty"`
	GIProfiles     []struct {
		NvmlProfile   int        `json:"nvmlProfile"`
		ID            uint32     `json:"id"`
		Name          string     `json:"name"`
		SliceCount    uint32     `json:"sliceCount"`
		InstanceCount uint32     `json:"instanceCount"`
		MemoryMB      uint64     `json:"memoryMB"`
		SMs           uint32     `json:"multiprocessors"`
		CopyEngines   uint32     `json:"copyEngines"`
		Decoders      uint32     `json:"decoders"`
		Encoders      uint32     `json:"encoders"`
		Jpegs         uint32     `json:"jpegs"`
		Ofas          uint32     `json:"ofas"`
		Placements    [][]uint32 `json:"placements"`
	} `json:"gpuInstanceProfiles"`
	CISource   string `json:"computeInstanceProfilesSource"`
	CIProfiles map[string][]struct {
		NvmlProfile   int      `json:"nvmlProfile"`
		SliceCount    uint32   `json:"sliceCount"`
		InstanceCount uint32   `json:"instanceCount"`
		Placements    []uint32 `json:"placements"`
	} `json:"computeInstanceProfiles"`
}

var architectures = map[string]nvml.DeviceArchitecture{
	"ampere": nvml.DEVICE_ARCH_AMPERE, "hopper": nvml.DEVICE_ARCH_HOPPER, "blackwell": nvml.DEVICE_ARCH_BLACKWELL,
}

// Keys lists the known models, sorted.
func Keys() []string {
	entries, _ := files.ReadDir("data") // embedded: cannot fail

	keys := make([]string, 0, len(entries))
	for _, e := range entries {
		keys = append(keys, strings.TrimSuffix(e.Name(), ".json"))
	}

	sort.Strings(keys)

	return keys
}

// Lookup loads one model by key.
func Lookup(key string) (Model, error) {
	data, err := files.ReadFile(path.Join("data", key+".json"))
	if err != nil {
		return Model{}, fmt.Errorf("unknown GPU model %q (known: %s)", key, strings.Join(Keys(), ", "))
	}

	m, err := parse(data)
	if err != nil {
		return Model{}, fmt.Errorf("GPU model data %s.json: %w", key, err)
	}

	if m.Key != key {
		return Model{}, fmt.Errorf("GPU model data %s.json: key is %q", key, m.Key)
	}

	return m, nil
}

// ByPCIID returns the known model with this PCI device id (device<<16 | vendor).
func ByPCIID(id uint32) (Model, bool) {
	m, ok := All()[id]

	return m, ok
}

// All returns every known model by PCI device id (its own and the ones it shares a table
// with), each file read once.
func All() map[uint32]Model {
	out := map[uint32]Model{}

	for _, k := range Keys() {
		if m, err := Lookup(k); err == nil {
			out[m.PciDeviceID] = m
			for _, id := range m.AlsoPciDeviceIDs {
				out[id] = m
			}
		}
	}

	return out
}

func parse(data []byte) (Model, error) {
	var f file

	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()

	if err := dec.Decode(&f); err != nil {
		return Model{}, err
	}

	arch, ok := architectures[f.Architecture]
	if !ok {
		return Model{}, fmt.Errorf("architecture %q unknown", f.Architecture)
	}

	major, minor, ok := strings.Cut(f.CudaCapability, ".")
	cmaj, err1 := strconv.Atoi(major)
	cmin, err2 := strconv.Atoi(minor)

	if !ok || err1 != nil || err2 != nil {
		return Model{}, fmt.Errorf("cudaComputeCapability %q is not MAJOR.MINOR", f.CudaCapability)
	}

	dev, err := pciID(f.PciDeviceID)
	if err != nil {
		return Model{}, fmt.Errorf("pciDeviceId: %w", err)
	}

	// A model's sources do not always name its subsystem id: 0 then.
	var sub uint32
	if f.PciSubsystemID != "" {
		if sub, err = pciID(f.PciSubsystemID); err != nil {
			return Model{}, fmt.Errorf("pciSubsystemId: %w", err)
		}
	}

	var also []uint32

	for _, s := range f.AlsoPciDevices {
		id, err := pciID(s)
		if err != nil {
			return Model{}, fmt.Errorf("alsoPciDeviceIds: %w", err)
		}

		also = append(also, id)
	}

	if f.MigModeChange != ModeResetByNVML && f.MigModeChange != ModePendingUntilReset {
		return Model{}, fmt.Errorf("migModeChange %q: want %s or %s", f.MigModeChange, ModeResetByNVML, ModePendingUntilReset)
	}

	if f.Source == "" || f.CISource == "" {
		return Model{}, fmt.Errorf("source and computeInstanceProfilesSource are required")
	}

	m := Model{
		Key: f.Key, Name: f.Name, Source: f.Source, Architecture: arch, CudaMajor: cmaj, CudaMinor: cmin,
		PciDeviceID: dev, PciSubsystemID: sub, AlsoPciDeviceIDs: also, MemoryBytes: f.MemoryBytes, Unverified: f.Unverified,
		ModeChangeNeedsReset: f.MigModeChange == ModePendingUntilReset,
		ComputeProfiles:      map[uint32][]CIProfile{},
	}

	for _, p := range f.GIProfiles {
		gp := GIProfile{Index: p.NvmlProfile, Name: p.Name, Info: nvml.GpuInstanceProfileInfo{
			Id: p.ID, SliceCount: p.SliceCount, InstanceCount: p.InstanceCount, MultiprocessorCount: p.SMs,
			CopyEngineCount: p.CopyEngines, DecoderCount: p.Decoders, EncoderCount: p.Encoders,
			JpegCount: p.Jpegs, OfaCount: p.Ofas, MemorySizeMB: p.MemoryMB,
		}}

		for _, pl := range p.Placements {
			if len(pl) != 2 {
				return Model{}, fmt.Errorf("profile %s: placement %v is not [start, size]", p.Name, pl)
			}

			gp.Placements = append(gp.Placements, nvml.GpuInstancePlacement{Start: pl[0], Size: pl[1]})
		}

		m.Profiles = append(m.Profiles, gp)

		if _, ok := f.CIProfiles[strconv.Itoa(int(p.SliceCount))]; !ok {
			return Model{}, fmt.Errorf("profile %s: no compute profiles for %d-slice GPU instances", p.Name, p.SliceCount)
		}
	}

	for size, cps := range f.CIProfiles {
		g, err := strconv.Atoi(size)
		if err != nil || g < 1 {
			return Model{}, fmt.Errorf("computeInstanceProfiles: %q is not a slice count", size)
		}

		for _, c := range cps {
			m.ComputeProfiles[uint32(g)] = append(m.ComputeProfiles[uint32(g)], CIProfile{
				Index: c.NvmlProfile, SliceCount: c.SliceCount, InstanceCount: c.InstanceCount, Starts: c.Placements,
			})
		}
	}

	return m, nil
}

func pciID(s string) (uint32, error) {
	if !strings.HasPrefix(s, "0x") {
		return 0, fmt.Errorf("%q: want 0x and 8 hex digits", s)
	}

	v, err := strconv.ParseUint(s[2:], 16, 32)
	if err != nil {
		return 0, fmt.Errorf("%q: %w", s, err)
	}

	return uint32(v), nil
}
