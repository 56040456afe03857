package testutil

import (
	"os"
	"os/signal"
	"syscall"
	"testing"
)

// DefaultSIGHUP makes the programs the test starts from now on get SIGHUP's default action
// (termination), even when the test itself runs with SIGHUP ignored, as under nohup: an
// ignored signal stays ignored across fork and exec, while one the Go runtime handles is
// reset to its default at exec. Tests whose stand-ins must die of a SIGHUP (deploy/'s
// driver-watch restarts the device plugin with one) call it before starting them.
func DefaultSIGHUP(t testing.TB) {
	t.Helper()

	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGHUP)
	t.Cleanup(func() { signal.Stop(c) })
}
