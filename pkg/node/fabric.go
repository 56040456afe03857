package node

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/talos-nvidia/nvidia-driver/pkg/daemons"
	"github.com/talos-nvidia/nvidia-driver/pkg/driverroot"
	"github.com/talos-nvidia/nvidia-driver/pkg/fabricmanager"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu"
	"github.com/talos-nvidia/nvidia-driver/pkg/nvswitch"
	"github.com/talos-nvidia/nvidia-driver/pkg/poll"
)

// States of the NVLink fabric on an NVSwitch board.
const (
	// FabricRegistered: a fabric manager runs (ext-nvidia-fabricmanager's, or one it left
	// alone), and every GPU that reports a fabric registered with it (GPUs before Hopper
	// report none).
	FabricRegistered = "registered"
	// FabricWaiting: GPUs are still registering.
	FabricWaiting = "waiting"
	// FabricDegraded: the GPUs are served, but some cannot use the fabric (or CUDA at all,
	// on Hopper and later), or no fabric manager runs to handle NVLink errors and GPU
	// resets, until what the message names is fixed.
	FabricDegraded = "degraded"
)

// Fabric is the NVSwitch part of the status; absent on a board without NVSwitches.
type Fabric struct {
	State   string         `json:"state"`
	Message string         `json:"message"`
	Board   nvswitch.Board `json:"board"`
	// Manager is the state the ext-nvidia-fabricmanager service reports (fabricmanager.State*:
	// "running", "restarting", "not-running", "foreign", ...), "" where that service is not
	// running.
	Manager string            `json:"manager,omitempty"`
	GPUs    []gpu.FabricState `json:"gpus,omitempty"`
}

// bringUpFabric runs the NVSwitch job: on a board with NVSwitches it shows the fabric
// manager's run directory (filled by the ext-nvidia-fabricmanager service) under the driver
// root, where CDI specs name its socket, and waits, bounded, until NVML says the GPUs
// registered with the fabric. The fabric manager itself runs in that other service, so that
// no restart of this one stops it. Nothing here stops the bring-up: where no fabric manager
// runs, the GPUs are still served and the status says why.
func (r *Runner) bringUpFabric(ctx context.Context) {
	board := nvswitch.Read(r.log, r.cfg.HostRoot)
	if !board.HasNVSwitch() {
		return
	}

	board.Log(r.log)

	// The fabric manager's run directory is the host's: a link there is refused and waited
	// out, as every other fault on the host path.
	src := r.cfg.Host(fabricmanager.RunDir)
	if err := r.retry(ctx, "the fabric manager's run directory", func() error { return daemons.MakeRunDir(src) }); err != nil {
		return
	}

	r.mirrorFabricManager(src)

	st := &Fabric{Board: board}
	r.waitFabric(ctx, st, r.cfg.FabricWait)
}

// mirrorFabricManager binds the fabric manager's run directory at the driver root's
// run/nvidia-fabricmanager (an empty directory the subroot ships), as the persistenced
// supervisor does for its socket. A failure costs containers the socket only.
func (r *Runner) mirrorFabricManager(src string) {
	dst := filepath.Join(r.cfg.DriverMount(), "run/nvidia-fabricmanager")
	if _, err := driverroot.MirrorRunDir(r.log, src, dst); err != nil {
		r.log.Warn("the fabric manager's socket will not be visible in the driver root", "error", err)
	}
}

// fabricManager observes the ext-nvidia-fabricmanager service: whether a fabric manager
// runs, why not, and whether waiting for one can help.
func (r *Runner) fabricManager(st *Fabric) (notRun string, hopeless bool) {
	obs := fabricmanager.Observe(r.cfg.HostRoot)

	st.Manager = ""
	if obs.Found && obs.Alive {
		st.Manager = obs.Status.State
	}

	// A live service that gave up, or found nothing to run, will not register the GPUs.
	hopeless = obs.Found && obs.Alive && (obs.Status.State == fabricmanager.StateNotRunning || obs.Status.State == fabricmanager.StateNoNVSwitch)

	return obs.Explain(), hopeless
}

// waitFabric reads the GPUs' fabric registration and the fabric manager's service until the
// registration is complete, no fabric manager can come, or bound has passed, reporting each
// distinct wait once, and records the outcome.
func (r *Runner) waitFabric(ctx context.Context, st *Fabric, bound time.Duration) {
	var (
		states          []gpu.FabricState
		pending, failed []gpu.FabricState
		notRun          string
		readErr         error
	)

	b := r.wait
	b.Within = bound

	err := b.Until(ctx, func() error {
		var hopeless bool

		states, readErr = r.jobs.FabricStates(ctx)
		pending, failed = fabricSummary(states)
		notRun, hopeless = r.fabricManager(st)

		switch {
		case readErr == nil && len(pending) == 0:
			return nil
		case hopeless:
			return poll.Permanent(errors.New(notRun))
		}

		return errors.New(fabricNotDone(readErr, pending, notRun, 0))
	}, func(err error) {
		st.GPUs, st.State, st.Message = states, FabricWaiting, err.Error()
		r.setFabric(st)
		r.report(PhaseWaiting, fmt.Sprintf("waiting for the NVLink fabric: %s", err))
	})

	st.GPUs = states

	switch {
	case err == nil:
		st.State, st.Message = fabricOutcome(states, failed, notRun, st.Manager)
	case ctx.Err() != nil:
		return
	default:
		st.State, st.Message = FabricDegraded, fabricNotDone(readErr, pending, notRun, bound)
	}

	r.setFabric(st)
}

