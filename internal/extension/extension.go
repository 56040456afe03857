// Package extension assembles the nvidia-driver Talos system extension from the built
// binaries and a driver payload, validates it with Talos's own code and with stricter checks
// of its own, and writes it as an OCI image archive.
package extension

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/talos-nvidia/nvidia-driver/pkg/driverroot"
)

// Paths inside the extension's rootfs/, as they appear on a Talos node.
const (
	// SubrootPath is the glibc subroot with NVIDIA's userspace.
	SubrootPath = "usr/local/glibc"
	// ServiceName is the extension service's name (Talos runs it as ext-nvidia-driver).
	ServiceName = "nvidia-driver"
	// FabricManagerServiceName is the second service (ext-nvidia-fabricmanager): the same
	// binary, in a root filesystem of its own, copied from the first one's.
	FabricManagerServiceName = "nvidia-fabricmanager"
	// ContainersPath holds each extension service's root filesystem.
	ContainersPath = "usr/local/lib/containers"
	// ServiceSpecPath holds each extension service's YAML.
	ServiceSpecPath = "usr/local/etc/containers"
	// HookPath is where device plugin and CDI specs name nvidia-cdi-hook.
	HookPath = "usr/bin/nvidia-cdi-hook"
	// LdconfigPath is the static ldconfig that the hook's update-ldcache resolves on the host
	// (/sbin/ldconfig links to /usr/bin/ldconfig on Talos).
	LdconfigPath = "usr/bin/ldconfig"
	// ModulesPath holds kernel modules.
	ModulesPath = "usr/lib/modules"
	// FirmwarePath holds NVIDIA's GSP firmware, one directory per driver version.
	FirmwarePath = "usr/lib/firmware/nvidia"
)

// ModuleKind says which of NVIDIA's kernel module flavors an extension carries.
type ModuleKind string

// Module kinds, told apart by the license their .modinfo declares.
const (
	ModulesOpen        ModuleKind = "open"
	ModulesProprietary ModuleKind = "proprietary"
)

// License is what a module kind's .modinfo says.
func (k ModuleKind) License() string {
	switch k {
	case ModulesOpen:
		return "Dual MIT/GPL"
	case ModulesProprietary:
		return "NVIDIA"
	default:
		return ""
	}
}

// Options says what goes into an extension.
type Options struct {
	// Name of the extension (manifest metadata.name), also the output directory's name.
	Name string
	// Version of the extension; empty: the payload's driver version, plus VersionSuffix.
	Version       string
	VersionSuffix string
	// TalosVersion is the Talos release the build is validated against, e.g. v1.13.5.
	TalosVersion string
	// TalosConstraint is the manifest's compatibility.talos.version, e.g. "= v1.13.5".
	TalosConstraint string
	Author          string
	Description     string

	// Payload is a glibc subroot with NVIDIA's userspace (the layout pkg/driverroot checks).
	Payload string
	// Modules, if set, is a directory of <kernel release>/ trees with NVIDIA's kernel modules,
	// copied to /usr/lib/modules. ModuleKind says which kind they must be.
	Modules    string
	ModuleKind ModuleKind
	// Firmware, if set, is a directory of NVIDIA's firmware files (gsp_*.bin), copied to
	// /usr/lib/firmware/nvidia/<driver version>.
	Firmware string

	// ServiceRootfs is the service's container root filesystem (make build's
	// _out/containers/nvidia-driver).
	ServiceRootfs string
	// ServiceSpec is the service's YAML (extension/nvidia-driver.yaml).
	ServiceSpec string
	// FabricManagerSpec is the fabric manager service's YAML
	// (extension/nvidia-fabricmanager.yaml); its root filesystem is a copy of ServiceRootfs.
	FabricManagerSpec string
	// Hook and Ldconfig are the host programs (make build's _out/bin).
	Hook     string
	Ldconfig string
	// Overlay, if set, is copied over rootfs/ last (extension/rootfs).
	Overlay string

	// OutDir receives <Name>/ (manifest.yaml and rootfs/).
	OutDir string
}

