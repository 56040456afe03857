package sim

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/talos-nvidia/nvidia-driver/pkg/gpu/models"
)

// Device is a handle to a whole simulated GPU. A handle taken before a reset
// of its GPU is stale afterwards (ERROR_GPU_IS_LOST), as after a real reset:
// callers must look handles up again.
type Device struct {
	*mock.Device

	n   *Node
	g   *gpu
	gen int
}

var _ nvml.Device = (*Device)(nil)

// begin locks the node, enters the call and checks the handle; end unlocks.
func (d *Device) begin(method string) nvml.Return { return d.beginAs("Device." + method) }

func (d *Device) beginAs(method string) nvml.Return {
	d.n.mu.Lock()

	if ret := d.n.check(method, d.g.index); ret != nvml.SUCCESS {
		return ret
	}

	if d.gen != d.g.generation {
		return nvml.ERROR_GPU_IS_LOST
	}

	return nvml.SUCCESS
}

func (d *Device) end() { d.n.mu.Unlock() }

func (d *Device) GetIndex() (int, nvml.Return) {
	defer d.end()
	if ret := d.begin("GetIndex"); ret != nvml.SUCCESS {
		return 0, ret
	}

	return d.g.index, nvml.SUCCESS
}

func (d *Device) GetName() (string, nvml.Return) {
	defer d.end()
	if ret := d.begin("GetName"); ret != nvml.SUCCESS {
		return "", ret
	}

	return d.g.model.Name, nvml.SUCCESS
}

func (d *Device) GetUUID() (string, nvml.Return) {
	defer d.end()
	if ret := d.begin("GetUUID"); ret != nvml.SUCCESS {
		return "", ret
	}

	return d.g.uuid, nvml.SUCCESS
}

func (d *Device) GetMinorNumber() (int, nvml.Return) {
	defer d.end()
	if ret := d.begin("GetMinorNumber"); ret != nvml.SUCCESS {
		return 0, ret
	}

	return d.g.minor, nvml.SUCCESS
}

func toInt8(s string, out []int8) {
	for i := 0; i < len(s) && i < len(out)-1; i++ {
		out[i] = int8(s[i])
	}
}

func (d *Device) GetPciInfo() (nvml.PciInfo, nvml.Return) {
	defer d.end()
	if ret := d.begin("GetPciInfo"); ret != nvml.SUCCESS {
		return nvml.PciInfo{}, ret
	}

	var info nvml.PciInfo

	toInt8(d.g.busID, info.BusId[:])
	toInt8(d.g.busID[4:], info.BusIdLegacy[:])

	var bus uint32
	_, _ = fmt.Sscanf(d.g.busID, "00000000:%02X:00.0", &bus)
	info.Bus = bus
	info.PciDeviceId = d.g.model.PciDeviceID
	info.PciSubSystemId = d.g.model.PciSubsystemID

	return info, nvml.SUCCESS
}

func (d *Device) GetMemoryInfo() (nvml.Memory, nvml.Return) {
	defer d.end()
	if ret := d.begin("GetMemoryInfo"); ret != nvml.SUCCESS {
		return nvml.Memory{}, ret
	}

	var used uint64
	for _, p := range d.g.processes {
		used += p.UsedGpuMemory
	}

	total := d.g.model.MemoryBytes

	return nvml.Memory{Total: total, Used: used, Free: total - used}, nvml.SUCCESS
}

func (d *Device) GetCudaComputeCapability() (int, int, nvml.Return) {
	defer d.end()
	if ret := d.begin("GetCudaComputeCapability"); ret != nvml.SUCCESS {
		return 0, 0, ret
	}

	return d.g.model.CudaMajor, d.g.model.CudaMinor, nvml.SUCCESS
}

func (d *Device) GetArchitecture() (nvml.DeviceArchitecture, nvml.Return) {
	defer d.end()
	if ret := d.begin("GetArchitecture"); ret != nvml.SUCCESS {
		return 0, ret
	}

	return d.g.model.Architecture, nvml.SUCCESS
}

func (d *Device) GetBrand() (nvml.BrandType, nvml.Return) {
	defer d.end()
	if ret := d.begin("GetBrand"); ret != nvml.SUCCESS {
		return 0, ret
	}

	return nvml.BRAND_NVIDIA, nvml.SUCCESS
}

