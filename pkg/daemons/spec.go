package daemons

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/talos-nvidia/nvidia-driver/pkg/atomicfile"
	"github.com/talos-nvidia/nvidia-driver/pkg/driverroot"
)

// Spec describes one daemon: how to start it and where its state lives.
type Spec struct {
	// Name is used in logs and errors.
	Name string
	// Path and Args are the command that starts the daemon. Unless Foreground is set, the
	// command forks a daemon and exits 0 once that daemon is ready (or non-zero if it failed).
	Path string
	Args []string
	// Env is the daemon's environment besides PATH (see environ); the supervisor's own is
	// not passed on.
	Env []string
	// Foreground: the command is the daemon itself and stays in the foreground. The
	// supervisor is then its parent: it reads its output into the log, collects its exit
	// status, and needs no pid file (PIDFile may be empty). It is ready when Socket answers.
	Foreground bool
	// RunDir is where the daemon keeps its pid file and socket. The supervisor
	// creates it before the first start (so that the daemon never removes it,
	// which keeps MirrorDir's bind mount valid) and, without a MirrorDir,
	// removes it on stop if it created it and it is empty.
	RunDir string
	// DaemonRunDir is where the daemon itself writes, compiled in, when that is not RunDir
	// for certain (nvidia-persistenced's /var/run/nvidia-persistenced): where it is another
	// directory, the daemon runs in a mount namespace of its own that shows RunDir there.
	DaemonRunDir string
	// PIDFile is the daemon's pid file. The daemon holds a POSIX (lockf) lock on it
	// while it lives; that lock, not the pid in it, tells a live daemon from a
	// stale file, because pids mean nothing across PID namespaces.
	PIDFile string
	// Socket is the daemon's UNIX stream socket. The daemon is ready when it accepts a connection.
	Socket string
	// MirrorDir, if set, is an existing empty directory onto which RunDir is
	// bind-mounted, so that the socket is visible there too (for example inside
	// the read-only driver root, where nvcdi looks). The mount outlives the
	// supervisor, which reuses it on its next run: containers' specs point at it.
	MirrorDir string
	// KeepSocket leaves a socket without a listener at Socket whenever no daemon holds it (the
	// supervisor's stop, a death), instead of removing the path: CDI specs name the socket,
	// and runc fails a container whose bind mount has no source ("failed to fulfil mount
	// request", seen on the H200 for a container created while the service restarted). The
	// daemon must unlink a stale socket before it binds, as nvidia-persistenced does
	// (nvidia-persistenced.c, setup_rpc).
	KeepSocket bool
	// Prepare, if set, runs before every start (the fabric manager writes its config file).
	Prepare func() error
	// Foreign, if set, runs before every start and returns a *ForeignDaemonError when a
	// daemon this supervisor did not start already does the job (seen, say, on a TCP port
	// in the host's network namespace): the supervisor then leaves it alone and gives up.
	Foreign func() error
	// NoRetry, if set, is shown a failed start's error (with the daemon's last output) and
	// returns why no restart can help, or "": the supervisor then gives up at once rather
	// than restart a daemon that can never run on this machine.
	NoRetry func(failure string) (reason string)
}

// daemonPath is the PATH a daemon gets. It runs from the subroot through its loader, by
// absolute paths, and needs no other variable: no LD_LIBRARY_PATH (the loader gets
// --library-path), no HOME, no locale.
const daemonPath = "PATH=/usr/sbin:/usr/bin:/sbin:/bin"

// environ is the whole environment of the daemon: PATH and Spec.Env. The service's own
// environment is not passed on: Talos fills it from the ExtensionServiceConfig document and
// the container spec, and whatever is there (LD_PRELOAD, LD_LIBRARY_PATH, GODEBUG, a
// proxy) would reach NVIDIA's daemons, which run as root with the GPUs open.
func (s Spec) environ() []string {
	return append([]string{daemonPath}, s.Env...)
}

// Validate reports every problem with the spec at once.
func (s Spec) Validate() error {
	var errs []error
	if s.Name == "" {
		errs = append(errs, errors.New("daemon spec: name is empty"))
	}
	paths := []struct{ name, val string }{{"path", s.Path}, {"run dir", s.RunDir}, {"socket", s.Socket}}
	if !s.Foreground || s.PIDFile != "" {
		paths = append(paths, struct{ name, val string }{"pid file", s.PIDFile})
	}
	for _, f := range paths {
		if !filepath.IsAbs(f.val) {
			errs = append(errs, fmt.Errorf("daemon spec %q: %s %q is not an absolute path", s.Name, f.name, f.val))
		}
	}
	if s.MirrorDir != "" && !filepath.IsAbs(s.MirrorDir) {
		errs = append(errs, fmt.Errorf("daemon spec %q: mirror dir %q is not an absolute path", s.Name, s.MirrorDir))
	}
	return errors.Join(errs...)
}

