// Package sim is a simulated NVML: a node of MIG-capable GPUs that enforces
// the real placement, overlap and capacity rules, the pending MIG mode of
// nvmlDeviceSetMigMode (Ampere, pass-through, a GPU held open), Hopper's reset
// on mode change, processes that hold a GPU open (written into a simulated
// /proc as the real kernel shows them), boards that cannot reset one GPU, a
// reboot (the mode survives, instances do not), fault injection on any call,
// and counters of the calls that change state. Its GPU models are the data
// files of pkg/gpu/models. It is for tests and the demo only.
//
// Node implements nvml.Interface. Methods it does not simulate fall through
// to go-nvml's mock types, which panic with the name of the missing method
// rather than with a bare nil dereference.
package sim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// Method names used by fault injection and call counters.
const (
	MSetMigMode                         = "Device.SetMigMode"
	MCreateGpuInstance                  = "Device.CreateGpuInstance"
	MCreateGpuInstanceWithPlacement     = "Device.CreateGpuInstanceWithPlacement"
	MCreateComputeInstance              = "GpuInstance.CreateComputeInstance"
	MCreateComputeInstanceWithPlacement = "GpuInstance.CreateComputeInstanceWithPlacement"
	MGpuInstanceDestroy                 = "GpuInstance.Destroy"
	MComputeInstanceDestroy             = "ComputeInstance.Destroy"
	MResetGPU                           = "Node.ResetGPU"
	// MResetGPUs is one reset of several GPUs at once (its mutating-call hook gets GPU -1).
	MResetGPUs = "Node.ResetGPUs"
)

// MutatingMethods are the calls that change GPU state.
var MutatingMethods = []string{
	MSetMigMode, MCreateGpuInstance, MCreateGpuInstanceWithPlacement, MCreateComputeInstance,
	MCreateComputeInstanceWithPlacement, MGpuInstanceDestroy, MComputeInstanceDestroy, MResetGPU, MResetGPUs,
}

func isMutating(method string) bool {
	for _, m := range MutatingMethods {
		if m == method {
			return true
		}
	}

	return false
}

// Fault makes a call fail. Method is a name such as "Device.GetMigMode" (the
// receiver type, a dot, the method; "Init" for Interface methods). GPU is the
// GPU index the call concerns, or -1 for any. Nth is which matching call
// (counted from injection, 1-based) fails first; Times how many fail from
// there (0 means 1). Ret is what the failing call returns.
type Fault struct {
	Method string
	GPU    int
	Nth    int
	Times  int
	Ret    nvml.Return

	seen int
	hits int
}

// Node is a simulated host with GPUs. It implements nvml.Interface.
type Node struct {
	*mock.Interface

	mu            sync.Mutex
	gpus          []*gpu
	faults        []*Fault
	calls         map[string]int
	initCount     int
	fabric        *fabric
	holders       []Holder
	onMutating    func(method string, gpu int)
	DriverVersion string
	CudaVersion   int

	// Board behaviour (see SetBoard).
	passThrough     bool
	noPerGPUReset   bool
	minorsMoveReset bool
	nextMinor       int
}

// Holder is a process that holds GPUs open through NVML without being a compute process:
// nvidia-persistenced, the device plugin, DCGM, GFD. NVML lists none of them in
// GetComputeRunningProcesses, but they keep a GPU from being unbound or reset; the kernel
// shows them in /proc/<pid>/fd as links to /dev/nvidiactl and /dev/nvidia<minor>.
type Holder struct {
	PID  int
	Name string // /proc/<pid>/comm
	GPUs []int  // indices of the GPUs it holds open
}

// Board says what kind of machine the GPUs sit in.
type Board struct {
	// PassThrough: the GPUs are passed through to a VM, which cannot reset them: SetMigMode's
	// activationStatus is ERROR_RESET_REQUIRED and only a (VM) reboot activates a mode.
	PassThrough bool
	// NoPerGPUReset: one GPU cannot be reset alone (NVSwitch boards such as HGX A100, where
	// `nvidia-smi -r -i N` refuses: the GPUs reset together).
	NoPerGPUReset bool
	// MinorsChangeOnReset: a reset gives the GPU a new minor number, which nvml.h allows
	// ("attributes associated with the device, such as minor number, might change").
	MinorsChangeOnReset bool
}

