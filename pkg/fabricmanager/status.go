package fabricmanager

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/talos-nvidia/nvidia-driver/pkg/daemons"
	"github.com/talos-nvidia/nvidia-driver/pkg/nvswitch"
	"github.com/talos-nvidia/nvidia-driver/pkg/report"
)

// Host paths of the service. RunDir is where nv-fabricmanager keeps its config, state file
// and sockets (NVIDIA's packaging uses /var/run/nvidia-fabricmanager; /var/run links to /run
// in the service's root filesystem); the status and the lock sit next to them, where
// ext-nvidia-driver, which mounts the same host directory, reads them.
const (
	RunDir     = "/run/nvidia-fabricmanager"
	StatusFile = RunDir + "/status.json"
	// LockFile is held (an open file description lock) by the service for as long as it
	// runs: a status file whose lock is free was left by a service that is gone.
	LockFile = RunDir + "/service.lock"
	// ServiceID is the Talos service that runs it.
	ServiceID = "ext-nvidia-fabricmanager"
)

// States of the service, in Status.State.
const (
	StateWaiting    = "waiting"     // for the nvidia module, the NVSwitch device nodes, NVML
	StateNoNVSwitch = "no-nvswitch" // the board has none: nothing to do, the service idles
	StateStarting   = "starting"
	StateRunning    = "running"    // our nv-fabricmanager is up
	StateRestarting = "restarting" // ours died on a board where NVIDIA allows a restart
	StateForeign    = "foreign"    // a fabric manager this service did not start does the job
	StateNotRunning = "not-running"
	StateStopped    = "stopped" // the service stopped (and its fabric manager with it)
)

// Status is what the service reports in its status file.
type Status struct {
	State   string `json:"state"`
	Message string `json:"message"`
	// Action says what a person can do, where something must be done.
	Action string         `json:"action,omitempty"`
	Board  nvswitch.Board `json:"board"`
	// Daemon is the supervisor's state of our nv-fabricmanager, "" where none was started.
	Daemon   daemons.State `json:"daemon,omitempty"`
	Restarts int           `json:"restarts,omitempty"`
	Updated  time.Time     `json:"updated"`
}

// Running says whether a fabric manager does its job, according to this status.
func (s Status) Running() bool { return s.State == StateRunning || s.State == StateForeign }

// newStatus is the service's status, kept in its file; a report logs at its state's level.
func newStatus(log *slog.Logger, path string) *report.Status[Status] {
	return report.New(log, path, Status{}, report.Shape[Status]{
		Key:    "state",
		Set:    func(s *Status, state, msg string) { s.State, s.Message = state, msg },
		Stamp:  func(s *Status, at time.Time) { s.Updated = at },
		Levels: map[string]slog.Level{StateNotRunning: slog.LevelError, StateWaiting: slog.LevelWarn, StateRestarting: slog.LevelWarn},
	})
}

// Observation is what another service sees of this one on the host.
type Observation struct {
	Status Status
	// Found: the status file exists; Alive: the service that wrote it holds its lock.
	Found, Alive bool
	// Err is a status file or lock that could not be read.
	Err error
}

// Observe reads the service's status file and lock under hostRoot ("/" on a node).
func Observe(hostRoot string) Observation {
	var o Observation

	data, err := os.ReadFile(filepath.Join(hostRoot, StatusFile))

	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		o.Err = fmt.Errorf("reading %s's status: %w", ServiceID, err)
	default:
		if err := json.Unmarshal(data, &o.Status); err != nil {
			o.Err = fmt.Errorf("%s's status %s: %w", ServiceID, filepath.Join(hostRoot, StatusFile), err)
		} else {
			o.Found = true
		}
	}

	alive, err := daemons.LockHeld(filepath.Join(hostRoot, LockFile))
	if err != nil {
		o.Err = errors.Join(o.Err, fmt.Errorf("checking %s's lock: %w", ServiceID, err))
	}

	o.Alive = alive

	return o
}

// Running says whether a fabric manager runs: the service is alive and says so.
func (o Observation) Running() bool { return o.Found && o.Alive && o.Status.Running() }

// Explain says, for a node whose board has NVSwitches, why no fabric manager runs and what
// to do; "" when one runs.
func (o Observation) Explain() string {
	logs := fmt.Sprintf("`talosctl service %s`, `talosctl logs %s`", ServiceID, ServiceID)

	switch {
	case o.Running():
		return ""
	case o.Err != nil && !o.Found:
		return fmt.Sprintf("no fabric manager known to run: %v (see %s)", o.Err, logs)
	case !o.Found || !o.Alive:
		return fmt.Sprintf("no fabric manager runs: the %s service is not running (no live status in %s); see %s", ServiceID, StatusFile, logs)
	}

	msg := fmt.Sprintf("no fabric manager runs (%s %s): %s", ServiceID, o.Status.State, o.Status.Message)
	if o.Status.Action != "" {
		msg += "; to fix: " + o.Status.Action
	}

	return msg
}
