// Package state is the state directory of a simulated NVML node (hack/sim-node/simnvml): what the
// kernel driver holds on a real node, in a file that every process loading the simulated
// libnvidia-ml reads under a lock, and the simulated /proc and /sys files that go with it.
package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/talos-nvidia/nvidia-driver/internal/sim"
	"github.com/talos-nvidia/nvidia-driver/pkg/atomicfile"
)

// DirName is the state directory's name next to the node's device nodes: /dev/.simnvml.
const DirName = ".simnvml"

// State is the content of the directory's state file.
type State struct {
	// HostRoot is where the simulated /proc and /sys files lie (sim.WriteProcFS); "" writes
	// none.
	HostRoot string `json:"hostRoot,omitempty"`
	// NVSwitches are the board's switches, written with /proc (sim.WriteNVSwitchFS).
	NVSwitches *sim.NVSwitches `json:"nvswitches,omitempty"`
	Node       sim.NodeState   `json:"node"`
}

const (
	file     = "state.json"
	lockFile = "lock"
	// AttachFile is the file that the processes holding the GPUs open lock shared
	// (hack/sim-node/simnvml attach.go).
	AttachFile = "attached"
)

// Create makes dir with the state s and an attach file.
func Create(dir string, s State) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}

	// Readable by all: processes of any user attach by a lock on a read-only descriptor.
	if err := os.WriteFile(filepath.Join(dir, AttachFile), nil, 0o644); err != nil {
		return fmt.Errorf("the attach file: %w", err)
	}

	return Write(dir, s)
}

// File is the state file of dir.
func File(dir string) string { return filepath.Join(dir, file) }

// Read reads dir's state.
func Read(dir string) (State, error) {
	var s State

	data, err := os.ReadFile(File(dir))
	if err != nil {
		return s, fmt.Errorf("reading the simulated node: %w", err)
	}

	if err := json.Unmarshal(data, &s); err != nil {
		return s, fmt.Errorf("%s: %w", File(dir), err)
	}

	return s, nil
}

// Write replaces dir's state, so that a reader never sees half of it.
func Write(dir string, s State) error {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}

	if _, err := atomicfile.Write(File(dir), data, 0o644); err != nil {
		return fmt.Errorf("writing the simulated node: %w", err)
	}

	return nil
}

// Lock takes dir's lock, exclusive for a change of state; the function returned drops it.
func Lock(dir string, exclusive bool) (func(), error) {
	fd, err := syscall.Open(filepath.Join(dir, lockFile), syscall.O_RDWR|syscall.O_CREAT|syscall.O_CLOEXEC, 0o644)
	if err != nil {
		// A read-only state directory is a reader's view: reads need no lock there.
		if !exclusive && errors.Is(err, syscall.EROFS) {
			return func() {}, nil
		}

		return nil, fmt.Errorf("locking the simulated node: %w", err)
	}

	how := syscall.LOCK_SH
	if exclusive {
		how = syscall.LOCK_EX
	}

	if err := syscall.Flock(fd, how); err != nil {
		syscall.Close(fd) //nolint:errcheck

		return nil, fmt.Errorf("locking the simulated node: %w", err)
	}

	return func() { syscall.Close(fd) }, nil //nolint:errcheck // closing drops the lock
}

// WriteProcFS writes the node's /proc and /sys files under s.HostRoot, as a loaded driver
// offers them. n must be initialized.
func WriteProcFS(s State, n *sim.Node) error {
	if err := sim.WriteProcFS(s.HostRoot, n); err != nil {
		return err
	}

	if s.NVSwitches != nil {
		return sim.WriteNVSwitchFS(s.HostRoot, *s.NVSwitches)
	}

	return nil
}
