package main

// Processes that hold the GPUs open. On a node, a process that initializes NVML attaches
// every GPU (nvml.h: NVML_INIT_FLAG_NO_ATTACH is what initializes "without attaching any
// discovered devices"): it opens /dev/nvidiactl and the GPUs' device nodes and keeps them
// open until its last nvmlShutdown or its exit. The driver does not unbind a GPU that another
// process holds open, which is why nvmlDeviceSetMigMode answers activationStatus
// NVML_ERROR_IN_USE while NVIDIA's device plugin runs: its health check holds NVML for the
// plugin's life (k8s-device-plugin v0.19.0 internal/rm/health.go, checkHealth). The caller's
// own handles do not count: nvidia-smi changes the mode through NVML.
//
// Here an attached process holds a shared flock on the state directory's attach file, from
// its first attaching init to its last shutdown. The lock belongs to the process's open file,
// so a process that dies, in whatever PID namespace (a pod's), lets go as a closed device
// node does; and flock needs no write access, so a pod whose driver root is read-only
// attaches too.

import "C"

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/talos-nvidia/nvidia-driver/hack/sim-node/simnvml/state"
	"github.com/talos-nvidia/nvidia-driver/internal/sim"
)

// attach takes this process's shared lock on the attach file. Callers hold the.mu.
func (l *lib) attach() {
	path := filepath.Join(l.dir, state.AttachFile)

	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		fmt.Fprintf(os.Stderr, "simnvml: this process does not hold the GPUs open (a mode change is not refused for it): %v\n", err)

		return
	}

	if err := syscall.Flock(fd, syscall.LOCK_SH); err != nil {
		syscall.Close(fd) //nolint:errcheck
		fmt.Fprintf(os.Stderr, "simnvml: this process does not hold the GPUs open: locking %s: %v\n", path, err)

		return
	}

	l.attached = fd
}

// detach drops the lock of attach. Callers hold the.mu.
func (l *lib) detach() {
	if l.attached < 0 {
		return
	}

	syscall.Close(l.attached) //nolint:errcheck // closing drops the lock

	l.attached = -1
}

// othersAttached says whether a process other than this one holds the GPUs open: this
// process's exclusive lock fails while another holds its shared one. Callers hold the.mu
// and the state directory's exclusive lock, so no other process tests at the same time and
// this process's shared lock, dropped by the test, is taken again without waiting.
func (l *lib) othersAttached() (bool, error) {
	fd := l.attached
	if fd < 0 {
		probe, err := syscall.Open(filepath.Join(l.dir, state.AttachFile), syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if errors.Is(err, syscall.ENOENT) {
			return false, nil // a state directory from before attach files: nobody attaches
		}

		if err != nil {
			return false, fmt.Errorf("the attach file: %w", err)
		}
		defer syscall.Close(probe) //nolint:errcheck

		fd = probe
	}

	err := syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB)
	others := errors.Is(err, syscall.EWOULDBLOCK)

	if err != nil && !others {
		return false, fmt.Errorf("the attach file: %w", err)
	}

	if fd == l.attached {
		// Linux converts a flock by dropping it first, whether the new one is granted or not.
		if err := syscall.Flock(fd, syscall.LOCK_SH); err != nil {
			return others, fmt.Errorf("the attach file: %w", err)
		}
	}

	return others, nil
}

// otherProcesses is the Holder that stands for every other attached process while a call
// that the driver refuses for held GPUs runs. It holds no pid of this process's namespace,
// so nothing names it, as the service cannot name the plugin on a node.
const otherProcesses = -1

// withOthersHolding runs f with the node's GPUs held by the other attached processes, if
// any. Callers hold the.mu and the state directory's exclusive lock (withNode(true, ...)).
func withOthersHolding(n *sim.Node, f func() C.int) C.int {
	others, err := the.othersAttached()
	if err != nil {
		fmt.Fprintln(os.Stderr, "simnvml:", err)

		return retUnknown
	}

	if !others {
		return f()
	}

	count, ret := n.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return C.int(ret)
	}

	all := make([]int, count)
	for i := range all {
		all[i] = i
	}

	n.Hold(sim.Holder{PID: otherProcesses, Name: "another NVML client", GPUs: all})
	defer n.Release(otherProcesses)

	return f()
}
