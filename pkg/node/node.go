// Package node brings a GPU node up: it runs the node jobs in order, reports the status
// and, on stop, stops what it started. It owns no job's logic, only their order.
package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/talos-nvidia/nvidia-driver/pkg/cdi"
	"github.com/talos-nvidia/nvidia-driver/pkg/config"
	"github.com/talos-nvidia/nvidia-driver/pkg/daemons"
	"github.com/talos-nvidia/nvidia-driver/pkg/devnodes"
	"github.com/talos-nvidia/nvidia-driver/pkg/driverroot"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu"
	"github.com/talos-nvidia/nvidia-driver/pkg/memory"
	"github.com/talos-nvidia/nvidia-driver/pkg/mig"
	"github.com/talos-nvidia/nvidia-driver/pkg/nfd"
	"github.com/talos-nvidia/nvidia-driver/pkg/nvmljobs"
	"github.com/talos-nvidia/nvidia-driver/pkg/poll"
)

// Backoff bounds how often the runner looks again for what it waits for.
type Backoff struct {
	Initial, Max time.Duration
}

// Runner brings up one node.
type Runner struct {
	log *slog.Logger
	cfg config.Config
	// jobs does the NVML work: in child processes on a node (see nvmljobs).
	jobs   nvmljobs.Jobs
	wait   Backoff
	status *statusFile
	// persistenced is our nvidia-persistenced supervisor once started, else nil.
	persistenced *daemons.Supervisor
	daemonsDone  chan struct{}
	fabric       fabricJob // the NVSwitch job (fabric.go)
}

// Option changes a Runner.
type Option func(*Runner)

// WithBackoff sets how the runner polls for the driver and for GPUs.
func WithBackoff(b Backoff) Option { return func(r *Runner) { r.wait = b } }

// New returns a runner. jobs does the NVML work: in child processes of the service on a
// node, on simulated GPUs in this process in the demo and tests.
func New(log *slog.Logger, cfg config.Config, jobs nvmljobs.Jobs, opts ...Option) *Runner {
	r := &Runner{
		log:    log,
		cfg:    cfg,
		jobs:   jobs,
		wait:   Backoff{Initial: time.Second, Max: 30 * time.Second},
		status: newStatusFile(cfg.StatusFile(), cfg.Subroot),
	}

	for _, o := range opts {
		o(r)
	}

	return r
}

// Status returns the latest status.
func (r *Runner) Status() Status { return r.status.get() }

// Run brings the node up and then holds it until ctx ends. It returns nil when stopped by
// ctx, whatever step it was in: a Talos service that exits non-zero on stop is restarted.
// Problems a restart cannot fix (a broken subroot) are reported and waited on, not returned:
// exiting would only make Talos restart the service in a loop.
func (r *Runner) Run(ctx context.Context) error {
	defer r.report(PhaseStopped, "service stopped; the driver root stays mounted for running containers")
	defer r.stopDaemons()
	defer r.stopFabric()

	if err := r.bringUp(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}

		// A ready file from an earlier run would now be a lie.
		if rmErr := driverroot.MarkNotReady(r.cfg.ValidationsDir()); rmErr != nil {
			r.log.Error("cannot remove the readiness files", "error", rmErr)
		}

		if r.cfg.MIGLayout != "" {
			r.labelNode(string(mig.ResultFailed))
		}

		r.report(PhaseFailed, err.Error())
		r.releaseMemory()
		<-ctx.Done()

		return nil
	}

	r.releaseMemory()
	<-ctx.Done()

	return nil
}

// releaseMemory gives back what the bring-up used: from here on the service only waits.
func (r *Runner) releaseMemory() {
	rel, err := memory.Release()
	if err != nil {
		r.log.Warn("cannot release the bring-up's memory", "error", err)

		return
	}

	r.log.Info("released the bring-up's memory", "rssKiB", rel.AfterKiB, "rssBeforeKiB", rel.BeforeKiB)
}