// fabricSummary lists the GPUs still registering and those whose registration failed.
func fabricSummary(states []gpu.FabricState) (pending, failed []gpu.FabricState) {
	for _, s := range states {
		switch {
		case s.State == gpu.FabricNotStarted || s.State == gpu.FabricInProgress:
			pending = append(pending, s)
		case s.State == gpu.FabricCompleted && !s.Registered():
			failed = append(failed, s)
		}
	}

	return pending, failed
}

// fabricOutcome judges a fabric whose GPUs are done registering: complete only where a
// fabric manager runs, since without one nothing handles NVLink errors or registers a GPU
// again after a reset.
func fabricOutcome(states, failed []gpu.FabricState, notRun, manager string) (string, string) {
	if len(failed) > 0 {
		var parts []string
		for _, f := range failed {
			parts = append(parts, fmt.Sprintf("GPU %d: %s", f.Index, f.Error))
		}

		msg := fmt.Sprintf("fabric registration failed (%s): these GPUs work without NVLink peer-to-peer", strings.Join(parts, "; "))
		if notRun != "" {
			msg += "; " + notRun
		}

		return FabricDegraded, msg
	}

	registered := 0

	for _, s := range states {
		if s.Registered() {
			registered++
		}
	}

	by := "by nv-fabricmanager"
	if manager == fabricmanager.StateForeign {
		by = "by a fabric manager that ext-nvidia-fabricmanager did not start"
	}

	switch {
	case registered > 0 && notRun == "":
		return FabricRegistered, fmt.Sprintf("%d GPU(s) registered with the NVLink fabric %s", registered, by)
	case registered > 0:
		return FabricDegraded, fmt.Sprintf("%d GPU(s) registered with the NVLink fabric, but %s", registered, notRun)
	case notRun == "":
		return FabricRegistered, "nv-fabricmanager is running; NVML reports no fabric registration for these GPUs (before Hopper)"
	default:
		return FabricDegraded, notRun + "; NVML reports no fabric registration for these GPUs"
	}
}

// fabricNotDone says why the fabric is not complete: the GPUs still registering and, where
// it applies, why no fabric manager of ours runs.
func fabricNotDone(err error, pending []gpu.FabricState, notRun string, bound time.Duration) string {
	var msg string

	if err != nil {
		msg = fmt.Sprintf("cannot read the GPUs' fabric registration: %v", err)
	} else {
		byState := map[string][]string{}
		for _, p := range pending {
			byState[p.State] = append(byState[p.State], fmt.Sprint(p.Index))
		}

		var parts []string
		for _, s := range []string{gpu.FabricNotStarted, gpu.FabricInProgress} {
			if ids := byState[s]; len(ids) > 0 {
				parts = append(parts, fmt.Sprintf("GPU %s %s", strings.Join(ids, ","), s))
			}
		}

		msg = "fabric registration: " + strings.Join(parts, ", ")
		if bound > 0 {
			msg += fmt.Sprintf(" after %s", bound)
		}

		msg += " (CUDA fails on these GPUs with cudaErrorSystemNotReady until they register)"
	}

	if notRun != "" {
		msg += "; " + notRun
	}

	return msg
}

func (r *Runner) setFabric(st *Fabric) {
	cp := *st
	r.status.Update(func(s *Status) { s.Fabric = &cp })
}

// fabricCondition is the NVLink fabric of a node that is up: a problem while it is not
// complete, its registration said once it is; nothing on a board without NVSwitches.
func (r *Runner) fabricCondition() Condition {
	c := Condition{Name: ConditionFabric}

	st := r.status.Get().Fabric

	switch {
	case st == nil:
	case st.State != FabricRegistered:
		c.Problem = fmt.Sprintf("NVLink fabric %s: %s", st.State, st.Message)
	default:
		c.Note = "NVLink fabric: " + st.Message
	}

	return c
}

// fabricPoll is how often the watch reads the fabric manager's status file (a small file on
// tmpfs); NVML is read only while the registration is not complete, with backoff.
const fabricPoll = 5 * time.Second

// watchFabric keeps the fabric's status current once the node is up: the fabric manager's
// service as it changes, and, while the registration is not complete, the GPUs'
// registration. The node turns degraded when its fabric manager stops and ready when the
// fabric is complete again.
func (r *Runner) watchFabric(ctx context.Context) {
	st := r.status.Get().Fabric
	if st == nil {
		return
	}

	r.tasks.Go(func() {
		every := min(fabricPoll, r.wait.Max)
		delay := r.wait.Next(0)
		nextNVML := time.Now().Add(delay)

		for poll.Sleep(ctx, every) {

			cur := *st
			notRun, _ := r.fabricManager(&cur)

			states := cur.GPUs
			if (cur.State != FabricRegistered && !time.Now().Before(nextNVML)) || cur.Manager != st.Manager {
				if s, err := r.jobs.FabricStates(ctx); err == nil {
					states = s
				}

				delay = r.wait.Next(delay)
				nextNVML = time.Now().Add(delay)
			}

			if pending, failed := fabricSummary(states); len(pending) == 0 {
				cur.GPUs = states
				cur.State, cur.Message = fabricOutcome(states, failed, notRun, cur.Manager)
			} else if cur.State == FabricRegistered {
				cur.GPUs, cur.State, cur.Message = states, FabricDegraded, fabricNotDone(nil, pending, notRun, 0)
			}

			if cur.State != st.State || cur.Message != st.Message || cur.Manager != st.Manager {
				r.setFabric(&cur)
				// The readiness file is left alone: it lists the devices, which the
				// fabric does not change.
				r.reportUp()

				if cur.Manager != st.Manager {
					delay = r.wait.Next(0)
				}
			}

			st = &cur
		}
	})
}
