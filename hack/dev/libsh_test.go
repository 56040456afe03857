package dev_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// runBash runs script under bash with args ($1...) and env added to the test's environment,
// and returns its exit code, its output and how long it took (at most a minute).
func runBash(t *testing.T, script string, env []string, args ...string) (code int, out string, took time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{"-c", script, "bash"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	start := time.Now()
	b, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return code, string(b), time.Since(start)
}
