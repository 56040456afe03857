// Command simnvml is a libnvidia-ml.so.1 of this project's own: the NVML C functions, with
// the semantics nvml.h (go-nvml pkg/nvml/nvml.h) documents, answered by the simulated GPUs
// of internal/sim. It is built as a C shared library (hack/sim-node/simnvml/build.sh:
// go build -buildmode=c-shared) and put in a test subroot in place of NVIDIA's, so that
// NVIDIA's own programs (the device plugin, nvcdi in the service's CDI job) and the
// service's NVML jobs run unchanged on a node without a GPU. It is never part of the product.
//
// What a kernel driver holds on a real node (MIG modes, GPU and compute instances, minors,
// the fabric registration) lives in a state directory that every process loading the
// library reads, under a lock, so that the service's jobs, the device plugin and any other
// NVML client see the same GPUs, as processes on a node see one driver:
//
//   - $SIMNVML_DIR, where set;
//   - else /dev/.simnvml: on a node every NVML client has the host's /dev (NVML opens
//     /dev/nvidiactl), and the test puts the state next to the device nodes;
//   - else <root>/dev/.simnvml, where the library was loaded from <root>/usr/lib64: NVIDIA's
//     device plugin loads NVML from the driver root it mounts (/driver-root), whose dev/ is
//     the host's /dev (docs/driver-root.md), while its own /dev has device nodes only.
//
// The directory holds the state file and its lock (package state). A change of state (MIG) rewrites the
// simulated /proc files under State.HostRoot, as the kernel driver keeps /proc current.
//
// Functions of nvml.h that the simulator does not answer return NVML_ERROR_NOT_SUPPORTED
// (stubs.c, generated from nvml.h by gen.go), and say so on standard error once per
// process. The library's state is process-global by nature: it is a C library with C
// callers.
package main

//go:generate go run gen.go

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
void *simnvml_handle(int id);
int simnvml_handle_id(void *h);
const char *simnvml_self_path(void);
*/
import "C"

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/talos-nvidia/nvidia-driver/hack/sim-node/simnvml/state"
	"github.com/talos-nvidia/nvidia-driver/internal/sim"
)

func main() {}

// The values of nvml.h's nvmlReturn_t that the library returns itself.
const (
	retSuccess      = C.int(nvml.SUCCESS)
	retInvalid      = C.int(nvml.ERROR_INVALID_ARGUMENT)
	retNotSupported = C.int(nvml.ERROR_NOT_SUPPORTED)
	retInsufficient = C.int(nvml.ERROR_INSUFFICIENT_SIZE)
	retUninit       = C.int(nvml.ERROR_UNINITIALIZED)
	retNotFound     = C.int(nvml.ERROR_NOT_FOUND)
	retUnknown      = C.int(nvml.ERROR_UNKNOWN)
	retDriver       = C.int(nvml.ERROR_DRIVER_NOT_LOADED)
	retGPULost      = C.int(nvml.ERROR_GPU_IS_LOST)
)

// lib is the process's view of the simulated node.
type lib struct {
	mu       sync.Mutex
	dir      string
	inits    int
	cached   *sim.Node
	state    state.State
	stamp    [3]int64 // inode, size, mtime of the state file the cache was read from
	stubbed  map[string]bool
	handles  []handleKey
	handleID map[handleKey]int
	attached int // the attach file's descriptor while this process holds the GPUs; -1 (attach.go)
}

var the = &lib{stubbed: map[string]bool{}, handleID: map[handleKey]int{}, attached: -1}

// stateDir finds the state directory (see the package comment).
func stateDir() (string, error) {
	if d := os.Getenv("SIMNVML_DIR"); d != "" {
		return d, nil
	}

	candidates := []string{filepath.Join("/dev", state.DirName)}
	if p := C.simnvml_self_path(); p != nil {
		// <root>/usr/lib64/libnvidia-ml.so.1
		candidates = append(candidates, filepath.Join(filepath.Dir(C.GoString(p)), "../../dev", state.DirName))
	}

	for _, d := range candidates {
		if _, err := os.Stat(state.File(d)); err == nil {
			return d, nil
		}
	}

	return "", fmt.Errorf("no simulated node: none of %v holds a state file (set SIMNVML_DIR)", candidates)
}

