package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/talos-nvidia/nvidia-driver/pkg/daemons"
	"github.com/talos-nvidia/nvidia-driver/pkg/driverroot"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu"
	"github.com/talos-nvidia/nvidia-driver/pkg/nvswitch"
)

// States of the NVLink fabric on an NVSwitch board.
const (
	// FabricRegistered: every GPU that reports a fabric registered with it, or, where NVML
	// reports none (GPUs before Hopper), our fabric manager is ready.
	FabricRegistered = "registered"
	// FabricWaiting: GPUs are still registering.
	FabricWaiting = "waiting"
	// FabricDegraded: the GPUs are served, but some cannot use the fabric (or CUDA at all,
	// on Hopper and later) until what the message names is fixed.
	FabricDegraded = "degraded"
)

// Fabric is the NVSwitch part of the status; absent on a board without NVSwitches.
type Fabric struct {
	State   string         `json:"state"`
	Message string         `json:"message"`
	Board   nvswitch.Board `json:"board"`
	// Manager is our nv-fabricmanager's supervision state ("ready", "restarting", "failed"),
	// "foreign" where another fabric manager runs, or "" where none was started.
	Manager string            `json:"manager,omitempty"`
	GPUs    []gpu.FabricState `json:"gpus,omitempty"`
}

// fabricJob is the runner's NVSwitch job: the fabric manager it supervises, if any, and
// the watch that keeps the status current after bring-up.
type fabricJob struct {
	sup       *daemons.Supervisor
	done      chan struct{}
	watchDone chan struct{}
	notRun    string // why no fabric manager of ours runs, "" when one does
}

// bringUpFabric runs the NVSwitch job: on a board with NVSwitches it starts and supervises
// nv-fabricmanager and waits, bounded, until NVML says the GPUs registered with the fabric.
// Nothing here stops the bring-up: where the fabric manager cannot run, the GPUs are still
// served and the status says why.
func (r *Runner) bringUpFabric(ctx context.Context) {
	board, err := nvswitch.Detect(r.cfg.HostRoot)
	if err != nil {
		r.log.Warn("cannot read the whole NVSwitch board; going on with what was read", "error", err)
	}

	if !board.HasNVSwitch() {
		return
	}

	r.log.Info("NVSwitch board", "board", board.String(), "pci", board.PCI, "driver", board.Driver, "nvlink5", board.NVLink5)

	st := &Fabric{Board: board}
	notRun, foreign := r.startFabricManager(ctx, board)
	r.fabric.notRun = notRun

	switch {
	case foreign != nil:
		st.Manager = "foreign"
	case r.fabric.sup != nil:
		st.Manager = string(r.fabric.sup.Status().State)
	}

	r.setFabric(st)

	// Where nothing registers the GPUs (no fabric manager of ours, none foreign), waiting
	// cannot help: say so once. A foreign one may still be at work: wait for it.
	bound := r.cfg.FabricWait
	if notRun != "" && foreign == nil {
		bound = 0
	}

	r.waitFabric(ctx, st, notRun, bound)
}