// Manifest is the extension's manifest.yaml (Talos's extensions.Manifest, with yaml tags
// for writing).
type Manifest struct {
	Version  string   `yaml:"version"`
	Metadata Metadata `yaml:"metadata"`
}

// Metadata is the manifest's metadata.
type Metadata struct {
	Name          string        `yaml:"name"`
	Version       string        `yaml:"version"`
	Author        string        `yaml:"author"`
	Description   string        `yaml:"description"`
	Compatibility Compatibility `yaml:"compatibility"`
}

// Compatibility holds the Talos version constraint.
type Compatibility struct {
	Talos struct {
		Version string `yaml:"version"`
	} `yaml:"talos"`
}

// Result describes an assembled extension.
type Result struct {
	Dir           string
	Manifest      Manifest
	DriverVersion string
	// Modules lists the kernel modules checked, relative to rootfs/.
	Modules []ModInfo
}

// Assemble builds OutDir/<Name>/ from opts and validates it; on any error the output
// directory is left as it was. The build is staged next to the output and renamed into
// place only once valid.
func Assemble(log *slog.Logger, opts Options) (Result, error) {
	if err := opts.check(); err != nil {
		return Result{}, err
	}

	report := driverroot.Check(opts.Payload)
	if err := report.Err(); err != nil {
		return Result{}, fmt.Errorf("driver payload: %w", err)
	}

	res := Result{DriverVersion: report.DriverVersion}

	version := opts.Version
	if version == "" {
		version = report.DriverVersion + opts.VersionSuffix
	}

	if err := os.MkdirAll(opts.OutDir, 0o755); err != nil {
		return Result{}, fmt.Errorf("creating %s: %w", opts.OutDir, err)
	}

	stage, err := os.MkdirTemp(opts.OutDir, "."+opts.Name+".stage-")
	if err != nil {
		return Result{}, fmt.Errorf("creating a staging directory: %w", err)
	}
	defer os.RemoveAll(stage) //nolint:errcheck // best effort: a failed build leaves no stage

	if err := os.Chmod(stage, 0o755); err != nil {
		return Result{}, err
	}

	rootfs := filepath.Join(stage, "rootfs")

	copies := []struct{ from, to string }{
		{opts.Payload, SubrootPath},
		{opts.ServiceRootfs, filepath.Join(ContainersPath, ServiceName)},
		{opts.ServiceRootfs, filepath.Join(ContainersPath, FabricManagerServiceName)},
	}

	if opts.Modules != "" {
		copies = append(copies, struct{ from, to string }{opts.Modules, ModulesPath})
	}

	if opts.Firmware != "" {
		copies = append(copies, struct{ from, to string }{opts.Firmware, filepath.Join(FirmwarePath, report.DriverVersion)})
	}

	if opts.Overlay != "" {
		copies = append(copies, struct{ from, to string }{opts.Overlay, "."})
	}

	for _, c := range copies {
		if err := CopyTree(c.from, filepath.Join(rootfs, c.to)); err != nil {
			return Result{}, err
		}
	}

	files := []struct {
		from, to string
		mode     os.FileMode
	}{
		{opts.ServiceSpec, filepath.Join(ServiceSpecPath, ServiceName+".yaml"), 0o644},
		{opts.FabricManagerSpec, filepath.Join(ServiceSpecPath, FabricManagerServiceName+".yaml"), 0o644},
		{opts.Hook, HookPath, 0o755},
		{opts.Ldconfig, LdconfigPath, 0o755},
	}

	for _, f := range files {
		if err := copyFile(f.from, filepath.Join(rootfs, f.to), f.mode); err != nil {
			return Result{}, err
		}
	}

	if opts.Modules != "" {
		mods, err := CheckModules(filepath.Join(rootfs, ModulesPath), report.DriverVersion, opts.ModuleKind)
		if err != nil {
			return Result{}, err
		}

		res.Modules = mods
	}

	m := Manifest{Version: "v1alpha1", Metadata: Metadata{
		Name: opts.Name, Version: version, Author: opts.Author, Description: opts.Description,
	}}
	m.Metadata.Compatibility.Talos.Version = opts.TalosConstraint

	data, err := yaml.Marshal(m)
	if err != nil {
		return Result{}, fmt.Errorf("encoding the manifest: %w", err)
	}

	if err := os.WriteFile(filepath.Join(stage, "manifest.yaml"), data, 0o644); err != nil {
		return Result{}, err
	}

	if err := Validate(stage, opts.TalosVersion); err != nil {
		return Result{}, err
	}

	dir := filepath.Join(opts.OutDir, opts.Name)
	if err := os.RemoveAll(dir); err != nil {
		return Result{}, fmt.Errorf("replacing %s: %w", dir, err)
	}

	if err := os.Rename(stage, dir); err != nil {
		return Result{}, fmt.Errorf("moving the extension into place: %w", err)
	}

	res.Dir, res.Manifest = dir, m
	log.Info("extension assembled", "dir", dir, "name", m.Metadata.Name, "version", m.Metadata.Version, "driver", report.DriverVersion, "modules", len(res.Modules))

	return res, nil
}

