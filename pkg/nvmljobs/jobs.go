// Package nvmljobs holds the node's NVML work: listing the GPUs, applying a MIG layout,
// reading the NVLink fabric registration and writing the CDI spec.
//
// On a node the service runs each job in a short-lived child process of its own binary
// (Child), so the process that stays up for the life of the node never loads
// libnvidia-ml. Once loaded, it stays: glibc cannot unload it (the go-nvml wrappers in the
// binary bind its symbols, which marks it NODELETE), and its heap, about 13 MB on an H200,
// stays resident after nvmlShutdown. Local runs the same jobs in the calling process: it is
// the child's side, and the demo's and tests' way with simulated GPUs.
package nvmljobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/talos-nvidia/nvidia-driver/pkg/cdi"
	"github.com/talos-nvidia/nvidia-driver/pkg/devnodes"
	"github.com/talos-nvidia/nvidia-driver/pkg/driverroot"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu"
	"github.com/talos-nvidia/nvidia-driver/pkg/mig"
	"github.com/talos-nvidia/nvidia-driver/pkg/nvswitch"
)

// Jobs runs the node's NVML work. Each call initializes NVML and shuts it down again.
type Jobs interface {
	// ListGPUs returns the GPUs NVML sees; ErrNoGPU when it sees none.
	ListGPUs(ctx context.Context) ([]gpu.GPU, error)
	// FabricStates reads every GPU's NVLink fabric registration.
	FabricStates(ctx context.Context) ([]gpu.FabricState, error)
	// ApplyMIG applies a MIG layout. changing runs once, when the job is about to change the
	// first GPU, after it withdrew the readiness files (in a Child, when the child's word of
	// it arrives: the change may have begun). A *mig.LayoutError means nothing was changed and
	// trying again cannot help.
	ApplyMIG(ctx context.Context, req MIGRequest, changing func()) (MIGResult, error)
	// WriteCDI writes the node's CDI spec, atomically, when its content changed.
	WriteCDI(ctx context.Context, req CDIRequest) error
}

// ErrNoGPU says that NVML sees no GPU.
var ErrNoGPU = errors.New("NVML sees no GPU")

// MIGRequest says which layout to apply and where the node's files are.
type MIGRequest struct {
	// ConfigFile holds the user's layouts; the built-in ones are added (mig.LoadFile).
	ConfigFile string `json:"configFile"`
	Layout     string `json:"layout"`
	// HostRoot is where the device nodes are made again after a change.
	HostRoot string `json:"hostRoot"`
	// ProcRoot is the host's /proc, where the processes holding a GPU open are found.
	ProcRoot string `json:"procRoot"`
	// ValidationsDir holds the readiness files, withdrawn before the first change.
	ValidationsDir string `json:"validationsDir"`
}

// MIGResult is what ApplyMIG did: one status per GPU, and the device nodes there are now
// (0 when none changed).
type MIGResult struct {
	GPUs        []mig.Status `json:"gpus"`
	DeviceNodes int          `json:"deviceNodes"`
}

// CDIRequest says how to generate the CDI spec and where to write it.
type CDIRequest struct {
	Options cdi.Options `json:"options"`
	Path    string      `json:"path"`
}

// Local runs the jobs in this process, on NVML.
type Local struct {
	Log  *slog.Logger
	NVML nvml.Interface
	// Resetter resets a GPU whose MIG mode change NVML leaves pending.
	Resetter mig.Resetter
	// AfterMIGChange runs after GPUs changed, before their device nodes are made again: a
	// simulated node rewrites its /proc there; on a node the driver keeps /proc current.
	AfterMIGChange func() error
}

var _ Jobs = (*Local)(nil)

// ListGPUs lists the GPUs.
func (l *Local) ListGPUs(context.Context) ([]gpu.GPU, error) {
	var gpus []gpu.GPU

	err := l.withNVML(func() error {
		var err error

		gpus, err = gpu.List(l.NVML)

		return err
	})
	if err != nil {
		return nil, err
	}

	if len(gpus) == 0 {
		return nil, ErrNoGPU
	}

	return gpus, nil
}

// FabricStates reads the GPUs' fabric registration.
func (l *Local) FabricStates(context.Context) ([]gpu.FabricState, error) {
	var states []gpu.FabricState

	err := l.withNVML(func() error {
		var err error

		states, err = gpu.Fabric(l.NVML)

		return err
	})

	return states, err
}

// ApplyMIG applies the layout. Before the first change it withdraws the readiness files:
// consumers that wait for them (the device plugin's and DCGM exporter's init containers)
// wait, and a stale file from an earlier run cannot let them take the GPUs again.
func (l *Local) ApplyMIG(ctx context.Context, req MIGRequest, changing func()) (MIGResult, error) {
	var res MIGResult

	cfg, err := mig.LoadFile(req.ConfigFile)
	if err != nil {
		return res, &mig.LayoutError{Err: err}
	}

	applier := &mig.Applier{
		NVML: l.NVML,
		// Our nvidia-persistenced starts after MIG (DESIGN's order): nothing to suspend.
		Persistenced: mig.NoPersistenced{},
		Resetter:     l.Resetter,
		Logger:       l.Log,
		ProcRoot:     req.ProcRoot,
		BeforeChange: func(context.Context) error {
			if err := driverroot.MarkNotReady(req.ValidationsDir); err != nil {
				return err
			}

			if changing != nil {
				changing()
			}

			return nil
		},
		OnChange: func(context.Context, []int) error {
			if l.AfterMIGChange != nil {
				if err := l.AfterMIGChange(); err != nil {
					return err
				}
			}

			nodes, err := devnodes.Sync(l.Log, req.HostRoot)
			res.DeviceNodes = len(nodes.Nodes)

			return err
		},
	}

	// NVSwitch boards reset their GPUs only together, once all modes are set (mig-parted).
	if nvswitch.Read(l.Log, req.HostRoot).HasNVSwitch() {
		applier.WholeBoard = true
		applier.NoReset = noReset(req.HostRoot)
	}

	err = l.withNVML(func() error {
		var err error

		res.GPUs, err = applier.Apply(ctx, cfg, req.Layout)

		return err
	})

	return res, err
}

// noReset says which GPUs the kernel cannot reset, "" when it can reset them all.
func noReset(hostRoot string) string {
	missing, err := gpu.Unresettable(hostRoot)

	switch {
	case err != nil:
		return fmt.Sprintf("the GPUs' PCI functions cannot be read (%v)", err)
	case len(missing) > 0:
		return fmt.Sprintf("the kernel offers no reset of GPU %s (no sysfs reset)", strings.Join(missing, ", "))
	}

	return ""
}

// WriteCDI generates the spec and writes it.
func (l *Local) WriteCDI(_ context.Context, req CDIRequest) error {
	// nvcdi initializes NVML itself.
	_, err := cdi.Write(l.Log, l.NVML, req.Options, req.Path)

	return err
}

func (l *Local) withNVML(job func() error) error {
	if err := gpu.Init(l.NVML); err != nil {
		return err
	}

	defer l.NVML.Shutdown() //nolint:errcheck // nothing to do about it

	return job()
}

// OnSubroot returns the jobs run here on a node's NVML: loaded from the subroot, with the
// subroot's nvidia-smi to reset GPUs.
func OnSubroot(subroot string, log *slog.Logger) *Local {
	return &Local{Log: log, NVML: gpu.FromSubroot(subroot), Resetter: mig.NvidiaSMIResetter{Root: subroot}}
}
