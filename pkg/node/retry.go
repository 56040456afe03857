package node

// A MIG layout that bring-up left pending because something held the GPUs is tried again
// once they are free, as the GPU Operator's mig-manager does it
// (mig-parted deployments/container/reconfigure-mig.sh): ask for the operands' pause, wait
// for them to leave, apply, lift the pause. The service has no Kubernetes credentials, so the
// pause is asked for through the Node Feature Discovery feature file it already writes:
// nvidia.com/gpu.deploy.<operand>=paused-for-mig-change, which NFD makes node labels at its
// worker's next pass and which the DaemonSets of deploy/ honour (their pods leave the node).
// The service cannot see the operands' processes (another PID namespace), so "left" is
// NVML's word: the next try no longer finds the GPUs in use.

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/talos-nvidia/nvidia-driver/pkg/cdi"
	"github.com/talos-nvidia/nvidia-driver/pkg/mig"
	"github.com/talos-nvidia/nvidia-driver/pkg/nfd"
)

// pendingMIG lists the GPUs the layout left pending on holders, and whether the service
// could name every holder (compute processes, processes of its own PID namespace).
func (r *Runner) pendingMIG() (gpus []int, named bool) {
	named = true

	for _, st := range r.status.Get().MIG {
		if st.Result == mig.ResultPending {
			gpus = append(gpus, st.Index)
			named = named && len(st.Holders) > 0
		}
	}

	return gpus, named
}

// startMIGRetry starts the retry of a pending layout, when there is one.
func (r *Runner) startMIGRetry(ctx context.Context) {
	pending, named := r.pendingMIG()
	if r.cfg.MIGLayout == "" || r.migProblem != nil || len(pending) == 0 {
		return
	}

	pause := r.cfg.MIGPause && r.cfg.NFDFeaturesDir != ""
	if !pause && !named {
		r.log.Warn("mig layout pending on GPU holders outside the service and not retried: without the operands' pause (migPause, nfdFeaturesDir) nothing lets them go; restart the service once they have stopped, or reboot",
			"layout", r.cfg.MIGLayout, "gpus", pending)

		return
	}

	r.tasks.Go(func() { r.retryMIG(ctx, pause) })
}

// retryMIG tries the layout every MIGRetryInterval, within MIGRetry, with the operands paused
// when pause is set and our nvidia-persistenced suspended (it holds every GPU). Whatever the
// outcome, persistenced is resumed, the CDI spec and readiness file say what the GPUs are,
// and then the pause is lifted: it is there only while the layout changes, so whatever the
// CDI step says (no device to serve, a spec not written) is the status's to say, with the
// operands back.
func (r *Runner) retryMIG(ctx context.Context, pause bool) {
	start := time.Now()
	pending, _ := r.pendingMIG()

	if pause {
		r.labelNode(ctx, r.migNodeState(), true)
		r.log.Info("mig layout pending: asked for the operands' pause through the NFD feature file; NFD labels the node at its worker's next pass (core.sleepInterval, 60 s by default)",
			"layout", r.cfg.MIGLayout, "gpus", pending, "labels", pauseLabelList(), "file", r.cfg.Host(r.cfg.NFDFeaturesDir))
	}

	resume := r.suspendPersistenced(ctx)

	defer func() {
		resume()

		// One try at the spec: a failure is not waited out while the operands are kept off.
		if ctx.Err() == nil {
			if err := r.refreshGPUs(ctx, false); err != nil {
				r.log.Error("after the MIG retry: the GPUs were not read again, or the readiness file not written", "error", err)
			}

			r.setUp()
		}

		// Last: the operands that come back find the readiness file and CDI spec current.
		if pause {
			r.log.Info("mig retry over: the operands' pause is lifted", "layout", r.cfg.MIGLayout, "state", r.migNodeState(),
				"after", time.Since(start).Round(time.Millisecond).String())
			r.labelNode(ctx, r.migNodeState(), false)
		}

		// A spec that failed otherwise than for want of devices, and readiness files not
		// written, are waited out now, as at bring-up; no device to serve changes only with a
		// new layout.
		cdiFailed := r.cdiProblem != nil && !errors.Is(r.cdiProblem, cdi.ErrNoDevices)
		if ctx.Err() == nil && (cdiFailed || r.readyProblem != nil) {
			if err := r.refreshGPUs(ctx, true); err != nil && ctx.Err() == nil {
				r.log.Error("after the MIG retry: the GPUs were not read again", "error", err)
			}

			if ctx.Err() == nil {
				r.setUp()
			}
		}
	}()

	for attempt := 1; ; attempt++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(r.cfg.MIGRetryInterval):
		}

		err := r.applyMIG(ctx)
		if ctx.Err() != nil {
			return
		}

		still, _ := r.pendingMIG()

		switch {
		case err != nil:
			r.log.Error("mig retry: the layout failed; not tried again", "layout", r.cfg.MIGLayout, "attempt", attempt, "error", err)

			return
		case len(still) == 0:
			r.log.Info("mig layout applied once the GPUs were free", "layout", r.cfg.MIGLayout, "state", r.migNodeState(),
				"attempts", attempt, "after", time.Since(start).Round(time.Millisecond).String())

			return
		case time.Since(start) >= r.cfg.MIGRetry:
			r.log.Warn("mig layout still pending; not tried again: the GPUs are still in use", "layout", r.cfg.MIGLayout, "gpus", still,
				"attempts", attempt, "after", time.Since(start).Round(time.Millisecond).String())

			return
		}

		// Still held: the try withdrew the readiness file before its first call (the mode
		// change NVML refused); consumers read the GPUs as they are until the next try.
		if err := r.refreshGPUs(ctx, false); err != nil {
			r.log.Error("mig retry: the GPUs were not read again, or the readiness file not written", "error", err)
		}

		r.setUp()
	}
}

// refreshGPUs reads the GPUs again (MIG devices may have changed) and publishes them; wait
// as publish has it.
func (r *Runner) refreshGPUs(ctx context.Context, wait bool) error {
	gpus, err := r.jobs.ListGPUs(ctx)
	if err != nil {
		return err
	}

	r.status.Update(func(s *Status) { s.GPUs = gpus })

	return r.publish(ctx, wait)
}

// suspendPersistenced stops our nvidia-persistenced for the retry; the function resumes it.
func (r *Runner) suspendPersistenced(ctx context.Context) func() {
	if r.persistenced == nil {
		return func() {}
	}

	resume, err := r.persistenced.Suspend(ctx)
	if err != nil {
		r.log.Warn("mig retry: nvidia-persistenced not suspended; it holds the GPUs, so the layout may stay pending", "error", err)

		return func() {}
	}

	return resume
}

func pauseLabelList() string {
	var out []string
	for k, v := range nfd.PauseLabels() {
		out = append(out, fmt.Sprintf("%s=%s", k, v))
	}

	sort.Strings(out)

	return strings.Join(out, ",")
}
