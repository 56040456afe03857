// Command fakedaemon daemonizes the way nvidia-persistenced does, so that the
// supervisor can be tested without a GPU: the parent re-executes itself as a
// child in a new session, the child creates its run directory, locks its pid
// file with lockf, listens on a UNIX socket, then tells the parent (through a
// pipe) that it is ready, and the parent exits 0. If the child dies before
// that, the parent exits 1.
//
// It accepts nvidia-persistenced's flags. Given nv-fabricmanager's -c CONFIG instead, it
// acts as the fabric manager run with DAEMONIZE=0 (see fabricManager below).
//
// Behaviour is set by environment (the real daemon's command line has no room for it):
//
//	FAKEDAEMON_RUN_DIR  run directory (default /var/run/nvidia-persistenced)
//	FAKEDAEMON_MODE     ok | fail | never-ready | hang-term | crash-after=DURATION, and for the
//	                    fabric manager also nothing-to-do | late-nothing-to-do (after its
//	                    socket answered) | bad-config | hang (never listens)
//	FAKEDAEMON_CONTROL  file whose content, when present, overrides FAKEDAEMON_MODE at each start
//	FAKEDAEMON_SYSLOG   datagram socket to send syslog lines to (the real daemon uses /dev/log)
//	FAKEDAEMON_ARGS     file the parent appends its command line to (one line per start)
//	FAKEDAEMON_ENV      file the parent writes its environment to, one variable a line
//	FAKEDAEMON_DEV      the fabric manager's /dev: it fails, as the real one does, unless the
//	                    NVSwitch and NVLink nodes it opens are character devices there
//
// The supervisor gives daemons a minimal environment of its own, not its caller's, so a test
// that cannot set the daemon's Env puts these settings, KEY=VALUE lines, in a file named as
// the binary with ".env" added (say usr/bin/nvidia-persistenced.env in a fake subroot).
package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const childEnv = "FAKEDAEMON_CHILD"

func main() {
	if err := loadEnvFile(); err != nil {
		fmt.Fprintf(os.Stderr, "fakedaemon: %v\n", err)
		os.Exit(2)
	}
	if len(os.Args) == 3 && (os.Args[1] == "-c" || os.Args[1] == "--config") {
		os.Exit(fabricManager(os.Args[2]))
	}
	if err := parseFlags(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "fakedaemon: %v\n", err)
		os.Exit(2)
	}
	if os.Getenv(childEnv) == "1" {
		os.Exit(child())
	}
	os.Exit(parent())
}

// parseFlags accepts exactly the flags of nvidia-persistenced that the supervisor may pass.
func parseFlags(args []string) error {
	for i := 0; i < len(args); i++ {
		switch args[i] {
		case "--verbose", "-V", "--persistence-mode", "--no-persistence-mode",
			"--uvm-persistence-mode", "--no-uvm-persistence-mode":
		case "--nvidia-cfg-path", "--user", "-u":
			if i+1 >= len(args) {
				return fmt.Errorf("flag %s needs a value", args[i])
			}
			i++
		default:
			return fmt.Errorf("unknown argument %q", args[i])
		}
	}
	return nil
}

func parent() int {
	recordArgs()
	r, w, err := os.Pipe()
	if err != nil {
		fmt.Fprintf(os.Stderr, "fakedaemon: pipe: %v\n", err)
		return 1
	}
	// Run by a subroot's loader, the executable is the loader: argv[0] names the program.
	self := os.Args[0]
	if !filepath.IsAbs(self) {
		if self, err = os.Executable(); err != nil {
			fmt.Fprintf(os.Stderr, "fakedaemon: %v\n", err)
			return 1
		}
	}
	cmd := exec.Command(self, os.Args[1:]...)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	cmd.ExtraFiles = []*os.File{w} // fd 3 in the child
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "fakedaemon: fork: %v\n", err)
		return 1
	}
	_ = w.Close()
	// Like the real daemon, never wait for the child: it is a daemon.
	_ = cmd.Process.Release()
	buf := make([]byte, 1)
	n, _ := r.Read(buf)
	if n != 1 || buf[0] != 1 {
		fmt.Fprintln(os.Stderr, "fakedaemon failed to initialize. Check syslog for more details.")
		return 1
	}
	return 0
}

type daemon struct {
	runDir, pidFile, socket string
	createdDir              bool
	syslog                  net.Conn
}