// withNode runs f on the node's current state, under the state directory's lock (exclusive
// when f changes the state, which is then written back). NVML must be initialized.
func withNode(write bool, f func(n *sim.Node) C.int) (ret C.int) {
	the.mu.Lock()
	defer the.mu.Unlock()

	defer func() {
		// A call the simulator leaves to go-nvml's mocks panics naming it: not simulated.
		if r := recover(); r != nil {
			fmt.Fprintf(os.Stderr, "simnvml: not simulated: %v\n", r)

			ret = retNotSupported
		}
	}()

	if the.inits == 0 {
		return retUninit
	}

	unlock, err := state.Lock(the.dir, write)
	if err != nil {
		fmt.Fprintln(os.Stderr, "simnvml:", err)

		return retUnknown
	}
	defer unlock()

	n, err := the.load()
	if err != nil {
		fmt.Fprintln(os.Stderr, "simnvml:", err)

		return retUnknown
	}

	if ret := n.Init(); ret != nvml.SUCCESS {
		return C.int(ret)
	}

	ret = f(n)

	if write {
		if err := the.save(n); err != nil {
			fmt.Fprintln(os.Stderr, "simnvml:", err)

			return retUnknown
		}
	}

	return ret
}

// load returns the node as the state file has it, read again only when the file changed.
// Callers hold the lock.
func (l *lib) load() (*sim.Node, error) {
	fi, err := os.Stat(state.File(l.dir))
	if err != nil {
		return nil, fmt.Errorf("reading the simulated node: %w", err)
	}

	stamp := [3]int64{0, fi.Size(), fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		stamp[0] = int64(st.Ino)
	}

	if l.cached != nil && stamp == l.stamp {
		return l.cached, nil
	}

	s, err := state.Read(l.dir)
	if err != nil {
		return nil, err
	}

	n, err := sim.LoadState(s.Node)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", state.File(l.dir), err)
	}

	l.cached, l.state, l.stamp = n, s, stamp

	return n, nil
}

// save writes the node's state back, and the simulated /proc files where this process sees
// them (a pod that loads the library from the driver root does not, and changes nothing).
func (l *lib) save(n *sim.Node) error {
	s := l.state
	s.Node = n.SaveState()

	if err := state.Write(l.dir, s); err != nil {
		return err
	}

	l.cached = nil

	if s.HostRoot == "" {
		return nil
	}

	if _, err := os.Stat(s.HostRoot); errors.Is(err, fs.ErrNotExist) {
		return nil
	}

	return state.WriteProcFS(s, n)
}

// --- handles: nvmlDevice_t, nvmlGpuInstance_t and nvmlComputeInstance_t are pointers into
// a C table (handles.c); each names what it stands for by a handleKey.

type handleKind int

const (
	kindGPU handleKind = iota
	kindMIG            // a MIG device: a compute instance seen as a device
	kindGI
	kindCI
)

// handleKey is what a handle stands for: a GPU (its index, and its generation, so that a
// handle from before a reset is stale after it), and for the other kinds a GPU instance id
// and a compute instance id.
type handleKey struct {
	kind     handleKind
	gpu, gen int
	gi, ci   int
}

// handleFor returns the C handle of k. Callers hold the.mu.
func handleFor(k handleKey) unsafe.Pointer {
	id, ok := the.handleID[k]
	if !ok {
		id = len(the.handles)
		the.handles = append(the.handles, k)
		the.handleID[k] = id
	}

	return C.simnvml_handle(C.int(id))
}

// keyOf returns what a C handle stands for. Callers hold the.mu.
func keyOf(h unsafe.Pointer) (handleKey, bool) {
	id := int(C.simnvml_handle_id(h))
	if id < 0 || id >= len(the.handles) {
		return handleKey{}, false
	}

	return the.handles[id], true
}

//export simnvmlStub
func simnvmlStub(name *C.char) C.int {
	the.mu.Lock()
	defer the.mu.Unlock()

	n := C.GoString(name)
	if !the.stubbed[n] {
		the.stubbed[n] = true
		fmt.Fprintf(os.Stderr, "simnvml: %s is not simulated: NVML_ERROR_NOT_SUPPORTED\n", n)
	}

	return retNotSupported
}