func (d *Device) IsMigDeviceHandle() (bool, nvml.Return) {
	defer d.end()
	if ret := d.begin("IsMigDeviceHandle"); ret != nvml.SUCCESS {
		return false, ret
	}

	return false, nvml.SUCCESS
}

// Not simulated; NVML answers so on GPUs without these features.
func (d *Device) GetAddressingMode() (nvml.DeviceAddressingMode, nvml.Return) {
	return nvml.DeviceAddressingMode{}, nvml.ERROR_NOT_SUPPORTED
}

// GetGpuFabricInfo reports the GPU's registration with an NVSwitch fabric (see Fabric), or
// ERROR_NOT_SUPPORTED on a node without one, as NVML does for a GPU that has no fabric.
func (d *Device) GetGpuFabricInfo() (nvml.GpuFabricInfo, nvml.Return) {
	defer d.end()
	if ret := d.begin("GetGpuFabricInfo"); ret != nvml.SUCCESS {
		return nvml.GpuFabricInfo{}, ret
	}

	return d.n.fabricInfo()
}

func (d *Device) GetComputeRunningProcesses() ([]nvml.ProcessInfo, nvml.Return) {
	defer d.end()
	if ret := d.begin("GetComputeRunningProcesses"); ret != nvml.SUCCESS {
		return nil, ret
	}

	return append([]nvml.ProcessInfo(nil), d.g.processes...), nvml.SUCCESS
}

// GetMigMode returns the current and the pending mode: nvml.h (nvmlDeviceGetMigMode) says the
// pending one "refers to the target mode following the next activation trigger" (a reset, a
// reboot), and it survives a reboot; see Reboot.
func (d *Device) GetMigMode() (int, int, nvml.Return) {
	defer d.end()
	if ret := d.begin("GetMigMode"); ret != nvml.SUCCESS {
		return 0, 0, ret
	}

	return d.g.mode, d.g.pending, nvml.SUCCESS
}

// SetMigMode follows nvml.h (go-nvml v0.13.4-1 gen/nvml/nvml.h, nvmlDeviceSetMigMode): the
// requested mode becomes the pending one at once (what nvmlDeviceGetMigMode reports as
// pendingMode); activating it may reset the device, so handles go stale and minors may
// change. activationStatus is ERROR_RESET_REQUIRED where this call does not reset (Ampere;
// pass-through, where a VM reboot is needed) and ERROR_IN_USE where unbinding fails because
// the device is not idle (a client holds it open): "the caller is expected to idle the
// device and retry". In both cases the current mode stays and the call itself succeeds.
func (d *Device) SetMigMode(mode int) (nvml.Return, nvml.Return) {
	defer d.end()
	if ret := d.begin("SetMigMode"); ret != nvml.SUCCESS {
		return ret, ret
	}

	if mode != nvml.DEVICE_MIG_DISABLE && mode != nvml.DEVICE_MIG_ENABLE {
		return nvml.ERROR_INVALID_ARGUMENT, nvml.ERROR_INVALID_ARGUMENT
	}

	if len(d.g.gis) > 0 {
		// GPU instances must be destroyed first (mig-parted does so before any mode change).
		return nvml.ERROR_IN_USE, nvml.ERROR_IN_USE
	}

	d.g.pending = mode

	switch {
	case d.g.mode == mode:
		return nvml.SUCCESS, nvml.SUCCESS
	case d.n.passThrough || d.g.model.ModeChangeNeedsReset:
		return nvml.ERROR_RESET_REQUIRED, nvml.SUCCESS
	case d.n.held(d.g):
		return nvml.ERROR_IN_USE, nvml.SUCCESS
	}

	d.n.resetLocked(d.g)

	return nvml.SUCCESS, nvml.SUCCESS
}

func (d *Device) GetGpuInstanceProfileInfo(idx int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
	defer d.end()
	if ret := d.begin("GetGpuInstanceProfileInfo"); ret != nvml.SUCCESS {
		return nvml.GpuInstanceProfileInfo{}, ret
	}

	// The last index go-nvml v0.13.4-1 knows (17, 3_SLICE_GFX) is past what driver 580 knows:
	// the real H200 answers INVALID_ARGUMENT there, ending the enumeration nvml.h describes
	// (fixtures/h200-mig.json, nvmlProfilesInvalidArgument); NOT_SUPPORTED below it.
	if idx < 0 || idx >= nvml.GPU_INSTANCE_PROFILE_COUNT-1 {
		return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
	}

	p, ok := d.g.model.Profile(idx)
	if !ok {
		return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
	}

	return p.Info, nvml.SUCCESS
}