func (d *daemon) logf(prio int, format string, args ...any) {
	if d.syslog == nil {
		return
	}
	// The local (RFC 3164 without host name) format that glibc's syslog(3) writes.
	msg := fmt.Sprintf("<%d>%s nvidia-persistenced[%d]: %s", 3<<3|prio,
		time.Now().Format(time.Stamp), os.Getpid(), fmt.Sprintf(format, args...))
	_, _ = d.syslog.Write([]byte(msg))
}

func mode() string {
	if p := os.Getenv("FAKEDAEMON_CONTROL"); p != "" {
		if b, err := os.ReadFile(p); err == nil {
			return strings.TrimSpace(string(b))
		}
	}
	if m := os.Getenv("FAKEDAEMON_MODE"); m != "" {
		return m
	}
	return "ok"
}

func child() int {
	ready := os.NewFile(3, "ready")
	d := &daemon{runDir: os.Getenv("FAKEDAEMON_RUN_DIR")}
	if d.runDir == "" {
		d.runDir = "/var/run/nvidia-persistenced"
	}
	d.pidFile = filepath.Join(d.runDir, "nvidia-persistenced.pid")
	d.socket = filepath.Join(d.runDir, "socket")
	if p := os.Getenv("FAKEDAEMON_SYSLOG"); p != "" {
		if c, err := net.Dial("unixgram", p); err == nil {
			d.syslog = c
		}
	}
	m := mode()

	if err := os.Mkdir(d.runDir, 0o755); err == nil {
		d.createdDir = true
	} else if !errors.Is(err, os.ErrExist) {
		d.logf(4, "Failed to create directory %s: %v", d.runDir, err)
	}
	fd, err := unix.Open(d.pidFile, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
	if err != nil {
		d.logf(3, "Failed to open PID file: %v", err)
		return 1
	}
	// lockf(fd, F_TLOCK, 0) is a POSIX write lock on the whole file.
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: 0, Len: 0}
	if err := unix.FcntlFlock(uintptr(fd), unix.F_SETLK, &lk); err != nil {
		d.logf(3, "Failed to lock PID file: %v", err)
		return 1
	}
	_ = unix.Ftruncate(fd, 0)
	_, _ = unix.Write(fd, []byte(fmt.Sprintf("%d\n", os.Getpid())))
	d.logf(5, "Started (%d)", os.Getpid())

	if m == "fail" {
		d.logf(3, "Failed to query NVIDIA devices")
		d.shutdown()
		return 1
	}
	if m == "never-ready" {
		for { // the parent waits forever, like a daemon stuck in its init
			time.Sleep(time.Hour)
		}
	}

	_ = os.Remove(d.socket)
	l, err := net.Listen("unix", d.socket)
	if err != nil {
		d.logf(3, "Failed to create socket: %v", err)
		d.shutdown()
		return 1
	}
	go acceptAndClose(l)

	sigs := make(chan os.Signal, 1)
	if m == "hang-term" {
		signal.Ignore(syscall.SIGTERM, syscall.SIGINT)
	} else {
		signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	}
	var crash <-chan time.Time
	if dur, ok := strings.CutPrefix(m, "crash-after="); ok {
		dd, err := time.ParseDuration(dur)
		if err != nil {
			d.logf(3, "bad crash-after duration %q", dur)
			return 1
		}
		crash = time.After(dd)
	}

	_, _ = ready.Write([]byte{1})
	_ = ready.Close()

	select {
	case <-sigs:
		_ = l.Close()
		d.shutdown()
		return 0
	case <-crash:
		d.logf(2, "crashing as told")
		return 3 // no clean-up: leaves a stale pid file and socket
	}
}

func (d *daemon) shutdown() {
	_ = os.Remove(d.socket)
	_ = os.Remove(d.pidFile)
	if d.createdDir {
		_ = os.Remove(d.runDir)
	}
	d.logf(5, "Shutdown (%d)", os.Getpid())
}

