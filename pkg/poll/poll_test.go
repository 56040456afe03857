package poll_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/pkg/poll"
)

// TestStopIsNotAWait: a check cut short by the end of ctx (a stop during bring-up) is not
// reported as a wait (issue 32: "WARN waiting for MIG layout ...: context canceled"); Until
// returns ctx's error.
func TestStopIsNotAWait(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())

	var waits []string

	err := poll.Backoff{Initial: time.Millisecond, Max: time.Millisecond}.Until(ctx, func() error {
		cancel() // the stop comes while the check runs

		return fmt.Errorf("applying the layout: %w", ctx.Err())
	}, func(err error) { waits = append(waits, err.Error()) })

	require.ErrorIs(t, err, context.Canceled)
	assert.Empty(t, waits)
}

// TestWaitsAreReportedOncePerReason: each distinct reason is reported once; success ends the
// wait.
func TestWaitsAreReportedOncePerReason(t *testing.T) {
	results := []error{errors.New("a"), errors.New("a"), errors.New("b"), errors.New("b"), nil}

	var waits []string

	err := poll.Backoff{Initial: time.Microsecond, Max: time.Microsecond}.Until(context.Background(), func() error {
		err := results[0]
		results = results[1:]

		return err
	}, func(err error) { waits = append(waits, err.Error()) })

	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b"}, waits)
}

// TestPermanentEndsTheWait: a Permanent error ends the wait at once, returned unmarked and
// never reported as a wait.
func TestPermanentEndsTheWait(t *testing.T) {
	cause := errors.New("cannot help")
	calls := 0

	err := poll.Backoff{Initial: time.Microsecond, Max: time.Microsecond}.Until(context.Background(), func() error {
		calls++

		return fmt.Errorf("step: %w", poll.Permanent(cause))
	}, func(err error) { t.Errorf("reported as a wait: %v", err) })

	require.ErrorIs(t, err, cause)
	assert.Equal(t, "cannot help", err.Error())
	assert.Equal(t, 1, calls)
}

// TestDeadlineEndsTheWait: past Within, the wait ends with ErrDeadline and the last error,
// after one check at the deadline.
func TestDeadlineEndsTheWait(t *testing.T) {
	start := time.Now()
	last := errors.New("still not there")

	err := poll.Backoff{Initial: 5 * time.Millisecond, Max: time.Hour, Within: 30 * time.Millisecond}.Until(context.Background(),
		func() error { return last }, nil)

	require.ErrorIs(t, err, poll.ErrDeadline)
	require.ErrorIs(t, err, last)
	assert.Less(t, time.Since(start), time.Second)
	assert.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond)
}

func TestNext(t *testing.T) {
	b := poll.Backoff{Initial: time.Second, Max: 3 * time.Second}
	assert.Equal(t, time.Second, b.Next(0))
	assert.Equal(t, 2*time.Second, b.Next(time.Second))
	assert.Equal(t, 3*time.Second, b.Next(2*time.Second))
}