// CannotRunError says that a daemon failed in a way no restart can fix.
type CannotRunError struct {
	Name, Reason string
	Err          error
}

func (e *CannotRunError) Error() string {
	return fmt.Sprintf("%s cannot run on this machine: %s (%v)", e.Name, e.Reason, e.Err)
}

func (e *CannotRunError) Unwrap() error { return e.Err }

// NotRestartedError says that a daemon died after it was ready and, by Options.
// NoRestartAfterReady, was not started again.
type NotRestartedError struct {
	Name, Reason string
	Err          error
}

func (e *NotRestartedError) Error() string {
	return fmt.Sprintf("%v; not started again: %s", e.Err, e.Reason)
}

func (e *NotRestartedError) Unwrap() error { return e.Err }

// Run directories of the daemons (the subroot's paths are pkg/driverroot's).
const (
	// PersistencedRunDir is where nvidia-persistenced keeps its state: its compiled-in
	// /var/run/nvidia-persistenced (no flag changes it), which is this directory in the
	// services' root filesystems, whose /var/run links to /run. Spelt without the link: the
	// supervisor makes and opens run directories without following one
	// (driverroot.OpenRunDir).
	PersistencedRunDir = "/run/nvidia-persistenced"
	// FabricManagerRunDir is where we point nv-fabricmanager's state and sockets: the
	// directory NVIDIA's packaging uses (NVIDIA Fabric Manager User Guide, "Running Fabric
	// Manager as a Non-Root User": /var/run/nvidia-fabricmanager), without the link.
	FabricManagerRunDir = "/run/nvidia-fabricmanager"
)

// PersistencedOptions says how to run nvidia-persistenced from a subroot.
type PersistencedOptions struct {
	// DriverRoot is the subroot directory (its loader, libraries and binary are used).
	DriverRoot string
	// RunDir must be where the daemon really writes: PersistencedRunDir for NVIDIA's
	// daemon. Tests change it together with Env for a fake daemon that reads it.
	RunDir string
	// MirrorDir: see Spec.MirrorDir. Typically
	// /run/nvidia/driver/run/nvidia-persistenced, an empty directory the subroot ships.
	MirrorDir string
	// PersistenceMode is passed explicitly as --persistence-mode or --no-persistence-mode.
	PersistenceMode bool
	// UVMPersistenceMode is passed explicitly as --[no-]uvm-persistence-mode.
	UVMPersistenceMode bool
	// Verbose makes the daemon log at debug level (to syslog).
	Verbose bool
	// Env is extra environment for the daemon (tests).
	Env []string
}

// DefaultPersistencedOptions returns the options that the service uses unless configured otherwise.
func DefaultPersistencedOptions(driverRoot string) PersistencedOptions {
	return PersistencedOptions{DriverRoot: driverRoot, RunDir: PersistencedRunDir, PersistenceMode: true}
}

// Persistenced returns the spec of nvidia-persistenced run from a subroot with the
// subroot's own loader:
//
//	<root>/<driverroot.LoaderPath> --library-path <root>/usr/lib64 \
//	    <root>/usr/bin/nvidia-persistenced --nvidia-cfg-path <root>/usr/lib64 ...
//
// It checks that the files the daemon needs are there.
func Persistenced(o PersistencedOptions) (Spec, error) {
	if o.RunDir == "" {
		o.RunDir = PersistencedRunDir
	}
	if err := checkSubroot(o.DriverRoot, "usr/bin/nvidia-persistenced", "usr/lib64/libnvidia-cfg.so.1"); err != nil {
		return Spec{}, fmt.Errorf("nvidia-persistenced: %w", err)
	}
	libDir := filepath.Join(o.DriverRoot, driverroot.LibDir)
	args := []string{"--library-path", libDir, filepath.Join(o.DriverRoot, "usr/bin/nvidia-persistenced"),
		"--nvidia-cfg-path", libDir}
	if o.PersistenceMode {
		args = append(args, "--persistence-mode")
	} else {
		args = append(args, "--no-persistence-mode")
	}
	if o.UVMPersistenceMode {
		args = append(args, "--uvm-persistence-mode")
	} else {
		args = append(args, "--no-uvm-persistence-mode")
	}
	if o.Verbose {
		args = append(args, "--verbose")
	}
	s := Spec{
		Name:         "nvidia-persistenced",
		Path:         filepath.Join(o.DriverRoot, driverroot.LoaderPath),
		Args:         args,
		Env:          o.Env,
		RunDir:       o.RunDir,
		DaemonRunDir: "/var/run/nvidia-persistenced",
		PIDFile:      filepath.Join(o.RunDir, "nvidia-persistenced.pid"),
		Socket:       filepath.Join(o.RunDir, "socket"),
		MirrorDir:    o.MirrorDir,
		// Where the socket is mirrored under the driver root, CDI specs name it.
		// nvidia-persistenced.c setup_rpc: "(void)unlink(NVPD_SOCKET_PATH)" before it binds.
		KeepSocket: o.MirrorDir != "",
	}
	return s, s.Validate()
}