// startFabricManager starts our nv-fabricmanager where it can run and waits until it is
// ready. It returns why none of ours runs ("" when it does), and the foreign fabric manager
// found instead, if any.
func (r *Runner) startFabricManager(ctx context.Context, board nvswitch.Board) (notRun string, foreign *daemons.ForeignDaemonError) {
	switch {
	case len(board.Driver) == 0 && len(board.NVLink5) > 0:
		return fmt.Sprintf("an NVLink 5 board (NVSwitches behind the ConnectX-7 management ports %s) needs nv-fabricmanager with NVLSM, which this service does not run",
			strings.Join(board.NVLink5, ", ")), nil
	case len(board.Driver) == 0:
		return fmt.Sprintf("NVSwitch PCI functions %s are present but the nvidia-nvswitch driver initialized none of them "+
			"(GPUs passed through to a VM without the board's NVSwitch topology?): no fabric manager can run", strings.Join(board.PCI, ", ")), nil
	}

	// Hopper and later: GPUs that registered already were registered by a fabric manager
	// that runs or ran before this service (one run on the host or by another extension, or
	// ours before a restart of the service). NVIDIA documents that a fabric manager restart
	// on HGX H100 and later needs the GPUs reset first ("Initializing NVSwitch and NVLink");
	// this service never resets GPUs, so it leaves such a fabric alone.
	if states, err := r.jobs.FabricStates(ctx); err == nil && allRegistered(states) {
		return "the GPUs were already registered with the NVLink fabric when the service started " +
			"(by a fabric manager it did not start, or its own before a restart): not starting another, " +
			"which NVIDIA documents to need a GPU reset first on HGX H100 and later", nil
	}

	if !r.cfg.FabricManager {
		return "running nv-fabricmanager is turned off (NVIDIA_DRIVER_FABRIC_MANAGER=false)", nil
	}

	spec, err := daemons.FabricManager(daemons.FabricManagerOptions{
		DriverRoot: r.cfg.Subroot,
		RunDir:     r.cfg.Host(daemons.FabricManagerRunDir),
		MirrorDir:  filepath.Join(r.cfg.DriverMount(), "run/nvidia-fabricmanager"),
	})
	if err != nil {
		// NVIDIA ships the fabric manager apart from the driver
		// (fabricmanager-linux-x86_64-<version>-archive.tar.xz).
		return fmt.Sprintf("nv-fabricmanager cannot be started from the subroot (the fabric manager archive is not in it?): %v", err), nil
	}

	// Ready is when its API socket answers, which may be after it has set the fabric up:
	// give a start as long as NVIDIA's nvidia-fabricmanager.service does (the wait's bound).
	sup := daemons.New(r.log, spec, daemons.Options{StartTimeout: r.cfg.FabricWait})
	done := make(chan struct{})
	r.fabric = fabricJob{sup: sup, done: done}

	go func() {
		defer close(done)

		if err := sup.Run(ctx); err != nil {
			r.log.Error("nv-fabricmanager supervision ended", "error", err)
		}
	}()

	// Bounded: the GPUs are served after this wait whatever the fabric manager does; the
	// supervisor goes on trying, and the fabric watch reports a later registration.
	waitCtx, cancel := context.WithTimeout(ctx, r.cfg.FabricWait)
	defer cancel()

	if err := sup.WaitReady(waitCtx); err != nil {
		if errors.As(err, &foreign) {
			return err.Error(), foreign
		}

		return err.Error(), nil
	}

	return "", nil
}

// waitFabric reads the GPUs' fabric registration until it is complete or bound has passed,
// reporting each distinct wait once, and records the outcome.
func (r *Runner) waitFabric(ctx context.Context, st *Fabric, notRun string, bound time.Duration) {
	deadline := time.Now().Add(bound)
	delay := r.wait.Initial
	last := ""

	for {
		states, err := r.jobs.FabricStates(ctx)
		pending, failed := fabricSummary(states)

		switch {
		case err == nil && len(pending) == 0:
			st.GPUs = states
			st.State, st.Message = r.fabricOutcome(states, failed, notRun)
			r.setFabric(st)

			return
		case ctx.Err() != nil:
			return
		case time.Now().After(deadline):
			st.GPUs = states
			st.State = FabricDegraded
			st.Message = fabricNotDone(err, pending, notRun, bound)
			r.setFabric(st)

			return
		}

		msg := fabricNotDone(err, pending, notRun, 0)
		if msg != last {
			st.GPUs, st.State, st.Message = states, FabricWaiting, msg
			r.setFabric(st)
			r.report(PhaseWaiting, fmt.Sprintf("waiting for the NVLink fabric: %s", msg))
			last = msg
		}

		select {
		case <-ctx.Done():
			return
		case <-time.After(min(delay, time.Until(deadline)+time.Millisecond)):
		}

		delay = min(delay*2, r.wait.Max)
	}
}

