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

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/talos-nvidia/nvidia-driver/pkg/cdi"
	"github.com/talos-nvidia/nvidia-driver/pkg/config"
	"github.com/talos-nvidia/nvidia-driver/pkg/daemons"
	"github.com/talos-nvidia/nvidia-driver/pkg/devnodes"
	"github.com/talos-nvidia/nvidia-driver/pkg/driverroot"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu"
	"github.com/talos-nvidia/nvidia-driver/pkg/mig"
	"github.com/talos-nvidia/nvidia-driver/pkg/nfd"
)

// Backoff bounds how often the runner looks again for what it waits for.
type Backoff struct {
	Initial, Max time.Duration
}

// Runner brings up one node.
type Runner struct {
	log    *slog.Logger
	cfg    config.Config
	nvml   nvml.Interface
	wait   Backoff
	status *statusFile
	// refreshProc rewrites a simulated node's /proc after a MIG change (the demo); nil on a
	// node, where the driver keeps /proc current.
	refreshProc func() error
	// persistenced is our nvidia-persistenced supervisor once started, else nil.
	persistenced *daemons.Supervisor
	daemonsDone  chan struct{}
}

// Option changes a Runner.
type Option func(*Runner)

// WithBackoff sets how the runner polls for the driver and for GPUs.
func WithBackoff(b Backoff) Option { return func(r *Runner) { r.wait = b } }

// WithSimulatedProc makes the runner rewrite a simulated node's /proc files after a MIG
// change, as the real driver does.
func WithSimulatedProc(refresh func() error) Option {
	return func(r *Runner) { r.refreshProc = refresh }
}