// FabricManagerOptions says how to run nv-fabricmanager from a subroot.
type FabricManagerOptions struct {
	DriverRoot string
	// RunDir holds the generated config, the state file and the sockets.
	RunDir string
	// Config is the config file to start from; default
	// <DriverRoot>/usr/share/nvidia/nvswitch/fabricmanager.cfg, where NVIDIA's archive
	// puts it (NVIDIA Fabric Manager User Guide, "Fabric Manager Startup Options").
	Config string
	// MirrorDir: see Spec.MirrorDir (/run/nvidia/driver/run/nvidia-fabricmanager).
	MirrorDir string
	// KeepCUDAJobsOnExit writes ABORT_CUDA_JOBS_ON_FM_EXIT=0, so that an exit of the fabric
	// manager does not abort the running CUDA jobs. NVIDIA ships 1; the key acts on NVSwitch
	// gen 2 boards (HGX A100), where a fabric manager may then be started again (NVIDIA Fabric
	// Manager User Guide, "CUDA Jobs Behavior When the Fabric Manager Service is Stopped or
	// Terminated").
	KeepCUDAJobsOnExit bool
	Env                []string
}

// FabricManagerConfig is the subroot's config file, relative to the subroot.
const FabricManagerConfig = "usr/share/nvidia/nvswitch/fabricmanager.cfg"

// FabricManager returns the spec of nv-fabricmanager run from a subroot in the foreground.
// Before each start it writes <RunDir>/fabricmanager.cfg: the subroot's config with the
// keys that must point at writable or subroot paths overridden. Like siderolabs'
// nvidia-fabricmanager extension (nvidia-gpu/nvidia-fabricmanager/pkg.yaml), it runs with
// DAEMONIZE=0, logs to stderr (an empty LOG_FILE_NAME), and keeps its state file under
// /var/run; unlike it, both of its sockets are UNIX sockets in RunDir, so it listens on no
// TCP port of the host's network namespace: the API socket FM_CMD_UNIX_SOCKET_PATH at
// <RunDir>/socket, where nvcdi (internal/discover/ipc.go) and libnvidia-container look for
// /run/nvidia-fabricmanager/socket, and its internal GFM/LFM channel UNIX_SOCKET_PATH.
//
// Before a start it checks the FM API TCP address of the subroot's config (default
// 127.0.0.1:6666, the port a fabric manager run as NVIDIA ships it listens on, as
// siderolabs' extension does): an answer there is a fabric manager this service did not
// start, which it leaves alone. NV_WARN_NOTHING_TO_DO and an invalid config end the
// supervision at once: no restart can change them.
func FabricManager(o FabricManagerOptions) (Spec, error) {
	if o.RunDir == "" {
		o.RunDir = FabricManagerRunDir
	}
	if o.Config == "" {
		o.Config = filepath.Join(o.DriverRoot, FabricManagerConfig)
	}
	if err := checkSubroot(o.DriverRoot, "usr/bin/nv-fabricmanager"); err != nil {
		return Spec{}, fmt.Errorf("nv-fabricmanager: %w", err)
	}
	shipped, err := os.ReadFile(o.Config)
	if err != nil {
		return Spec{}, fmt.Errorf("nv-fabricmanager: config file: %w", err)
	}
	cfg := filepath.Join(o.RunDir, "fabricmanager.cfg")
	nvswitchDir := filepath.Join(o.DriverRoot, "usr/share/nvidia/nvswitch")
	overrides := map[string]string{
		"DAEMONIZE":               "0",
		"LOG_FILE_NAME":           "",
		"LOG_USE_SYSLOG":          "0",
		"STATE_FILE_NAME":         filepath.Join(o.RunDir, "fabricmanager.state"),
		"FM_CMD_UNIX_SOCKET_PATH": filepath.Join(o.RunDir, "socket"),
		"UNIX_SOCKET_PATH":        filepath.Join(o.RunDir, "internal.socket"),
		"DATABASE_PATH":           nvswitchDir,
		"TOPOLOGY_FILE_PATH":      nvswitchDir,
	}
	if o.KeepCUDAJobsOnExit {
		overrides["ABORT_CUDA_JOBS_ON_FM_EXIT"] = "0"
	}
	apiAddr := fabricManagerAPIAddr(shipped)
	s := Spec{
		Name: "nv-fabricmanager",
		Path: filepath.Join(o.DriverRoot, driverroot.LoaderPath),
		Args: []string{"--library-path", filepath.Join(o.DriverRoot, driverroot.LibDir),
			filepath.Join(o.DriverRoot, "usr/bin/nv-fabricmanager"), "-c", cfg},
		Env:        o.Env,
		Foreground: true,
		RunDir:     o.RunDir,
		Socket:     filepath.Join(o.RunDir, "socket"),
		MirrorDir:  o.MirrorDir,
		Prepare: func() error {
			_, err := atomicfile.Write(cfg, RewriteConfig(shipped, overrides), 0o644)
			return err
		},
		Foreign: func() error {
			c, err := net.DialTimeout("tcp", apiAddr, 200*time.Millisecond)
			if err != nil {
				return nil
			}
			_ = c.Close()
			return &ForeignDaemonError{Name: "nv-fabricmanager",
				Evidence: fmt.Sprintf("%s, the fabric manager's API address (FM_CMD_BIND_INTERFACE, FM_CMD_PORT_NUMBER in %s), accepts connections", apiAddr, o.Config)}
		},
		NoRetry: fabricManagerNoRetry,
	}
	return s, s.Validate()
}

