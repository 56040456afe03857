package mig

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/siderolabs/go-cmd/pkg/cmd"
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

// ChangeHook runs after GPUs changed (the service recreates device nodes and
// regenerates the CDI spec there). It gets the indices of the changed GPUs.
type ChangeHook func(ctx context.Context, changed []int) error

// NvidiaSMIResetter resets a GPU with the subroot's nvidia-smi (NVML has no
// public reset call).
type NvidiaSMIResetter struct {
	Root string // the glibc subroot, e.g. /usr/local/glibc
}

var _ Resetter = NvidiaSMIResetter{}

// ResetGPU runs `nvidia-smi -r -i N` through the subroot's loader.
func (r NvidiaSMIResetter) ResetGPU(ctx context.Context, index int) error {
	loader := filepath.Join(r.Root, "lib64/ld-linux-x86-64.so.2")

	out, err := cmd.RunContext(ctx, loader, "--library-path", filepath.Join(r.Root, "usr/lib64"),
		filepath.Join(r.Root, "usr/bin/nvidia-smi"), "-r", "-i", fmt.Sprint(index))
	if err != nil {
		return fmt.Errorf("nvidia-smi -r -i %d: %w (%s)", index, err, strings.TrimSpace(out))
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
	ResultSuccess       Result = "success"
	ResultFailed        Result = "failed"
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
}

// Applier applies a plan to the GPUs of a node through NVML (already initialized).
type Applier struct {
	NVML         nvml.Interface
	Persistenced Persistenced
	Resetter     Resetter
	OnChange     ChangeHook
	Logger       *slog.Logger
	// ProcRoot is where process names are read from (<ProcRoot>/<pid>/comm),
	// to say what holds a GPU; default /proc.
	ProcRoot string
}

var errPendingReboot = errors.New("pending reboot")

// ReadGPUs reads every GPU of the node.
func ReadGPUs(lib nvml.Interface) ([]*GPU, error) {
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("count GPUs: %w", ret)
	}

	gpus := make([]*GPU, 0, n)

	for i := 0; i < n; i++ {
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("gpu %d: get handle: %w", i, ret)
		}

		g, err := ReadGPU(dev)
		if err != nil {
			return nil, err
		}

		gpus = append(gpus, g)
	}

	return gpus, nil
}