var _ nvml.Interface = (*Node)(nil)

type ciState struct {
	id        int
	size      uint32
	placement nvml.ComputeInstancePlacement
}

type giState struct {
	id        int
	profile   GIProfile
	placement nvml.GpuInstancePlacement
	cis       map[int]*ciState
}

type gpu struct {
	index      int
	model      ModelSpec
	uuid       string
	minor      int
	busID      string
	mode       int
	pending    int
	generation int // bumped on every reset: handles from before go stale
	gis        map[int]*giState
	processes  []nvml.ProcessInfo
	clients    int // open non-compute clients such as nvidia-persistenced
}

// New returns a node with count GPUs of one model.
func New(model ModelSpec, count int) *Node {
	models := make([]ModelSpec, count)
	for i := range models {
		models[i] = model
	}

	return NewNode(models...)
}

var busIDs = []uint32{0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD}

// NewNode returns a node with one GPU per model, indexed in order.
func NewNode(models ...ModelSpec) *Node {
	n := &Node{
		Interface:     &mock.Interface{},
		calls:         map[string]int{},
		DriverVersion: "580.159.04",
		CudaVersion:   13000,
	}

	for i, m := range models {
		bus := uint32(0x10 + i)
		if i < len(busIDs) {
			bus = busIDs[i]
		}

		n.gpus = append(n.gpus, &gpu{
			index:   i,
			model:   m,
			uuid:    fmt.Sprintf("GPU-5a1a0000-0000-4000-8000-%012x", i),
			minor:   i,
			busID:   fmt.Sprintf("00000000:%02X:00.0", bus),
			mode:    nvml.DEVICE_MIG_DISABLE,
			pending: nvml.DEVICE_MIG_DISABLE,
			gis:     map[int]*giState{},
		})
	}

	return n
}

// SetBoard sets what kind of machine the GPUs sit in.
func (n *Node) SetBoard(b Board) {
	n.mu.Lock()
	defer n.mu.Unlock()

	n.passThrough, n.noPerGPUReset, n.minorsMoveReset = b.PassThrough, b.NoPerGPUReset, b.MinorsChangeOnReset
}

// Hold makes a process hold GPUs open (replacing an earlier holder of the same pid).
func (n *Node) Hold(h Holder) {
	n.mu.Lock()
	defer n.mu.Unlock()

	n.releaseLocked(h.PID)
	h.GPUs = append([]int(nil), h.GPUs...)
	n.holders = append(n.holders, h)
}

// Release ends a holder, as when its pod stops.
func (n *Node) Release(pid int) {
	n.mu.Lock()
	defer n.mu.Unlock()

	n.releaseLocked(pid)
}

func (n *Node) releaseLocked(pid int) {
	kept := n.holders[:0]

	for _, h := range n.holders {
		if h.PID != pid {
			kept = append(kept, h)
		}
	}

	n.holders = kept
}

// Holders returns the processes that hold GPUs open.
func (n *Node) Holders() []Holder {
	n.mu.Lock()
	defer n.mu.Unlock()

	return append([]Holder(nil), n.holders...)
}

// OnMutating registers f to be called at the start of every state-changing call (before
// faults and effects), with the method name and GPU index. f runs with the node locked and
// must not call the node.
func (n *Node) OnMutating(f func(method string, gpu int)) {
	n.mu.Lock()
	defer n.mu.Unlock()

	n.onMutating = f
}

// Reboot is a (simulated) reboot of the machine: every pending MIG mode becomes current (the
// mode lives in the GPU's InfoROM), no GPU or compute instance survives, every process that
// held a GPU is gone, NVML must be initialized again, and handles from before are stale.
func (n *Node) Reboot() {
	n.mu.Lock()
	defer n.mu.Unlock()

	n.holders = nil
	n.initCount = 0

	for _, g := range n.gpus {
		g.processes = nil
		g.clients = 0
		g.mode = g.pending
		g.gis = map[int]*giState{}
		g.generation++
	}
}

