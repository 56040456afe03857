package daemons

import (
	"github.com/talos-nvidia/nvidia-driver/pkg/atomicfile"

	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Spec describes one daemonizing daemon: how to start it and where its state lives.
type Spec struct {
	// Name is used in logs and errors.
	Name string
	// Path and Args are the command that starts the daemon; the command forks a
	// daemon and exits 0 once that daemon is ready (or non-zero if it failed).
	Path string
	Args []string
	// Env is appended to the supervisor's environment.
	Env []string
	// RunDir is where the daemon keeps its pid file and socket. The supervisor
	// creates it before the first start (so that the daemon never removes it,
	// which keeps MirrorDir's bind mount valid) and, without a MirrorDir,
	// removes it on stop if it created it and it is empty.
	RunDir string
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
	// Prepare, if set, runs before every start (the fabric manager writes its config file).
	Prepare func() error
}

// Validate reports every problem with the spec at once.
func (s Spec) Validate() error {
	var errs []error
	if s.Name == "" {
		errs = append(errs, errors.New("daemon spec: name is empty"))
	}
	for _, f := range []struct{ name, val string }{
		{"path", s.Path}, {"run dir", s.RunDir}, {"pid file", s.PIDFile}, {"socket", s.Socket},
	} {
		if !filepath.IsAbs(f.val) {
			errs = append(errs, fmt.Errorf("daemon spec %q: %s %q is not an absolute path", s.Name, f.name, f.val))
		}
	}
	if s.MirrorDir != "" && !filepath.IsAbs(s.MirrorDir) {
		errs = append(errs, fmt.Errorf("daemon spec %q: mirror dir %q is not an absolute path", s.Name, s.MirrorDir))
	}
	return errors.Join(errs...)
}

// Paths inside a glibc subroot (see DESIGN.md §4, "the subroot").
const (
	subrootLoader = "lib64/ld-linux-x86-64.so.2"
	subrootLibDir = "usr/lib64"

	// PersistencedRunDir is where nvidia-persistenced keeps its state; the path is
	// compiled into the daemon and no flag changes it.
	PersistencedRunDir = "/var/run/nvidia-persistenced"
	// FabricManagerRunDir is where we point nv-fabricmanager's pid file, state and socket.
	FabricManagerRunDir = "/var/run/nvidia-fabricmanager"
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
//	<root>/lib64/ld-linux-x86-64.so.2 --library-path <root>/usr/lib64 \
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
	libDir := filepath.Join(o.DriverRoot, subrootLibDir)
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
		Name:      "nvidia-persistenced",
		Path:      filepath.Join(o.DriverRoot, subrootLoader),
		Args:      args,
		Env:       o.Env,
		RunDir:    o.RunDir,
		PIDFile:   filepath.Join(o.RunDir, "nvidia-persistenced.pid"),
		Socket:    filepath.Join(o.RunDir, "socket"),
		MirrorDir: o.MirrorDir,
	}
	return s, s.Validate()
}

// FabricManagerOptions says how to run nv-fabricmanager from a subroot.
type FabricManagerOptions struct {
	DriverRoot string
	// RunDir holds the generated config, pid file, state file, log file and socket.
	RunDir string
	// Config is the config file to start from; default
	// <DriverRoot>/usr/share/nvidia/nvswitch/fabricmanager.cfg.
	Config string
	// MirrorDir: see Spec.MirrorDir (/run/nvidia/driver/run/nvidia-fabricmanager).
	MirrorDir string
	Env       []string
}

// FabricManager returns the spec of nv-fabricmanager run from a subroot. Before each
// start it writes <RunDir>/fabricmanager.cfg: the subroot's config with the keys that
// must point at writable or subroot paths overridden (daemonize, syslog logging, the
// pid/state/log files in RunDir, the API socket at <RunDir>/socket where nvcdi looks,
// and the topology and database directories in the subroot).
func FabricManager(o FabricManagerOptions) (Spec, error) {
	if o.RunDir == "" {
		o.RunDir = FabricManagerRunDir
	}
	if o.Config == "" {
		o.Config = filepath.Join(o.DriverRoot, "usr/share/nvidia/nvswitch/fabricmanager.cfg")
	}
	if err := checkSubroot(o.DriverRoot, "usr/bin/nv-fabricmanager"); err != nil {
		return Spec{}, fmt.Errorf("nv-fabricmanager: %w", err)
	}
	if _, err := os.Stat(o.Config); err != nil {
		return Spec{}, fmt.Errorf("nv-fabricmanager: config file: %w", err)
	}
	cfg := filepath.Join(o.RunDir, "fabricmanager.cfg")
	nvswitchDir := filepath.Join(o.DriverRoot, "usr/share/nvidia/nvswitch")
	overrides := map[string]string{
		"DAEMONIZE":          "1",
		"LOG_USE_SYSLOG":     "1",
		"LOG_FILE_NAME":      filepath.Join(o.RunDir, "fabricmanager.log"),
		"STATE_FILE_NAME":    filepath.Join(o.RunDir, "fabricmanager.state"),
		"UNIX_SOCKET_PATH":   filepath.Join(o.RunDir, "socket"),
		"DATABASE_PATH":      nvswitchDir,
		"TOPOLOGY_FILE_PATH": nvswitchDir,
	}
	s := Spec{
		Name: "nv-fabricmanager",
		Path: filepath.Join(o.DriverRoot, subrootLoader),
		Args: []string{"--library-path", filepath.Join(o.DriverRoot, subrootLibDir),
			filepath.Join(o.DriverRoot, "usr/bin/nv-fabricmanager"), "-c", cfg},
		Env:       o.Env,
		RunDir:    o.RunDir,
		PIDFile:   filepath.Join(o.RunDir, "nv-fabricmanager.pid"),
		Socket:    filepath.Join(o.RunDir, "socket"),
		MirrorDir: o.MirrorDir,
		Prepare: func() error {
			in, err := os.ReadFile(o.Config)
			if err != nil {
				return fmt.Errorf("read fabric manager config: %w", err)
			}
			_, err = atomicfile.Write(cfg, RewriteConfig(in, overrides), 0o644)
			return err
		},
	}
	return s, s.Validate()
}

// RewriteConfig sets KEY=value lines of a fabricmanager.cfg-style file: existing keys
// are replaced in place, missing ones appended in sorted order.
func RewriteConfig(in []byte, set map[string]string) []byte {
	var out bytes.Buffer
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(in))
	for sc.Scan() {
		line := sc.Text()
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

// HasNVSwitch says whether the node has NVSwitches (so needs the fabric manager):
// the nvswitch driver lists them in /proc/driver/nvidia-nvswitch/devices/.
// prefix is prepended to the path (empty on a real node).
func HasNVSwitch(prefix string) (bool, error) {
	dir := filepath.Join(prefix, "/proc/driver/nvidia-nvswitch/devices")
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("look for nvswitches in %s: %w", dir, err)
	}
	return len(ents) > 0, nil
}

func checkSubroot(root string, files ...string) error {
	if !filepath.IsAbs(root) {
		return fmt.Errorf("driver root %q is not an absolute path", root)
	}
	var errs []error
	for _, f := range append([]string{subrootLoader}, files...) {
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			errs = append(errs, fmt.Errorf("subroot %s lacks %s: %w", root, f, err))
		}
	}
	return errors.Join(errs...)
}
