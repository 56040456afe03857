// Package fabricmanager is the ext-nvidia-fabricmanager service: it runs NVIDIA's
// nv-fabricmanager on NVSwitch boards, apart from ext-nvidia-driver, so that no change of the
// nvidia-driver document (each restarts that service) stops the fabric manager.
//
// It starts on every node and never exits on a problem (Talos restarts a `restart: always`
// service that exits, and a `depends` that never comes true stalls the boot): it waits, with
// backoff, for the nvidia module, then reads the board; without NVSwitches it says so once
// and idles. On an NVSwitch board it waits for the switches' device nodes (ext-nvidia-driver
// makes them) and starts nv-fabricmanager from the subroot, following NVIDIA's restart rules
// (NVIDIA Fabric Manager User Guide, "Service Restart Procedure"):
//   - HGX H100 and later (NVSwitch gen 3, NVLink 4/5): a fabric manager that died is not
//     started again, nor is one started where the GPUs are registered with the fabric
//     already (a fabric manager ran before): that needs the GPUs reset first. The status
//     says so and what to do.
//   - HGX A100 (NVSwitch gen 2): the config it writes has ABORT_CUDA_JOBS_ON_FM_EXIT=0, so an
//     exit does not abort CUDA jobs, and a fabric manager that died is started again.
//
// Its status goes to StatusFile, atomically; ext-nvidia-driver reads it (Observe).
package fabricmanager

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/talos-nvidia/nvidia-driver/pkg/daemons"
	"github.com/talos-nvidia/nvidia-driver/pkg/devnodes"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu"
	"github.com/talos-nvidia/nvidia-driver/pkg/nvswitch"
	"github.com/talos-nvidia/nvidia-driver/pkg/poll"
	"github.com/talos-nvidia/nvidia-driver/pkg/report"
)

// FabricReader reads the GPUs' NVLink fabric registration (NVML, in a child process on a node).
type FabricReader interface {
	FabricStates(ctx context.Context) ([]gpu.FabricState, error)
}

// Config is the service's configuration: it reads no nvidia-driver document.
type Config struct {
	// HostRoot prefixes every host path: "/" on a node.
	HostRoot string
	// Subroot is the glibc subroot that carries nv-fabricmanager.
	Subroot string
	// StartTimeout bounds one start of nv-fabricmanager, until its API socket answers.
	StartTimeout time.Duration
	// PollInitial and PollMax bound the waits for what the service needs (1 s, 30 s).
	PollInitial, PollMax time.Duration
	// Env is extra environment for nv-fabricmanager (tests).
	Env []string
	// Daemon tunes the supervisor (tests); StartTimeout and NoRestartAfterReady are set here.
	Daemon daemons.Options
}

func (c Config) host(p string) string { return filepath.Join(c.HostRoot, p) }

// Service is one run of ext-nvidia-fabricmanager.
type Service struct {
	log    *slog.Logger
	cfg    Config
	nvml   FabricReader
	status *report.Status[Status]
}

// New returns the service; Run runs it.
func New(log *slog.Logger, cfg Config, nvml FabricReader) *Service {
	if cfg.PollInitial <= 0 {
		cfg.PollInitial = time.Second
	}

	if cfg.PollMax <= 0 {
		cfg.PollMax = 30 * time.Second
	}

	return &Service{log: log, cfg: cfg, nvml: nvml, status: newStatus(log, cfg.host(StatusFile))}
}

// Status returns the latest status.
func (s *Service) Status() Status { return s.status.Get() }

// Run runs the service until ctx ends and returns nil then: whatever it meets is reported
// and waited on, never returned (an exit would be restarted by Talos in a loop).
func (s *Service) Run(ctx context.Context) error {
	// The run directory is the host's: a link there is refused and waited out, as every
	// other fault on the host path.
	runDir := s.cfg.host(RunDir)
	if !s.waitFor(ctx, "the run directory "+runDir, func() error { return daemons.MakeRunDir(runDir) }) {
		return nil
	}

	release, err := holdLock(s.cfg.host(LockFile))
	if err != nil {
		s.report(StateNotRunning, err.Error(), "")
		<-ctx.Done()

		return nil
	}
	defer release()

	s.run(ctx)
	<-ctx.Done()
	s.report(StateStopped, "the service stopped; its fabric manager, if it ran one, stopped with it", "")

	return nil
}