// held says whether anything holds g open. Callers hold n.mu.
func (n *Node) held(g *gpu) bool {
	if len(g.processes) > 0 || g.clients > 0 {
		return true
	}

	for _, h := range n.holders {
		for _, i := range h.GPUs {
			if i == g.index {
				return true
			}
		}
	}

	return false
}

// InjectFault arms a fault.
func (n *Node) InjectFault(f Fault) {
	n.mu.Lock()
	defer n.mu.Unlock()

	if f.Times == 0 {
		f.Times = 1
	}

	if f.Nth == 0 {
		f.Nth = 1
	}

	n.faults = append(n.faults, &f)
}

// ClearFaults disarms every fault.
func (n *Node) ClearFaults() {
	n.mu.Lock()
	defer n.mu.Unlock()

	n.faults = nil
}

// Calls returns how often a method was called (faulted calls included).
func (n *Node) Calls(method string) int {
	n.mu.Lock()
	defer n.mu.Unlock()

	return n.calls[method]
}

// MutatingCalls returns how many state-changing calls were made.
func (n *Node) MutatingCalls() int {
	n.mu.Lock()
	defer n.mu.Unlock()

	total := 0
	for _, m := range MutatingMethods {
		total += n.calls[m]
	}

	return total
}

// ResetCounters zeroes all call counters.
func (n *Node) ResetCounters() {
	n.mu.Lock()
	defer n.mu.Unlock()

	n.calls = map[string]int{}
}

// SetProcesses sets the compute processes running on GPU index.
func (n *Node) SetProcesses(index int, procs ...nvml.ProcessInfo) {
	n.mu.Lock()
	defer n.mu.Unlock()

	n.gpus[index].processes = append([]nvml.ProcessInfo(nil), procs...)
}

// SetClients sets how many non-compute clients (nvidia-persistenced, DCGM)
// hold GPU index open: they block mode changes and resets but are not listed
// as processes, like on a real GPU.
func (n *Node) SetClients(index, clients int) {
	n.mu.Lock()
	defer n.mu.Unlock()

	n.gpus[index].clients = clients
}

// Clients returns the number of non-compute clients of GPU index.
func (n *Node) Clients(index int) int {
	n.mu.Lock()
	defer n.mu.Unlock()

	return n.gpus[index].clients
}

// enter records a call and returns the injected failure, if any. Callers hold n.mu.
func (n *Node) enter(method string, gpuIndex int) nvml.Return {
	n.calls[method]++

	if n.onMutating != nil && isMutating(method) {
		n.onMutating(method, gpuIndex)
	}

	for _, f := range n.faults {
		if f.Method != method || (f.GPU >= 0 && f.GPU != gpuIndex) || f.hits >= f.Times {
			continue
		}

		f.seen++
		if f.seen >= f.Nth {
			f.hits++

			return f.Ret
		}
	}

	return nvml.SUCCESS
}

// ErrResetNotSupported is what resetting one GPU gives where the board cannot.
var ErrResetNotSupported = errors.New("resetting this GPU alone is not supported")

// ResetGPU resets one GPU the way `nvidia-smi -r -i N` does: it fails while
// anything holds the GPU, in pass-through and on boards whose GPUs reset only
// together; otherwise it activates a pending MIG mode and drops all instances.
func (n *Node) ResetGPU(_ context.Context, index int) error {
	n.mu.Lock()
	defer n.mu.Unlock()

	if index < 0 || index >= len(n.gpus) {
		return fmt.Errorf("reset gpu %d: %w", index, nvml.ERROR_INVALID_ARGUMENT)
	}

	if ret := n.enter(MResetGPU, index); ret != nvml.SUCCESS {
		return fmt.Errorf("reset gpu %d: %w", index, ret)
	}

	g := n.gpus[index]

	switch {
	case n.passThrough:
		return fmt.Errorf("reset gpu %d: %w: the GPU is passed through to a VM; reboot the VM", index, ErrResetNotSupported)
	case n.noPerGPUReset:
		return fmt.Errorf("reset gpu %d: %w: GPUs connected through NVSwitch reset together", index, ErrResetNotSupported)
	case n.held(g):
		return fmt.Errorf("reset gpu %d: %w", index, nvml.ERROR_IN_USE)
	}

	n.resetLocked(g)

	return nil
}

