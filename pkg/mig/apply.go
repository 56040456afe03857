package mig

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/siderolabs/go-cmd/pkg/cmd"

	"github.com/talos-nvidia/nvidia-driver/pkg/driverroot"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu"
)

// Persistenced suspends our nvidia-persistenced while a GPU's MIG mode
// changes or the GPU is reset (it holds every GPU open). Suspend returns a
// function that resumes it.
type Persistenced interface {
	Suspend(ctx context.Context) (resume func(context.Context) error, err error)
}

// Resetter resets one GPU.
type Resetter interface {
	ResetGPU(ctx context.Context, index int) error
}

// BoardResetter resets several GPUs in one go, by PCI bus id: the only reset an NVSwitch
// board allows.
type BoardResetter interface {
	ResetGPUs(ctx context.Context, busIDs []string) error
}

// ChangeHook runs after GPUs changed (the service recreates device nodes and
// regenerates the CDI spec there). It gets the indices of the changed GPUs.
type ChangeHook func(ctx context.Context, changed []int) error

// NvidiaSMIResetter resets a GPU with the subroot's nvidia-smi (NVML has no
// public reset call).
type NvidiaSMIResetter struct {
	Root string // the glibc subroot, e.g. /usr/local/glibc
}

var (
	_ Resetter      = NvidiaSMIResetter{}
	_ BoardResetter = NvidiaSMIResetter{}
)

// ResetGPU runs `nvidia-smi -r -i N` through the subroot's loader.
func (r NvidiaSMIResetter) ResetGPU(ctx context.Context, index int) error {
	return r.reset(ctx, fmt.Sprint(index))
}

// ResetGPUs runs `nvidia-smi -r -i A,B,...` with every bus id at once, as mig-parted resets
// all GPUs (cmd/nvidia-mig-parted/util/device.go nvmlResetAllGPUs).
func (r NvidiaSMIResetter) ResetGPUs(ctx context.Context, busIDs []string) error {
	return r.reset(ctx, strings.Join(busIDs, ","))
}

func (r NvidiaSMIResetter) reset(ctx context.Context, which string) error {
	argv := driverroot.Command(r.Root, "nvidia-smi", "-r", "-i", which)

	out, err := cmd.RunContext(ctx, argv[0], argv[1:]...)
	if err != nil {
		return fmt.Errorf("nvidia-smi -r -i %s: %w (%s)", which, err, strings.TrimSpace(out))
	}

	return nil
}

// NoPersistenced is the null Persistenced, for nodes without our daemon.
type NoPersistenced struct{}

// Suspend does nothing.
func (NoPersistenced) Suspend(context.Context) (func(context.Context) error, error) {
	return func(context.Context) error { return nil }, nil
}

// Result of applying a layout to one GPU.
type Result string

const (
	ResultSuccess Result = "success"
	ResultFailed  Result = "failed"
	// ResultPending: the MIG mode must change but something holds the GPU open; nothing was
	// changed (or NVML keeps the new mode pending). The service applies it at its next start
	// with the GPU idle: the next boot, before workloads start, or a restart after the
	// holders stopped.
	ResultPending Result = "pending"
	// ResultPendingReboot: the new mode is pending and only a reboot activates it (a board
	// that cannot reset one GPU, a pass-through VM). The pending mode is kept.
	ResultPendingReboot Result = "pending-reboot"
)

// Status reports what happened to one GPU.
type Status struct {
	Index   int    `json:"index"`
	UUID    string `json:"uuid"`
	Layout  string `json:"layout"`
	Result  Result `json:"result"`
	Changed bool   `json:"changed"`
	Message string `json:"message"`
	// Holders are the processes that kept the change from happening.
	Holders []gpu.Holder `json:"holders,omitempty"`
}

// Applier applies a plan to the GPUs of a node through NVML (already initialized).
type Applier struct {
	NVML         nvml.Interface
	Persistenced Persistenced
	Resetter     Resetter
	OnChange     ChangeHook
	// BeforeChange runs once per apply, before the first call that changes any GPU: the
	// service withdraws its readiness signal there, so consumers that wait for it wait.
	BeforeChange func(ctx context.Context) error
	Logger       *slog.Logger
	// ProcRoot is the host's /proc, where the processes that hold a GPU open are found
	// (/proc/<pid>/fd); default /proc.
	ProcRoot string
	// WholeBoard: the GPUs reset only together (an NVSwitch board). A mode change that waits
	// for a reset is then finished as mig-parted finishes it (cmd/nvidia-mig-parted/apply/
	// mode.go): the mode set on every GPU first, then one reset of all the node's GPUs
	// (util/device.go ResetAllGPUs), only when nothing holds any of them, through a Resetter
	// that is a BoardResetter. The instances of GPUs the layout leaves alone are made again.
	WholeBoard bool
	// NoReset says why no GPU can be reset here (mig-parted's deployments/systemd/utils.sh
	// assert_gpu_reset_available: a GPU without a sysfs reset); "" when they can.
	NoReset string
}