func (s *Service) run(ctx context.Context) {
	if !s.waitFor(ctx, gpu.ModuleWait, func() error { return gpu.DriverLoaded(s.cfg.HostRoot) }) {
		return
	}

	board := nvswitch.Read(s.log, s.cfg.HostRoot)
	s.status.Update(func(st *Status) { st.Board = board })

	if !board.HasNVSwitch() {
		s.report(StateNoNVSwitch, "no NVSwitch on this board: no fabric manager is needed; the service idles", "")

		return
	}

	board.Log(s.log)

	switch {
	case len(board.Driver) == 0 && len(board.NVLink5) > 0:
		s.report(StateNotRunning, fmt.Sprintf("an NVLink 5 board (NVSwitches behind the ConnectX-7 management ports %s) needs nv-fabricmanager with NVLSM, which this service does not run",
			strings.Join(board.NVLink5, ", ")), "run NVIDIA's fabric manager and NVLSM for NVLink 5 yourself")

		return
	case len(board.Driver) == 0:
		s.report(StateNotRunning, fmt.Sprintf("NVSwitch PCI functions %s are present but the nvidia-nvswitch driver initialized none of them "+
			"(GPUs passed through to a VM without the board's NVSwitch topology?): no fabric manager can run", strings.Join(board.PCI, ", ")), "")

		return
	}

	spec, err := daemons.FabricManager(daemons.FabricManagerOptions{
		DriverRoot:         s.cfg.Subroot,
		RunDir:             s.cfg.host(RunDir),
		KeepCUDAJobsOnExit: board.PreHopper(),
		Env:                s.cfg.Env,
	})
	if err != nil {
		// NVIDIA ships the fabric manager apart from the driver
		// (fabricmanager-linux-x86_64-<version>-archive.tar.xz); the subroot is the
		// extension's own content, which no wait changes.
		s.report(StateNotRunning, fmt.Sprintf("the subroot %s does not carry the fabric manager: %v", s.cfg.Subroot, err),
			"install a build of the extension whose subroot has NVIDIA's fabric manager archive (usr/bin/nv-fabricmanager)")

		return
	}

	if !s.waitFor(ctx, "the NVSwitch device nodes (ext-nvidia-driver makes them)", s.deviceNodes) {
		return
	}

	// A fabric manager that answers on the API address of the shipped config is someone
	// else's: it is left alone.
	if err := spec.Foreign(); err != nil {
		s.report(StateForeign, err.Error(), "")

		return
	}

	if !board.PreHopper() && !s.checkUnregistered(ctx) {
		return
	}

	s.supervise(ctx, spec, board)
}

// resetProcedure is what NVIDIA's "Service Restart Procedure" for HGX H100 and later asks
// for, in Talos terms.
const resetProcedure = "stop every CUDA application and what holds the GPUs (the device plugin and DCGM exporter pods), " +
	"reset the GPUs (nvidia-smi -r) and restart this service (talosctl service " + ServiceID + " restart), or reboot the node"

// checkUnregistered waits until NVML answers and says whether a fabric manager may start:
// not where every GPU is registered with the fabric already (one ran before, ours before a
// restart of this service included), which NVIDIA requires a GPU reset for on HGX H100 and
// later.
func (s *Service) checkUnregistered(ctx context.Context) bool {
	var states []gpu.FabricState

	if !s.waitFor(ctx, "NVML's fabric registration of the GPUs", func() error {
		var err error

		states, err = s.nvml.FabricStates(ctx)

		return err
	}) {
		return false
	}

	registered := 0

	for _, st := range states {
		if st.Registered() {
			registered++
		}
	}

	if registered == 0 || registered < len(states) {
		return true
	}

	s.report(StateNotRunning, fmt.Sprintf("the %d GPU(s) are registered with the NVLink fabric already, by a fabric manager that ran before "+
		"(this service's own before it was restarted, or one it did not start): NVIDIA requires the GPUs to be reset before a fabric manager "+
		"starts again on HGX H100 and later, so none is started; NVLink errors and GPU resets are not handled until then", registered), resetProcedure)

	return false
}

// supervise runs nv-fabricmanager until ctx ends or the supervisor gives up, keeping the
// status current.
func (s *Service) supervise(ctx context.Context, spec daemons.Spec, board nvswitch.Board) {
	opts := s.cfg.Daemon
	opts.StartTimeout = s.cfg.StartTimeout

	if !board.PreHopper() {
		opts.NoRestartAfterReady = "on HGX H100 and later NVIDIA requires the GPUs to be reset before a fabric manager starts again"
	}

	sup := daemons.New(s.log, spec, opts)
	done := make(chan error, 1)

	go func() { done <- sup.Run(ctx) }()

	for {
		changed := sup.Changed()
		s.daemonState(sup.Status(), board)

		select {
		case err := <-done:
			s.ended(ctx, sup.Status(), err)

			return
		case <-changed:
		}
	}
}