func (r *Runner) bringUp(ctx context.Context) error {
	r.report(PhaseStarting, "checking the subroot")

	report := driverroot.Check(r.cfg.Subroot)
	if err := report.Err(); err != nil {
		return err
	}

	r.status.update(func(s *Status) { s.DriverVersion = report.DriverVersion }) //nolint:errcheck // reported by report()

	// A bad MIG layout file or name is a configuration error: say so now, before anything is
	// mounted and before waiting for a driver that may be missing too.
	if r.cfg.MIGLayout != "" {
		cfg, err := mig.LoadFile(r.cfg.MIGConfig)
		if err != nil {
			return err
		}

		if _, err := cfg.Select(r.cfg.MIGLayout); err != nil {
			return fmt.Errorf("MIG layout %q: %w", r.cfg.MIGLayout, err)
		}
	}

	// The driver root is the extension's own content: mounting it needs no GPU, and consumers
	// that start early find it.
	mount := r.cfg.DriverMount()
	if _, err := driverroot.Mount(r.log, r.cfg.Subroot, mount); err != nil {
		return fmt.Errorf("mounting the driver root: %w", err)
	}

	r.status.update(func(s *Status) { s.DriverRoot = mount }) //nolint:errcheck

	if err := r.waitFor(ctx, "the nvidia kernel module (machine.kernel.modules in the machine config)", r.driverLoaded); err != nil {
		return err
	}

	if err := r.syncDeviceNodes(); err != nil {
		return err
	}

	// The driver root's dev/ shows the host's /dev, as a driver container's root does: the
	// device plugin, DRA driver and GPU Operator validator look for device nodes there.
	if _, err := driverroot.BindDev(r.log, r.cfg.Host("/dev"), mount); err != nil {
		return fmt.Errorf("binding the host's /dev under the driver root: %w", err)
	}

	var gpus []gpu.GPU

	err := r.waitFor(ctx, "a GPU that NVML can see", func() error {
		var err error

		gpus, err = r.jobs.ListGPUs(ctx)

		return err
	})
	if err != nil {
		return err
	}

	r.status.update(func(s *Status) { s.GPUs = gpus }) //nolint:errcheck

	if r.cfg.MIGLayout != "" {
		// A GPU that failed half-way was rolled back to its previous layout; a few more tries
		// may succeed, then the node comes up with it as it is. A GPU held open is pending and
		// not retried; a layout that does not fit fails at once.
		attempts := 0

		err := r.waitFor(ctx, fmt.Sprintf("MIG layout %q", r.cfg.MIGLayout), func() error {
			attempts++

			err := r.applyMIG(ctx)
			if err != nil && attempts >= maxMIGAttempts {
				r.log.Error("MIG layout not applied; the node comes up with the GPUs as they are", "layout", r.cfg.MIGLayout, "attempts", attempts, "error", err)

				return nil
			}

			return err
		})
		if err != nil {
			return err
		}

		// MIG mode and instances may have changed what NVML reports.
		if gpus, err = r.jobs.ListGPUs(ctx); err != nil {
			return err
		}

		r.status.update(func(s *Status) { s.GPUs = gpus }) //nolint:errcheck
	}

	r.startPersistenced(ctx)
	r.bringUpFabric(ctx)

	if r.cfg.CDI {
		// nvcdi looks under the driver root for the libraries and the persistenced socket:
		// the /run/nvidia/driver mount has both (see docs/cdi.md).
		opts := cdi.DefaultOptions(mount)
		opts.DevRoot = r.cfg.HostRoot

		err := r.waitFor(ctx, "a CDI spec of the node's GPUs", func() error {
			return r.jobs.WriteCDI(ctx, nvmljobs.CDIRequest{Options: opts, Path: r.cfg.Host(r.cfg.CDISpec)})
		})
		if err != nil {
			return err
		}

		r.status.update(func(s *Status) { s.CDISpec = r.cfg.Host(r.cfg.CDISpec) }) //nolint:errcheck
	}

	// The readiness file holds only what consumers act on, no timestamps: the device plugin
	// and DCGM exporter restart when its bytes change, so a restart of the service that
	// changes nothing must not change it.
	summary, err := json.MarshalIndent(r.readiness(), "", "  ")
	if err != nil {
		return fmt.Errorf("encoding the readiness summary: %w", err)
	}

	if err := driverroot.MarkReady(r.cfg.ValidationsDir(), append(summary, '\n')); err != nil {
		return err
	}

	r.labelNode(migState(r.status.get().MIG))

	msg := fmt.Sprintf("node ready: %d GPU(s), driver %s", len(gpus), report.DriverVersion)
	if state := migState(r.status.get().MIG); state != "" {
		msg += fmt.Sprintf(", MIG layout %q: %s%s", r.cfg.MIGLayout, state, migDetail(r.status.get().MIG))
	}

	r.fabric.readyMsg = msg
	r.report(r.fabricPhase(PhaseReady, msg))
	r.watchFabric(ctx)

	return nil
}

// permanentError ends a waitFor: trying again cannot help.
type permanentError struct{ err error }

func (p permanentError) Error() string { return p.err.Error() }

func permanent(err error) error { return permanentError{err} }

func (r *Runner) driverLoaded() error {
	p := r.cfg.Host("/proc/driver/nvidia/version")
	if _, err := os.Stat(p); err != nil {
		return fmt.Errorf("%w: %s is missing", gpu.ErrNoDriver, p)
	}

	return nil
}