// LayoutError is a layout that cannot be planned for the node's GPUs, or a layouts file
// that cannot be read: nothing was changed, and trying again cannot help.
type LayoutError struct{ Err error }

func (e *LayoutError) Error() string { return e.Err.Error() }
func (e *LayoutError) Unwrap() error { return e.Err }

// Apply plans the layout for every GPU (nothing changes if any GPU cannot
// take it) and applies it GPU by GPU. It returns one status per GPU; the
// error is set only when nothing was changed: a *LayoutError when planning
// failed, another error when NVML could not be read (that may pass).
func (a *Applier) Apply(ctx context.Context, cfg *Config, layout string) ([]Status, error) {
	gpus, err := ReadGPUs(a.NVML)
	if err != nil {
		return nil, fmt.Errorf("reading the GPUs' MIG state: %w", err)
	}

	plan, err := PlanLayout(cfg, layout, gpus)
	if err != nil {
		return nil, &LayoutError{Err: err}
	}

	if plan.Selected() == 0 && len(plan.GPUs) > 0 {
		a.logger().Info("mig layout selects no GPU of this node (its device filters match none); nothing to do",
			"layout", layout, "gpus", describeGPUs(plan.GPUs))
	}

	return a.ApplyPlan(ctx, plan), nil
}

// ApplyPlan applies a plan. A GPU already in its target state gets no
// mutating call at all.
func (a *Applier) ApplyPlan(ctx context.Context, plan *Plan) []Status {
	log := a.logger()

	var (
		statuses []Status
		changed  []int
		prepared bool
		prepErr  error
	)

	// prepare runs BeforeChange once, before the first mutating call.
	prepare := func() error {
		if !prepared {
			prepared = true
			if a.BeforeChange != nil {
				prepErr = a.BeforeChange(ctx)
			}
		}

		return prepErr
	}

	var awaiting []awaitingReset

	for k, gp := range plan.GPUs {
		st := a.applyGPU(ctx, plan.Layout, gp, prepare, func(prev State) {
			awaiting = append(awaiting, awaitingReset{status: k, plan: gp, prev: prev})
		})

		statuses = append(statuses, st)
	}

	if len(awaiting) > 0 {
		a.resetBoard(ctx, plan, statuses, awaiting)
	}

	for _, st := range statuses {
		level := slog.LevelInfo
		if st.Result != ResultSuccess {
			level = slog.LevelWarn
		}

		log.Log(ctx, level, "mig layout", "gpu", st.Index, "layout", st.Layout, "result", st.Result, "changed", st.Changed,
			"message", st.Message)

		if st.Changed {
			changed = append(changed, st.Index)
		}
	}

	if len(changed) > 0 && a.OnChange != nil {
		if err := a.OnChange(ctx, changed); err != nil {
			log.Error("mig change hook failed", "error", err)

			for i := range statuses {
				if statuses[i].Changed && statuses[i].Result == ResultSuccess {
					statuses[i].Result = ResultFailed
					statuses[i].Message += fmt.Sprintf("; after the change: %v", err)
				}
			}
		}
	}

	return statuses
}

func (a *Applier) logger() *slog.Logger {
	if a.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}

	return a.Logger
}

