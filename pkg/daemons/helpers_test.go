package daemons_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
	"github.com/talos-nvidia/nvidia-driver/pkg/daemons"
	"github.com/talos-nvidia/nvidia-driver/pkg/driverroot"
)

// fakeDaemon is the fake nvidia-persistenced, built once by TestMain.
var fakeDaemon string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "fakedaemon")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		fakeDaemon = filepath.Join(dir, "fakedaemon")
		cmd := exec.Command("go", "build", "-o", fakeDaemon, "../../internal/fakedaemon")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build fake daemon: %v\n%s", err, out)
			return 1
		}
		return m.Run()
	}())
}

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (mounts, pidfds of reparented daemons)")
	}
}

// shortTempDir keeps socket paths under the 108-byte limit of sun_path.
func shortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "dmn")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// fakeSubroot builds a subroot whose "loader" is a shell script that drops
// --library-path like ld.so does and runs the fake daemon as nvidia-persistenced.
func fakeSubroot(t testing.TB) string {
	t.Helper()
	root := shortTempDir(t)
	for _, d := range []string{filepath.Dir(driverroot.LoaderPath), "usr/lib64", "usr/bin", "run/nvidia-persistenced"} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, d), 0o755))
	}
	loader := "#!/bin/sh\n[ \"$1\" = --library-path ] || { echo \"loader: want --library-path, got $1\" >&2; exit 127; }\nshift 2\nexec \"$@\"\n"
	require.NoError(t, os.WriteFile(filepath.Join(root, driverroot.LoaderPath), []byte(loader), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "usr/lib64/libnvidia-cfg.so.1"), nil, 0o644))
	require.NoError(t, os.Symlink(fakeDaemon, filepath.Join(root, "usr/bin/nvidia-persistenced")))
	return root
}

type fixture struct {
	root, runDir, control, argsFile string
	spec                            daemons.Spec
	logs                            *testutil.SyncBuffer
	log                             *slog.Logger
}

// newFixture returns a persistenced spec run from a fake subroot, with its run
// dir in a temp dir and the fake told its mode by a control file.
func newFixture(t testing.TB, mode string, edit ...func(*daemons.PersistencedOptions)) *fixture {
	t.Helper()
	requireRoot(t)
	f := &fixture{root: fakeSubroot(t), logs: &testutil.SyncBuffer{}}
	state := shortTempDir(t)
	f.runDir = filepath.Join(state, "run")
	f.control = filepath.Join(state, "mode")
	f.argsFile = filepath.Join(state, "args")
	require.NoError(t, os.WriteFile(f.control, []byte(mode), 0o644))
	o := daemons.DefaultPersistencedOptions(f.root)
	o.RunDir = f.runDir
	o.Env = []string{"FAKEDAEMON_RUN_DIR=" + f.runDir, "FAKEDAEMON_CONTROL=" + f.control, "FAKEDAEMON_ARGS=" + f.argsFile}
	for _, e := range edit {
		e(&o)
	}
	spec, err := daemons.Persistenced(o)
	require.NoError(t, err)
	f.spec = spec
	f.log = slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("supervisor log:\n%s", f.logs.String())
		}
	})
	return f
}

func (f *fixture) setMode(t testing.TB, mode string) {
	require.NoError(t, os.WriteFile(f.control, []byte(mode), 0o644))
}

// run starts a supervisor and returns it with a stop function that cancels it
// and returns Run's error.
func (f *fixture) run(t testing.TB, opts daemons.Options) (*daemons.Supervisor, func() error) {
	t.Helper()
	s := daemons.New(f.log, f.spec, opts)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- s.Run(ctx) }()
	var once sync.Once
	var err error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-errc:
			case <-time.After(15 * time.Second):
				err = fmt.Errorf("Run did not return 15 s after cancel")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return s, stop
}

func waitReady(t testing.TB, s *daemons.Supervisor) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, s.WaitReady(ctx))
}

// waitFor polls cond until it holds or 10 s pass.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

type netDialer struct{}

func (netDialer) dial(path string) (interface{ Close() error }, error) {
	return net.DialTimeout("unix", path, time.Second)
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }
