package daemons_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/talos-nvidia/nvidia-driver/pkg/daemons"
	"github.com/talos-nvidia/nvidia-driver/pkg/poll"
)

// fmFixture is nv-fabricmanager run from a fake subroot: the fake daemon in its fabric
// manager role, with a shipped config whose API TCP port is apiPort.
type fmFixture struct {
	*fixture
}

func newFMFixture(t *testing.T, mode string, apiPort int) *fmFixture {
	t.Helper()
	f := &fmFixture{newFixture(t, "ok")}
	f.setMode(t, mode)
	require.NoError(t, os.MkdirAll(filepath.Join(f.root, "usr/share/nvidia/nvswitch"), 0o755))
	require.NoError(t, os.Symlink(fakeDaemon, filepath.Join(f.root, "usr/bin/nv-fabricmanager")))
	shipped, err := os.ReadFile("testdata/fabricmanager.cfg")
	require.NoError(t, err)
	shipped = []byte(strings.ReplaceAll(string(shipped), "FM_CMD_PORT_NUMBER=6666", fmt.Sprintf("FM_CMD_PORT_NUMBER=%d", apiPort)))
	require.NoError(t, os.WriteFile(filepath.Join(f.root, daemons.FabricManagerConfig), shipped, 0o644))
	spec, err := daemons.FabricManager(daemons.FabricManagerOptions{DriverRoot: f.root, RunDir: f.runDir,
		Env: []string{"FAKEDAEMON_CONTROL=" + f.control, "FAKEDAEMON_ARGS=" + f.argsFile}})
	require.NoError(t, err)
	f.spec = spec
	return f
}

// freePort returns a TCP port on 127.0.0.1 that nothing listens on.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	return port
}

func (f *fixture) starts(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile(f.argsFile)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	require.NoError(t, err)
	return strings.Count(string(b), "\n")
}

// TestFabricManagerSupervised: started in the foreground from the written config, its
// output in the log, restarted when it dies, stopped with SIGTERM.
func TestFabricManagerSupervised(t *testing.T) {
	f := newFMFixture(t, "ok", freePort(t))
	s, stop := f.run(t, daemons.Options{Backoff: poll.Backoff{Initial: 10 * time.Millisecond}})
	waitReady(t, s)

	first := s.Status().PID
	require.NotZero(t, first)
	// Foreground: the daemon is our child, and no pid file is involved.
	ppid, err := parentOf(first)
	require.NoError(t, err)
	assert.Equal(t, os.Getpid(), ppid)

	cfg, err := os.ReadFile(filepath.Join(f.runDir, "fabricmanager.cfg"))
	require.NoError(t, err)
	assert.Contains(t, string(cfg), "\nDAEMONIZE=0\n")
	assert.Contains(t, string(cfg), "\nFM_CMD_UNIX_SOCKET_PATH="+filepath.Join(f.runDir, "socket")+"\n")
	waitFor(t, "its output in the log", func() bool { return strings.Contains(f.logs.String(), "Successfully configured") })

	require.NoError(t, unix.Kill(first, unix.SIGKILL))
	waitFor(t, "a restart", func() bool { st := s.Status(); return st.State == daemons.StateReady && st.PID != first })
	assert.Equal(t, 1, s.Status().Restarts)
	assert.Contains(t, f.logs.String(), "killed by signal killed")

	second := s.Status().PID
	require.NoError(t, stop())
	assert.Equal(t, daemons.StateStopped, s.Status().State)
	assert.ErrorIs(t, unix.Kill(second, 0), unix.ESRCH, "the daemon is gone")
	assert.Contains(t, f.logs.String(), "Fabric Manager is exiting", "it got SIGTERM and exited cleanly")
	assert.NoFileExists(t, filepath.Join(f.runDir, "socket"))
}