func (d *Device) GetGpuInstancePossiblePlacements(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
	defer d.end()
	if ret := d.begin("GetGpuInstancePossiblePlacements"); ret != nvml.SUCCESS {
		return nil, ret
	}

	if info == nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}

	p, ok := profileByID(&d.g.model, info.Id)
	if !ok {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}

	return append([]nvml.GpuInstancePlacement(nil), p.Placements...), nvml.SUCCESS
}

// fits says whether a GI of profile p can be created at pl now.
func (g *gpu) fits(p GIProfile, pl nvml.GpuInstancePlacement) nvml.Return {
	valid := false
	for _, c := range p.Placements {
		if c == pl {
			valid = true
		}
	}

	if !valid {
		return nvml.ERROR_INVALID_ARGUMENT
	}

	count := uint32(0)
	compute := p.Info.SliceCount

	for _, s := range g.gis {
		if s.profile.Info.Id == p.Info.Id {
			count++
		}

		compute += s.profile.Info.SliceCount

		if pl.Start < s.placement.Start+s.placement.Size && s.placement.Start < pl.Start+pl.Size {
			return nvml.ERROR_INSUFFICIENT_RESOURCES
		}
	}

	if count >= p.Info.InstanceCount || compute > g.model.ComputeSlices() {
		return nvml.ERROR_INSUFFICIENT_RESOURCES
	}

	return nvml.SUCCESS
}

func (d *Device) GetGpuInstanceRemainingCapacity(info *nvml.GpuInstanceProfileInfo) (int, nvml.Return) {
	defer d.end()
	if ret := d.begin("GetGpuInstanceRemainingCapacity"); ret != nvml.SUCCESS {
		return 0, ret
	}

	if d.g.mode != nvml.DEVICE_MIG_ENABLE {
		return 0, nvml.ERROR_NOT_SUPPORTED
	}

	p, ok := profileByID(&d.g.model, info.Id)
	if !ok {
		return 0, nvml.ERROR_INVALID_ARGUMENT
	}

	free := 0
	for _, pl := range p.Placements {
		if d.g.fits(p, pl) == nvml.SUCCESS {
			free++
		}
	}

	return free, nvml.SUCCESS
}

func (d *Device) create(p GIProfile, pl nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
	if ret := d.g.fits(p, pl); ret != nvml.SUCCESS {
		return nil, ret
	}

	id := 1
	for d.g.gis[id] != nil {
		id++
	}

	d.g.gis[id] = &giState{id: id, profile: p, placement: pl, cis: map[int]*ciState{}}

	return &GpuInstance{GpuInstance: &mock.GpuInstance{}, d: d, id: id}, nvml.SUCCESS
}

// CreateGpuInstance places the instance at the first free placement, as
// NVML's own choice can: this fragments a GPU, which is why a planner must
// pass placements.
func (d *Device) CreateGpuInstance(info *nvml.GpuInstanceProfileInfo) (nvml.GpuInstance, nvml.Return) {
	defer d.end()
	if ret := d.begin("CreateGpuInstance"); ret != nvml.SUCCESS {
		return nil, ret
	}

	if d.g.mode != nvml.DEVICE_MIG_ENABLE {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}

	p, ok := profileByID(&d.g.model, info.Id)
	if !ok {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}

	for _, pl := range p.Placements {
		if d.g.fits(p, pl) == nvml.SUCCESS {
			return d.create(p, pl)
		}
	}

	return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
}

func (d *Device) CreateGpuInstanceWithPlacement(info *nvml.GpuInstanceProfileInfo, pl *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
	defer d.end()
	if ret := d.begin("CreateGpuInstanceWithPlacement"); ret != nvml.SUCCESS {
		return nil, ret
	}

	if d.g.mode != nvml.DEVICE_MIG_ENABLE {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}

	p, ok := profileByID(&d.g.model, info.Id)
	if !ok || pl == nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}

	return d.create(p, *pl)
}

func (d *Device) GetGpuInstances(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstance, nvml.Return) {
	defer d.end()
	if ret := d.begin("GetGpuInstances"); ret != nvml.SUCCESS {
		return nil, ret
	}

	if d.g.mode != nvml.DEVICE_MIG_ENABLE {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}

	var out []nvml.GpuInstance

	for _, id := range d.g.giIDs() {
		if d.g.gis[id].profile.Info.Id == info.Id {
			out = append(out, &GpuInstance{GpuInstance: &mock.GpuInstance{}, d: d, id: id})
		}
	}

	return out, nvml.SUCCESS
}

