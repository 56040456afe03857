package daemons_test

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/talos-nvidia/nvidia-driver/pkg/atomicfile"
	"github.com/talos-nvidia/nvidia-driver/pkg/daemons"
	"github.com/talos-nvidia/nvidia-driver/pkg/poll"
)

// fast makes backoff and polling small so that tests run quickly.
var fast = daemons.Options{
	StartTimeout: 5 * time.Second,
	Backoff:      poll.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond},
	StopGrace:    2 * time.Second,
	PollInterval: time.Millisecond,
	RestartDelay: time.Millisecond,
}

// lockHolder returns the pid holding the pid file's lock (0: none or outside our PID namespace) and whether it is locked.
func lockHolder(t testing.TB, path string) (int, bool) {
	t.Helper()
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return 0, false
	}
	require.NoError(t, err)
	defer unix.Close(fd)
	lk := unix.Flock_t{Type: unix.F_WRLCK}
	require.NoError(t, unix.FcntlFlock(uintptr(fd), unix.F_GETLK, &lk))
	return int(lk.Pid), lk.Type != unix.F_UNLCK
}

func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	// Zombies are reaped by the supervisor (subreaper), so a zombie would show
	// as alive only for a moment; read the state to be sure.
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}

func TestRestartsEveryDeathAfterReady(t *testing.T) {
	f := newFixture(t, "ok")
	s, stop := f.run(t, fast)
	waitReady(t, s)

	const deaths = 100
	seen := map[int]bool{}
	for i := range deaths {
		st := s.Status()
		require.Equal(t, daemons.StateReady, st.State)
		require.Equal(t, i, st.Restarts)
		require.False(t, seen[st.PID], "pid %d reused as a new daemon", st.PID)
		seen[st.PID] = true
		holder, locked := lockHolder(t, filepath.Join(f.runDir, "nvidia-persistenced.pid"))
		require.True(t, locked)
		require.Equal(t, st.PID, holder, "status pid is the lock holder")

		require.NoError(t, syscall.Kill(st.PID, syscall.SIGKILL))
		waitFor(t, "restart "+strconv.Itoa(i+1), func() bool {
			st := s.Status()
			return st.Restarts == i+1 && st.State == daemons.StateReady
		})
		assert.False(t, alive(st.PID), "killed daemon %d is gone (reaped)", st.PID)
	}
	st := s.Status()
	assert.Equal(t, deaths, st.Restarts)
	assert.Contains(t, st.LastError, "killed by signal killed")

	require.NoError(t, stop())
	assert.Equal(t, daemons.StateStopped, s.Status().State)
	assert.NoDirExists(t, f.runDir, "the run dir we created is removed on stop")
	assert.False(t, alive(s.Status().PID))
}

func TestCrashingDaemonIsRestartedAndSaysWhy(t *testing.T) {
	f := newFixture(t, "crash-after=20ms")
	s, stop := f.run(t, fast)
	waitFor(t, "3 restarts", func() bool { return s.Status().Restarts >= 3 })
	f.setMode(t, "ok")
	waitFor(t, "stable", func() bool { return s.Status().State == daemons.StateReady })
	assert.Contains(t, s.Status().LastError, "exited with status 3")
	assert.Contains(t, f.logs.String(), "daemon died; restarting")
	require.NoError(t, stop())
}