// applyGPU applies the plan to one GPU. A mode change that waits for the board's reset is
// handed to await with the GPU's state before, and reported pending until resetBoard is done.
func (a *Applier) applyGPU(ctx context.Context, layout string, gp GPUPlan, prepare func() error, await func(prev State)) Status {
	g := gp.GPU
	st := Status{Index: g.Index, UUID: g.UUID, Layout: layout}

	if !gp.Selected {
		st.Result = ResultSuccess
		st.Message = "not selected by the layout; left as it is"

		return st
	}

	if !g.MigCapable() {
		st.Result = ResultSuccess
		st.Message = "not MIG-capable; nothing to do"

		return st
	}

	dev, err := a.device(g)
	if err != nil {
		return failed(st, err)
	}

	prev, pending, err := ReadState(dev, g)
	if err != nil {
		return failed(st, err)
	}

	want := mode(gp.Target.MigEnabled)
	if prev.signature() == gp.Target.signature() && pending == want {
		st.Result = ResultSuccess
		st.Message = "already in layout: " + prev.String()

		return st
	}

	// Activating another mode unbinds or resets the GPU; setting the current one again (to
	// cancel a pending change) does not.
	activate := prev.MigEnabled != gp.Target.MigEnabled
	destroys := prev.MigEnabled && len(prev.Instances) > 0 && (activate || prev.signature() != gp.Target.signature())

	// Never take a GPU from under anyone. Instances are destroyed only when no compute process
	// runs on the GPU and, where the mode must change next, nothing holds it open (else the
	// GPU would be left without them): nothing is touched then. Without instances to destroy,
	// SetMigMode itself is asked: on a held GPU it sets the new mode pending (nvml.h), so the
	// next boot activates it.
	if !destroys {
		// No instance to lose.
	} else if holders, err := a.holders(dev, g, activate); err != nil {
		return failed(st, err)
	} else if len(holders) > 0 {
		what := "its instances must change"
		if activate {
			what = fmt.Sprintf("its MIG mode must change (%s to %s)", modeWord(prev.MigEnabled), modeWord(gp.Target.MigEnabled))
		}

		st.Result = ResultPending
		st.Holders = holders
		st.Message = fmt.Sprintf("not changed: %s but the GPU is held open by %s; it changes when the service starts with the GPU idle: at the next boot, before workloads start, or on a restart once these have stopped",
			what, gpu.HolderList(holders))

		return st
	}

	if err := prepare(); err != nil {
		return failed(st, fmt.Errorf("before changing the GPU: %w", err))
	}

	st.Changed = true

	err = a.converge(ctx, g, prev, gp.Target)
	if err == nil {
		st.Result = ResultSuccess
		st.Message = "applied: " + gp.Target.String()

		return st
	}

	if errors.Is(err, errAwaitingReset) {
		st.Result = ResultPending
		st.Message = err.Error()

		await(prev)

		return st
	}

	if errors.Is(err, errPending) || errors.Is(err, errPendingReboot) {
		a.keepPending(&st, g, prev, err.Error(), err)

		return st
	}

	// Roll back to where the GPU was; if that fails too, leave it clean.
	now, _, rerr := a.readNow(g)
	if rerr == nil {
		rerr = a.converge(ctx, g, now, prev)
	}

	st.Result = ResultFailed

	if rerr != nil && !errors.Is(rerr, errPendingReboot) && !errors.Is(rerr, errPending) {
		st.Message = fmt.Sprintf("%v; rollback to the previous layout failed too: %v", err, rerr)

		return st
	}

	st.Message = fmt.Sprintf("%v; rolled back to the previous layout (%s)", err, prev.String())

	return st
}

func modeWord(enabled bool) string {
	if enabled {
		return "enabled"
	}

	return "disabled"
}

func failed(st Status, err error) Status {
	st.Result = ResultFailed
	st.Message = err.Error()

	return st
}

func mode(enabled bool) int {
	if enabled {
		return nvml.DEVICE_MIG_ENABLE
	}

	return nvml.DEVICE_MIG_DISABLE
}

// device looks the GPU up again by UUID: a reset can invalidate handles and
// change indices and minor numbers.
func (a *Applier) device(g *GPU) (nvml.Device, error) {
	dev, ret := a.NVML.DeviceGetHandleByUUID(g.UUID)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("gpu %d: get handle of %s: %w", g.Index, g.UUID, ret)
	}

	return dev, nil
}

func (a *Applier) readNow(g *GPU) (State, int, error) {
	dev, err := a.device(g)
	if err != nil {
		return State{}, 0, err
	}

	return ReadState(dev, g)
}

// converge takes a GPU from state cur to target: instances away, MIG mode,
// then instances at their planned placements.
func (a *Applier) converge(ctx context.Context, g *GPU, cur, target State) error {
	dev, err := a.device(g)
	if err != nil {
		return err
	}

	_, pending, ret := dev.GetMigMode()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("gpu %d: get MIG mode: %w", g.Index, ret)
	}

	want := mode(target.MigEnabled)
	activate := cur.MigEnabled != target.MigEnabled
	rebuild := activate || cur.signature() != target.signature()

	if cur.MigEnabled && rebuild {
		if err := a.destroyAll(dev, g); err != nil {
			return err
		}
	}

	// A pending mode other than the target is set back too (nothing to activate then).
	if activate || pending != want {
		if err := a.setMode(ctx, g, want); err != nil {
			return err
		}

		if dev, err = a.device(g); err != nil {
			return err
		}
	}

	if !target.MigEnabled || !rebuild {
		return nil
	}

	return a.create(dev, g, target)
}