func (d *Device) GetGpuInstanceById(id int) (nvml.GpuInstance, nvml.Return) {
	defer d.end()
	if ret := d.begin("GetGpuInstanceById"); ret != nvml.SUCCESS {
		return nil, ret
	}

	if d.g.gis[id] == nil {
		return nil, nvml.ERROR_NOT_FOUND
	}

	return &GpuInstance{GpuInstance: &mock.GpuInstance{}, d: d, id: id}, nvml.SUCCESS
}

func (d *Device) GetMaxMigDeviceCount() (int, nvml.Return) {
	defer d.end()
	if ret := d.begin("GetMaxMigDeviceCount"); ret != nvml.SUCCESS {
		return 0, ret
	}

	if d.g.mode != nvml.DEVICE_MIG_ENABLE {
		return 0, nvml.SUCCESS
	}

	return int(d.g.model.ComputeSlices()), nvml.SUCCESS
}

func (d *Device) GetMigDeviceHandleByIndex(i int) (nvml.Device, nvml.Return) {
	defer d.end()
	if ret := d.begin("GetMigDeviceHandleByIndex"); ret != nvml.SUCCESS {
		return nil, ret
	}

	if d.g.mode != nvml.DEVICE_MIG_ENABLE || i < 0 || i >= int(d.g.model.ComputeSlices()) {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}

	mds := d.n.migDevices(d.g)
	if i >= len(mds) {
		return nil, nvml.ERROR_NOT_FOUND
	}

	return mds[i], nvml.SUCCESS
}

// migDevices lists the MIG devices of g in (GI id, CI id) order. Callers hold n.mu.
func (n *Node) migDevices(g *gpu) []*MigDevice {
	var out []*MigDevice

	for _, gid := range g.giIDs() {
		for _, cid := range g.gis[gid].ciIDs() {
			out = append(out, &MigDevice{Device: &mock.Device{}, parent: n.handle(g), gi: gid, ci: cid})
		}
	}

	return out
}

// MigDevice is a handle to one compute instance seen as a device.
type MigDevice struct {
	*mock.Device

	parent *Device
	gi, ci int
}

var _ nvml.Device = (*MigDevice)(nil)

func (m *MigDevice) begin(method string) (*giState, *ciState, nvml.Return) {
	d := m.parent
	if ret := d.beginAs("MigDevice." + method); ret != nvml.SUCCESS {
		return nil, nil, ret
	}

	gs := d.g.gis[m.gi]
	if gs == nil || gs.cis[m.ci] == nil {
		return nil, nil, nvml.ERROR_NOT_FOUND
	}

	return gs, gs.cis[m.ci], nvml.SUCCESS
}

func (m *MigDevice) uuid() string {
	return fmt.Sprintf("MIG-5a1a0000-%04x-4000-8000-%04x%04x%04x", m.parent.g.index, m.parent.g.generation, m.gi, m.ci)
}

func (m *MigDevice) IsMigDeviceHandle() (bool, nvml.Return) { return true, nvml.SUCCESS }

func (m *MigDevice) GetDeviceHandleFromMigDeviceHandle() (nvml.Device, nvml.Return) {
	defer m.parent.end()
	if _, _, ret := m.begin("GetDeviceHandleFromMigDeviceHandle"); ret != nvml.SUCCESS {
		return nil, ret
	}

	return m.parent, nvml.SUCCESS
}

func (m *MigDevice) GetGpuInstanceId() (int, nvml.Return) {
	defer m.parent.end()
	if _, _, ret := m.begin("GetGpuInstanceId"); ret != nvml.SUCCESS {
		return 0, ret
	}

	return m.gi, nvml.SUCCESS
}

func (m *MigDevice) GetComputeInstanceId() (int, nvml.Return) {
	defer m.parent.end()
	if _, _, ret := m.begin("GetComputeInstanceId"); ret != nvml.SUCCESS {
		return 0, ret
	}

	return m.ci, nvml.SUCCESS
}

func (m *MigDevice) GetUUID() (string, nvml.Return) {
	defer m.parent.end()
	if _, _, ret := m.begin("GetUUID"); ret != nvml.SUCCESS {
		return "", ret
	}

	return m.uuid(), nvml.SUCCESS
}

