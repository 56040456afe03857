// Package config loads the service's configuration from its environment and an optional
// YAML file, both of which a Talos ExtensionServiceConfig provides. Every setting has a
// default, so a node needs no configuration at all. Loading is strict: unknown keys and
// variables, bad values and a missing or unknown version are all reported at once
// (document.Invalid). The file (document.MaxFileSize) and each value (MaxValueLen) have size
// limits, checked before they are parsed.
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/talos-nvidia/nvidia-driver/pkg/document"
)

// Version is the only version of the configuration file this build reads.
const Version = "v1alpha1"

// EnvPrefix starts every environment variable the service reads.
const EnvPrefix = "NVIDIA_DRIVER_"

// foreignEnv are NVIDIA's own variables that share our prefix: CUDA images and the container
// toolkit set NVIDIA_DRIVER_CAPABILITIES, the device plugin reads NVIDIA_DRIVER_ROOT. They
// are not ours, so the strict check leaves them alone.
var foreignEnv = map[string]bool{"NVIDIA_DRIVER_CAPABILITIES": true, "NVIDIA_DRIVER_ROOT": true}

// EnvConfigFile names the configuration file; DefaultConfigFile is used when it is unset,
// and may be absent.
const (
	EnvConfigFile     = EnvPrefix + "CONFIG"
	DefaultConfigFile = "/etc/nvidia-driver/config.yaml"
)

// Config is the service's configuration.
type Config struct {
	// HostRoot prefixes every host path the service reads or writes (/dev, /proc, /sys,
	// /run): "/" on a node, a throwaway directory in tests and the demo.
	HostRoot string
	// Subroot is the glibc subroot with the NVIDIA userspace, as the service sees it.
	Subroot  string
	LogLevel slog.Level

	Persistenced        bool
	PersistenceMode     bool
	UVMPersistenceMode  bool
	PersistencedVerbose bool

	// FabricWait bounds the wait for the GPUs' NVLink fabric registration on NVSwitch
	// boards (the ext-nvidia-fabricmanager service runs the fabric manager), and one start
	// of nv-fabricmanager there.
	FabricWait time.Duration

	CDI     bool
	CDISpec string // a host path

	MIGConfig string // a path in the service's own filesystem (an ExtensionServiceConfig file)
	MIGLayout string // empty: leave MIG as it is

	NFDFeaturesDir string // a host path; empty: off

	// MIGPause: a layout left pending by GPU holders outside the service asks for the
	// operands' pause through the NFD feature file (nvidia.com/gpu.deploy.<operand>=
	// paused-for-mig-change), retries until the GPUs are free, and lifts the pause. Needs
	// NFDFeaturesDir.
	MIGPause bool
	// MIGRetry bounds the retries of a pending layout (and so the pause); MIGRetryInterval is
	// the time between two tries.
	MIGRetry         time.Duration
	MIGRetryInterval time.Duration

	// Ignored says, for each setting given that this build no longer has, why it has none.
	Ignored []string

	// FromDocument lists the document files read from Talos's document directory because
	// Talos had not mounted them (the document came after the service's container was made).
	FromDocument []string

	// Source says where each setting came from ("default", "env", the file), for the log.
	Source map[string]string
}

// Host returns path (absolute, as on the node) under the host root.
func (c Config) Host(path string) string { return filepath.Join(c.HostRoot, path) }

// DriverMount is where the subroot is mounted for the GPU Operator and the device plugin.
func (c Config) DriverMount() string { return c.Host("/run/nvidia/driver") }

// ValidationsDir holds the readiness files.
func (c Config) ValidationsDir() string { return c.Host("/run/nvidia/validations") }

// StatusFile holds the service's status as JSON.
func (c Config) StatusFile() string { return c.Host("/run/nvidia-driver/status.json") }

// MaxValueLen bounds each value, from the file or the environment, checked before the value
// is parsed: every setting is a path, a layout name, a level, a boolean or a duration, and the
// longest of these, a path, is at most PATH_MAX (4096 bytes) long. A longer value is refused
// and the message gives its length, not the value.
const MaxValueLen = 4096