// fabricManagerAPIAddr is the TCP address a fabric manager with the shipped config listens
// on for its API: FM_CMD_BIND_INTERFACE and FM_CMD_PORT_NUMBER, defaults 127.0.0.1 and 6666
// (NVIDIA Fabric Manager User Guide, config options).
func fabricManagerAPIAddr(cfg []byte) string {
	host, port := "127.0.0.1", "6666"
	for _, line := range configLines(cfg) {
		k, v, ok := strings.Cut(strings.TrimSpace(string(line)), "=")
		switch {
		case !ok || strings.HasPrefix(k, "#") || strings.TrimSpace(v) == "":
		case k == "FM_CMD_BIND_INTERFACE":
			host = strings.TrimSpace(v)
		case k == "FM_CMD_PORT_NUMBER":
			port = strings.TrimSpace(v)
		}
	}
	return net.JoinHostPort(host, port)
}

// fabricManagerNoRetry recognizes the failures of nv-fabricmanager that a restart repeats.
func fabricManagerNoRetry(failure string) string {
	switch {
	case strings.Contains(failure, "NV_WARN_NOTHING_TO_DO"):
		// "request to query NVSwitch device information from NVSwitch driver failed with
		// error:WARNING Nothing to do [NV_WARN_NOTHING_TO_DO]", exit status 1
		// (NVIDIA/gpu-operator#610, siderolabs/talos#14015).
		return "the NVSwitch driver has nothing for it to manage (NV_WARN_NOTHING_TO_DO): the GPUs are passed through " +
			"to a VM without the board's NVSwitch topology, or the board needs NVLSM (NVLink 5)"
	case strings.Contains(failure, "has an invalid value"):
		// "fabric manager config file item: FABRIC_NODE_CONFIG_FILE has an invalid value"
		// (siderolabs/extensions#511).
		return "its configuration file has an invalid value"
	}
	return ""
}

// configLines splits a config file into its lines, whatever their length (a bufio.Scanner
// stops at 64 KiB and would drop the rest of the file); a last line without a newline
// counts, an empty remainder after the last newline does not.
func configLines(in []byte) [][]byte {
	lines := bytes.Split(in, []byte("\n"))
	if len(lines) > 0 && len(lines[len(lines)-1]) == 0 {
		lines = lines[:len(lines)-1]
	}
	return lines
}

// RewriteConfig sets KEY=value lines of a fabricmanager.cfg-style file: existing keys
// are replaced in place, missing ones appended in sorted order. Every other line, of any
// length, is kept as it is.
func RewriteConfig(in []byte, set map[string]string) []byte {
	var out bytes.Buffer
	seen := map[string]bool{}
	for _, b := range configLines(in) {
		line := string(b)
		key, _, ok := strings.Cut(line, "=")
		key = strings.TrimSpace(key)
		if v, want := set[key]; ok && want && !strings.HasPrefix(key, "#") {
			line = key + "=" + v
			seen[key] = true
		}
		out.WriteString(line + "\n")
	}
	keys := make([]string, 0, len(set))
	for k := range set {
		if !seen[k] {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		out.WriteString(k + "=" + set[k] + "\n")
	}
	return out.Bytes()
}

func checkSubroot(root string, files ...string) error {
	if !filepath.IsAbs(root) {
		return fmt.Errorf("driver root %q is not an absolute path", root)
	}
	var errs []error
	for _, f := range append([]string{driverroot.LoaderPath}, files...) {
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			errs = append(errs, fmt.Errorf("subroot %s lacks %s: %w", root, f, err))
		}
	}
	return errors.Join(errs...)
}