// waitFor calls check until it succeeds, with backoff, reporting the wait once per distinct
// reason; a permanent error ends it.
func (r *Runner) waitFor(ctx context.Context, what string, check func() error) error {
	err := poll.Until(ctx, r.wait.Initial, r.wait.Max, check,
		func(err error) bool { var p permanentError; return errors.As(err, &p) },
		func(err error) { r.report(PhaseWaiting, fmt.Sprintf("waiting for %s: %s", what, err)) })

	var p permanentError
	if errors.As(err, &p) {
		return p.err
	}

	return err
}

func (r *Runner) report(phase, msg string) {
	st, err := r.status.update(func(s *Status) { s.Phase, s.Message = phase, msg })

	level := slog.LevelInfo

	switch phase {
	case PhaseFailed:
		level = slog.LevelError
	case PhaseWaiting, PhaseDegraded:
		level = slog.LevelWarn
	}

	r.log.Log(context.Background(), level, msg, "phase", st.Phase)

	if err != nil {
		r.log.Error("cannot write the status file", "error", err)
	}
}

// maxMIGAttempts bounds the tries of a layout that failed half-way.
const maxMIGAttempts = 3

// applyMIG applies the configured layout. Our nvidia-persistenced is not running yet (it
// starts after MIG, as DESIGN's order says), so there is nothing of ours to suspend. The job
// withdraws the readiness files before the first change; GPUs the change does not touch keep
// their device nodes and CDI devices throughout.
func (r *Runner) applyMIG(ctx context.Context) error {
	req := nvmljobs.MIGRequest{
		ConfigFile:     r.cfg.MIGConfig,
		Layout:         r.cfg.MIGLayout,
		HostRoot:       r.cfg.HostRoot,
		ProcRoot:       r.hostProc(),
		ValidationsDir: r.cfg.ValidationsDir(),
	}

	changing := false

	res, err := r.jobs.ApplyMIG(ctx, req, func() {
		changing = true

		r.report(PhaseStarting, fmt.Sprintf("changing the GPUs to MIG layout %q; readiness withdrawn meanwhile", r.cfg.MIGLayout))
	})

	var layoutErr *mig.LayoutError
	if errors.As(err, &layoutErr) {
		// Planning failed: nothing was changed, and trying again cannot help.
		return permanent(fmt.Errorf("MIG layout %q: %w", r.cfg.MIGLayout, err))
	}

	if err != nil && changing {
		// The job ended without an answer after it began to change GPUs (its process died):
		// it may have changed some without making their device nodes, and the next try,
		// finding them in the layout, changes nothing and so makes none either.
		if syncErr := r.syncDeviceNodes(); syncErr != nil {
			return fmt.Errorf("%w; then %w", err, syncErr)
		}
	}

	if err != nil {
		return err
	}

	r.status.update(func(s *Status) { //nolint:errcheck // reported by report()
		s.MIG = res.GPUs
		if res.DeviceNodes > 0 {
			s.DeviceNodes = res.DeviceNodes
		}
	})

	var failed []string

	for _, st := range res.GPUs {
		// pending and pending-reboot leave the GPU usable as it is: the node comes up and says
		// so; trying again now cannot help.
		if st.Result == mig.ResultFailed {
			failed = append(failed, fmt.Sprintf("GPU %d: %s", st.Index, st.Message))
		}
	}

	if len(failed) > 0 {
		return fmt.Errorf("not applied, GPUs rolled back: %s", strings.Join(failed, "; "))
	}

	return nil
}

// syncDeviceNodes makes the host's NVIDIA device nodes match what the driver offers now, and
// counts them in the status.
func (r *Runner) syncDeviceNodes() error {
	nodes, err := devnodes.Sync(r.log, r.cfg.HostRoot)
	if err != nil {
		return fmt.Errorf("creating device nodes: %w", err)
	}

	r.status.update(func(s *Status) { s.DeviceNodes = len(nodes.Nodes) }) //nolint:errcheck // reported by report()

	return nil
}

// startPersistenced starts the supervised nvidia-persistenced and waits until it answers.
// The node is usable without it, so a failure is reported, not fatal. Once it answers, its
// socket is visible under the driver root, where nvcdi finds it for the CDI spec.
func (r *Runner) startPersistenced(ctx context.Context) {
	if !r.cfg.Persistenced {
		return
	}

	opts := daemons.DefaultPersistencedOptions(r.cfg.Subroot)
	opts.PersistenceMode = r.cfg.PersistenceMode
	opts.UVMPersistenceMode = r.cfg.UVMPersistenceMode
	opts.Verbose = r.cfg.PersistencedVerbose
	opts.MirrorDir = filepath.Join(r.cfg.DriverMount(), driverroot.PersistencedSocketDir)

	spec, err := daemons.Persistenced(opts)
	if err != nil {
		r.log.Error("nvidia-persistenced not started", "error", err)

		return
	}

	sup := daemons.New(r.log, spec, daemons.Options{})
	r.persistenced = sup
	r.daemonsDone = make(chan struct{})

	go func() {
		defer close(r.daemonsDone)

		if err := sup.Run(ctx); err != nil {
			r.log.Error("nvidia-persistenced supervision ended", "error", err)
		}
	}()

	if err := sup.WaitReady(ctx); err != nil {
		r.log.Error("nvidia-persistenced is not ready; continuing without it", "error", err)

		return
	}

	r.status.update(func(s *Status) { s.Persistenced = string(sup.Status().State) }) //nolint:errcheck
}