// setValue checks v's length, then sets it.
func (s setting) setValue(c *Config, v string) error {
	if len(v) > MaxValueLen {
		return fmt.Errorf("a value of %d bytes, longer than the limit of %d", len(v), MaxValueLen)
	}

	return s.set(c, v)
}

// setting describes one key: its name in the file, its variable, its default and how to
// store a value.
type setting struct {
	key, env, def, help string
	set                 func(c *Config, v string) error
}

func settings() []setting {
	return []setting{
		{"hostRoot", "HOST_ROOT", "/", "prefix of every host path", absPath(func(c *Config) *string { return &c.HostRoot })},
		{"subroot", "SUBROOT", "/usr/local/glibc", "the glibc subroot with the NVIDIA userspace", absPath(func(c *Config) *string { return &c.Subroot })},
		{"logLevel", "LOG_LEVEL", "info", "debug, info, warn or error", func(c *Config, v string) error {
			return c.LogLevel.UnmarshalText([]byte(v))
		}},
		{"persistenced", "PERSISTENCED", "true", "run nvidia-persistenced", boolean(func(c *Config) *bool { return &c.Persistenced })},
		{"persistenceMode", "PERSISTENCE_MODE", "true", "nvidia-persistenced --persistence-mode", boolean(func(c *Config) *bool { return &c.PersistenceMode })},
		{"uvmPersistenceMode", "UVM_PERSISTENCE_MODE", "false", "nvidia-persistenced --uvm-persistence-mode", boolean(func(c *Config) *bool { return &c.UVMPersistenceMode })},
		{"persistencedVerbose", "PERSISTENCED_VERBOSE", "false", "nvidia-persistenced --verbose", boolean(func(c *Config) *bool { return &c.PersistencedVerbose })},
		// NVIDIA's nvidia-fabricmanager.service gives the daemon TimeoutStartSec=240.
		{"fabricWait", "FABRIC_WAIT", "4m", "how long to wait for the GPUs' NVLink fabric registration on NVSwitch boards", duration(func(c *Config) *time.Duration { return &c.FabricWait })},
		{"cdi", "CDI", "true", "generate a CDI spec", boolean(func(c *Config) *bool { return &c.CDI })},
		{"cdiSpec", "CDI_SPEC", "/run/cdi/nvidia.yaml", "where the CDI spec is written", absPath(func(c *Config) *string { return &c.CDISpec })},
		{"migConfig", "MIG_CONFIG", "/etc/nvidia-driver/mig.yaml", "MIG layouts file (mig-parted v1 format)", absPath(func(c *Config) *string { return &c.MIGConfig })},
		{"migLayout", "MIG_LAYOUT", "", "the MIG layout to apply; empty leaves MIG as it is", text(func(c *Config) *string { return &c.MIGLayout })},
		{"nfdFeaturesDir", "NFD_FEATURES_DIR", "", "write Node Feature Discovery labels there; empty is off", optionalAbsPath(func(c *Config) *string { return &c.NFDFeaturesDir })},
		{"migPause", "MIG_PAUSE", "true", "pause the device plugin and DCGM exporter through NFD labels while a pending MIG layout waits for its GPUs", boolean(func(c *Config) *bool { return &c.MIGPause })},
		{"migRetry", "MIG_RETRY", "10m", "how long a MIG layout left pending by GPU holders is retried (and the operands kept paused)", duration(func(c *Config) *time.Duration { return &c.MIGRetry })},
		{"migRetryInterval", "MIG_RETRY_INTERVAL", "10s", "the time between two tries of a pending MIG layout", duration(func(c *Config) *time.Duration { return &c.MIGRetryInterval })},
	}
}