func (m *MigDevice) GetName() (string, nvml.Return) {
	defer m.parent.end()

	gs, cs, ret := m.begin("GetName")
	if ret != nvml.SUCCESS {
		return "", ret
	}

	return m.parent.g.model.Name + " MIG " + profileName(gs.profile, cs.size), nvml.SUCCESS
}

func (m *MigDevice) GetMemoryInfo() (nvml.Memory, nvml.Return) {
	defer m.parent.end()

	gs, _, ret := m.begin("GetMemoryInfo")
	if ret != nvml.SUCCESS {
		return nvml.Memory{}, ret
	}

	total := gs.profile.Info.MemorySizeMB * mib

	return nvml.Memory{Total: total, Free: total}, nvml.SUCCESS
}

func (m *MigDevice) GetAttributes() (nvml.DeviceAttributes, nvml.Return) {
	defer m.parent.end()

	gs, cs, ret := m.begin("GetAttributes")
	if ret != nvml.SUCCESS {
		return nvml.DeviceAttributes{}, ret
	}

	info := gs.profile.Info

	return nvml.DeviceAttributes{
		MultiprocessorCount:       info.MultiprocessorCount * cs.size / info.SliceCount,
		SharedCopyEngineCount:     info.CopyEngineCount,
		SharedDecoderCount:        info.DecoderCount,
		SharedEncoderCount:        info.EncoderCount,
		SharedJpegCount:           info.JpegCount,
		SharedOfaCount:            info.OfaCount,
		GpuInstanceSliceCount:     info.SliceCount,
		ComputeInstanceSliceCount: cs.size,
		MemorySizeMB:              info.MemorySizeMB,
	}, nvml.SUCCESS
}

func (m *MigDevice) GetMinorNumber() (int, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }

func (m *MigDevice) GetArchitecture() (nvml.DeviceArchitecture, nvml.Return) {
	return m.parent.g.model.Architecture, nvml.SUCCESS
}

func (m *MigDevice) GetCudaComputeCapability() (int, int, nvml.Return) {
	return m.parent.g.model.CudaMajor, m.parent.g.model.CudaMinor, nvml.SUCCESS
}

func (m *MigDevice) GetBrand() (nvml.BrandType, nvml.Return) { return nvml.BRAND_NVIDIA, nvml.SUCCESS }

// profileName is the name of a compute instance of ciSize slices in a GPU instance of
// profile p, as nvidia-smi prints it: the data file's GPU-instance name, with <c>c. in front
// where the compute instance is smaller.
func profileName(p GIProfile, ciSize uint32) string {
	if ciSize != p.Info.SliceCount {
		return fmt.Sprintf("%dc.%s", ciSize, p.Name)
	}

	return p.Name
}

// GpuInstance is a handle to a simulated GPU instance.
type GpuInstance struct {
	*mock.GpuInstance

	d  *Device
	id int
}

var _ nvml.GpuInstance = (*GpuInstance)(nil)

func (gi *GpuInstance) begin(method string) (*giState, nvml.Return) {
	if ret := gi.d.beginAs("GpuInstance." + method); ret != nvml.SUCCESS {
		return nil, ret
	}

	s := gi.d.g.gis[gi.id]
	if s == nil {
		return nil, nvml.ERROR_NOT_FOUND
	}

	return s, nvml.SUCCESS
}

func (gi *GpuInstance) GetInfo() (nvml.GpuInstanceInfo, nvml.Return) {
	defer gi.d.end()

	s, ret := gi.begin("GetInfo")
	if ret != nvml.SUCCESS {
		return nvml.GpuInstanceInfo{}, ret
	}

	return nvml.GpuInstanceInfo{Device: gi.d, Id: uint32(s.id), ProfileId: s.profile.Info.Id, Placement: s.placement}, nvml.SUCCESS
}

// Destroy refuses while compute instances exist, like NVML.
func (gi *GpuInstance) Destroy() nvml.Return {
	defer gi.d.end()

	s, ret := gi.begin("Destroy")
	if ret != nvml.SUCCESS {
		return ret
	}

	if len(s.cis) > 0 {
		return nvml.ERROR_IN_USE
	}

	delete(gi.d.g.gis, gi.id)

	return nvml.SUCCESS
}

