package mig

// The whole-board reset of NVSwitch boards, as mig-parted does it: every GPU's MIG mode is
// set first with no reset (cmd/nvidia-mig-parted/apply/mode.go, --skip-reset), then, if any
// change is pending, one `nvidia-smi -r -i <every GPU>` (util/device.go ResetAllGPUs).
// mig-parted's safety checks come first: every GPU can be reset (deployments/systemd/utils.sh
// assert_gpu_reset_available, Applier.NoReset) and nothing uses any GPU (mig-manager stops
// every GPU client of the node before, deployments/container/reconfigure-mig.sh). A reset
// takes the instances of every GPU of the board, so those the layout leaves alone, and those
// it changed without a mode change, are made again as they were just before.

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/talos-nvidia/nvidia-driver/pkg/gpu"
)

// awaitingReset is a GPU whose mode is set and pending until the board's reset.
type awaitingReset struct {
	status int // its index in the statuses
	plan   GPUPlan
	prev   State // before this apply
}

// resetBoard finishes the awaiting GPUs' mode changes with one reset of all GPUs, or, where
// a check forbids it, leaves them pending with their previous instances back.
func (a *Applier) resetBoard(ctx context.Context, plan *Plan, statuses []Status, awaiting []awaitingReset) {
	all := make([]*GPU, 0, len(plan.GPUs))
	for _, gp := range plan.GPUs {
		all = append(all, gp.GPU)
	}

	// Each GPU as it is now, to be made again after the reset; and who holds any of them.
	before := map[int]State{}

	var (
		held    []gpu.Holder
		heldOn  []string
		busIDs  []string
		readErr error
	)

	for _, g := range all {
		busIDs = append(busIDs, g.BusID)

		dev, err := a.device(g)
		if err != nil {
			readErr = errors.Join(readErr, err)

			continue
		}

		if !g.MigCapable() {
			continue
		}

		st, _, err := ReadState(dev, g)
		if err != nil {
			readErr = errors.Join(readErr, err)

			continue
		}

		before[g.Index] = st

		hs, err := a.holders(dev, g, true)
		if err != nil {
			readErr = errors.Join(readErr, err)
		}

		if len(hs) > 0 {
			held = append(held, hs...)
			heldOn = append(heldOn, fmt.Sprintf("gpu %d by %s", g.Index, gpu.HolderList(hs)))
		}
	}

	br, canReset := a.Resetter.(BoardResetter)

	var why error

	switch {
	case readErr != nil:
		why = fmt.Errorf("the board was not reset: reading its GPUs: %w", readErr)
	case len(heldOn) > 0:
		why = &heldError{kind: errPending, holders: held, msg: fmt.Sprintf(
			"the board's GPUs reset only together, and %s; it changes at the next boot, before workloads start, or on a restart once these have stopped",
			strings.Join(heldOn, ", "))}
	case !canReset:
		why = pendingReboot("the board's GPUs reset only together and there is no way to reset them at once; reboot to finish")
	}

	if why == nil {
		why = a.resetAll(ctx, br, busIDs)
	}

	if why != nil {
		for _, w := range awaiting {
			st := &statuses[w.status]
			a.keepPending(st, w.plan.GPU, w.prev, fmt.Sprintf("%s; %v", st.Message, why), why)
		}

		return
	}

	a.logger().Info("reset all GPUs of the NVSwitch board at once, as their MIG mode changes need", "gpus", len(all))

	done := map[int]bool{}

	for _, w := range awaiting {
		done[w.plan.GPU.Index] = true
		st := &statuses[w.status]
		st.Changed = true

		if err := a.finishMode(w); err != nil {
			st.Result = ResultFailed
			st.Message = fmt.Sprintf("%v (after the reset of all %d GPUs of the board)", err, len(all))

			continue
		}

		st.Result = ResultSuccess
		st.Message = fmt.Sprintf("applied: %s (after the reset of all %d GPUs of the board)", w.plan.Target.String(), len(all))
	}

	// The reset took every other GPU's instances: they come back as they were.
	for k, gp := range plan.GPUs {
		g := gp.GPU
		prev, ok := before[g.Index]

		if done[g.Index] || !ok || !prev.MigEnabled || len(prev.Instances) == 0 {
			continue
		}

		st := &statuses[k]
		st.Changed = true

		dev, err := a.device(g)
		if err == nil {
			err = a.create(dev, g, prev)
		}

		if err != nil {
			st.Result = ResultFailed
			st.Message += fmt.Sprintf("; the board's reset took its instances and making them again failed: %v", err)

			continue
		}

		st.Message += "; its instances were made again after the board's reset"
	}
}

// resetAll resets every GPU at once with our nvidia-persistenced suspended (it holds them).
func (a *Applier) resetAll(ctx context.Context, br BoardResetter, busIDs []string) (err error) {
	p := a.Persistenced
	if p == nil {
		p = NoPersistenced{}
	}

	resume, err := p.Suspend(ctx)
	if err != nil {
		return fmt.Errorf("the board was not reset: suspend nvidia-persistenced: %w", err)
	}

	defer func() {
		if rerr := resume(ctx); rerr != nil && err == nil {
			err = fmt.Errorf("resume nvidia-persistenced: %w", rerr)
		}
	}()

	if err := br.ResetGPUs(ctx, busIDs); err != nil {
		if errors.Is(err, nvml.ERROR_IN_USE) {
			return &heldError{kind: errPending, msg: fmt.Sprintf("resetting the board's GPUs failed, one is in use (%v); it changes at the next boot, or on a restart once nothing holds them", err)}
		}

		return pendingReboot("resetting the board's GPUs failed (%v); reboot to finish (the pending mode is kept)", err)
	}

	return nil
}

// finishMode checks that the reset made the mode current and creates the target instances.
func (a *Applier) finishMode(w awaitingReset) error {
	g, target := w.plan.GPU, w.plan.Target

	dev, err := a.device(g)
	if err != nil {
		return err
	}

	cur, _, ret := dev.GetMigMode()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("gpu %d: get MIG mode after the reset: %w", g.Index, ret)
	}

	if cur != mode(target.MigEnabled) {
		return fmt.Errorf("gpu %d: MIG mode still pending after the board's reset", g.Index)
	}

	if !target.MigEnabled {
		return nil
	}

	return a.create(dev, g, target)
}

// keepPending reports a GPU pending (or pending-reboot) for why, with msg: the new mode stays
// pending (no rollback of the mode: the next boot or idle start finishes it), and instances
// destroyed on the way come back, so the GPU serves as before.
func (a *Applier) keepPending(st *Status, g *GPU, prev State, msg string, why error) {
	st.Result = ResultPending
	if errors.Is(why, errPendingReboot) {
		st.Result = ResultPendingReboot
	}

	var held *heldError
	if errors.As(why, &held) {
		st.Holders = held.holders
	}

	st.Message = msg
	st.Changed = false

	if restored, err := a.restoreInstances(g, prev); err != nil {
		st.Message += fmt.Sprintf("; restoring the previous instances failed: %v", err)
		st.Changed = true
	} else if restored {
		st.Changed = true
		st.Message += "; the previous instances were restored until then"
	}
}
