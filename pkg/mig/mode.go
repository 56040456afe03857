package mig

// The MIG mode change as nvml.h describes nvmlDeviceSetMigMode, and what keeps a GPU from
// changing: the processes that hold it.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/talos-nvidia/nvidia-driver/pkg/gpu"
)

// errPending: the GPU is held, the change waits for an idle GPU. errPendingReboot: only a
// reboot activates the pending mode.
var (
	errPending       = errors.New("pending")
	errPendingReboot = errors.New("pending reboot")
	// errAwaitingReset: the mode is set and pending; the board's one reset of all GPUs
	// (Applier.WholeBoard) comes after every GPU's mode.
	errAwaitingReset = errors.New("awaiting the board's reset")
)

// heldError is errPending or errPendingReboot with its message and the processes that hold
// the GPU, where known.
type heldError struct {
	kind    error
	msg     string
	holders []gpu.Holder
}

func (e *heldError) Error() string { return e.msg }

// pendingReboot is errPendingReboot with a message of its own.
func pendingReboot(format string, args ...any) error {
	return &heldError{kind: errPendingReboot, msg: fmt.Sprintf(format, args...)}
}
func (e *heldError) Unwrap() error { return e.kind }

// holders lists what uses the GPU: its compute processes (NVML) and, when openers is set,
// every process that has its device node open (/proc), ours excepted.
func (a *Applier) holders(dev nvml.Device, g *GPU, openers bool) ([]gpu.Holder, error) {
	procs, ret := dev.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("gpu %d: list processes: %w", g.Index, ret)
	}

	seen := map[int]bool{}

	var out []gpu.Holder

	for _, p := range procs {
		seen[int(p.Pid)] = true
		out = append(out, gpu.Holder{PID: int(p.Pid), Name: a.comm(int(p.Pid))})
	}

	if !openers {
		return out, nil
	}

	minor, ret := dev.GetMinorNumber()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("gpu %d: read minor number: %w", g.Index, ret)
	}

	open, err := gpu.Holders(a.procRoot(), minor)
	if err != nil {
		// NVML still refuses to unbind a held GPU (activationStatus IN_USE): say what is
		// missing and go on.
		a.logger().Warn("cannot see which processes hold the GPU", "gpu", g.Index, "error", err)
	}

	for _, h := range open {
		if !seen[h.PID] {
			out = append(out, h)
		}
	}

	return out, nil
}

func (a *Applier) procRoot() string {
	if a.ProcRoot == "" {
		return "/proc"
	}

	return a.ProcRoot
}

func (a *Applier) comm(pid int) string {
	b, err := os.ReadFile(filepath.Join(a.procRoot(), fmt.Sprint(pid), "comm"))
	if err != nil {
		return ""
	}

	return strings.TrimSpace(string(b))
}

// setMode changes the MIG mode with our nvidia-persistenced suspended. Where NVML leaves the
// change pending (nvml.h, nvmlDeviceSetMigMode's activationStatus) it resets the GPU if
// nothing holds it; a change that only a reboot can finish is errPendingReboot, one that waits
// for an idle GPU errPending. The pending mode is kept either way.
func (a *Applier) setMode(ctx context.Context, g *GPU, want int) (err error) {
	dev, err := a.device(g)
	if err != nil {
		return err
	}

	p := a.Persistenced
	if p == nil {
		p = NoPersistenced{}
	}

	resume, err := p.Suspend(ctx)
	if err != nil {
		return fmt.Errorf("gpu %d: suspend nvidia-persistenced: %w", g.Index, err)
	}

	defer func() {
		if rerr := resume(ctx); rerr != nil && err == nil {
			err = fmt.Errorf("gpu %d: resume nvidia-persistenced: %w", g.Index, rerr)
		}
	}()

	activation, ret := dev.SetMigMode(want)

	switch {
	case errors.Is(ret, nvml.ERROR_IN_USE) || (ret == nvml.SUCCESS && errors.Is(activation, nvml.ERROR_IN_USE)):
		return a.heldErr(errPending, dev, g, fmt.Sprintf("gpu %d: MIG mode %s is pending: NVML cannot unbind the GPU, it is in use (activationStatus %v)",
			g.Index, modeWord(want == nvml.DEVICE_MIG_ENABLE), nvml.ERROR_IN_USE))
	case ret != nvml.SUCCESS:
		return fmt.Errorf("gpu %d: set MIG mode: %w", g.Index, ret)
	case activation != nvml.SUCCESS && !errors.Is(activation, nvml.ERROR_RESET_REQUIRED):
		return fmt.Errorf("gpu %d: set MIG mode: activation: %w", g.Index, activation)
	}

	// nvml.h: the call "may unbind or reset the device ... the minor number might change":
	// look the GPU up again.
	if dev, err = a.device(g); err != nil {
		return err
	}

	cur, _, ret := dev.GetMigMode()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("gpu %d: get MIG mode: %w", g.Index, ret)
	}

	if cur == want {
		return nil
	}

	// The change is pending until a reset (Ampere, pass-through).
	holders, err := a.holders(dev, g, true)
	if err != nil {
		return err
	}

	if len(holders) > 0 {
		// Pausing them lets a restart reset the GPU; a reboot activates the kept pending mode.
		return &heldError{kind: errPending, holders: holders, msg: fmt.Sprintf(
			"gpu %d: MIG mode %s is pending until a GPU reset, and the GPU is held open by %s; it changes at the next boot, before workloads start, or on a restart once these have stopped",
			g.Index, modeWord(want == nvml.DEVICE_MIG_ENABLE), gpu.HolderList(holders))}
	}

	if a.Resetter == nil || a.NoReset != "" {
		why := "no way to reset the GPU"
		if a.NoReset != "" {
			why = a.NoReset
		}

		return pendingReboot("gpu %d: MIG mode change pending and %s; reboot to finish", g.Index, why)
	}

	if a.WholeBoard {
		return &heldError{kind: errAwaitingReset, msg: fmt.Sprintf("gpu %d: MIG mode %s is pending until the board's GPUs are reset together",
			g.Index, modeWord(want == nvml.DEVICE_MIG_ENABLE))}
	}

	if err := a.Resetter.ResetGPU(ctx, g.Index); err != nil {
		return pendingReboot("gpu %d: MIG mode %s is pending; resetting the GPU failed (%v); reboot to finish (the pending mode is kept)",
			g.Index, modeWord(want == nvml.DEVICE_MIG_ENABLE), err)
	}

	if dev, err = a.device(g); err != nil {
		return err
	}

	if cur, _, ret = dev.GetMigMode(); ret != nvml.SUCCESS {
		return fmt.Errorf("gpu %d: get MIG mode after reset: %w", g.Index, ret)
	}

	if cur != want {
		return pendingReboot("gpu %d: MIG mode still pending after a reset; reboot to finish", g.Index)
	}

	return nil
}

// heldErr is kind with the processes that hold the GPU named, as far as /proc shows them.
func (a *Applier) heldErr(kind error, dev nvml.Device, g *GPU, msg string) error {
	holders, err := a.holders(dev, g, true)
	if err != nil || len(holders) == 0 {
		// The service sees only its own PID namespace (pkg/node hostProc says why).
		return &heldError{kind: kind, msg: msg + "; something outside the service holds it (the device plugin, the DCGM exporter or another NVML client: " +
			"the service cannot see the host's processes); it changes at the next boot, before workloads start, or on a restart once they have stopped"}
	}

	return &heldError{kind: kind, holders: holders, msg: fmt.Sprintf("%s; held open by %s; it changes at the next boot, before workloads start, or on a restart once these have stopped",
		msg, gpu.HolderList(holders))}
}