// Load reads the configuration from environ (os.Environ() form) and the file it names.
// With an error, it still returns what it could read (defaults where a value was bad), so
// that the service can log at the level asked for and write its status where the node looks
// for it; HostRoot is then empty if the host root itself was not given right.
func Load(environ []string) (Config, error) {
	var (
		errs = document.Invalid{What: "configuration"}
		c    = Config{Source: map[string]string{}}
		all  = settings()
	)

	env := map[string]string{}
	bad := map[string]bool{} // keys given a value that was refused

	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, EnvPrefix) && !foreignEnv[k] {
			env[k] = v
		}
	}

	// Defaults first, then the file, then the environment.
	for _, s := range all {
		if err := s.set(&c, s.def); err != nil {
			return Config{}, fmt.Errorf("default of %s: %w", s.key, err) // a bug, not user input
		}

		c.Source[s.key] = "default"
	}

	path, explicit := env[EnvConfigFile]
	if !explicit {
		path = DefaultConfigFile
	}

	delete(env, EnvConfigFile)

	// The host root is needed before the file is read: the file may have to come from the
	// document's directory on the host (package document).
	docs := documentDir(env)

	path = c.resolve(docs, path)

	values := readFile(path, explicit, &errs)

	byKey := map[string]setting{}
	for _, s := range all {
		byKey[s.key] = s
	}

	for _, v := range values {
		if r, ok := retired[v.key]; ok {
			c.Ignored = append(c.Ignored, fmt.Sprintf("%s:%d: %s is ignored: %s", path, v.line, v.key, r.why))

			continue
		}

		s, ok := byKey[v.key]
		if !ok {
			errs.Add(fmt.Errorf("%s:%d: unknown key %q%s", path, v.line, v.key, suggest(v.key, keys(all))))

			continue
		}

		if err := s.setValue(&c, v.value); err != nil {
			errs.Add(fmt.Errorf("%s:%d: %s: %w", path, v.line, v.key, err))
			bad[s.key] = true

			continue
		}

		c.Source[s.key] = path
	}

	byEnv := map[string]setting{}
	for _, s := range all {
		byEnv[EnvPrefix+s.env] = s
	}

	names := make([]string, 0, len(env))
	for k := range env {
		names = append(names, k)
	}

	sort.Strings(names)

	retiredEnv := map[string]string{}
	for _, r := range retired {
		retiredEnv[EnvPrefix+r.env] = r.why
	}

	for _, name := range names {
		if why, ok := retiredEnv[name]; ok {
			c.Ignored = append(c.Ignored, fmt.Sprintf("environment: %s is ignored: %s", name, why))

			continue
		}

		s, ok := byEnv[name]
		if !ok {
			errs.Add(fmt.Errorf("environment: unknown variable %s%s", name, suggest(name, envNames(all))))

			continue
		}

		if err := s.setValue(&c, env[name]); err != nil {
			errs.Add(fmt.Errorf("environment: %s: %w", name, err))
			bad[s.key] = true

			continue
		}

		c.Source[s.key] = "env"
	}

	c.MIGConfig = c.resolve(docs, c.MIGConfig)

	if err := errs.Err(); err != nil {
		if bad["hostRoot"] {
			c.HostRoot = ""
		}

		return c, err
	}

	return c, nil
}

// retired are settings of earlier builds, by file key, with what replaced them: a document
// that still sets one is not wrong, the setting is ignored and the log says so once.
var retired = map[string]struct{ env, why string }{
	"fabricManager": {"FABRIC_MANAGER", "the fabric manager runs in the ext-nvidia-fabricmanager service, on NVSwitch boards only (docs/nvswitch.md)"},
}

// ServiceName is the extension service's name, the name of its ExtensionServiceConfig.
const ServiceName = "nvidia-driver"

// documentDir is the service's document directory under the host root that the environment
// names (the default where it names none or a bad one: the error is reported with the rest).
func documentDir(env map[string]string) document.Dir {
	root := env[EnvPrefix+"HOST_ROOT"]
	if !filepath.IsAbs(root) {
		root = "/"
	}

	return document.For(root, ServiceName)
}

// resolve returns where to read the document file mounted at path, and notes it when it
// comes from the document directory.
func (c *Config) resolve(docs document.Dir, path string) string {
	p, fromDocument := docs.Resolve(path)
	if fromDocument {
		c.FromDocument = append(c.FromDocument, path)
	}

	return p
}

type fileValue struct {
	key, value string
	line       int
}