// TestFabricManagerLongOutputLine: a line longer than any line buffer neither stops the
// reading of its output (a closed pipe would kill it with SIGPIPE at its next write) nor
// keeps its later lines out of the log.
func TestFabricManagerLongOutputLine(t *testing.T) {
	f := newFMFixture(t, "long-line", freePort(t))
	s, stop := f.run(t, daemons.Options{})
	waitReady(t, s)
	waitFor(t, "the line after the long one in the log", func() bool { return strings.Contains(f.logs.String(), "Successfully configured") })

	pid := s.Status().PID
	require.NoError(t, stop())
	assert.Contains(t, f.logs.String(), "Fabric Manager is exiting", "it was alive, got SIGTERM and exited cleanly")
	assert.Zero(t, s.Status().Restarts)
	assert.ErrorIs(t, unix.Kill(pid, 0), unix.ESRCH)
}

func parentOf(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// pid (comm) state ppid ...
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	var ppid int
	_, err = fmt.Sscan(fields[1], &ppid)
	return ppid, err
}

// TestFabricManagerCannotRun: failures no restart can fix end the supervision after one
// start; other failures are retried MaxStartFailures times, then given up. Never a loop.
func TestFabricManagerCannotRun(t *testing.T) {
	for _, tc := range []struct {
		mode, want string
		starts     int
		cannotRun  bool
	}{
		{"nothing-to-do", "NV_WARN_NOTHING_TO_DO", 1, true},
		{"late-nothing-to-do", "NV_WARN_NOTHING_TO_DO", 1, true},
		{"bad-config", "has an invalid value", 1, true},
		{"fail", "never became ready: giving up after 3 failed starts", 3, false},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			f := newFMFixture(t, tc.mode, freePort(t))
			s, _ := f.run(t, daemons.Options{Backoff: poll.Backoff{Initial: time.Millisecond}, MaxStartFailures: 3})
			select {
			case <-s.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("the supervisor did not give up")
			}
			err := s.WaitReady(context.Background()) // Run's error, now that it has returned
			require.ErrorContains(t, err, tc.want)

			var cr *daemons.CannotRunError
			assert.Equal(t, tc.cannotRun, errors.As(err, &cr))
			assert.Equal(t, daemons.StateFailed, s.Status().State)
			assert.Equal(t, tc.starts, f.starts(t))
			assert.Contains(t, s.Status().LastError, "status 1")
		})
	}
}

// TestFabricManagerForeign: a fabric manager this supervisor did not start, seen on the
// API TCP port of the shipped config or on our socket, is left alone: nothing is started.
func TestFabricManagerForeign(t *testing.T) {
	for _, tc := range []struct {
		name string
		want string
		// listen makes the foreign daemon's listener.
		listen func(t *testing.T, f *fmFixture) net.Listener
	}{
		{"API TCP port answers", "accepts connections", nil},
		{"our socket answers", "answers and no daemon of ours runs", func(t *testing.T, f *fmFixture) net.Listener {
			require.NoError(t, os.MkdirAll(f.runDir, 0o755))
			l, err := net.Listen("unix", filepath.Join(f.runDir, "socket"))
			require.NoError(t, err)
			return l
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tcp, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			port := tcp.Addr().(*net.TCPAddr).Port
			if tc.listen != nil {
				require.NoError(t, tcp.Close())
				port = freePort(t)
			}
			f := newFMFixture(t, "ok", port)
			l := tcp
			if tc.listen != nil {
				l = tc.listen(t, f)
			}
			defer l.Close()
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					_ = c.Close()
				}
			}()

			s, _ := f.run(t, daemons.Options{})
			<-s.Done()
			var foreign *daemons.ForeignDaemonError
			require.ErrorAs(t, s.WaitReady(context.Background()), &foreign)
			assert.Contains(t, foreign.Error(), tc.want)
			assert.Contains(t, foreign.Error(), "leaving it alone")
			assert.Zero(t, f.starts(t), "nothing was started")
		})
	}
}
