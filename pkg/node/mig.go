package node

// The node's MIG step: the layout is read and checked before anything is mounted, applied
// after the device nodes, and a layout that cannot be applied never takes the GPUs away.

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/talos-nvidia/nvidia-driver/pkg/driverroot"
	"github.com/talos-nvidia/nvidia-driver/pkg/mig"
)

// checkMIGLayout reads the layouts file and finds the configured layout in it. A problem is
// kept in r.migProblem, not returned: the node then serves its GPUs as they are, degraded,
// as the GPU Operator's mig-manager leaves them (mig.config.state=failed).
func (r *Runner) checkMIGLayout() {
	cfg, err := mig.LoadFile(r.cfg.MIGConfig)
	if err != nil {
		r.migProblem = err

		return
	}

	// mig-parted has no built-in layouts, so NVIDIA's files define all-disabled, all-enabled
	// and all-balanced themselves: the file's win. Said once, at each start.
	if len(cfg.Overridden) > 0 {
		r.log.Info("the MIG layouts file defines layouts named like built-in ones; the file's are used",
			"file", cfg.Source, "layouts", strings.Join(cfg.Overridden, ","))
	}

	if _, err := cfg.Select(r.cfg.MIGLayout); err != nil {
		r.migProblem = fmt.Errorf("MIG layout %q: %w", r.cfg.MIGLayout, err)
	}
}

// bringUpMIG applies the configured layout unless checkMIGLayout found it unusable. It
// returns only what ends the bring-up (ctx); a layout that cannot be applied is kept in
// r.migProblem.
func (r *Runner) bringUpMIG(ctx context.Context) error {
	if r.migProblem != nil {
		r.log.Error("MIG layout not applied; the GPUs are served as they are", "layout", r.cfg.MIGLayout, "error", r.migProblem)

		return nil
	}

	// A GPU that failed half-way was rolled back to its previous layout; a few more tries
	// may succeed, then the node comes up with it as it is. A GPU held open is pending and
	// not retried; a layout that does not fit fails at once.
	attempts := 0

	err := r.waitFor(ctx, fmt.Sprintf("MIG layout %q", r.cfg.MIGLayout), func() error {
		// The job withdraws the readiness files before its first change, and refuses every
		// GPU where it cannot (a link at their directory): a fault on the host path, waited
		// out until it clears like every other, not an attempt of the layout.
		if err := driverroot.CheckReadyDir(r.cfg.ValidationsDir()); err != nil {
			return err
		}

		attempts++

		err := r.applyMIG(ctx)
		if err != nil && attempts >= maxMIGAttempts {
			r.log.Error("MIG layout not applied; the node comes up with the GPUs as they are", "layout", r.cfg.MIGLayout, "attempts", attempts, "error", err)

			// GPUs that failed say so in their results; without any, the error is all there is.
			if len(r.status.Get().MIG) == 0 {
				r.migProblem = fmt.Errorf("after %d attempts: %w", attempts, err)
			}

			return nil
		}

		return err
	})

	var layoutErr *mig.LayoutError
	if errors.As(err, &layoutErr) {
		r.migProblem = err
		r.log.Error("MIG layout not applied; the GPUs are served as they are", "layout", r.cfg.MIGLayout, "error", err)

		return nil
	}

	return err
}

// migNodeState is the node's mig.config.state: failed when the layout could not be
// applied at all, else the GPUs' results summed up; "" without a layout.
func (r *Runner) migNodeState() string {
	if r.migProblem != nil {
		return string(mig.ResultFailed)
	}

	return migState(r.status.Get().MIG)
}

// migCondition is the MIG layout's outcome on a node that is up: a problem when the layout,
// or a GPU of it, failed; otherwise the layout's state, said; nothing without a layout.
func (r *Runner) migCondition() Condition {
	c := Condition{Name: ConditionMIG}
	state := r.migNodeState()

	switch {
	case r.migProblem != nil:
		c.Problem = fmt.Sprintf("MIG layout %q not applied, the GPUs are served as they are: %v", r.cfg.MIGLayout, r.migProblem)
	case state == string(mig.ResultFailed):
		c.Problem = fmt.Sprintf("MIG layout %q: %s%s", r.cfg.MIGLayout, state, migDetail(r.status.Get().MIG))
	case state != "":
		c.Note = fmt.Sprintf("MIG layout %q: %s%s", r.cfg.MIGLayout, state, migDetail(r.status.Get().MIG))
	}

	return c
}
