package main

/*
#include <stdlib.h>
*/
import "C"

import (
	"fmt"
	"os"
	"sync"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/talos-nvidia/nvidia-driver/internal/sim"
)

// initialize is nvmlInit: the state directory must hold a simulated node, as a real NVML
// needs the kernel driver (NVML_ERROR_DRIVER_NOT_LOADED without it). Init calls nest: each
// needs a Shutdown (nvml.h, nvmlInit_v2). The first attaches the GPUs unless noAttach
// (attach.go).
func initialize(noAttach bool) C.int {
	the.mu.Lock()
	defer the.mu.Unlock()

	if the.inits == 0 {
		dir, err := stateDir()
		if err != nil {
			fmt.Fprintln(os.Stderr, "simnvml:", err)

			return retDriver
		}

		the.dir = dir

		if !noAttach {
			the.attach()
		}
	}

	the.inits++

	return retSuccess
}

//export nvmlInit_v2
func nvmlInit_v2() C.int { return initialize(false) }

//export nvmlInit
func nvmlInit() C.int { return initialize(false) }

// nvmlInitWithFlags: NVML_INIT_FLAG_NO_ATTACH (nvml.h) initializes without attaching the GPUs.
//
//export nvmlInitWithFlags
func nvmlInitWithFlags(flags C.uint) C.int { return initialize(flags&initFlagNoAttach != 0) }

const initFlagNoAttach = 1 << 1 // nvml.h NVML_INIT_FLAG_NO_ATTACH

//export nvmlShutdown
func nvmlShutdown() C.int {
	the.mu.Lock()
	defer the.mu.Unlock()

	if the.inits == 0 {
		return retUninit
	}

	the.inits--
	if the.inits == 0 {
		the.detach()
	}

	return retSuccess
}

// errorStrings keeps the C strings nvmlErrorString returns (nvml.h's caller does not free
// them), under a lock of their own: an error formatted while a call holds the.mu may come
// back here.
var errorStrings = struct {
	sync.Mutex
	m map[C.int]*C.char
}{m: map[C.int]*C.char{}}

//export nvmlErrorString
func nvmlErrorString(r C.int) *C.char {
	errorStrings.Lock()
	defer errorStrings.Unlock()

	s, ok := errorStrings.m[r]
	if !ok {
		// go-nvml's own table: this process never loads a library through go-nvml, so
		// Error does not call back into nvmlErrorString.
		s = C.CString(nvml.Return(r).Error())
		errorStrings.m[r] = s
	}

	return s
}

// putString copies s into the caller's buffer of length bytes, NUL-terminated.
func putString(dst *C.char, length C.uint, s string) C.int {
	if dst == nil {
		return retInvalid
	}

	if uint(len(s))+1 > uint(length) {
		return retInsufficient
	}

	b := unsafe.Slice((*byte)(unsafe.Pointer(dst)), int(length))
	copy(b, s)
	b[len(s)] = 0

	return retSuccess
}

//export nvmlSystemGetDriverVersion
func nvmlSystemGetDriverVersion(version *C.char, length C.uint) C.int {
	return withNode(false, func(n *sim.Node) C.int {
		v, ret := n.SystemGetDriverVersion()
		if ret != nvml.SUCCESS {
			return C.int(ret)
		}

		return putString(version, length, v)
	})
}

// nvmlSystemGetNVMLVersion: "<CUDA major>.<driver version>", as NVML prints its own
// (nvidia-smi: "NVML Version: 13.580.159.04" with driver 580 and CUDA 13).
//
//export nvmlSystemGetNVMLVersion
func nvmlSystemGetNVMLVersion(version *C.char, length C.uint) C.int {
	return withNode(false, func(n *sim.Node) C.int {
		v, ret := n.SystemGetDriverVersion()
		if ret != nvml.SUCCESS {
			return C.int(ret)
		}

		cuda, ret := n.SystemGetCudaDriverVersion()
		if ret != nvml.SUCCESS {
			return C.int(ret)
		}

		return putString(version, length, fmt.Sprintf("%d.%s", cuda/1000, v))
	})
}

func cudaVersion(v *C.int) C.int {
	if v == nil {
		return retInvalid
	}

	return withNode(false, func(n *sim.Node) C.int {
		cuda, ret := n.SystemGetCudaDriverVersion()
		*v = C.int(cuda)

		return C.int(ret)
	})
}

//export nvmlSystemGetCudaDriverVersion
func nvmlSystemGetCudaDriverVersion(v *C.int) C.int { return cudaVersion(v) }

//export nvmlSystemGetCudaDriverVersion_v2
func nvmlSystemGetCudaDriverVersion_v2(v *C.int) C.int { return cudaVersion(v) }
