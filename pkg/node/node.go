// Package node brings a GPU node up: it runs the node jobs in order, reports the status
// and, on stop, stops what it started. It owns no job's logic, only their order.
package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/talos-nvidia/nvidia-driver/pkg/atomicfile"
	"github.com/talos-nvidia/nvidia-driver/pkg/cdi"
	"github.com/talos-nvidia/nvidia-driver/pkg/config"
	"github.com/talos-nvidia/nvidia-driver/pkg/daemons"
	"github.com/talos-nvidia/nvidia-driver/pkg/devnodes"
	"github.com/talos-nvidia/nvidia-driver/pkg/driverroot"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu"
	"github.com/talos-nvidia/nvidia-driver/pkg/memory"
	"github.com/talos-nvidia/nvidia-driver/pkg/mig"
	"github.com/talos-nvidia/nvidia-driver/pkg/nvmljobs"
	"github.com/talos-nvidia/nvidia-driver/pkg/poll"
	"github.com/talos-nvidia/nvidia-driver/pkg/report"
)

// Backoff bounds how often the runner looks again for what it waits for.
type Backoff = poll.Backoff

// Runner brings up one node.
type Runner struct {
	log *slog.Logger
	cfg config.Config
	// jobs does the NVML work: in child processes on a node (see nvmljobs).
	jobs   nvmljobs.Jobs
	wait   Backoff
	status *report.Status[Status]
	// persistenced is our nvidia-persistenced supervisor once started, else nil;
	// persistencedErr why it could not be started.
	persistenced    *daemons.Supervisor
	persistencedErr string
	daemonOpts      daemons.Options
	daemonLog       func(tag string) string
	daemonsDone     chan struct{}
	// tasks are the goroutines that end with Run's context: the fabric's and persistenced's
	// watches, the pending MIG layout's retry (retry.go) and the labels' (labels.go).
	tasks sync.WaitGroup

	// upMu serializes the reports of a node that is up (reportUp): the fabric's and
	// persistenced's watchers both make them. It guards up.
	upMu sync.Mutex
	// up is what the status of the node, once up, derives from (conditions.go): its GPUs and
	// the MIG, CDI and readiness conditions as setUp last found them. The fabric's,
	// persistenced's and the labels', which change under their watchers and retry, are read
	// at each reportUp. isUp: setUp has set up.
	up   Up
	isUp bool
	// migProblem is why the configured MIG layout cannot be applied (mig.go); the node then
	// serves its GPUs as they are.
	migProblem error
	// cdiProblem is why the last publish wrote no CDI spec: cdi.ErrNoDevices (the GPUs as
	// they are offer no device) or a failure it did not wait out (publish); nil once written.
	cdiProblem error
	// readyProblem is why the last publish wrote no readiness files, a failure it did not
	// retry (publish without wait); nil once written.
	readyProblem error
	// labels is the NFD feature file as the runner keeps it, retried in the background
	// (labels.go).
	labels labelState
}

// Option changes a Runner.
type Option func(*Runner)

// WithBackoff sets how the runner polls for the driver and for GPUs.
func WithBackoff(b Backoff) Option { return func(r *Runner) { r.wait = b } }

// WithDaemonOptions sets how nvidia-persistenced is supervised; a zero StartTimeout keeps
// persistencedStartTimeout.
func WithDaemonOptions(o daemons.Options) Option { return func(r *Runner) { r.daemonOpts = o } }

// WithDaemonLog gives the runner the last syslog line of a daemon by its tag (the service's
// /dev/log reader, daemons.SyslogSink.LastLine), for the status of a daemon that is down.
func WithDaemonLog(last func(tag string) string) Option {
	return func(r *Runner) { r.daemonLog = last }
}

// persistencedStartTimeout bounds one start of nvidia-persistenced, and so how long the
// bring-up waits for it. Its starter returns once the daemon has opened every GPU and set
// persistence mode (DESIGN §4), a few seconds a GPU whose GSP firmware loads; a start not
// back after 30 s is stuck, not slow. The bring-up waits for one start only: the node
// comes up without the daemon (degraded, saying so) while the supervisor keeps trying,
// where it used to wait three starts of 60 s.
const persistencedStartTimeout = 30 * time.Second

