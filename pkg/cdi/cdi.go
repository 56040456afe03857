// Package cdi generates the node's CDI spec in-process with NVIDIA's nvcdi library and writes
// it atomically where Talos's containerd reads specs (/run/cdi).
package cdi

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi/spec"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi/transform"

	"github.com/talos-nvidia/nvidia-driver/pkg/atomicfile"
)

// Defaults for a Talos node.
const (
	// Vendor and Class make the kind nvidia.com/gpu, as nvidia-ctk names it.
	Vendor = "nvidia.com"
	Class  = "gpu"
	// HookPath is where the extension installs nvidia-cdi-hook (an allowed extension path).
	HookPath = "/usr/bin/nvidia-cdi-hook"
	// LdconfigPath is the extension's static ldconfig, which the update-ldcache hook runs.
	LdconfigPath = "/usr/bin/ldconfig"
	// SpecPath is where Talos's containerd reads CDI specs.
	SpecPath = "/run/cdi/nvidia.yaml"
)

// Options say where things are. Host paths in the spec come from DriverRoot and DevRoot.
type Options struct {
	// DriverRoot is where nvcdi finds the libraries and binaries, the persistenced socket
	// and the MIG minors, and what the spec's host paths point at: /run/nvidia/driver on a
	// node (docs/cdi.md says why).
	DriverRoot string
	// DevRoot holds /dev: "/" on a node.
	DevRoot string
	// HookPath and LdconfigPath are host paths of the hook and the static ldconfig.
	HookPath     string
	LdconfigPath string
	Vendor       string
	Class        string
}

// DefaultOptions returns the options for a node whose driver root is driverRoot.
func DefaultOptions(driverRoot string) Options {
	return Options{
		DriverRoot:   driverRoot,
		DevRoot:      "/",
		HookPath:     HookPath,
		LdconfigPath: LdconfigPath,
		Vendor:       Vendor,
		Class:        Class,
	}
}

// ErrNoDevices says that NVML sees no GPU: a spec without devices is not written (it would
// only make every CDI request fail later, with a less clear error).
var ErrNoDevices = errors.New("no GPU to put in a CDI spec")

// Generate builds the spec from NVML (lib) and the driver root.
func Generate(log *slog.Logger, lib nvml.Interface, o Options) (spec.Interface, error) {
	// nvcdi initializes and shuts NVML down around each of its steps, and a first NVML init
	// costs about 10 ms on a real driver. One reference held for the whole generation makes
	// the inner ones cheap (NVML counts them). A failure here is nvcdi's to report.
	if ret := lib.Init(); ret == nvml.SUCCESS {
		defer lib.Shutdown() //nolint:errcheck
	}

	// Named as nvidia-ctk names them: by index (0, and 0:1 for MIG) and by UUID.
	var namers []nvcdi.DeviceNamer

	for _, strategy := range []string{nvcdi.DeviceNameStrategyIndex, nvcdi.DeviceNameStrategyUUID} {
		n, err := nvcdi.NewDeviceNamer(strategy)
		if err != nil {
			return nil, fmt.Errorf("nvcdi device namer %q: %w", strategy, err)
		}

		namers = append(namers, n)
	}

	cdilib, err := nvcdi.New(
		nvcdi.WithLogger(logAdapter{log}),
		nvcdi.WithNvmlLib(lib),
		nvcdi.WithMode(nvcdi.ModeNvml),
		nvcdi.WithDriverRoot(o.DriverRoot),
		nvcdi.WithDevRoot(o.DevRoot),
		nvcdi.WithNVIDIACDIHookPath(o.HookPath),
		nvcdi.WithLdconfigPath(o.LdconfigPath),
		nvcdi.WithVendor(o.Vendor),
		nvcdi.WithClass(o.Class),
		nvcdi.WithDeviceNamers(namers...),
	)
	if err != nil {
		return nil, fmt.Errorf("setting up nvcdi: %w", err)
	}

	devices, err := cdilib.GetDeviceSpecsByID("all")
	if err != nil {
		return nil, fmt.Errorf("generating CDI device specs: %w", err)
	}

	if len(devices) == 0 {
		return nil, ErrNoDevices
	}

	common, err := cdilib.GetCommonEdits()
	if err != nil {
		return nil, fmt.Errorf("generating CDI edits common to all devices: %w", err)
	}

	s, err := spec.New(
		spec.WithVendor(o.Vendor),
		spec.WithClass(o.Class),
		spec.WithDeviceSpecs(devices),
		spec.WithEdits(*common.ContainerEdits),
		spec.WithFormat(spec.FormatYAML),
		spec.WithPermissions(0o644),
		spec.WithMergedDeviceOptions(transform.WithName("all"), transform.WithSkipIfExists(true)),
	)
	if err != nil {
		return nil, fmt.Errorf("assembling the CDI spec: %w", err)
	}

	return s, nil
}

