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

	err := poll.Until(ctx, time.Millisecond, time.Millisecond, func() error {
		cancel() // the stop comes while the check runs

		return fmt.Errorf("applying the layout: %w", ctx.Err())
	}, nil, func(err error) { waits = append(waits, err.Error()) })

	require.ErrorIs(t, err, context.Canceled)
	assert.Empty(t, waits)
}

// TestWaitsAreReportedOncePerReason: each distinct reason is reported once; success ends the
// wait.
func TestWaitsAreReportedOncePerReason(t *testing.T) {
	results := []error{errors.New("a"), errors.New("a"), errors.New("b"), errors.New("b"), nil}

	var waits []string

	err := poll.Until(context.Background(), time.Microsecond, time.Microsecond, func() error {
		err := results[0]
		results = results[1:]

		return err
	}, nil, func(err error) { waits = append(waits, err.Error()) })

	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b"}, waits)
}