// New returns a runner. jobs does the NVML work: in child processes of the service on a
// node, on simulated GPUs in this process in the demo and tests.
func New(log *slog.Logger, cfg config.Config, jobs nvmljobs.Jobs, opts ...Option) *Runner {
	r := &Runner{
		log:    log,
		cfg:    cfg,
		jobs:   jobs,
		wait:   Backoff{Initial: time.Second, Max: 30 * time.Second},
		status: newStatus(log, cfg.StatusFile(), cfg.Subroot),
	}

	for _, o := range opts {
		o(r)
	}

	if r.daemonOpts.StartTimeout <= 0 {
		r.daemonOpts.StartTimeout = persistencedStartTimeout
	}

	return r
}

// Status returns the latest status.
func (r *Runner) Status() Status { return r.status.Get() }

// Run brings the node up and then holds it until ctx ends. It returns nil when stopped by
// ctx, whatever step it was in: a Talos service that exits non-zero on stop is restarted.
// Problems a restart cannot fix (a broken subroot) are reported and waited on, not returned:
// exiting would only make Talos restart the service in a loop.
func (r *Runner) Run(ctx context.Context) error {
	defer r.report(PhaseStopped, "service stopped; the driver root stays mounted for running containers")
	defer r.stopDaemons()
	defer r.tasks.Wait()

	if err := r.bringUp(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}

		// A ready file from an earlier run would now be a lie.
		if rmErr := driverroot.MarkNotReady(r.cfg.ValidationsDir()); rmErr != nil {
			r.log.Error("cannot remove the readiness files", "error", rmErr)
		}

		if r.cfg.MIGLayout != "" {
			r.labelNode(ctx, string(mig.ResultFailed), false)
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

	r.status.Update(func(s *Status) { s.DriverVersion = report.DriverVersion })

	// A bad MIG layout file or name is found now, before anything is mounted; it does not
	// stop the node from serving its GPUs as they are (mig.go).
	if r.cfg.MIGLayout != "" {
		r.checkMIGLayout()
	}

	// The driver root is the extension's own content: mounting it needs no GPU, and consumers
	// that start early find it. What stops the mount is on the host path (a link at
	// run/nvidia, a read-only /run) and clears when it is fixed: it is retried.
	mount := r.cfg.DriverMount()
	if err := r.retry(ctx, "the driver root's mount at "+mount, func() error {
		_, err := driverroot.Mount(r.log, r.cfg.Subroot, mount)

		return err
	}); err != nil {
		return err
	}

	r.status.Update(func(s *Status) { s.DriverRoot = mount })

	if err := r.waitFor(ctx, gpu.ModuleWait, func() error { return gpu.DriverLoaded(r.cfg.HostRoot) }); err != nil {
		return err
	}

	// /proc can lag the module's load, and a person can fix /dev: a failed sync is tried
	// again with backoff, and each distinct error reported once.
	if err := r.waitFor(ctx, "the NVIDIA device nodes", r.syncDeviceNodes); err != nil {
		return err
	}

	// The driver root's dev/ shows the host's /dev, as a driver container's root does: the
	// device plugin, DRA driver and GPU Operator validator look for device nodes there.
	if err := r.retry(ctx, "the bind of the host's /dev under the driver root", func() error {
		_, err := driverroot.BindDev(r.log, r.cfg.Host("/dev"), mount)

		return err
	}); err != nil {
		return err
	}

	var gpus []gpu.GPU

	err := r.waitFor(ctx, "a GPU that NVML can see", func() error {
		var err error

		gpus, err = r.jobs.ListGPUs(ctx)
		if err == nil {
			return nil
		}

		// NVML sees no GPU and says no more when the loaded module flavor cannot drive the
		// node's GPUs; the module changes only with another extension and a reboot.
		var undriven *gpu.UndrivenError
		if errors.As(gpu.CheckDriven(r.cfg.HostRoot), &undriven) {
			return poll.Permanent(undriven)
		}

		return err
	})
	if err != nil {
		return err
	}

	r.status.Update(func(s *Status) { s.GPUs = gpus })

	if r.cfg.MIGLayout != "" {
		if err := r.bringUpMIG(ctx); err != nil {
			return err
		}

		// MIG mode and instances may have changed what NVML reports.
		if gpus, err = r.jobs.ListGPUs(ctx); err != nil {
			return err
		}

		r.status.Update(func(s *Status) { s.GPUs = gpus })
	}

	r.startPersistenced(ctx)
	r.bringUpFabric(ctx)

	if err := r.publish(ctx, true); err != nil {
		return err
	}

	r.labelNode(ctx, r.migNodeState(), false)
	r.setUp()
	r.watchFabric(ctx)
	r.watchPersistenced(ctx)
	r.startMIGRetry(ctx)

	return nil
}

// publish writes what consumers read once the GPUs are as they will be: the CDI spec and the
// readiness files. A failure to write the spec is waited out when wait is set (bring-up);
// otherwise it is kept in r.cdiProblem and the readiness files are written all the same. GPUs
// that offer no device (all in MIG mode without instances) are no failure to wait out:
// only a new layout changes them, so r.cdiProblem says so either way. The readiness files
// are retried until written when wait is set; otherwise a failure is kept in r.readyProblem
// and returned.
func (r *Runner) publish(ctx context.Context, wait bool) error {
	if r.cfg.CDI {
		r.cdiProblem = r.writeCDI(ctx, wait)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}

	// The readiness file holds only what consumers act on, no timestamps: the device plugin
	// and DCGM exporter restart when its bytes change, so a restart of the service that
	// changes nothing must not change it.
	summary, err := json.MarshalIndent(r.readiness(), "", "  ")
	if err != nil {
		return fmt.Errorf("encoding the readiness summary: %w", err)
	}

	dir, content := r.cfg.ValidationsDir(), append(summary, '\n')
	markReady := func() error { return driverroot.MarkReady(dir, content) }

	if wait {
		err = r.retry(ctx, "the readiness files in "+dir, markReady)
	} else {
		err = markReady()
	}

	if ctx.Err() == nil {
		r.readyProblem = err
	}

	return err
}

// writeCDI writes the node's CDI spec. With no device to put in it, the spec of the GPUs as
// they were is removed: it would name whole GPUs that are now in MIG mode.
func (r *Runner) writeCDI(ctx context.Context, wait bool) error {
	// nvcdi looks under the driver root for the libraries and the persistenced socket: the
	// /run/nvidia/driver mount has both (see docs/cdi.md).
	opts := cdi.DefaultOptions(r.cfg.DriverMount())
	opts.DevRoot = r.cfg.HostRoot
	path := r.cfg.Host(r.cfg.CDISpec)

	err := r.waitFor(ctx, "a CDI spec of the node's GPUs", func() error {
		err := r.jobs.WriteCDI(ctx, nvmljobs.CDIRequest{Options: opts, Path: path})
		if err != nil && (!wait || errors.Is(err, cdi.ErrNoDevices)) {
			return poll.Permanent(err)
		}

		return err
	})

	switch {
	case err == nil:
		r.status.Update(func(s *Status) { s.CDISpec = path })

		return nil
	case errors.Is(err, cdi.ErrNoDevices):
		r.status.Update(func(s *Status) { s.CDISpec = "" })

		if rmErr := atomicfile.Remove(path); rmErr != nil {
			return fmt.Errorf("%w; the spec of the GPUs as they were stays: %w", err, rmErr)
		}

		return err
	default:
		return fmt.Errorf("the CDI spec %s was not written: %w", path, err)
	}
}

// setUp reports the node up, with its MIG layout's outcome and what its CDI spec lacks; the
// fabric's and persistenced's conditions are added at each report (reportUp).
func (r *Runner) setUp() {
	st := r.status.Get()
	up := Up{
		GPUs:          len(st.GPUs),
		DriverVersion: st.DriverVersion,
		Conditions:    []Condition{r.migCondition(), r.cdiCondition(), r.readinessCondition()},
	}

	r.upMu.Lock()
	r.up, r.isUp = up, true
	r.upMu.Unlock()

	r.reportUp()
}

// cdiCondition is a problem while the node's last CDI spec was not written, saying why: no
// device to serve (naming the GPUs in MIG mode without instances, and what gives them
// devices) or the failure.
func (r *Runner) cdiCondition() Condition {
	c := Condition{Name: ConditionCDI}
	if r.cdiProblem == nil {
		return c
	}

	if !errors.Is(r.cdiProblem, cdi.ErrNoDevices) {
		c.Problem = r.cdiProblem.Error()

		return c
	}

	var bare []string

	for _, g := range r.status.Get().GPUs {
		if g.MIGOn() && len(g.MIGDevices) == 0 {
			bare = append(bare, strconv.Itoa(g.Index))
		}
	}

	why := "NVML offers no device"
	if len(bare) > 0 {
		why = fmt.Sprintf("GPU %s in MIG mode without MIG instances", strings.Join(bare, ","))
	}

	c.Problem = fmt.Sprintf("no device to serve: %s, so the CDI spec %s is not written and the device plugin advertises none; "+
		"create instances in the MIG layout, or leave a GPU out of MIG mode", why, r.cfg.Host(r.cfg.CDISpec))

	return c
}

// readinessCondition is a problem while the last readiness files were not written (a
// publish after the node came up, which does not retry them: the MIG retry tries them again
// once it is over).
func (r *Runner) readinessCondition() Condition {
	c := Condition{Name: ConditionReadiness}
	if r.readyProblem != nil {
		c.Problem = fmt.Sprintf("the readiness files in %s are not written, tried again after the MIG retry: %s", r.cfg.ValidationsDir(), r.readyProblem)
	}

	return c
}

// waitFor calls check until it succeeds, with backoff, reporting the wait once per distinct
// reason; a poll.Permanent error ends it, and so does ctx.
func (r *Runner) waitFor(ctx context.Context, what string, check func() error) error {
	return r.status.Wait(ctx, r.wait, PhaseWaiting, "waiting for "+what, check)
}

// retry does step until it succeeds, as waitFor waits: for a step of the service's own (a
// mount, a file it writes) that a fault on the host path stops, a link where a directory
// belongs or a read-only file system, which clears once a person or the host fixes it, with
// no restart. The status says what is retried and why, once per distinct error; the node
// waits meanwhile (PhaseWaiting), since it serves nothing without the step.
func (r *Runner) retry(ctx context.Context, what string, step func() error) error {
	return r.status.Wait(ctx, r.wait, PhaseWaiting, "retrying "+what, step)
}

func (r *Runner) report(phase, msg string) { r.status.Report(phase, msg, nil) }

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
		return poll.Permanent(fmt.Errorf("MIG layout %q: %w", r.cfg.MIGLayout, err))
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

	r.status.Update(func(s *Status) {
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

	r.status.Update(func(s *Status) { s.DeviceNodes = len(nodes.Nodes) })

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
	opts.RunDir = r.cfg.Host(daemons.PersistencedRunDir)
	opts.PersistenceMode = r.cfg.PersistenceMode
	opts.UVMPersistenceMode = r.cfg.UVMPersistenceMode
	opts.Verbose = r.cfg.PersistencedVerbose
	opts.MirrorDir = filepath.Join(r.cfg.DriverMount(), driverroot.PersistencedSocketDir)

	// The run directory is the host's: a link there is refused and waited out, as every
	// other fault on the host path.
	if err := r.retry(ctx, "nvidia-persistenced's run directory", func() error { return daemons.MakeRunDir(opts.RunDir) }); err != nil {
		return
	}

	spec, err := daemons.Persistenced(opts)
	if err != nil {
		r.log.Error("nvidia-persistenced not started", "error", err)
		r.persistencedErr = err.Error()

		return
	}

	sup := daemons.New(r.log, spec, r.daemonOpts)
	r.persistenced = sup
	r.daemonsDone = make(chan struct{})

	go func() {
		defer close(r.daemonsDone)

		if err := sup.Run(ctx); err != nil {
			r.log.Error("nvidia-persistenced supervision ended", "error", err)
		}
	}()

	// One start, not every start the supervisor may try (see persistencedStartTimeout).
	wctx, cancel := context.WithTimeout(ctx, r.daemonOpts.StartTimeout+time.Second)
	defer cancel()

	if err := sup.WaitReady(wctx); err != nil {
		r.log.Error("nvidia-persistenced is not ready; continuing without it", "error", err)
	}

	r.status.Update(func(s *Status) { s.Persistenced = string(sup.Status().State) })
}

// persistencedCondition is a problem while the nvidia-persistenced the node promises is not
// running, saying why: its state, the supervisor's last error and the daemon's last syslog
// line.
func (r *Runner) persistencedCondition() Condition {
	c := Condition{Name: ConditionPersistenced}

	switch {
	case r.persistencedErr != "":
		c.Problem = "nvidia-persistenced is not running: " + r.persistencedErr
	case r.persistenced == nil:
	default:
		st := r.persistenced.Status()
		if st.State == daemons.StateReady {
			return c
		}

		// Starting and restarting alternate at every retry: one state for the status, so
		// that a daemon failing the same way is reported once, not at every retry.
		state := st.State
		if state == daemons.StateStarting {
			state = daemons.StateRestarting
		}

		c.Problem = fmt.Sprintf("nvidia-persistenced is not running (%s", state)
		if st.LastError != "" {
			c.Problem += ": " + st.LastError
		}

		c.Problem += ")"

		if r.daemonLog != nil {
			if line := r.daemonLog("nvidia-persistenced"); line != "" {
				c.Problem += fmt.Sprintf("; its last log line: %q", line)
			}
		}
	}

	return c
}

// reportUp reports the phase of a node that is up, derived from its conditions: ready, or
// degraded by any of them; an unchanged status is not written again.
func (r *Runner) reportUp() {
	r.upMu.Lock()
	defer r.upMu.Unlock()

	if !r.isUp {
		return // the labels' retry (labels.go) can run before the node is up, or when it failed
	}

	// Clip: the fabric's and persistenced's conditions go into a copy, not into r.up.
	up := r.up
	up.Conditions = append(slices.Clip(up.Conditions), r.fabricCondition(), r.persistencedCondition(), r.labelsCondition())
	phase, msg := up.Derive()

	if r.persistenced != nil {
		r.status.Update(func(s *Status) { s.Persistenced = string(r.persistenced.Status().State) })
	}

	if cur := r.status.Get(); cur.Phase == phase && cur.Message == msg {
		return
	}

	r.report(phase, msg)
}

// watchPersistenced keeps the node's status current as nvidia-persistenced's supervision
// state changes after bring-up: a daemon that died, is restarting or was given up makes the
// node degraded, one that is ready again makes it ready.
func (r *Runner) watchPersistenced(ctx context.Context) {
	sup := r.persistenced
	if sup == nil {
		return
	}

	r.tasks.Go(func() {
		for {
			// Taken before the status is read, so that no change between the two is missed.
			changed := sup.Changed()

			if ctx.Err() != nil {
				return // the stop's states are not the daemon failing
			}

			r.reportUp()

			select {
			case <-ctx.Done():
				return
			case <-changed:
			case <-sup.Done():
				if ctx.Err() == nil {
					r.reportUp()
				}

				return
			}
		}
	})
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

// readinessSummary is the content of the readiness file: the devices the node serves, and
// nothing else. The device plugin and the DCGM exporter restart when its bytes change
// (deploy/'s driver-watch and the exporter's liveness probe), so it changes whenever the set
// of devices does and never otherwise: a layout pending, failed or retried, a pending MIG
// mode, the fabric's or persistenced's state and a restart that changes nothing leave it
// byte-identical. The status file and the NFD labels say those states.
type readinessSummary struct {
	DriverVersion string         `json:"driverVersion"`
	GPUs          []readinessGPU `json:"gpus"`
}

type readinessGPU struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid"`
	Name  string `json:"name"`
	// MIG is the current mode only, "enabled" or "disabled" ("" without MIG): a pending mode
	// serves no other device until the reset that makes it current. deploy/'s check-sharing
	// reads it.
	MIG string `json:"mig,omitempty"`
	// MIGDevices change whenever instances are made again (new UUIDs), so the file's bytes
	// change with the set of devices, which is what makes driver-watch restart the plugin.
	MIGDevices []gpu.MIGDevice `json:"migDevices,omitempty"`
}

func (r *Runner) readiness() readinessSummary {
	st := r.status.Get()
	sum := readinessSummary{DriverVersion: st.DriverVersion}

	for _, g := range st.GPUs {
		mode := ""

		switch {
		case g.MIGOn():
			mode = "enabled"
		case g.MigCapable():
			mode = "disabled"
		}

		sum.GPUs = append(sum.GPUs, readinessGPU{Index: g.Index, UUID: g.UUID, Name: g.Name, MIG: mode, MIGDevices: g.MIGDevices})
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
