// Package poll waits for a condition outside the process with capped exponential backoff,
// telling each distinct reason for the wait once, so that a node waiting for a GPU logs one
// line, not one a second.
package poll

import (
	"context"
	"time"
)

// Until calls check until it returns nil or stop says an error ends the wait, sleeping
// initial, then twice as long each time up to max. waiting is called with each error whose
// text differs from the one before. It returns nil, the error stop accepted, or ctx's error.
//
// An error of check once ctx has ended is the end's doing (a check that was cut short says
// "context canceled"): it is no reason to wait, and Until returns ctx's error without
// calling waiting, so that a stop reads as a stop.
func Until(ctx context.Context, initial, max time.Duration, check func() error, stop func(error) bool, waiting func(error)) error {
	delay := initial
	last := ""

	for {
		err := check()
		if err == nil {
			return nil
		}

		if ctx.Err() != nil {
			return ctx.Err()
		}

		if stop != nil && stop(err) {
			return err
		}

		if msg := err.Error(); msg != last {
			waiting(err)
			last = msg
		}

		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}

		delay = min(delay*2, max)
	}
}
