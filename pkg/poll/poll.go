// Package poll is the one way the services wait and retry: capped exponential backoff, an
// optional deadline, errors that end the wait (Permanent), and each distinct reason for the
// wait told once, so that a node waiting for a GPU logs one line, not one a second.
package poll

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Backoff sleeps Initial, then twice as long each time up to Max. Within, when set, bounds
// the whole wait.
type Backoff struct {
	Initial, Max time.Duration
	Within       time.Duration
}

// Next is the delay after cur: Initial after none (cur <= 0), else twice cur up to Max.
func (b Backoff) Next(cur time.Duration) time.Duration {
	if cur <= 0 {
		return b.Initial
	}

	return min(2*cur, b.Max)
}

// ErrDeadline ends a wait whose Within has passed; Until wraps the check's last error with it.
var ErrDeadline = errors.New("gave up waiting")

// permanentError ends a wait: trying again cannot help.
type permanentError struct{ err error }

func (p permanentError) Error() string { return p.err.Error() }
func (p permanentError) Unwrap() error { return p.err }

// Permanent marks err as one that ends the wait: Until returns err itself, unwrapped.
func Permanent(err error) error { return permanentError{err} }

// Until calls check until it returns nil, a Permanent error, or b.Within has passed, sleeping
// with b's backoff between calls. waiting is called with each error whose text differs from
// the one before. It returns nil, the permanent error (unmarked), ErrDeadline wrapping the
// last error, or ctx's error.
//
// An error of check once ctx has ended is the end's doing (a check that was cut short says
// "context canceled"): it is no reason to wait, and Until returns ctx's error without
// calling waiting, so that a stop reads as a stop.
func (b Backoff) Until(ctx context.Context, check func() error, waiting func(error)) error {
	var deadline time.Time
	if b.Within > 0 {
		deadline = time.Now().Add(b.Within)
	}

	delay := b.Next(0)
	last := ""

	for {
		err := check()
		if err == nil {
			return nil
		}

		if ctx.Err() != nil {
			return ctx.Err()
		}

		if p, ok := errors.AsType[permanentError](err); ok {
			return p.err
		}

		if !deadline.IsZero() && !time.Now().Before(deadline) {
			return fmt.Errorf("%w after %s: %w", ErrDeadline, b.Within, err)
		}

		if msg := err.Error(); msg != last && waiting != nil {
			waiting(err)
			last = msg
		}

		sleep := delay
		if !deadline.IsZero() {
			sleep = min(delay, time.Until(deadline)+time.Millisecond)
		}

		if !Sleep(ctx, sleep) {
			return ctx.Err()
		}

		delay = b.Next(delay)
	}
}

// Sleep waits d or until ctx ends, and says whether d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()

	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