// daemonState reports the supervisor's state of a running supervision.
func (s *Service) daemonState(d daemons.Status, board nvswitch.Board) {
	s.status.Update(func(st *Status) { st.Daemon, st.Restarts = d.State, d.Restarts })

	switch d.State {
	case daemons.StateStarting:
		s.report(StateStarting, "starting nv-fabricmanager", "")
	case daemons.StateReady:
		msg := "nv-fabricmanager is running"
		if board.PreHopper() {
			msg += " (NVSwitch gen 2: ABORT_CUDA_JOBS_ON_FM_EXIT=0, started again if it dies)"
		} else {
			msg += " (HGX H100 and later: not started again if it dies, as NVIDIA requires)"
		}

		s.report(StateRunning, msg, "")
	case daemons.StateRestarting:
		if d.EverReady && !board.PreHopper() {
			// The supervisor waits a moment before it gives up (a stop of the whole
			// service may be under way); nothing will start it again.
			s.report(StateNotRunning, d.LastError+"; not started again: on HGX H100 and later NVIDIA requires the GPUs to be reset first", resetProcedure)

			return
		}

		s.report(StateRestarting, "nv-fabricmanager is not running; starting it again: "+d.LastError, "")
	}
}

// ended reports why a supervision ended.
func (s *Service) ended(ctx context.Context, d daemons.Status, err error) {
	s.status.Update(func(st *Status) { st.Daemon, st.Restarts = d.State, d.Restarts })

	var (
		foreign  *daemons.ForeignDaemonError
		notAgain *daemons.NotRestartedError
		cannot   *daemons.CannotRunError
	)

	switch {
	case ctx.Err() != nil:
	case errors.As(err, &foreign):
		s.report(StateForeign, err.Error(), "")
	case errors.As(err, &notAgain):
		s.report(StateNotRunning, err.Error(), resetProcedure)
	case errors.As(err, &cannot):
		s.report(StateNotRunning, err.Error(), "")
	case err != nil:
		s.report(StateNotRunning, err.Error(), fmt.Sprintf("read `talosctl logs %s`, then `talosctl service %s restart`", ServiceID, ServiceID))
	}
}

// deviceNodes checks that the nodes nv-fabricmanager opens exist: /dev/nvidiactl and the
// NVSwitch and NVLink nodes of the board (devnodes.FabricNodes, what ext-nvidia-driver makes).
func (s *Service) deviceNodes() error {
	want, err := devnodes.FabricNodes(s.cfg.HostRoot)
	if err != nil {
		return err
	}

	var missing []string

	for _, p := range append([]string{"dev/nvidiactl"}, nodePaths(want)...) {
		var st unix.Stat_t
		if err := unix.Stat(s.cfg.host(p), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR {
			missing = append(missing, "/"+p)
		}
	}

	if len(missing) > 0 {
		return fmt.Errorf("missing %s (is ext-nvidia-driver running?)", strings.Join(missing, ", "))
	}

	return nil
}

func nodePaths(nodes []devnodes.Node) []string {
	paths := make([]string, 0, len(nodes))
	for _, n := range nodes {
		paths = append(paths, n.Path)
	}

	return paths
}

// waitFor calls check until it succeeds, with backoff, reporting each distinct reason once.
// It says whether check succeeded (false: ctx ended).
func (s *Service) waitFor(ctx context.Context, what string, check func() error) bool {
	b := poll.Backoff{Initial: s.cfg.PollInitial, Max: s.cfg.PollMax}

	return s.status.Wait(ctx, b, StateWaiting, "waiting for "+what, check) == nil
}

func (s *Service) report(state, msg, action string) {
	var args []any
	if action != "" {
		args = []any{"action", action}
	}

	s.status.Report(state, msg, func(st *Status) { st.Action = action }, args...)
}

// holdLock takes an open file description lock on path for the service's lifetime. Unlike a
// classic POSIX lock it is not dropped when the process closes another descriptor of the
// file, and it conflicts with a probe from any process, this one included (fcntl(2)).
func holdLock(path string) (release func(), err error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening the service's lock %s: %w", path, err)
	}

	lk := unix.Flock_t{Type: unix.F_WRLCK}
	if err := unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &lk); err != nil {
		unix.Close(fd) //nolint:errcheck

		return nil, fmt.Errorf("another %s holds its lock %s (two instances?): %w", ServiceID, path, err)
	}

	return func() { unix.Close(fd) }, nil //nolint:errcheck
}
