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
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/talos-nvidia/nvidia-driver/pkg/config"
	"github.com/talos-nvidia/nvidia-driver/pkg/devnodes"
	"github.com/talos-nvidia/nvidia-driver/pkg/driverroot"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu"
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
}

// Option changes a Runner.
type Option func(*Runner)

// WithBackoff sets how the runner polls for the driver and for GPUs.
func WithBackoff(b Backoff) Option { return func(r *Runner) { r.wait = b } }

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

	if err := r.bringUp(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}

		// A ready file from an earlier run would now be a lie.
		if rmErr := driverroot.MarkNotReady(r.cfg.ValidationsDir()); rmErr != nil {
			r.log.Error("cannot remove the readiness files", "error", rmErr)
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

	var gpus []gpu.GPU

	err = r.waitFor(ctx, "a GPU that NVML can see", func() error {
		gpus, err = r.listGPUs()

		return err
	})
	if err != nil {
		return err
	}

	r.status.update(func(s *Status) { s.GPUs = gpus }) //nolint:errcheck

	summary, err := json.Marshal(r.status.get())
	if err != nil {
		return fmt.Errorf("encoding the readiness summary: %w", err)
	}

	if err := driverroot.MarkReady(r.cfg.ValidationsDir(), summary); err != nil {
		return err
	}

	r.report(PhaseReady, fmt.Sprintf("node ready: %d GPU(s), driver %s", len(gpus), report.DriverVersion))

	return nil
}

var errNoGPU = errors.New("NVML sees no GPU")

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