// Apply plans the layout for every GPU (nothing changes if any GPU cannot
// take it) and applies it GPU by GPU. It returns one status per GPU; the
// error is set only when planning failed.
func (a *Applier) Apply(ctx context.Context, cfg *Config, layout string) ([]Status, error) {
	gpus, err := ReadGPUs(a.NVML)
	if err != nil {
		return nil, err
	}

	plan, err := PlanLayout(cfg, layout, gpus)
	if err != nil {
		return nil, err
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
	)

	for _, gp := range plan.GPUs {
		st := a.applyGPU(ctx, plan.Layout, gp)
		log.Info("mig layout", "gpu", st.Index, "layout", st.Layout, "result", st.Result, "changed", st.Changed, "message", st.Message)

		if st.Changed {
			changed = append(changed, st.Index)
		}

		statuses = append(statuses, st)
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

func (a *Applier) applyGPU(ctx context.Context, layout string, gp GPUPlan) Status {
	g := gp.GPU
	st := Status{Index: g.Index, UUID: g.UUID, Layout: layout}

	if !gp.Selected {
		st.Result = ResultSuccess
		st.Message = "not selected by the layout; left as it is"

		return st
	}

	if !g.MigCapable {
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

	st.Changed = true

	err = a.converge(ctx, g, prev, gp.Target)
	switch {
	case err == nil:
		st.Result = ResultSuccess
		st.Message = "applied: " + gp.Target.String()

		return st
	case errors.Is(err, errPendingReboot):
		// Nothing a workload can see changed: no device nodes or CDI to redo.
		st.Changed = false
		st.Result = ResultPendingReboot
		st.Message = err.Error()

		return st
	}

	// Roll back to where the GPU was; if that fails too, leave it clean.
	now, _, rerr := a.readNow(g)
	if rerr == nil {
		rerr = a.converge(ctx, g, now, prev)
	}

	st.Result = ResultFailed

	if rerr != nil && !errors.Is(rerr, errPendingReboot) {
		st.Message = fmt.Sprintf("%v; rollback to the previous layout failed too: %v", err, rerr)

		return st
	}

	st.Message = fmt.Sprintf("%v; rolled back to the previous layout (%s)", err, prev.String())

	return st
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
	modeChange := cur.MigEnabled != target.MigEnabled || pending != want

	if modeChange {
		// Never take a GPU from under a workload: a mode change waits for
		// an idle GPU (the next start, or a reboot).
		procs, ret := dev.GetComputeRunningProcesses()
		if ret != nvml.SUCCESS {
			return fmt.Errorf("gpu %d: list processes: %w", g.Index, ret)
		}

		if len(procs) > 0 {
			return fmt.Errorf("%w: gpu %d: MIG mode must change but the GPU is %s; it changes once the GPU is idle at the next start",
				errPendingReboot, g.Index, a.holders(procs))
		}
	}

	if cur.MigEnabled && (modeChange || cur.signature() != target.signature()) {
		if err := a.destroyAll(dev, g); err != nil {
			return err
		}
	}

	if modeChange {
		if err := a.setMode(ctx, g, want); err != nil {
			return err
		}

		if dev, err = a.device(g); err != nil {
			return err
		}
	}

	if !target.MigEnabled || (!modeChange && cur.signature() == target.signature()) {
		return nil
	}

	return a.create(dev, g, target)
}

func (a *Applier) destroyAll(dev nvml.Device, g *GPU) error {
	for _, p := range g.Profiles {
		info := p.Info

		gis, ret := dev.GetGpuInstances(&info)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("gpu %d: list GPU instances of %s: %w", g.Index, p.Name, ret)
		}

		for _, gi := range gis {
			for _, c := range ciSizes(p.Info.SliceCount) {
				ciInfo, ret := gi.GetComputeInstanceProfileInfo(ciProfileIndex(c), nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
				if errors.Is(ret, nvml.ERROR_NOT_SUPPORTED) {
					continue
				}

				if ret != nvml.SUCCESS {
					return fmt.Errorf("gpu %d: compute profile %dc of %s: %w", g.Index, c, p.Name, ret)
				}

				cis, ret := gi.GetComputeInstances(&ciInfo)
				if ret != nvml.SUCCESS {
					return fmt.Errorf("gpu %d: list compute instances of %s: %w", g.Index, p.Name, ret)
				}

				for _, ci := range cis {
					if ret := ci.Destroy(); ret != nvml.SUCCESS {
						return fmt.Errorf("gpu %d: destroy compute instance of %s: %w", g.Index, p.Name, ret)
					}
				}
			}

			if ret := gi.Destroy(); ret != nvml.SUCCESS {
				return fmt.Errorf("gpu %d: destroy GPU instance %s: %w", g.Index, p.Name, ret)
			}
		}
	}

	return nil
}

func (a *Applier) create(dev nvml.Device, g *GPU, target State) error {
	for _, in := range target.Instances {
		p, ok := g.profileByIndex(in.ProfileIndex)
		if !ok {
			return fmt.Errorf("gpu %d: no profile %s", g.Index, in.Profile)
		}

		info := p.Info
		pl := in.Placement

		gi, ret := dev.CreateGpuInstanceWithPlacement(&info, &pl)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("gpu %d: create GPU instance %s at %d: %w", g.Index, in.Profile, pl.Start, ret)
		}

		for _, c := range in.ComputeInstances {
			ciInfo, ret := gi.GetComputeInstanceProfileInfo(ciProfileIndex(c.Slices), nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
			if ret != nvml.SUCCESS {
				return fmt.Errorf("gpu %d: compute profile %s: %w", g.Index, c.Profile, ret)
			}

			cpl := c.Placement
			if _, ret := gi.CreateComputeInstanceWithPlacement(&ciInfo, &cpl); ret != nvml.SUCCESS {
				return fmt.Errorf("gpu %d: create compute instance %s at %d: %w", g.Index, c.Profile, cpl.Start, ret)
			}
		}
	}

	return nil
}

// setMode changes the MIG mode with our nvidia-persistenced suspended, and
// resets the GPU when the change is only pending and nothing uses the GPU.
func (a *Applier) setMode(ctx context.Context, g *GPU, want int) (err error) {
	dev, err := a.device(g)
	if err != nil {
		return err
	}

	procs, ret := dev.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("gpu %d: list processes: %w", g.Index, ret)
	}

	p := a.Persistenced
	if p == nil {
		p = NoPersistenced{}
	}

	resume, err := p.Suspend(ctx)
	if err != nil {
		return fmt.Errorf("gpu %d: suspend nvidia-persistenced: %w", g.Index, err)
	}

	defer func() {
		if rerr := resume(ctx); rerr != nil && err == nil {
			err = fmt.Errorf("gpu %d: resume nvidia-persistenced: %w", g.Index, rerr)
		}
	}()

	activation, ret := dev.SetMigMode(want)
	if errors.Is(ret, nvml.ERROR_IN_USE) || errors.Is(activation, nvml.ERROR_IN_USE) {
		return fmt.Errorf("gpu %d: set MIG mode: %w: %s", g.Index, nvml.ERROR_IN_USE, a.holders(procs))
	}

	if ret != nvml.SUCCESS {
		return fmt.Errorf("gpu %d: set MIG mode: %w", g.Index, ret)
	}

	if dev, err = a.device(g); err != nil {
		return err
	}

	cur, _, ret := dev.GetMigMode()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("gpu %d: get MIG mode: %w", g.Index, ret)
	}

	if cur == want {
		return nil
	}

	// The change is pending (Ampere, pass-through): reset, unless in use.
	if len(procs) > 0 {
		return fmt.Errorf("%w: gpu %d: MIG mode change pending; %s", errPendingReboot, g.Index, a.holders(procs))
	}

	if a.Resetter == nil {
		return fmt.Errorf("%w: gpu %d: MIG mode change pending and no way to reset the GPU", errPendingReboot, g.Index)
	}

	if err := a.Resetter.ResetGPU(ctx, g.Index); err != nil {
		return fmt.Errorf("gpu %d: MIG mode change pending, reset failed: %w", g.Index, err)
	}

	if dev, err = a.device(g); err != nil {
		return err
	}

	if cur, _, ret = dev.GetMigMode(); ret != nvml.SUCCESS {
		return fmt.Errorf("gpu %d: get MIG mode after reset: %w", g.Index, ret)
	}

	if cur != want {
		return fmt.Errorf("%w: gpu %d: MIG mode still pending after reset", errPendingReboot, g.Index)
	}

	return nil
}

// holders says what uses a GPU, with process names where /proc shows them.
func (a *Applier) holders(procs []nvml.ProcessInfo) string {
	if len(procs) == 0 {
		return "held by another client (nvidia-persistenced, DCGM, a device plugin?)"
	}

	root := a.ProcRoot
	if root == "" {
		root = "/proc"
	}

	parts := make([]string, 0, len(procs))

	for _, p := range procs {
		name := ""
		if b, err := os.ReadFile(filepath.Join(root, fmt.Sprint(p.Pid), "comm")); err == nil {
			name = strings.TrimSpace(string(b))
		}

		if name != "" {
			parts = append(parts, fmt.Sprintf("%d (%s)", p.Pid, name))
		} else {
			parts = append(parts, fmt.Sprint(p.Pid))
		}
	}

	return "in use by process " + strings.Join(parts, ", ")
}
