// Package report keeps a service's status, the one reporter of ext-nvidia-driver and
// ext-nvidia-fabricmanager: in memory, and whole in its status file, as indented JSON written
// atomically, on every change, stamped with the time; a report is also logged, at the level
// its state gives. A status file that cannot be written is logged once per distinct error,
// not at every change: readers poll the file, the log says why it is stale.
package report

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/talos-nvidia/nvidia-driver/pkg/atomicfile"
	"github.com/talos-nvidia/nvidia-driver/pkg/poll"
)

// Shape says how a service's status type S takes a report.
type Shape[S any] struct {
	// Key names the state in the log line ("phase", "state").
	Key string
	// Set records a report's state and message.
	Set func(s *S, state, msg string)
	// Stamp records when the status changed.
	Stamp func(s *S, at time.Time)
	// Levels gives the log level of a report by its state; Info where it has none.
	Levels map[string]slog.Level
}

// Status is a service's status and its file.
type Status[S any] struct {
	log   *slog.Logger
	path  string
	shape Shape[S]

	mu     sync.Mutex
	cur    S
	failed string // the write error last logged, "" once a write works
}

// New returns the status at path, holding initial; nothing is written until a change.
func New[S any](log *slog.Logger, path string, initial S, shape Shape[S]) *Status[S] {
	return &Status[S]{log: log, path: path, shape: shape, cur: initial}
}

// Get returns the status.
func (s *Status[S]) Get() S {
	s.mu.Lock()
	defer s.mu.Unlock()

	return s.cur
}

// Update changes the status with f, stamps it and writes it; the status changes even when
// the write fails, which is logged once per distinct error.
func (s *Status[S]) Update(f func(*S)) {
	s.mu.Lock()
	defer s.mu.Unlock()

	err := s.change(f)

	switch {
	case err == nil:
		s.failed = ""
	case err.Error() != s.failed:
		s.failed = err.Error()
		s.log.Error("cannot write the status file", "error", err)
	}
}

// Write is Update for a caller that handles the error itself.
func (s *Status[S]) Write(f func(*S)) error {
	s.mu.Lock()
	defer s.mu.Unlock()

	return s.change(f)
}

func (s *Status[S]) change(f func(*S)) error {
	f(&s.cur)
	s.shape.Stamp(&s.cur, time.Now().UTC())

	data, err := json.MarshalIndent(s.cur, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding %s: %w", s.path, err)
	}

	if _, err := atomicfile.Write(s.path, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing status: %w", err)
	}

	return nil
}

// Report records state and msg (and what more sets, when not nil) and logs msg at the state's
// level with the state and args.
func (s *Status[S]) Report(state, msg string, more func(*S), args ...any) {
	s.Update(func(st *S) {
		s.shape.Set(st, state, msg)

		if more != nil {
			more(st)
		}
	})

	level, ok := s.shape.Levels[state]
	if !ok {
		level = slog.LevelInfo
	}

	s.log.Log(context.Background(), level, msg, append([]any{s.shape.Key, state}, args...)...)
}

// Wait calls check with b's backoff until it succeeds (poll.Backoff.Until), reporting state
// with "<say>: <error>" once per distinct error.
func (s *Status[S]) Wait(ctx context.Context, b poll.Backoff, state, say string, check func() error) error {
	return b.Until(ctx, check, func(err error) { s.Report(state, fmt.Sprintf("%s: %s", say, err), nil) })
}