// ResetGPUs resets the GPUs of these PCI bus ids in one go, as `nvidia-smi -r -i A,B,...`
// does (mig-parted's cmd/nvidia-mig-parted/util/device.go nvmlResetAllGPUs): it fails in
// pass-through, while anything holds any of them, and, on a board whose GPUs reset only
// together, unless every GPU of the board is named. Otherwise each GPU is reset.
func (n *Node) ResetGPUs(_ context.Context, busIDs []string) error {
	n.mu.Lock()
	defer n.mu.Unlock()

	if ret := n.enter(MResetGPUs, -1); ret != nvml.SUCCESS {
		return fmt.Errorf("reset gpus %s: %w", strings.Join(busIDs, ","), ret)
	}

	var gpus []*gpu

	for _, id := range busIDs {
		i := slices.IndexFunc(n.gpus, func(g *gpu) bool { return g.busID == id })
		if i < 0 {
			return fmt.Errorf("reset gpus: no GPU at %s: %w", id, nvml.ERROR_INVALID_ARGUMENT)
		}

		gpus = append(gpus, n.gpus[i])
	}

	switch {
	case n.passThrough:
		return fmt.Errorf("reset gpus: %w: the GPUs are passed through to a VM; reboot the VM", ErrResetNotSupported)
	case n.noPerGPUReset && len(gpus) != len(n.gpus):
		return fmt.Errorf("reset gpus: %w: GPUs connected through NVSwitch reset together, all %d of them", ErrResetNotSupported, len(n.gpus))
	}

	for _, g := range gpus {
		if n.held(g) {
			return fmt.Errorf("reset gpus: gpu %d: %w", g.index, nvml.ERROR_IN_USE)
		}
	}

	for _, g := range gpus {
		n.resetLocked(g)
	}

	return nil
}

// resetLocked resets g: the pending mode becomes current, instances are gone, handles go
// stale, and the minor may change. Callers hold n.mu.
func (n *Node) resetLocked(g *gpu) {
	g.mode = g.pending
	g.gis = map[int]*giState{}
	g.generation++

	if n.minorsMoveReset {
		if n.nextMinor < len(n.gpus) {
			n.nextMinor = len(n.gpus)
		}

		g.minor = n.nextMinor
		n.nextMinor++
	}
}

// State is a read-only snapshot of one GPU, for tests and the demo.
type State struct {
	MigMode, PendingMigMode int
	Instances               []InstanceState
}

// InstanceState is one GPU instance in a State.
type InstanceState struct {
	ID        int
	ProfileID uint32
	Slices    uint32
	Start     uint32
	Size      uint32
	// ComputeSizes lists the compute slices of each compute instance, by CI id.
	ComputeSizes []uint32
}

// State returns a snapshot of GPU index, instances sorted by placement.
func (n *Node) State(index int) State {
	n.mu.Lock()
	defer n.mu.Unlock()

	g := n.gpus[index]
	st := State{MigMode: g.mode, PendingMigMode: g.pending}

	for _, id := range g.giIDs() {
		s := g.gis[id]
		is := InstanceState{ID: s.id, ProfileID: s.profile.Info.Id, Slices: s.profile.Info.SliceCount,
			Start: s.placement.Start, Size: s.placement.Size}

		for _, cid := range s.ciIDs() {
			is.ComputeSizes = append(is.ComputeSizes, s.cis[cid].size)
		}

		st.Instances = append(st.Instances, is)
	}

	sort.Slice(st.Instances, func(i, j int) bool { return st.Instances[i].Start < st.Instances[j].Start })

	return st
}