// Render returns the spec as the YAML document written to disk, after the CDI library's
// validation.
//
// The library renders through files in os.TempDir() (the service's TMPDIR): spec.WriteTo
// saves to "nvcdi-spec-*.yaml", and its Save writes "spec.*.tmp" and renames it, keeping the
// "spec.*.tmp" of a write that failed (a full /run left one per retry, issue 32). Render has it
// save into a directory of its own ("nvcdi-render-*") and removes that directory whole,
// whatever happened; SweepTemp removes what a killed service left. An error of a temporary
// file is given without the file's random name, so that a retry reads the same.
//
// TMPDIR is opened, and made if it is missing, without following a link on its path: a link
// at the host's /run/nvidia-driver would have the library write where it points (issue 32).
// Checked at every rendering, so that a link removed later, or a TMPDIR removed under the
// service, clears at the next try without a restart.
func Render(s spec.Interface) ([]byte, error) {
	tmp, err := atomicfile.OpenDirNoSymlinks(os.TempDir(), true, 0o700)
	if err != nil {
		return nil, fmt.Errorf("rendering the CDI spec: TMPDIR: %w", err)
	}
	tmp.Close() //nolint:errcheck // an O_PATH descriptor: nothing to flush

	dir, err := os.MkdirTemp("", renderDirPattern)
	if err != nil {
		return nil, fmt.Errorf("rendering the CDI spec in %s: %w", os.TempDir(), bare(err))
	}
	defer os.RemoveAll(dir) //nolint:errcheck // what stays is SweepTemp's

	path := filepath.Join(dir, "spec.yaml")
	if err := s.Save(path); err != nil {
		return nil, fmt.Errorf("rendering the CDI spec in %s: %w", os.TempDir(), bare(err))
	}

	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("rendering the CDI spec in %s: %w", os.TempDir(), bare(err))
	}

	return data, nil
}

// renderDirPattern names Render's directories (os.MkdirTemp).
const renderDirPattern = "nvcdi-render-*"

// bare replaces a *fs.PathError in err, whose path is a random temporary name, by its
// operation and cause.
func bare(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %w", pe.Op, pe.Err)
	}

	return err
}

// SweepTemp removes from the temporary directory dir what renderings of a killed service left:
// Render's directories, and the CDI library's files of earlier builds that rendered in dir
// itself ("nvcdi-spec-*", "spec.*.tmp"). The service calls it at start, before any rendering.
func SweepTemp(dir string) error {
	var errs []error

	for _, pattern := range []string{renderDirPattern, "nvcdi-spec-*", "spec.*.tmp"} {
		stale, err := filepath.Glob(filepath.Join(dir, pattern))
		if err != nil {
			return fmt.Errorf("listing %s: %w", dir, err)
		}

		for _, p := range stale {
			if err := os.RemoveAll(p); err != nil {
				errs = append(errs, fmt.Errorf("removing a leftover CDI spec rendering: %w", err))
			}
		}
	}

	return errors.Join(errs...)
}

// Write generates the spec and writes it to path atomically (a reader sees the old spec or
// the new one, whole), only when its content changed. It reports whether it wrote.
func Write(log *slog.Logger, lib nvml.Interface, o Options, path string) (bool, error) {
	s, err := Generate(log, lib, o)
	if err != nil {
		return false, err
	}

	data, err := Render(s)
	if err != nil {
		return false, err
	}

	changed, err := atomicfile.Write(path, data, 0o644)
	if err != nil {
		return false, fmt.Errorf("writing the CDI spec: %w", err)
	}

	log.Info("CDI spec up to date", "path", path, "changed", changed, "devices", len(s.Raw().Devices))

	return changed, nil
}

// logAdapter passes nvcdi's printf-style logging to the service's logger. nvcdi warns about
// every optional file it does not find (graphics, X11, Vulkan, MPS) on every run: its
// warnings are details, logged at debug level; what fails comes back as an error.
type logAdapter struct{ log *slog.Logger }

func (l logAdapter) Debugf(f string, a ...any)   { l.logf(slog.LevelDebug, f, a...) }
func (l logAdapter) Errorf(f string, a ...any)   { l.logf(slog.LevelError, f, a...) }
func (l logAdapter) Infof(f string, a ...any)    { l.logf(slog.LevelDebug, f, a...) }
func (l logAdapter) Warningf(f string, a ...any) { l.logf(slog.LevelDebug, f, a...) }
func (l logAdapter) Tracef(string, ...any)       {}

func (l logAdapter) logf(level slog.Level, f string, a ...any) {
	l.log.Log(context.Background(), level, fmt.Sprintf(f, a...), "component", "nvcdi")
}