// allRegistered says whether the GPUs report a fabric and every one of them registered.
func allRegistered(states []gpu.FabricState) bool {
	registered := 0

	for _, s := range states {
		switch {
		case s.Registered():
			registered++
		case s.State != gpu.FabricNotSupported:
			return false
		}
	}

	return registered > 0
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

// fabricOutcome judges a fabric whose GPUs are done registering.
func (r *Runner) fabricOutcome(states, failed []gpu.FabricState, notRun string) (string, string) {
	if len(failed) > 0 {
		var parts []string
		for _, f := range failed {
			parts = append(parts, fmt.Sprintf("GPU %d: %s", f.Index, f.Error))
		}

		return FabricDegraded, fmt.Sprintf("fabric registration failed (%s): these GPUs work without NVLink peer-to-peer", strings.Join(parts, "; "))
	}

	registered := 0

	for _, s := range states {
		if s.Registered() {
			registered++
		}
	}

	switch {
	case registered > 0 && notRun == "":
		return FabricRegistered, fmt.Sprintf("%d GPU(s) registered with the NVLink fabric by nv-fabricmanager", registered)
	case registered > 0:
		return FabricRegistered, fmt.Sprintf("%d GPU(s) registered with the NVLink fabric; %s", registered, notRun)
	case notRun == "":
		return FabricRegistered, "nv-fabricmanager is ready; NVML reports no fabric registration for these GPUs (before Hopper)"
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
	if r.fabric.sup != nil && cp.Manager != "foreign" {
		cp.Manager = string(r.fabric.sup.Status().State)
	}

	r.status.update(func(s *Status) { s.Fabric = &cp }) //nolint:errcheck // reported by report()
}

// fabricPhase turns a ready node into a degraded one when its fabric is not complete, and
// adds the fabric to the message.
func (r *Runner) fabricPhase(phase, msg string) (string, string) {
	st := r.status.get().Fabric
	if st == nil {
		return phase, msg
	}

	if st.State != FabricRegistered {
		return PhaseDegraded, fmt.Sprintf("%s; NVLink fabric %s: %s", strings.Replace(msg, "node ready", "node degraded", 1), st.State, st.Message)
	}

	return phase, fmt.Sprintf("%s, NVLink fabric: %s", msg, st.Message)
}

// watchFabric keeps the fabric's status current once the node is up: our fabric manager's
// supervision state as it changes, and, while the fabric is not complete, the GPUs'
// registration, read with backoff; when it completes, the node becomes ready.
func (r *Runner) watchFabric(ctx context.Context) {
	st := r.status.get().Fabric
	if st == nil {
		return
	}

	r.fabric.watchDone = make(chan struct{})

	go func() {
		defer close(r.fabric.watchDone)

		delay := r.wait.Initial

		for {
			// Taken before the status is read, so that no change between the two is missed.
			var changed <-chan struct{}
			if r.fabric.sup != nil {
				changed = r.fabric.sup.Changed()
			}

			cur := *st
			if cur.State != FabricRegistered {
				if states, err := r.jobs.FabricStates(ctx); err == nil {
					if pending, failed := fabricSummary(states); len(pending) == 0 {
						cur.GPUs = states
						cur.State, cur.Message = r.fabricOutcome(states, failed, r.fabric.notRun)
					}
				}
			}

			r.setFabric(&cur)

			if cur.State == FabricRegistered && st.State != FabricRegistered {
				r.fabricReady()
			}

			st = &cur

			var poll <-chan time.Time

			switch {
			case cur.State != FabricRegistered:
				poll = time.After(delay)
				delay = min(delay*2, r.wait.Max)
			case r.fabric.sup == nil:
				return // nothing left to watch
			}

			select {
			case <-ctx.Done():
				return
			case <-changed:
			case <-poll:
			}
		}
	}()
}

// fabricReady reports a degraded node ready once its fabric completed.
func (r *Runner) fabricReady() {
	summary, err := json.MarshalIndent(r.readiness(), "", "  ")
	if err == nil {
		err = driverroot.MarkReady(r.cfg.ValidationsDir(), append(summary, '\n'))
	}

	if err != nil {
		r.log.Error("cannot update the readiness files", "error", err)
	}

	st := r.status.get()
	r.report(PhaseReady, fmt.Sprintf("node ready: %d GPU(s), driver %s, NVLink fabric: %s", len(st.GPUs), st.DriverVersion, st.Fabric.Message))
}

// stopFabric waits for our fabric manager's supervisor, which stops the daemon when the
// runner's context ends, within Talos's stop budget.
func (r *Runner) stopFabric() {
	if r.fabric.watchDone != nil {
		<-r.fabric.watchDone
	}

	if r.fabric.done == nil {
		return
	}

	select {
	case <-r.fabric.done:
	case <-time.After(9 * time.Second):
		r.log.Error("nv-fabricmanager did not stop in time")
	}
}