func (o Options) check() error {
	var errs []error

	if o.Name == "" {
		errs = append(errs, errors.New("extension name is empty"))
	}

	if o.TalosVersion == "" {
		errs = append(errs, errors.New("talos version is empty"))
	}

	if o.OutDir == "" {
		errs = append(errs, errors.New("output directory is empty"))
	}

	for what, p := range map[string]string{
		"driver payload": o.Payload, "service rootfs": o.ServiceRootfs, "service spec": o.ServiceSpec,
		"fabric manager service spec": o.FabricManagerSpec,
		"nvidia-cdi-hook":             o.Hook, "ldconfig": o.Ldconfig,
	} {
		if p == "" {
			errs = append(errs, fmt.Errorf("%s: no path given", what))
		} else if _, err := os.Stat(p); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
		}
	}

	if o.Modules != "" && o.ModuleKind.License() == "" {
		errs = append(errs, fmt.Errorf("kernel modules given, but module kind %q is neither %q nor %q", o.ModuleKind, ModulesOpen, ModulesProprietary))
	}

	return errors.Join(errs...)
}

// CopyTree copies src into dst (created if missing), keeping symlinks as symlinks and
// permission bits as they are; ownership becomes the caller's.
func CopyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("copying %s: %w", src, err)
		}

		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}

		target := filepath.Join(dst, rel)

		info, err := d.Info()
		if err != nil {
			return err
		}

		switch {
		case d.IsDir():
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}

			return os.Chmod(target, info.Mode().Perm())
		case info.Mode()&fs.ModeSymlink != 0:
			link, err := os.Readlink(path)
			if err != nil {
				return err
			}

			_ = os.Remove(target) //nolint:errcheck // the overlay may replace a file

			return os.Symlink(link, target)
		case info.Mode().IsRegular():
			return copyFile(path, target, info.Mode().Perm()|info.Mode()&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky))
		default:
			// Kept as is, so that validation names it (Talos refuses special files).
			return fmt.Errorf("%s: special file (%v) cannot go into an extension", path, info.Mode().Type())
		}
	})
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close() //nolint:errcheck

	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}

	_ = os.Remove(dst) //nolint:errcheck // replaced whole

	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}

	if _, err := io.Copy(out, in); err != nil {
		out.Close() //nolint:errcheck

		return fmt.Errorf("copying %s: %w", src, err)
	}

	if err := out.Close(); err != nil {
		return err
	}

	// Chmod after writing: the umask must not change what the payload says.
	return os.Chmod(dst, mode)
}

// rel turns a path under rootfs into the absolute path it has on a node.
func nodePath(rootfs, path string) string {
	r, err := filepath.Rel(rootfs, path)
	if err != nil || strings.HasPrefix(r, "..") {
		return path
	}

	return "/" + r
}