// fabricManager acts as nv-fabricmanager with DAEMONIZE=0: it reads its config file
// (KEY=VALUE lines), logs to stderr, checks the device nodes it would open, listens on
// FM_CMD_UNIX_SOCKET_PATH and runs until SIGTERM. Its failure lines are the real daemon's
// (NVIDIA/gpu-operator#610, siderolabs/extensions#511); both exit 1.
func fabricManager(config string) int {
	recordArgs()
	cfg, err := readConfig(config)
	if err != nil {
		fmt.Fprintf(os.Stderr, "failed to open config file %s: %v\n", config, err)
		return 1
	}
	if cfg["DAEMONIZE"] != "0" {
		fmt.Fprintf(os.Stderr, "fakedaemon: only DAEMONIZE=0 is simulated, got %q\n", cfg["DAEMONIZE"])
		return 2
	}
	fmt.Fprintf(os.Stderr, "Fabric Manager version 580.159.04 is running with the following configuration options\n")
	if mode() == "long-line" {
		// One line longer than a bufio.Scanner's default limit (64 KiB), then on as "ok".
		fmt.Fprintln(os.Stderr, "topology: "+strings.Repeat("x", 100<<10))
	}
	switch m := mode(); {
	case m == "nothing-to-do":
		fmt.Fprintln(os.Stderr, "request to query NVSwitch device information from NVSwitch driver failed with error:WARNING Nothing to do [NV_WARN_NOTHING_TO_DO]")
		return 1
	case m == "bad-config":
		fmt.Fprintln(os.Stderr, "fabric manager config file item: FABRIC_NODE_CONFIG_FILE has an invalid value")
		return 1
	case m == "fail":
		fmt.Fprintln(os.Stderr, "failed to initialize the fabric: an unexpected error")
		return 1
	}
	if mode() == "hang" {
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
		<-sigs
		return 0
	}
	if dev := os.Getenv("FAKEDAEMON_DEV"); dev != "" {
		for _, n := range []string{"nvidia-nvswitchctl", "nvidia-nvswitch0", "nvidia-nvlink", "nvidiactl"} {
			var st unix.Stat_t
			if err := unix.Stat(filepath.Join(dev, n), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR {
				fmt.Fprintf(os.Stderr, "failed to open NVSwitch device /dev/%s: %v\n", n, err)
				return 1
			}
		}
	}
	// Handle SIGTERM before the socket tells anyone that we are up.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	sock := cfg["FM_CMD_UNIX_SOCKET_PATH"]
	if sock == "" {
		fmt.Fprintln(os.Stderr, "fakedaemon: FM_CMD_UNIX_SOCKET_PATH is empty; the fake listens only on a UNIX socket")
		return 2
	}
	_ = os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		fmt.Fprintf(os.Stderr, "failed to bind the fabric manager API socket: %v\n", err)
		return 1
	}
	go acceptAndClose(l)
	if p := cfg["STATE_FILE_NAME"]; p != "" {
		_ = os.WriteFile(p, []byte("fake fabric state\n"), 0o644)
	}
	fmt.Fprintln(os.Stderr, "Successfully configured all the available NVSwitches to route GPU NVLink traffic.")

	var crash <-chan time.Time
	if dur, ok := strings.CutPrefix(mode(), "crash-after="); ok {
		if d, err := time.ParseDuration(dur); err == nil {
			crash = time.After(d)
		}
	}
	var late <-chan time.Time
	if mode() == "late-nothing-to-do" {
		late = time.After(100 * time.Millisecond)
	}
	select {
	case <-sigs:
		_ = l.Close()
		fmt.Fprintln(os.Stderr, "Fabric Manager is exiting")
		return 0
	case <-crash:
		fmt.Fprintln(os.Stderr, "crashing as told")
		return 3 // leaves its socket behind
	case <-late:
		fmt.Fprintln(os.Stderr, "request to query NVSwitch device information from NVSwitch driver failed with error:WARNING Nothing to do [NV_WARN_NOTHING_TO_DO]")
		return 1
	}
}

func readConfig(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	cfg := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok && !strings.HasPrefix(k, "#") {
			cfg[k] = v
		}
	}
	return cfg, nil
}

func recordArgs() {
	if p := os.Getenv("FAKEDAEMON_ENV"); p != "" {
		_ = os.WriteFile(p, []byte(strings.Join(os.Environ(), "\n")+"\n"), 0o644)
	}
	if p := os.Getenv("FAKEDAEMON_ARGS"); p != "" {
		if f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644); err == nil {
			fmt.Fprintln(f, strings.Join(os.Args, " "))
			_ = f.Close()
		}
	}
}

// acceptAndClose answers every connection by closing it: enough for a client that only checks
// that the socket is served.
func acceptAndClose(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		_ = c.Close()
	}
}

// loadEnvFile sets the variables of <argv[0]>.env that the environment does not set.
func loadEnvFile() error {
	data, err := os.ReadFile(os.Args[0] + ".env")
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), "=")
		if !ok {
			continue
		}
		if _, set := os.LookupEnv(k); !set {
			if err := os.Setenv(k, v); err != nil {
				return err
			}
		}
	}
	return nil
}