func (g *gpu) giIDs() []int {
	ids := make([]int, 0, len(g.gis))
	for id := range g.gis {
		ids = append(ids, id)
	}

	sort.Ints(ids)

	return ids
}

func (s *giState) ciIDs() []int {
	ids := make([]int, 0, len(s.cis))
	for id := range s.cis {
		ids = append(ids, id)
	}

	sort.Ints(ids)

	return ids
}

// --- nvml.Interface ---

func (n *Node) Init() nvml.Return {
	n.mu.Lock()
	defer n.mu.Unlock()

	if ret := n.enter("Init", -1); ret != nvml.SUCCESS {
		return ret
	}

	n.initCount++

	return nvml.SUCCESS
}

func (n *Node) Shutdown() nvml.Return {
	n.mu.Lock()
	defer n.mu.Unlock()

	if ret := n.enter("Shutdown", -1); ret != nvml.SUCCESS {
		return ret
	}

	if n.initCount == 0 {
		return nvml.ERROR_UNINITIALIZED
	}

	n.initCount--

	return nvml.SUCCESS
}

// check enters a call and requires Init. Callers hold n.mu.
func (n *Node) check(method string, gpuIndex int) nvml.Return {
	if ret := n.enter(method, gpuIndex); ret != nvml.SUCCESS {
		return ret
	}

	if n.initCount == 0 {
		return nvml.ERROR_UNINITIALIZED
	}

	return nvml.SUCCESS
}

func (n *Node) ErrorString(r nvml.Return) string { return r.Error() }

func (n *Node) SystemGetDriverVersion() (string, nvml.Return) {
	n.mu.Lock()
	defer n.mu.Unlock()

	if ret := n.check("SystemGetDriverVersion", -1); ret != nvml.SUCCESS {
		return "", ret
	}

	return n.DriverVersion, nvml.SUCCESS
}

func (n *Node) SystemGetCudaDriverVersion() (int, nvml.Return) {
	n.mu.Lock()
	defer n.mu.Unlock()

	if ret := n.check("SystemGetCudaDriverVersion", -1); ret != nvml.SUCCESS {
		return 0, ret
	}

	return n.CudaVersion, nvml.SUCCESS
}

func (n *Node) SystemGetCudaDriverVersion_v2() (int, nvml.Return) {
	return n.SystemGetCudaDriverVersion()
}

func (n *Node) DeviceGetCount() (int, nvml.Return) {
	n.mu.Lock()
	defer n.mu.Unlock()

	if ret := n.check("DeviceGetCount", -1); ret != nvml.SUCCESS {
		return 0, ret
	}

	return len(n.gpus), nvml.SUCCESS
}

func (n *Node) DeviceGetHandleByIndex(i int) (nvml.Device, nvml.Return) {
	n.mu.Lock()
	defer n.mu.Unlock()

	if ret := n.check("DeviceGetHandleByIndex", i); ret != nvml.SUCCESS {
		return nil, ret
	}

	if i < 0 || i >= len(n.gpus) {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}

	return n.handle(n.gpus[i]), nvml.SUCCESS
}

func (n *Node) DeviceGetHandleByUUID(uuid string) (nvml.Device, nvml.Return) {
	n.mu.Lock()
	defer n.mu.Unlock()

	if ret := n.check("DeviceGetHandleByUUID", -1); ret != nvml.SUCCESS {
		return nil, ret
	}

	for _, g := range n.gpus {
		if g.uuid == uuid {
			return n.handle(g), nvml.SUCCESS
		}

		for _, md := range n.migDevices(g) {
			if md.uuid() == uuid {
				return md, nvml.SUCCESS
			}
		}
	}

	return nil, nvml.ERROR_NOT_FOUND
}

func (n *Node) handle(g *gpu) *Device {
	return &Device{Device: &mock.Device{}, n: n, g: g, gen: g.generation}
}

// Extensions reports every NVML symbol as present: the simulated library implements the
// calls that go-nvlib probes for (MIG) itself.
func (n *Node) Extensions() nvml.ExtendedInterface { return allSymbols{} }

type allSymbols struct{}

func (allSymbols) LookupSymbol(string) error { return nil }
