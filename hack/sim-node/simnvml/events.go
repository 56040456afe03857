package main

/*
#include <stdlib.h>
*/
import "C"

import (
	"time"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/talos-nvidia/nvidia-driver/internal/sim"
)

// Event sets (nvml.h, nvmlEventSetCreate ... nvmlEventSetFree): the simulated GPUs never
// raise an event, so a wait ends with NVML_ERROR_TIMEOUT. What they are for here is what
// NVIDIA's device plugin does with them: its health check keeps NVML initialized while it
// waits (k8s-device-plugin v0.19.0 internal/rm/health.go), so the plugin holds the GPUs open
// for its whole life, as on a node (attach.go); without event sets it gave NVML up at once.

// supportedEvents are the events an H100 reports through nvmlDeviceGetSupportedEventTypes
// that the device plugin registers for.
const supportedEvents = C.ulonglong(nvml.EventTypeSingleBitEccError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeXidCriticalError)

//export nvmlEventSetCreate
func nvmlEventSetCreate(set *unsafe.Pointer) C.int {
	if set == nil {
		return retInvalid
	}

	// An opaque handle of its own (nvmlEventSet_t): the caller frees it with nvmlEventSetFree.
	*set = C.malloc(1)

	return retSuccess
}

//export nvmlEventSetFree
func nvmlEventSetFree(set unsafe.Pointer) C.int {
	if set == nil {
		return retInvalid
	}

	C.free(set)

	return retSuccess
}

//export nvmlDeviceGetSupportedEventTypes
func nvmlDeviceGetSupportedEventTypes(h unsafe.Pointer, types *C.ulonglong) C.int {
	if types == nil {
		return retInvalid
	}

	return onDevice(false, h, func(*sim.Node, nvml.Device, handleKey) C.int {
		*types = supportedEvents

		return retSuccess
	})
}

//export nvmlDeviceRegisterEvents
func nvmlDeviceRegisterEvents(h unsafe.Pointer, types C.ulonglong, set unsafe.Pointer) C.int {
	if set == nil || types&^supportedEvents != 0 {
		return retInvalid
	}

	return onDevice(false, h, func(*sim.Node, nvml.Device, handleKey) C.int { return retSuccess })
}

// eventWait waits timeoutms for an event that never comes.
func eventWait(set unsafe.Pointer, data unsafe.Pointer, timeoutms C.uint) C.int {
	if set == nil || data == nil {
		return retInvalid
	}

	time.Sleep(time.Duration(timeoutms) * time.Millisecond)

	return C.int(nvml.ERROR_TIMEOUT)
}

//export nvmlEventSetWait
func nvmlEventSetWait(set unsafe.Pointer, data unsafe.Pointer, timeoutms C.uint) C.int {
	return eventWait(set, data, timeoutms)
}

//export nvmlEventSetWait_v2
func nvmlEventSetWait_v2(set unsafe.Pointer, data unsafe.Pointer, timeoutms C.uint) C.int {
	return eventWait(set, data, timeoutms)
}
