// Command persistenced-e2e runs the real nvidia-persistenced from a subroot
// under the daemons supervisor, on a GPU host, and measures it: time to ready,
// kill -9 to ready again, clean stop. It never changes the GPU's state: the
// daemon always runs with --no-persistence-mode and --no-uvm-persistence-mode
// (no flag changes that), and nothing here touches MIG or resets a GPU.
//
// It refuses to run outside a private mount namespace with its own /run (use
// hack/gpu-host/e2e-persistenced.sh, which sets that up): the daemon's state then lives
// on a private tmpfs and the host's own daemon, if any, is not disturbed.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/talos-nvidia/nvidia-driver/pkg/daemons"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	subroot := flag.String("subroot", "", "glibc subroot with usr/bin/nvidia-persistenced (required)")
	kills := flag.Int("kills", 5, "how many times to kill -9 the daemon")
	verbose := flag.Bool("verbose", true, "run the daemon with --verbose and log at debug level")
	grace := flag.Duration("stop-grace", 5*time.Second, "SIGTERM grace before SIGKILL on stop")
	flag.Parse()
	if *subroot == "" || !filepath.IsAbs(*subroot) {
		return errors.New("--subroot must be an absolute path")
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	if err := checkPrivateNamespace(); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// The daemon logs to syslog only: catch /dev/log in this namespace.
	syslogLines := &counter{}
	sinkLog := slog.New(&countingHandler{Handler: log.Handler(), n: syslogLines})
	// Its own context: it must outlive the daemon to catch its last lines.
	sinkCtx, stopSink := context.WithCancel(context.Background())
	defer stopSink()
	sinkDone, sinkWhere := captureDevLog(sinkCtx, log, sinkLog)

	o := daemons.DefaultPersistencedOptions(*subroot)
	o.PersistenceMode = false // never change the host's persistence mode
	o.UVMPersistenceMode = false
	o.Verbose = *verbose
	mirrorCheck := setupDriverRoot(log, *subroot)
	if mirrorCheck != "" {
		o.MirrorDir = filepath.Dir(mirrorCheck)
	}
	spec, err := daemons.Persistenced(o)
	if err != nil {
		return err
	}
	for _, a := range spec.Args {
		if a == "--persistence-mode" || a == "--uvm-persistence-mode" {
			return fmt.Errorf("refusing to run with %s", a)
		}
	}
	sup := daemons.New(log, spec, daemons.Options{StopGrace: *grace, StableAfter: time.Nanosecond})
	runErr := make(chan error, 1)
	t0 := time.Now()
	go func() { runErr <- sup.Run(ctx) }()

	readyCtx, readyCancel := context.WithTimeout(ctx, 90*time.Second)
	err = sup.WaitReady(readyCtx)
	readyCancel()
	if err != nil {
		return fmt.Errorf("first start: %w", err)
	}
	firstReady := time.Since(t0)
	var failures []string
	check := func(ok bool, format string, args ...any) {
		if !ok {
			failures = append(failures, fmt.Sprintf(format, args...))
		}
	}
	check(answers(spec.Socket), "socket %s does not answer", spec.Socket)
	if mirrorCheck != "" {
		check(answers(mirrorCheck), "socket does not answer in the driver root at %s", mirrorCheck)
	}

	var lat []time.Duration
	for i := range *kills {
		pid := sup.Status().PID
		start := time.Now()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			return fmt.Errorf("kill -9 %d: %w", pid, err)
		}
		deadline := start.Add(60 * time.Second)
		for {
			st := sup.Status()
			if st.Restarts == i+1 && st.State == daemons.StateReady {
				break
			}
			if st.State == daemons.StateFailed || time.Now().After(deadline) {
				return fmt.Errorf("no restart after kill %d: state %s, last error %q", i+1, st.State, st.LastError)
			}
			time.Sleep(100 * time.Microsecond)
		}
		lat = append(lat, time.Since(start))
		check(answers(spec.Socket), "socket does not answer after restart %d", i+1)
		fmt.Printf("kill %d: pid %d -> pid %d ready in %s\n", i+1, pid, sup.Status().PID, lat[i].Round(10*time.Microsecond))
	}

	lastPID := sup.Status().PID
	stopStart := time.Now()
	cancel()
	if err := <-runErr; err != nil {
		return fmt.Errorf("stop: %w", err)
	}
	stopTook := time.Since(stopStart)
	check(sup.Status().State == daemons.StateStopped, "state after stop is %s", sup.Status().State)
	check(syscall.Kill(lastPID, 0) != nil, "daemon pid %d still exists after stop", lastPID)
	_, err = os.Lstat(spec.PIDFile)
	check(errors.Is(err, os.ErrNotExist), "%s left after stop", spec.PIDFile)
	// The supervisor keeps the socket's path (Spec.KeepSocket: CDI specs bind it), with no
	// listener once the daemon is gone.
	if spec.KeepSocket {
		fi, err := os.Lstat(spec.Socket)
		check(err == nil && fi.Mode()&os.ModeSocket != 0, "%s not kept after stop (%v)", spec.Socket, err)
		check(!answers(spec.Socket), "%s still answers after stop", spec.Socket)
	} else {
		_, err := os.Lstat(spec.Socket)
		check(errors.Is(err, os.ErrNotExist), "%s left after stop", spec.Socket)
	}
	check(stopTook < 8*time.Second, "stop took %s (Talos kills at 10 s)", stopTook)
	time.Sleep(200 * time.Millisecond) // let the daemon's last datagrams in
	stopSink()
	<-sinkDone

	fmt.Println("---- summary ----")
	fmt.Printf("daemon:            %s\n", strings.Join(append([]string{spec.Path}, spec.Args...), " "))
	fmt.Printf("first ready:       %s\n", firstReady.Round(time.Millisecond))
	if len(lat) > 0 {
		s := slices.Clone(lat)
		slices.Sort(s)
		fmt.Printf("kill -9 to ready:  min %s  p50 %s  max %s  (%d kills; includes the supervisor's 500 ms RestartDelay)\n",
			s[0].Round(time.Millisecond), s[len(s)/2].Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond), len(s))
	}
	fmt.Printf("clean stop:        %s\n", stopTook.Round(time.Millisecond))
	fmt.Printf("syslog lines:      %d captured via %s\n", syslogLines.n, sinkWhere)
	if mirrorCheck != "" {
		fmt.Printf("driver root:       socket answered at %s\n", mirrorCheck)
	}
	if len(failures) > 0 {
		for _, f := range failures {
			fmt.Println("FAIL:", f)
		}
		return fmt.Errorf("%d checks failed", len(failures))
	}
	fmt.Println("PASS")
	return nil
}