func TestStalePIDFileIsCleaned(t *testing.T) {
	f := newFixture(t, "ok")
	require.NoError(t, os.MkdirAll(f.runDir, 0o755))
	// A pid file left by a process that died without cleaning up: nobody holds its lock.
	dead := exec.Command("true")
	require.NoError(t, dead.Run())
	pidFile := filepath.Join(f.runDir, "nvidia-persistenced.pid")
	require.NoError(t, os.WriteFile(pidFile, []byte(strconv.Itoa(dead.Process.Pid)+"\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(f.runDir, "socket"), nil, 0o644))

	s, stop := f.run(t, fast)
	waitReady(t, s)
	assert.Contains(t, f.logs.String(), "removing stale pid file")
	b, err := os.ReadFile(pidFile)
	require.NoError(t, err)
	assert.Equal(t, strconv.Itoa(s.Status().PID), strings.TrimSpace(string(b)))
	require.NoError(t, stop())
	assert.NoFileExists(t, pidFile)
	assert.DirExists(t, f.runDir, "a run dir we did not create stays")
}

func TestForeignLiveDaemonIsLeftAlone(t *testing.T) {
	for _, tc := range []struct {
		name string
		// probe runs a supervisor against the foreign daemon's run dir and
		// returns Run's error and the final status.
		probe func(t *testing.T, f *fixture) (foreignPID int, errText string, st daemons.State)
		// wantPID: whether the holder is visible from the supervisor's PID namespace.
		wantPID bool
	}{
		{
			name: "supervisor in the same PID namespace",
			probe: func(t *testing.T, f *fixture) (int, string, daemons.State) {
				s := daemons.New(f.log, f.spec, fast)
				err := s.Run(context.Background())
				var foreign *daemons.ForeignDaemonError
				require.ErrorAs(t, err, &foreign)
				assert.Equal(t, err.Error(), s.Status().LastError)
				return foreign.PID, err.Error(), s.Status().State
			},
			wantPID: true,
		},
		{
			// As on Talos: the host's daemon (here: ours) is outside the
			// service's PID namespace, where its pid cannot be named.
			name: "supervisor in a child PID namespace",
			probe: func(t *testing.T, f *fixture) (int, string, daemons.State) {
				result := filepath.Join(shortTempDir(t), "result")
				cmd := exec.Command(os.Args[0], "-test.run=^TestHelperForeignProbe$", "-test.v")
				cmd.Env = append(os.Environ(), "DAEMONS_HELPER_RUNDIR="+f.runDir, "DAEMONS_HELPER_RESULT="+result)
				cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
				out, err := cmd.CombinedOutput()
				require.NoError(t, err, string(out))
				b, err := os.ReadFile(result)
				require.NoError(t, err, string(out))
				parts := strings.SplitN(string(b), "\n", 3)
				require.Len(t, parts, 3)
				n, err := strconv.Atoi(parts[0])
				require.NoError(t, err)
				return n, parts[1], daemons.State(parts[2])
			},
			wantPID: false,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, "ok")
			cmd := exec.Command(fakeDaemon)
			cmd.Env = append(os.Environ(), f.spec.Env...)
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, string(out))
			pidFile := filepath.Join(f.runDir, "nvidia-persistenced.pid")
			holder, locked := lockHolder(t, pidFile)
			require.True(t, locked)
			defer syscall.Kill(holder, syscall.SIGKILL)
			before, err := os.ReadFile(pidFile)
			require.NoError(t, err)

			pid, errText, state := tc.probe(t, f)
			if tc.wantPID {
				assert.Equal(t, holder, pid)
				assert.Contains(t, errText, "pid "+strconv.Itoa(holder)+" in our PID namespace")
			} else {
				assert.Equal(t, 0, pid)
				assert.Contains(t, errText, "in another PID namespace")
			}
			assert.Contains(t, errText, "leaving it alone")
			assert.Equal(t, daemons.StateFailed, state)

			after, err := os.ReadFile(pidFile)
			require.NoError(t, err, "the foreign pid file is still there")
			assert.Equal(t, before, after)
			assert.FileExists(t, filepath.Join(f.runDir, "socket"))
			h, locked := lockHolder(t, pidFile)
			assert.True(t, locked, "the foreign daemon still runs")
			assert.Equal(t, holder, h)
			assert.True(t, alive(holder))
		})
	}
}

// TestHelperForeignProbe runs, re-executed in a child PID namespace, the
// supervisor against a run dir whose daemon lives outside that namespace.
func TestHelperForeignProbe(t *testing.T) {
	runDir := os.Getenv("DAEMONS_HELPER_RUNDIR")
	if runDir == "" {
		t.Skip("helper for TestForeignLiveDaemonIsLeftAlone")
	}
	require.Equal(t, 1, os.Getpid(), "runs as pid 1 of its own PID namespace")
	spec := daemons.Spec{Name: "nvidia-persistenced", Path: "/bin/false", RunDir: runDir,
		PIDFile: filepath.Join(runDir, "nvidia-persistenced.pid"), Socket: filepath.Join(runDir, "socket")}
	s := daemons.New(discard(), spec, fast)
	err := s.Run(context.Background())
	var foreign *daemons.ForeignDaemonError
	require.ErrorAs(t, err, &foreign)
	res := strconv.Itoa(foreign.PID) + "\n" + err.Error() + "\n" + string(s.Status().State)
	require.NoError(t, os.WriteFile(os.Getenv("DAEMONS_HELPER_RESULT"), []byte(res), 0o644))
}

func TestStartFailures(t *testing.T) {
	for _, tc := range []struct {
		mode    string
		wantErr []string
	}{
		{"never-ready", []string{"never became ready: giving up after 2 failed starts", "not ready within 300ms"}},
		{"fail", []string{"never became ready", "start command failed: exit status 1", "failed to initialize"}},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			f := newFixture(t, tc.mode)
			opts := fast
			opts.StartTimeout = 300 * time.Millisecond
			opts.MaxStartFailures = 2
			s := daemons.New(f.log, f.spec, opts)
			start := time.Now()
			err := s.Run(context.Background())
			require.Error(t, err)
			assert.Less(t, time.Since(start), 3*time.Second, "fails fast")
			for _, w := range tc.wantErr {
				assert.Contains(t, err.Error(), w)
			}
			st := s.Status()
			assert.Equal(t, daemons.StateFailed, st.State)
			assert.Equal(t, 2, st.StartFailures)
			assert.Equal(t, err.Error(), st.LastError)
			assert.ErrorContains(t, s.WaitReady(context.Background()), "never became ready")
			_, locked := lockHolder(t, filepath.Join(f.runDir, "nvidia-persistenced.pid"))
			assert.False(t, locked, "no daemon is left behind")
			assert.NoFileExists(t, filepath.Join(f.runDir, "nvidia-persistenced.pid"))
		})
	}
}

func TestCancelWhileStarting(t *testing.T) {
	f := newFixture(t, "never-ready")
	s, stop := f.run(t, fast)
	pidFile := filepath.Join(f.runDir, "nvidia-persistenced.pid")
	waitFor(t, "the daemon to take its lock", func() bool { _, l := lockHolder(t, pidFile); return l })
	holder, _ := lockHolder(t, pidFile)
	assert.Equal(t, daemons.StateStarting, s.Status().State)

	start := time.Now()
	require.NoError(t, stop())
	assert.Less(t, time.Since(start), 2*time.Second)
	assert.Equal(t, daemons.StateStopped, s.Status().State)
	assert.False(t, alive(holder), "the half-started daemon is killed")
	assert.NoDirExists(t, f.runDir)
}

func TestStopKillsDaemonThatIgnoresSIGTERM(t *testing.T) {
	f := newFixture(t, "hang-term")
	opts := fast
	opts.StopGrace = 300 * time.Millisecond
	s, stop := f.run(t, opts)
	waitReady(t, s)
	pid := s.Status().PID

	start := time.Now()
	require.NoError(t, stop())
	took := time.Since(start)
	assert.GreaterOrEqual(t, took, opts.StopGrace)
	assert.Less(t, took, opts.StopGrace+time.Second, "SIGKILL right after the grace")
	assert.False(t, alive(pid))
	assert.Contains(t, f.logs.String(), "daemon ignored SIGTERM; killing it")
	assert.NoDirExists(t, f.runDir, "state left by the killed daemon is removed")
}

func TestDefaultStopFitsTalosBudget(t *testing.T) {
	f := newFixture(t, "hang-term")
	s, stop := f.run(t, daemons.Options{Backoff: poll.Backoff{Initial: time.Millisecond}, PollInterval: time.Millisecond})
	waitReady(t, s)
	start := time.Now()
	require.NoError(t, stop())
	assert.Less(t, time.Since(start), 8*time.Second, "Talos sends SIGKILL 10 s after SIGTERM")
}

func TestSuspendResume(t *testing.T) {
	f := newFixture(t, "ok")
	s, stop := f.run(t, fast)
	waitReady(t, s)
	pid := s.Status().PID

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resume, err := s.Suspend(ctx)
	require.NoError(t, err)
	assert.Equal(t, daemons.StateSuspended, s.Status().State)
	assert.False(t, alive(pid))
	assert.NoFileExists(t, filepath.Join(f.runDir, "socket"))

	resume()
	resume() // idempotent
	waitReady(t, s)
	assert.NotEqual(t, pid, s.Status().PID)
	assert.Equal(t, 0, s.Status().Restarts, "a suspension is not a death")

	require.NoError(t, stop())
	_, err = s.Suspend(ctx)
	assert.ErrorIs(t, err, daemons.ErrNotRunning)
}

func TestPassesPersistencedFlags(t *testing.T) {
	f := newFixture(t, "ok", func(o *daemons.PersistencedOptions) {
		o.PersistenceMode = false
		o.Verbose = true
	})
	s, stop := f.run(t, fast)
	waitReady(t, s)
	require.NoError(t, stop())
	b, err := os.ReadFile(f.argsFile)
	require.NoError(t, err)
	// The loader script dropped --library-path; the daemon got the rest.
	assert.Equal(t, filepath.Join(f.root, "usr/bin/nvidia-persistenced")+
		" --nvidia-cfg-path "+filepath.Join(f.root, "usr/lib64")+
		" --no-persistence-mode --no-uvm-persistence-mode --verbose\n", string(b))
}