// stopDaemons waits for the supervisors, which stop their daemons when ctx ends, within
// Talos's stop budget.
func (r *Runner) stopDaemons() {
	if r.daemonsDone == nil {
		return
	}

	select {
	case <-r.daemonsDone:
	case <-time.After(9 * time.Second):
		r.log.Error("nvidia-persistenced did not stop in time")
	}
}

// readinessSummary is the content of the readiness file.
type readinessSummary struct {
	DriverVersion string         `json:"driverVersion"`
	GPUs          []readinessGPU `json:"gpus"`
	MIGLayout     string         `json:"migLayout,omitempty"`
	MIG           []readinessMIG `json:"mig,omitempty"`
	CDISpec       string         `json:"cdiSpec,omitempty"`
	Fabric        string         `json:"fabric,omitempty"`
}

type readinessGPU struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid"`
	Name  string `json:"name"`
	MIG   string `json:"mig,omitempty"`
}

type readinessMIG struct {
	Index  int        `json:"index"`
	Result mig.Result `json:"result"`
}

func (r *Runner) readiness() readinessSummary {
	st := r.status.get()
	sum := readinessSummary{DriverVersion: st.DriverVersion, MIGLayout: r.cfg.MIGLayout, CDISpec: st.CDISpec}
	if st.Fabric != nil {
		sum.Fabric = st.Fabric.State
	}

	for _, g := range st.GPUs {
		sum.GPUs = append(sum.GPUs, readinessGPU{Index: g.Index, UUID: g.UUID, Name: g.Name, MIG: g.MIG})
	}

	for _, m := range st.MIG {
		sum.MIG = append(sum.MIG, readinessMIG{Index: m.Index, Result: m.Result})
	}

	return sum
}

// hostProc is where the service looks for the processes that hold a GPU open: its own /proc,
// which shows only its PID namespace (Talos gives each extension service one). The host's
// /proc is not mounted: through /proc/<pid>/root it would give write access to the whole
// host, machine config and secrets included. NVML still names compute processes, and still
// refuses a MIG mode change while anything holds the GPU (activationStatus IN_USE).
func (r *Runner) hostProc() string {
	return r.cfg.Host("/proc")
}

// migState sums up the GPUs' MIG results for the node label: failed wins over
// pending-reboot, then pending, then success; "" when no layout was applied.
func migState(results []mig.Status) string {
	rank := map[mig.Result]int{mig.ResultSuccess: 1, mig.ResultPending: 2, mig.ResultPendingReboot: 3, mig.ResultFailed: 4}
	state := mig.Result("")

	for _, res := range results {
		if rank[res.Result] > rank[state] {
			state = res.Result
		}
	}

	return string(state)
}

// migDetail names the GPUs that are not in the layout and what finishes them.
func migDetail(results []mig.Status) string {
	var parts []string

	for _, res := range results {
		switch res.Result {
		case mig.ResultPendingReboot:
			parts = append(parts, fmt.Sprintf("GPU %d pending-reboot: reboot to finish", res.Index))
		case mig.ResultPending:
			who := "a client the service cannot see"
			if len(res.Holders) > 0 {
				who = gpu.HolderList(res.Holders)
			}

			parts = append(parts, fmt.Sprintf("GPU %d pending: held open by %s", res.Index, who))
		case mig.ResultFailed:
			parts = append(parts, fmt.Sprintf("GPU %d failed: %s", res.Index, res.Message))
		}
	}

	if len(parts) == 0 {
		return ""
	}

	return " (" + strings.Join(parts, "; ") + ")"
}

// labelNode writes the Node Feature Discovery feature file, when configured: the MIG
// layout, its state and the GPU product, for clusters that run NFD.
func (r *Runner) labelNode(state string) {
	if r.cfg.NFDFeaturesDir == "" {
		return
	}

	layout := ""
	if state != "" {
		layout = r.cfg.MIGLayout
	}

	product := ""
	if gpus := r.status.get().GPUs; len(gpus) > 0 {
		product = gpus[0].Name
	}

	w, err := nfd.NewWriter(r.cfg.Host(r.cfg.NFDFeaturesDir), nfd.DefaultName)
	if err == nil {
		err = w.Write(nfd.MIGLabels(layout, state, product))
	}

	if err != nil {
		r.log.Error("cannot write the Node Feature Discovery labels", "error", err)
	}
}