// ciInfo is what GetComputeInstanceProfileInfo returns for a compute profile of the model's
// data in this GPU instance; engines are shared with the GPU instance.
func ciInfo(s *giState, c models.CIProfile) nvml.ComputeInstanceProfileInfo {
	p := s.profile.Info

	return nvml.ComputeInstanceProfileInfo{
		Id: uint32(c.Index), SliceCount: c.SliceCount, InstanceCount: c.InstanceCount,
		MultiprocessorCount:   p.MultiprocessorCount * c.SliceCount / p.SliceCount,
		SharedCopyEngineCount: p.CopyEngineCount, SharedDecoderCount: p.DecoderCount,
		SharedEncoderCount: p.EncoderCount, SharedJpegCount: p.JpegCount, SharedOfaCount: p.OfaCount,
	}
}

// ciProfile finds the compute profile a caller passes back (by its id, as NVML does).
func (gi *GpuInstance) ciProfile(s *giState, info *nvml.ComputeInstanceProfileInfo) (models.CIProfile, bool) {
	if info == nil {
		return models.CIProfile{}, false
	}

	return ciProfile(&gi.d.g.model, s.profile.Info.SliceCount, int(info.Id))
}

func (gi *GpuInstance) GetComputeInstanceProfileInfo(profile, eng int) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
	defer gi.d.end()

	s, ret := gi.begin("GetComputeInstanceProfileInfo")
	if ret != nvml.SUCCESS {
		return nvml.ComputeInstanceProfileInfo{}, ret
	}

	if eng != nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED || profile < 0 || profile >= nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
	}

	c, ok := ciProfile(&gi.d.g.model, s.profile.Info.SliceCount, profile)
	if !ok {
		return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
	}

	return ciInfo(s, c), nvml.SUCCESS
}

// ciPlacements are the possible placements of a compute profile, from the model's data.
func ciPlacements(c models.CIProfile) []nvml.ComputeInstancePlacement {
	out := make([]nvml.ComputeInstancePlacement, 0, len(c.Starts))
	for _, start := range c.Starts {
		out = append(out, nvml.ComputeInstancePlacement{Start: start, Size: c.SliceCount})
	}

	return out
}

func (gi *GpuInstance) GetComputeInstancePossiblePlacements(info *nvml.ComputeInstanceProfileInfo) ([]nvml.ComputeInstancePlacement, nvml.Return) {
	defer gi.d.end()

	s, ret := gi.begin("GetComputeInstancePossiblePlacements")
	if ret != nvml.SUCCESS {
		return nil, ret
	}

	c, ok := gi.ciProfile(s, info)
	if !ok {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}

	return ciPlacements(c), nvml.SUCCESS
}

func ciFits(s *giState, p models.CIProfile, pl nvml.ComputeInstancePlacement) nvml.Return {
	valid := false
	for _, c := range ciPlacements(p) {
		if c == pl {
			valid = true
		}
	}

	if !valid {
		return nvml.ERROR_INVALID_ARGUMENT
	}

	for _, c := range s.cis {
		if pl.Start < c.placement.Start+c.placement.Size && c.placement.Start < pl.Start+pl.Size {
			return nvml.ERROR_INSUFFICIENT_RESOURCES
		}
	}

	return nvml.SUCCESS
}

func (gi *GpuInstance) createCI(s *giState, p models.CIProfile, pl nvml.ComputeInstancePlacement) (nvml.ComputeInstance, nvml.Return) {
	if ret := ciFits(s, p, pl); ret != nvml.SUCCESS {
		return nil, ret
	}

	id := 0
	for s.cis[id] != nil {
		id++
	}

	s.cis[id] = &ciState{id: id, size: p.SliceCount, placement: pl}

	return &ComputeInstance{ComputeInstance: &mock.ComputeInstance{}, gi: gi, id: id}, nvml.SUCCESS
}

func (gi *GpuInstance) CreateComputeInstance(info *nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return) {
	defer gi.d.end()

	s, ret := gi.begin("CreateComputeInstance")
	if ret != nvml.SUCCESS {
		return nil, ret
	}

	p, ok := gi.ciProfile(s, info)
	if !ok {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}

	for _, pl := range ciPlacements(p) {
		if ciFits(s, p, pl) == nvml.SUCCESS {
			return gi.createCI(s, p, pl)
		}
	}

	return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
}

