package sim

import (
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Fabric puts a simulated node's GPUs on an NVSwitch fabric, as on an HGX H100 or H200 board.
// nvmlDeviceGetGpuFabricInfo (go-nvml pkg/nvml/nvml.h) then reports each GPU's registration
// with the fabric: IN_PROGRESS while no fabric manager runs ("State : In Progress, Status :
// N/A", NVIDIA Fabric Manager User Guide, "Initializing NVSwitch and NVLink"), COMPLETED with
// Status once one has run for RegisterAfter. The status is meaningful only when COMPLETED
// (nvml.h: "Must be checked only if state returns complete"). Registration, once completed,
// stays: the simulator does not model a fabric manager that dies and a GPU reset.
type Fabric struct {
	// Manager says whether a fabric manager runs now. It is asked on each call, with the
	// node locked: it must not call the node.
	Manager func() bool
	// RegisterAfter is how long registration takes once a fabric manager runs.
	RegisterAfter time.Duration
	// Status is what a completed registration reports: zero is nvml.SUCCESS.
	Status nvml.Return
}

type fabric struct {
	Fabric

	managedSince time.Time
}

// SetFabric puts the node's GPUs on an NVSwitch fabric; without it GetGpuFabricInfo returns
// ERROR_NOT_SUPPORTED, as on a GPU that has none.
func (n *Node) SetFabric(f Fabric) {
	n.mu.Lock()
	defer n.mu.Unlock()

	n.fabric = &fabric{Fabric: f}
}

// fabricInfo answers GetGpuFabricInfo. Callers hold n.mu.
func (n *Node) fabricInfo() (nvml.GpuFabricInfo, nvml.Return) {
	f := n.fabric
	if f == nil {
		return nvml.GpuFabricInfo{}, nvml.ERROR_NOT_SUPPORTED
	}

	if f.managedSince.IsZero() && f.Manager != nil && f.Manager() {
		f.managedSince = time.Now()
	}

	if f.managedSince.IsZero() || time.Since(f.managedSince) < f.RegisterAfter {
		return nvml.GpuFabricInfo{State: nvml.GPU_FABRIC_STATE_IN_PROGRESS, Status: uint32(nvml.ERROR_NOT_READY)}, nvml.SUCCESS
	}

	return nvml.GpuFabricInfo{State: nvml.GPU_FABRIC_STATE_COMPLETED, Status: uint32(f.Status)}, nvml.SUCCESS
}