// readFile reads the configuration file's values, adding its problems to errs. The file's
// size is checked before it is parsed (document.ReadFile).
func readFile(path string, required bool, errs *document.Invalid) []fileValue {
	data, err := document.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) && !required {
		return nil
	}

	if err != nil {
		errs.Add(fmt.Errorf("reading configuration file: %w", err))

		return nil
	}

	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		errs.Add(fmt.Errorf("%s: %w", path, err))

		return nil
	}

	if len(doc.Content) == 0 {
		errs.Add(fmt.Errorf("%s: empty file: it needs at least \"version: %s\"", path, Version))

		return nil
	}

	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		errs.Add(fmt.Errorf("%s:%d: expected a mapping of settings", path, root.Line))

		return nil
	}

	var (
		out     []fileValue
		version string
		seen    = map[string]int{}
	)

	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]

		if prev, dup := seen[k.Value]; dup {
			errs.Add(fmt.Errorf("%s:%d: key %q repeated (first on line %d)", path, k.Line, k.Value, prev))

			continue
		}

		seen[k.Value] = k.Line

		if v.Kind != yaml.ScalarNode {
			errs.Add(fmt.Errorf("%s:%d: %s: expected a single value", path, v.Line, k.Value))

			continue
		}

		if k.Value == "version" {
			version = v.Value

			continue
		}

		out = append(out, fileValue{key: k.Value, value: v.Value, line: k.Line})
	}

	switch version {
	case Version:
	case "":
		errs.Add(fmt.Errorf("%s: missing \"version: %s\"", path, Version))
	default:
		errs.Add(fmt.Errorf("%s: version %q is not supported, this build reads %q", path, version, Version))
	}

	return out
}

func absPath(field func(*Config) *string) func(*Config, string) error {
	return func(c *Config, v string) error {
		if !filepath.IsAbs(v) {
			return fmt.Errorf("%q is not an absolute path", v)
		}

		*field(c) = filepath.Clean(v)

		return nil
	}
}

func optionalAbsPath(field func(*Config) *string) func(*Config, string) error {
	return func(c *Config, v string) error {
		if v == "" {
			*field(c) = ""

			return nil
		}

		return absPath(field)(c, v)
	}
}

func text(field func(*Config) *string) func(*Config, string) error {
	return func(c *Config, v string) error {
		*field(c) = strings.TrimSpace(v)

		return nil
	}
}

func boolean(field func(*Config) *bool) func(*Config, string) error {
	return func(c *Config, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("%q is not a boolean (true or false)", v)
		}

		*field(c) = b

		return nil
	}
}

func duration(field func(*Config) *time.Duration) func(*Config, string) error {
	return func(c *Config, v string) error {
		d, err := time.ParseDuration(strings.TrimSpace(v))
		if err != nil || d <= 0 {
			return fmt.Errorf("%q is not a positive duration (e.g. 90s, 4m)", v)
		}

		*field(c) = d

		return nil
	}
}

func keys(all []setting) []string {
	out := []string{"version"}
	for _, s := range all {
		out = append(out, s.key)
	}

	return out
}

func envNames(all []setting) []string {
	out := []string{EnvConfigFile}
	for _, s := range all {
		out = append(out, EnvPrefix+s.env)
	}

	return out
}

// suggest names the closest known name, for typos.
func suggest(name string, known []string) string {
	best, bestDist := "", 4

	for _, k := range known {
		if d := distance(strings.ToLower(name), strings.ToLower(k)); d < bestDist {
			best, bestDist = k, d
		}
	}

	if best == "" {
		return ""
	}

	return fmt.Sprintf(" (did you mean %s?)", best)
}

// distance is the Levenshtein distance.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}

	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i

		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}

			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}

		prev = cur
	}

	return prev[len(b)]
}

// Describe returns the settings with their variables and defaults, for --help.
func Describe() string {
	var b strings.Builder

	for _, s := range settings() {
		def := s.def
		if def == "" {
			def = `""`
		}

		fmt.Fprintf(&b, "  %-36s %-20s default %s\n      %s\n", EnvPrefix+s.env, s.key, def, s.help)
	}

	return b.String()
}
