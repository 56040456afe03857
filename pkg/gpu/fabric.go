package gpu

import (
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Fabric registration states of a GPU, by NVML's NVML_GPU_FABRIC_STATE_* (nvml.h).
const (
	FabricNotSupported = "not-supported" // no NVSwitch fabric, or a GPU before Hopper
	FabricNotStarted   = "not-started"
	FabricInProgress   = "in-progress"
	FabricCompleted    = "completed"
)

// FabricState is one GPU's registration with the NVLink fabric of an NVSwitch board: on
// Hopper and later, CUDA starts on a GPU only after it has registered (NVIDIA Fabric Manager
// User Guide, "Initializing NVSwitch and NVLink").
type FabricState struct {
	Index int    `json:"index"`
	State string `json:"state"`
	// Error is the registration's failure; NVML's status is read only once registration
	// completed (nvml.h: "Must be checked only if state returns complete").
	Error string `json:"error,omitempty"`
}

// Registered says whether the GPU completed registration without error.
func (f FabricState) Registered() bool { return f.State == FabricCompleted && f.Error == "" }

// Fabric reads every GPU's fabric registration. NVML must be initialized.
//
// It calls nvmlDeviceGetGpuFabricInfo, which nvml.h marks deprecated for
// nvmlDeviceGetGpuFabricInfoV: the driver's library still exports it, and go-nvml's handler
// for the V call keeps its device in an unexported field, so no simulator could answer that.
func Fabric(lib nvml.Interface) ([]FabricState, error) {
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("counting GPUs: %w", ret)
	}

	states := make([]FabricState, 0, n)

	for i := range n {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("GPU %d: getting its handle: %w", i, ret)
		}

		info, ret := d.GetGpuFabricInfo()

		st := FabricState{Index: i}

		switch {
		case errors.Is(ret, nvml.ERROR_NOT_SUPPORTED) || (ret == nvml.SUCCESS && info.State == nvml.GPU_FABRIC_STATE_NOT_SUPPORTED):
			st.State = FabricNotSupported
		case ret != nvml.SUCCESS:
			return nil, fmt.Errorf("GPU %d: reading its fabric registration: %w", i, ret)
		case info.State == nvml.GPU_FABRIC_STATE_NOT_STARTED:
			st.State = FabricNotStarted
		case info.State == nvml.GPU_FABRIC_STATE_IN_PROGRESS:
			st.State = FabricInProgress
		case info.State == nvml.GPU_FABRIC_STATE_COMPLETED:
			st.State = FabricCompleted
			if status := nvml.Return(info.Status); status != nvml.SUCCESS {
				st.Error = status.Error()
			}
		default:
			return nil, fmt.Errorf("GPU %d: unknown fabric state %d", i, info.State)
		}

		states = append(states, st)
	}

	return states, nil
}