func (gi *GpuInstance) CreateComputeInstanceWithPlacement(info *nvml.ComputeInstanceProfileInfo, pl *nvml.ComputeInstancePlacement) (nvml.ComputeInstance, nvml.Return) {
	defer gi.d.end()

	s, ret := gi.begin("CreateComputeInstanceWithPlacement")
	if ret != nvml.SUCCESS {
		return nil, ret
	}

	p, ok := gi.ciProfile(s, info)
	if !ok || pl == nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}

	return gi.createCI(s, p, *pl)
}

func (gi *GpuInstance) GetComputeInstanceRemainingCapacity(info *nvml.ComputeInstanceProfileInfo) (int, nvml.Return) {
	defer gi.d.end()

	s, ret := gi.begin("GetComputeInstanceRemainingCapacity")
	if ret != nvml.SUCCESS {
		return 0, ret
	}

	p, ok := gi.ciProfile(s, info)
	if !ok {
		return 0, nvml.ERROR_INVALID_ARGUMENT
	}

	free := 0
	for _, pl := range ciPlacements(p) {
		if ciFits(s, p, pl) == nvml.SUCCESS {
			free++
		}
	}

	return free, nvml.SUCCESS
}

func (gi *GpuInstance) GetComputeInstances(info *nvml.ComputeInstanceProfileInfo) ([]nvml.ComputeInstance, nvml.Return) {
	defer gi.d.end()

	s, ret := gi.begin("GetComputeInstances")
	if ret != nvml.SUCCESS {
		return nil, ret
	}

	var out []nvml.ComputeInstance

	for _, id := range s.ciIDs() {
		if info != nil && s.cis[id].size == info.SliceCount && ciProfileIDForSize(&gi.d.g.model, s.profile.Info.SliceCount, info.SliceCount) == info.Id {
			out = append(out, &ComputeInstance{ComputeInstance: &mock.ComputeInstance{}, gi: gi, id: id})
		}
	}

	return out, nvml.SUCCESS
}

func (gi *GpuInstance) GetComputeInstanceById(id int) (nvml.ComputeInstance, nvml.Return) {
	defer gi.d.end()

	s, ret := gi.begin("GetComputeInstanceById")
	if ret != nvml.SUCCESS {
		return nil, ret
	}

	if s.cis[id] == nil {
		return nil, nvml.ERROR_NOT_FOUND
	}

	return &ComputeInstance{ComputeInstance: &mock.ComputeInstance{}, gi: gi, id: id}, nvml.SUCCESS
}

// ComputeInstance is a handle to a simulated compute instance.
type ComputeInstance struct {
	*mock.ComputeInstance

	gi *GpuInstance
	id int
}

var _ nvml.ComputeInstance = (*ComputeInstance)(nil)

func (ci *ComputeInstance) begin(method string) (*giState, *ciState, nvml.Return) {
	d := ci.gi.d
	if ret := d.beginAs("ComputeInstance." + method); ret != nvml.SUCCESS {
		return nil, nil, ret
	}

	s := d.g.gis[ci.gi.id]
	if s == nil {
		return nil, nil, nvml.ERROR_NOT_FOUND
	}

	c := s.cis[ci.id]
	if c == nil {
		return nil, nil, nvml.ERROR_NOT_FOUND
	}

	return s, c, nvml.SUCCESS
}

func (ci *ComputeInstance) GetInfo() (nvml.ComputeInstanceInfo, nvml.Return) {
	defer ci.gi.d.end()

	s, c, ret := ci.begin("GetInfo")
	if ret != nvml.SUCCESS {
		return nvml.ComputeInstanceInfo{}, ret
	}

	return nvml.ComputeInstanceInfo{
		Device: ci.gi.d, GpuInstance: ci.gi, Id: uint32(c.id),
		ProfileId: ciProfileIDForSize(&ci.gi.d.g.model, s.profile.Info.SliceCount, c.size), Placement: c.placement,
	}, nvml.SUCCESS
}

// Destroy refuses while a process runs on this compute instance.
func (ci *ComputeInstance) Destroy() nvml.Return {
	defer ci.gi.d.end()

	s, c, ret := ci.begin("Destroy")
	if ret != nvml.SUCCESS {
		return ret
	}

	for _, p := range ci.gi.d.g.processes {
		if int(p.GpuInstanceId) == s.id && int(p.ComputeInstanceId) == c.id {
			return nvml.ERROR_IN_USE
		}
	}

	delete(s.cis, c.id)

	return nvml.SUCCESS
}