// New returns a runner. lib is NVML: loaded from the subroot on a node, simulated in the
// demo and tests.
func New(log *slog.Logger, cfg config.Config, lib nvml.Interface, opts ...Option) *Runner {
	r := &Runner{
		log:    log,
		cfg:    cfg,
		nvml:   lib,
		wait:   Backoff{Initial: time.Second, Max: 30 * time.Second},
		status: &statusFile{path: cfg.StatusFile(), cur: Status{Subroot: cfg.Subroot}},
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
		<-ctx.Done()

		return nil
	}

	<-ctx.Done()

	return nil
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
		cfg, err := r.migConfig()
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

	nodes, err := devnodes.Sync(r.log, r.cfg.HostRoot)
	if err != nil {
		return fmt.Errorf("creating device nodes: %w", err)
	}

	r.status.update(func(s *Status) { s.DeviceNodes = len(nodes.Nodes) }) //nolint:errcheck

	// The driver root's dev/ shows the host's /dev, as a driver container's root does: the
	// device plugin, DRA driver and GPU Operator validator look for device nodes there.
	if _, err := driverroot.BindDev(r.log, r.cfg.Host("/dev"), mount); err != nil {
		return fmt.Errorf("binding the host's /dev under the driver root: %w", err)
	}

	var gpus []gpu.GPU

	err = r.waitFor(ctx, "a GPU that NVML can see", func() error {
		gpus, err = r.listGPUs()

		return err
	})
	if err != nil {
		return err
	}

	r.status.update(func(s *Status) { s.GPUs = gpus }) //nolint:errcheck

	if r.cfg.MIGLayout != "" {
		// A GPU that failed half-way was rolled back to its previous layout; the next try
		// may succeed (a process let go of the GPU). A layout that does not fit never will.
		err := r.waitFor(ctx, fmt.Sprintf("MIG layout %q", r.cfg.MIGLayout), func() error { return r.applyMIG(ctx) })
		if err != nil {
			return err
		}

		// MIG mode and instances may have changed what NVML reports.
		if gpus, err = r.listGPUs(); err != nil {
			return err
		}

		r.status.update(func(s *Status) { s.GPUs = gpus }) //nolint:errcheck
	}

	r.startPersistenced(ctx)

	if r.cfg.CDI {
		// nvcdi looks under the driver root for the libraries and the persistenced socket:
		// the /run/nvidia/driver mount has both (see docs/cdi.md).
		opts := cdi.DefaultOptions(mount)
		opts.DevRoot = r.cfg.HostRoot

		err := r.waitFor(ctx, "a CDI spec of the node's GPUs", func() error {
			_, err := cdi.Write(r.log, r.nvml, opts, r.cfg.Host(r.cfg.CDISpec))

			return err
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
		msg += fmt.Sprintf(", MIG layout %q: %s", r.cfg.MIGLayout, state)
	}

	r.report(PhaseReady, msg)

	return nil
}

var errNoGPU = errors.New("NVML sees no GPU")

// permanentError ends a waitFor: trying again cannot help.
type permanentError struct{ err error }

func (p permanentError) Error() string { return p.err.Error() }

func permanent(err error) error { return permanentError{err} }

func (r *Runner) listGPUs() ([]gpu.GPU, error) {
	if err := gpu.Init(r.nvml); err != nil {
		return nil, err
	}

	defer r.nvml.Shutdown() //nolint:errcheck // nothing to do about it

	gpus, err := gpu.List(r.nvml)
	if err != nil {
		return nil, err
	}

	if len(gpus) == 0 {
		return nil, errNoGPU
	}

	return gpus, nil
}

func (r *Runner) driverLoaded() error {
	p := r.cfg.Host("/proc/driver/nvidia/version")
	if _, err := os.Stat(p); err != nil {
		return fmt.Errorf("%w: %s is missing", gpu.ErrNoDriver, p)
	}

	return nil
}

// waitFor calls check until it succeeds, with backoff. It reports the wait once per distinct
// reason, so a node without a GPU logs one line, not one a second.
func (r *Runner) waitFor(ctx context.Context, what string, check func() error) error {
	delay := r.wait.Initial
	last := ""

	for {
		err := check()
		if err == nil {
			return nil
		}

		var p permanentError
		if errors.As(err, &p) {
			return p.err
		}

		if msg := err.Error(); msg != last {
			r.report(PhaseWaiting, fmt.Sprintf("waiting for %s: %s", what, msg))
			last = msg
		}

		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}

		delay = min(delay*2, r.wait.Max)
	}
}

func (r *Runner) report(phase, msg string) {
	st, err := r.status.update(func(s *Status) { s.Phase, s.Message = phase, msg })

	level := slog.LevelInfo

	switch phase {
	case PhaseFailed:
		level = slog.LevelError
	case PhaseWaiting:
		level = slog.LevelWarn
	}

	r.log.Log(context.Background(), level, msg, "phase", st.Phase)

	if err != nil {
		r.log.Error("cannot write the status file", "error", err)
	}
}

// applyMIG applies the configured layout. Our nvidia-persistenced is not running yet (it
// starts after MIG, as DESIGN's order says), so there is nothing of ours to suspend.
func (r *Runner) applyMIG(ctx context.Context) error {
	cfg, err := r.migConfig()
	if err != nil {
		return err
	}

	if err := gpu.Init(r.nvml); err != nil {
		return err
	}
	defer r.nvml.Shutdown() //nolint:errcheck

	applier := &mig.Applier{
		NVML:         r.nvml,
		Persistenced: mig.NoPersistenced{},
		Resetter:     mig.NvidiaSMIResetter{Root: r.cfg.Subroot},
		Logger:       r.log,
		ProcRoot:     r.cfg.Host("/proc"),
		OnChange: func(context.Context, []int) error {
			if r.refreshProc != nil {
				if err := r.refreshProc(); err != nil {
					return err
				}
			}

			nodes, err := devnodes.Sync(r.log, r.cfg.HostRoot)
			if err == nil {
				r.status.update(func(s *Status) { s.DeviceNodes = len(nodes.Nodes) }) //nolint:errcheck
			}

			return err
		},
	}

	results, err := applier.Apply(ctx, cfg, r.cfg.MIGLayout)
	if err != nil {
		// Planning failed: nothing was changed, and trying again cannot help.
		return permanent(fmt.Errorf("MIG layout %q: %w", r.cfg.MIGLayout, err))
	}

	r.status.update(func(s *Status) { s.MIG = results }) //nolint:errcheck

	var failed []string

	for _, res := range results {
		// pending-reboot leaves the GPU usable as it is: the node comes up and says so.
		if res.Result == mig.ResultFailed {
			failed = append(failed, fmt.Sprintf("GPU %d: %s", res.Index, res.Message))
		}
	}

	if len(failed) > 0 {
		return fmt.Errorf("not applied, GPUs rolled back: %s", strings.Join(failed, "; "))
	}

	return nil
}

// migConfig reads the layout file, if there is one, and adds the built-in layouts.
func (r *Runner) migConfig() (*mig.Config, error) {
	data, err := os.ReadFile(r.cfg.MIGConfig)
	if errors.Is(err, os.ErrNotExist) {
		return mig.Builtin(), nil
	}

	if err != nil {
		return nil, fmt.Errorf("reading the MIG layouts: %w", err)
	}

	cfg, err := mig.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", r.cfg.MIGConfig, err)
	}

	return cfg.WithBuiltins(), nil
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

	for _, g := range st.GPUs {
		sum.GPUs = append(sum.GPUs, readinessGPU{Index: g.Index, UUID: g.UUID, Name: g.Name, MIG: g.MIG})
	}

	for _, m := range st.MIG {
		sum.MIG = append(sum.MIG, readinessMIG{Index: m.Index, Result: m.Result})
	}

	return sum
}

// migState sums up the GPUs' MIG results for the node label: failed wins over
// pending-reboot, which wins over success; "" when no layout was applied.
func migState(results []mig.Status) string {
	state := ""

	for _, res := range results {
		switch {
		case res.Result == mig.ResultFailed:
			return string(mig.ResultFailed)
		case res.Result == mig.ResultPendingReboot:
			state = string(mig.ResultPendingReboot)
		case state == "":
			state = string(mig.ResultSuccess)
		}
	}

	return state
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