// checkPrivateNamespace refuses to run in the host's mount namespace or with
// any shared mount (which would leak our mounts to the host), and wants /run on
// its own tmpfs.
func checkPrivateNamespace() error {
	// The script records its own namespace and /run before unshare.
	outerNS, outerRun := os.Getenv("PERSISTENCED_E2E_OUTER_MNTNS"), os.Getenv("PERSISTENCED_E2E_OUTER_RUN_DEV")
	if outerNS == "" || outerRun == "" {
		return errors.New("run me through hack/gpu-host/e2e-persistenced.sh (it makes a private mount namespace and /run)")
	}
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil || self == outerNS {
		return errors.New("not in a private mount namespace: run me through hack/gpu-host/e2e-persistenced.sh")
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return fmt.Errorf("read mountinfo: %w", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		sep := slices.Index(f, "-")
		if len(f) < 7 || sep < 6 {
			continue
		}
		if slices.ContainsFunc(f[6:sep], func(s string) bool { return strings.HasPrefix(s, "shared:") }) {
			return fmt.Errorf("mount %s is shared with other namespaces: run `mount --make-rprivate /` first", f[4])
		}
	}
	// /run must be our own file system, not the host's.
	var st unix.Stat_t
	if err := unix.Stat("/run", &st); err != nil {
		return fmt.Errorf("stat /run: %w", err)
	}
	if strconv.FormatUint(st.Dev, 10) == outerRun {
		return errors.New("/run is the host's: mount a private tmpfs on /run first")
	}
	return nil
}

// captureDevLog listens where the daemon's syslog(3) writes (/dev/log, or where
// it links to), inside this private namespace only.
func captureDevLog(ctx context.Context, log, sinkLog *slog.Logger) (done <-chan struct{}, where string) {
	ch := make(chan struct{})
	const devLog = "/dev/log"
	listen := func(path string) (*daemons.SyslogSink, error) {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return nil, err
		}
		return daemons.ListenSyslog(sinkLog, path)
	}
	var sink *daemons.SyslogSink
	var err error
	fi, lerr := os.Lstat(devLog)
	switch {
	case lerr != nil:
		err = fmt.Errorf("%s does not exist and must not be created on the host's /dev", devLog)
	case fi.Mode().Type() == os.ModeSymlink:
		dest, _ := os.Readlink(devLog)
		if !filepath.IsAbs(dest) {
			dest = filepath.Join("/dev", dest)
		}
		if !strings.HasPrefix(dest, "/run/") && !strings.HasPrefix(dest, "/var/run/") {
			err = fmt.Errorf("%s links to %s, outside our private /run", devLog, dest)
			break
		}
		sink, err = listen(dest)
		where = devLog + " -> " + dest
	default:
		// Bind our socket over the host's: the bind exists in this namespace only.
		own := "/run/persistenced-e2e/log"
		if sink, err = listen(own); err == nil {
			if err = unix.Mount(own, devLog, "", unix.MS_BIND, ""); err != nil {
				err = fmt.Errorf("bind %s over %s: %w", own, devLog, err)
			}
		}
		where = devLog + " (bind of " + own + ")"
	}
	if err != nil {
		log.Warn("daemon syslog lines will not be shown", "error", err)
		close(ch)
		return ch, "nothing (" + err.Error() + ")"
	}
	go func() {
		defer close(ch)
		if err := sink.Serve(ctx); err != nil {
			log.Warn("syslog sink", "error", err)
		}
	}()
	return ch, where
}