func TestMirrorsSocketIntoReadOnlyDriverRoot(t *testing.T) {
	f := newFixture(t, "ok")
	// The driver root: a read-only bind mount of the subroot, which ships an empty run/nvidia-persistenced.
	driverRoot := filepath.Join(shortTempDir(t), "driver")
	require.NoError(t, os.Mkdir(driverRoot, 0o755))
	require.NoError(t, unix.Mount(f.root, driverRoot, "", unix.MS_BIND, ""))
	t.Cleanup(func() { _ = unix.Unmount(driverRoot, unix.MNT_DETACH) })
	require.NoError(t, unix.Mount("", driverRoot, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""))
	f.spec.MirrorDir = filepath.Join(driverRoot, "run/nvidia-persistenced")

	s, stop := f.run(t, fast)
	waitReady(t, s)
	mirrored := filepath.Join(f.spec.MirrorDir, "socket")
	fi, err := os.Stat(mirrored)
	require.NoError(t, err)
	assert.Equal(t, os.ModeSocket, fi.Mode().Type())
	c, err := (&netDialer{}).dial(mirrored)
	require.NoError(t, err, "the socket answers through the driver root")
	c.Close()

	// A restart keeps it visible: the run dir is ours, so the daemon never removes it.
	require.NoError(t, syscall.Kill(s.Status().PID, syscall.SIGKILL))
	waitFor(t, "restart", func() bool { st := s.Status(); return st.Restarts == 1 && st.State == daemons.StateReady })
	c, err = (&netDialer{}).dial(mirrored)
	require.NoError(t, err)
	c.Close()

	require.NoError(t, stop())
	t.Cleanup(func() { _ = unix.Unmount(f.spec.MirrorDir, unix.MNT_DETACH) })
	assert.Equal(t, 1, mountsAt(t, f.spec.MirrorDir), "the mirror stays after stop: containers' specs point at it")

	// The next run (the service restarted) reuses it: no second mount, the socket answers.
	s, stop = f.run(t, fast)
	waitReady(t, s)
	assert.Equal(t, 1, mountsAt(t, f.spec.MirrorDir), "reused, not stacked")
	assert.Contains(t, f.logs.String(), "result=reused")
	c, err = (&netDialer{}).dial(mirrored)
	require.NoError(t, err)
	c.Close()
	require.NoError(t, stop())
}

// TestTalosStopRestartsNothing: a stop that reaches the daemon before the service (runc 1.1's
// kill --all signals every process of the container; runc 1.4, Talos v1.13's, the init
// alone; a user's kill may signal anything), here the daemon 3 ms before the service's own
// signal ends ctx. The daemon had been up long enough to count as stable, which once meant an
// immediate restart. Which of the two the supervisor sees first is a race, so only what must
// hold either way is checked: nothing restarted, the daemon stopped, the supervisor stopped.
func TestTalosStopRestartsNothing(t *testing.T) {
	f := newFixture(t, "ok")
	opts := fast
	opts.StableAfter = time.Millisecond
	opts.RestartDelay = 0 // the default

	for i := range 5 {
		s, stop := f.run(t, opts)
		waitReady(t, s)
		time.Sleep(2 * time.Millisecond) // stable
		require.NoError(t, syscall.Kill(s.Status().PID, syscall.SIGTERM))
		time.Sleep(3 * time.Millisecond)
		require.NoError(t, stop())

		b, err := os.ReadFile(f.argsFile)
		require.NoError(t, err)
		assert.Equal(t, i+1, strings.Count(string(b), "\n"), "stop %d: no daemon started after the signal", i+1)
		assert.Equal(t, 0, s.Status().Restarts)
		assert.Equal(t, daemons.StateStopped, s.Status().State)
	}

	assert.NotContains(t, f.logs.String(), "restarting")
	assert.Equal(t, 5, strings.Count(f.logs.String(), "daemon stopped"), "each stop logged once, whichever came first:\n%s", f.logs.String())
}

func mountsAt(t *testing.T, path string) int {
	t.Helper()
	infos, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(path))
	require.NoError(t, err)
	return len(infos)
}

func TestSpecErrors(t *testing.T) {
	root := fakeSubroot(t)
	require.NoError(t, os.Remove(filepath.Join(root, "usr/lib64/libnvidia-cfg.so.1")))
	_, err := daemons.Persistenced(daemons.DefaultPersistencedOptions(root))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "lacks usr/lib64/libnvidia-cfg.so.1")

	_, err = daemons.Persistenced(daemons.DefaultPersistencedOptions("relative/root"))
	assert.ErrorContains(t, err, `driver root "relative/root" is not an absolute path`)

	s := daemons.New(discard(), daemons.Spec{Name: "x", Path: "bin", RunDir: "/r", PIDFile: "/r/p", Socket: "s"}, fast)
	err = s.Run(context.Background())
	assert.ErrorContains(t, err, `path "bin" is not an absolute path`)
	assert.ErrorContains(t, err, `socket "s" is not an absolute path`)
	assert.Equal(t, daemons.StateFailed, s.Status().State)
}

// TestDaemonGetsAMinimalEnvironment: what the service's environment holds (an LD_PRELOAD
// from a document's environment, say) does not reach the daemon; it gets PATH and its
// spec's Env only.
func TestDaemonGetsAMinimalEnvironment(t *testing.T) {
	f := newFixture(t, "ok")
	envFile := filepath.Join(shortTempDir(t), "env")
	f.spec.Env = append(f.spec.Env, "FAKEDAEMON_ENV="+envFile)
	t.Setenv("LD_PRELOAD", "/nonexistent/libleak.so")
	t.Setenv("NVIDIA_DRIVER_LEAK_CHECK", "1")

	s, stop := f.run(t, fast)
	waitReady(t, s)
	require.NoError(t, stop())

	data, err := os.ReadFile(envFile)
	require.NoError(t, err)
	env := strings.Fields(string(data))
	assert.Contains(t, env, "PATH=/usr/sbin:/usr/bin:/sbin:/bin")
	assert.Contains(t, env, "FAKEDAEMON_ENV="+envFile, "the spec's Env is passed")

	for _, kv := range env {
		assert.False(t, strings.HasPrefix(kv, "LD_PRELOAD=") || strings.HasPrefix(kv, "NVIDIA_DRIVER_LEAK_CHECK="), "the service's %s reached the daemon", kv)
	}
}

// TestSocketPathOutlivesTheDaemon: CDI specs name nvidia-persistenced's socket, and runc
// fails a container whose bind mount has no source (seen on the H200 for a container created
// while the service restarted). Between daemons the path holds a socket nobody listens on;
// the next daemon replaces it (as nvidia-persistenced.c setup_rpc unlinks a stale socket).
func TestSocketPathOutlivesTheDaemon(t *testing.T) {
	f := newFixture(t, "ok", func(o *daemons.PersistencedOptions) { o.MirrorDir = "/run/nvidia/driver/run/nvidia-persistenced" })
	require.True(t, f.spec.KeepSocket, "mirrored under the driver root, where CDI specs name it: kept")
	f.spec.MirrorDir = "" // the supervisor itself, without the mount
	socket := filepath.Join(f.runDir, "socket")

	for i := range 2 {
		s, stop := f.run(t, fast)
		waitReady(t, s)

		c, err := net.Dial("unix", socket)
		require.NoError(t, err, "run %d: the daemon answers", i+1)
		require.NoError(t, c.Close())

		require.NoError(t, stop())

		st, err := os.Lstat(socket)
		require.NoError(t, err, "run %d: the socket's path is still there after the stop", i+1)
		assert.Equal(t, os.ModeSocket, st.Mode().Type())

		_, err = net.Dial("unix", socket)
		assert.Error(t, err, "nothing listens on it between daemons")
	}
}

// TestLinkAtRunDirIsRefused: a link in place of the daemon's run directory is refused, with
// an error naming it, before anything is made where it points or the daemon starts.
func TestLinkAtRunDirIsRefused(t *testing.T) {
	f := newFixture(t, "ok")
	elsewhere := t.TempDir()
	require.NoError(t, os.Symlink(elsewhere, f.runDir))

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	err := daemons.New(f.log, f.spec, fast).Run(ctx)
	require.ErrorIs(t, err, atomicfile.ErrSymlink)
	assert.Contains(t, err.Error(), f.runDir+" is a symbolic link")

	entries, err := os.ReadDir(elsewhere)
	require.NoError(t, err)
	assert.Empty(t, entries, "nothing made through the link")
}