// setupDriverRoot mounts the subroot read-only at /run/nvidia/driver (on our
// private /run) like the service does, if the subroot ships
// run/nvidia-persistenced, and returns where the socket should then appear.
func setupDriverRoot(log *slog.Logger, subroot string) string {
	if fi, err := os.Stat(filepath.Join(subroot, "run/nvidia-persistenced")); err != nil || !fi.IsDir() {
		log.Warn("subroot has no run/nvidia-persistenced dir; skipping the driver root socket check")
		return ""
	}
	target := "/run/nvidia/driver"
	if err := os.MkdirAll(target, 0o755); err != nil {
		log.Warn("skipping the driver root socket check", "error", err)
		return ""
	}
	if err := unix.Mount(subroot, target, "", unix.MS_BIND, ""); err != nil {
		log.Warn("skipping the driver root socket check", "error", err)
		return ""
	}
	if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		log.Warn("driver root stays read-write", "error", err)
	}
	return filepath.Join(target, "run/nvidia-persistenced/socket")
}

func answers(path string) bool {
	c, err := net.DialTimeout("unix", path, 2*time.Second)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

type counter struct{ n int }

// countingHandler counts the syslog lines it forwards.
type countingHandler struct {
	slog.Handler
	n *counter
}

func (h *countingHandler) Handle(ctx context.Context, r slog.Record) error {
	h.n.n++
	return h.Handler.Handle(ctx, r)
}
