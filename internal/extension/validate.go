package extension

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/blang/semver/v4"
	securejoin "github.com/cyphar/filepath-securejoin"
	"github.com/siderolabs/talos/pkg/machinery/extensions"
	"github.com/siderolabs/talos/pkg/machinery/extensions/services"
	"gopkg.in/yaml.v3"

	"github.com/talos-nvidia/nvidia-driver/pkg/driverroot"
)

// Validate checks an extension directory (manifest.yaml and rootfs/) as Talos does, then
// more strictly:
//   - Talos's own extensions.Load and Validate (version constraint, allowed paths, no special
//     files) for talosVersion;
//   - no world-writable file or directory (Talos v1.13.5 means to refuse them, but its check
//     reads fs.DirEntry.Type(), which carries no permission bits, so it never fires);
//   - every service YAML under /usr/local/etc/containers parses strictly as a services.Spec
//     and passes Spec.Validate, and its container root filesystem and entrypoint exist;
//   - every program run directly finds its ELF interpreter and libraries where it runs: the
//     service entrypoint inside its container root filesystem, the programs in /usr/bin on
//     the host (whose only glibc is the one the extension brings);
//   - every ELF file but NVIDIA's GPU firmware is of the service binary's architecture;
//   - /usr/bin/ldconfig is static (the CDI hook copies it into containers);
//   - the glibc subroot passes driverroot.Check (check-root), as the builder's payload did:
//     an image whose packing lost a piece (the empty dev/ mount point, say) is refused.
//
// It reports every problem it finds, each naming the node path at fault.
func Validate(dir, talosVersion string) error {
	v, err := semver.ParseTolerant(talosVersion)
	if err != nil {
		return fmt.Errorf("talos version %q: %w", talosVersion, err)
	}

	ext, err := extensions.Load(dir)
	if err != nil {
		return fmt.Errorf("talos cannot load the extension %s: %w", dir, err)
	}

	if err := ext.Validate(extensions.WithValidateConstraints(), extensions.WithValidateContents(), extensions.WithTalosVersion(&v)); err != nil {
		return fmt.Errorf("talos %s rejects the extension %s: %w", talosVersion, dir, err)
	}

	rootfs := ext.RootfsPath()

	var errs []error

	errs = append(errs, worldWritable(rootfs)...)
	errs = append(errs, checkOneArchitecture(rootfs)...)
	errs = append(errs, checkServices(rootfs)...)
	errs = append(errs, checkHostPrograms(rootfs)...)
	errs = append(errs, checkSubroot(rootfs)...)

	if len(errs) > 0 {
		return fmt.Errorf("extension %s is invalid, %d problem(s):\n%w", dir, len(errs), errors.Join(errs...))
	}

	return nil
}

// checkSubroot reports the subroot's problems with their node paths.
func checkSubroot(rootfs string) []error {
	var errs []error

	for _, p := range driverroot.Check(filepath.Join(rootfs, SubrootPath)).Problems {
		errs = append(errs, fmt.Errorf("%s: %s (needed by %s)", filepath.Join("/", SubrootPath, p.Path), p.Message, p.Consumer))
	}

	return errs
}

func worldWritable(rootfs string) []error {
	var errs []error

	err := filepath.WalkDir(rootfs, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}

		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}

		info, err := d.Info()
		if err != nil {
			return err
		}

		if info.Mode().Perm()&0o002 != 0 {
			errs = append(errs, fmt.Errorf("%s: world-writable (mode %v): anyone on the node could change it", nodePath(rootfs, path), info.Mode().Perm()))
		}

		return nil
	})
	if err != nil {
		errs = append(errs, err)
	}

	return errs
}

// LoadServiceSpec reads a service YAML strictly (unknown keys are errors, as a typo in a
// mount would otherwise silently drop it) and validates it with Talos's Spec.Validate.
func LoadServiceSpec(path string) (services.Spec, error) {
	var spec services.Spec

	data, err := os.ReadFile(path)
	if err != nil {
		return spec, err
	}

	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)

	if err := dec.Decode(&spec); err != nil {
		return spec, fmt.Errorf("%s: %w", path, err)
	}

	if err := spec.Validate(); err != nil {
		return spec, fmt.Errorf("%s: talos rejects the service: %w", path, err)
	}

	return spec, nil
}

func checkServices(rootfs string) []error {
	var errs []error

	specs, _ := filepath.Glob(filepath.Join(rootfs, ServiceSpecPath, "*.yaml")) //nolint:errcheck // the pattern is valid

	for _, p := range specs {
		spec, err := LoadServiceSpec(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", nodePath(rootfs, p), errors.Unwrap(err)))

			continue
		}

		if want := strings.TrimSuffix(filepath.Base(p), ".yaml"); spec.Name != want {
			errs = append(errs, fmt.Errorf("%s: service name %q differs from the file name %q", nodePath(rootfs, p), spec.Name, want))
		}

		ctr := filepath.Join(rootfs, ContainersPath, spec.Name)
		if st, err := os.Stat(ctr); err != nil || !st.IsDir() {
			errs = append(errs, fmt.Errorf("%s: missing: the root filesystem of service %s", nodePath(rootfs, ctr), spec.Name))

			continue
		}

		errs = append(errs, checkProgram(ctr, spec.Container.Entrypoint, "service "+spec.Name+" (in its container)", func(p string) string {
			return nodePath(rootfs, filepath.Join(ctr, p))
		})...)
	}

	return errs
}

func checkHostPrograms(rootfs string) []error {
	var errs []error

	entries, err := os.ReadDir(filepath.Join(rootfs, "usr/bin"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return []error{err}
	}

	for _, e := range entries {
		p := filepath.Join("/usr/bin", e.Name())

		errs = append(errs, checkProgram(rootfs, p, "the host", func(p string) string { return p })...)
	}

	if p := filepath.Join(rootfs, LdconfigPath); fileExists(p) {
		if interp, err := driverroot.Interpreter(p); err == nil && interp != "" {
			errs = append(errs, fmt.Errorf("/%s: must be static (the CDI update-ldcache hook runs it inside containers), but asks for the interpreter %s", LdconfigPath, interp))
		}
	}

	return errs
}

// checkProgram checks that the program at path (absolute, inside root) is an executable
// whose ELF interpreter and libraries resolve inside root. Scripts and non-ELF files are
// left alone. show turns a path inside root into the path that messages name.
func checkProgram(root, path, where string, show func(string) string) []error {
	full, err := securejoin.SecureJoin(root, path)
	if err != nil {
		return []error{fmt.Errorf("%s: %w", show(path), err)}
	}

	st, err := os.Stat(full)
	if err != nil {
		return []error{fmt.Errorf("%s: missing (run by %s)", show(path), where)}
	}

	if !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		return []error{fmt.Errorf("%s: not an executable file (mode %v), run by %s", show(path), st.Mode(), where)}
	}

	f, err := elf.Open(full)
	if err != nil {
		return nil // not ELF: a script's interpreter is its own business
	}
	defer f.Close() //nolint:errcheck

	interp, err := driverroot.Interpreter(full)
	if err != nil {
		return []error{fmt.Errorf("%s: %w", show(path), err)}
	}

	if interp == "" {
		return nil // static
	}

	if !resolves(root, interp) {
		return []error{fmt.Errorf("%s: its ELF interpreter %s does not exist where %s runs it", show(path), interp, where)}
	}

	return missingLibs(root, f, show(path), where)
}

// Library directories the glibc loader searches by default, plus its cache's usual ones.
var defaultLibDirs = []string{
	"/lib64", "/usr/lib64", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/lib", "/usr/lib",
}

func missingLibs(root string, f *elf.File, name, where string) []error {
	needed, err := f.ImportedLibraries()
	if err != nil {
		return []error{fmt.Errorf("%s: reading its libraries: %w", name, err)}
	}

	var dirs []string

	for _, tag := range []elf.DynTag{elf.DT_RUNPATH, elf.DT_RPATH} {
		paths, _ := f.DynString(tag) //nolint:errcheck // absent is fine
		for _, p := range paths {
			dirs = append(dirs, strings.Split(p, ":")...)
		}
	}

	dirs = append(dirs, defaultLibDirs...)

	var errs []error

	sort.Strings(needed)

	for _, lib := range needed {
		found := false

		for _, d := range dirs {
			if resolves(root, filepath.Join(d, lib)) {
				found = true

				break
			}
		}

		if !found {
			errs = append(errs, fmt.Errorf("%s: needs %s, found in none of %s where %s runs it", name, lib, strings.Join(dirs, ", "), where))
		}
	}

	return errs
}

// resolves reports whether path names a regular file inside root, symlinks followed as a
// process rooted there would follow them.
func resolves(root, path string) bool {
	p, err := securejoin.SecureJoin(root, path)
	if err != nil {
		return false
	}

	st, err := os.Stat(p)

	return err == nil && st.Mode().IsRegular()
}

func fileExists(p string) bool {
	_, err := os.Lstat(p)

	return err == nil
}

// ValidateRelease validates a release image as its recipe's test step does: Validate, and
// with a module kind also the subroot (pkg/driverroot, whose driver version must be
// driverVersion) and the kernel modules (CheckModules).
func ValidateRelease(dir, talosVersion string, kind ModuleKind, driverVersion string) error {
	if err := Validate(dir, talosVersion); err != nil {
		return err
	}

	if kind == "" {
		return nil
	}

	if kind.License() == "" || driverVersion == "" {
		return fmt.Errorf("module kind %q, driver version %q: want %q or %q, and a driver version", kind, driverVersion, ModulesOpen, ModulesProprietary)
	}

	var errs []error

	rootfs := filepath.Join(dir, "rootfs")

	report := driverroot.Check(filepath.Join(rootfs, SubrootPath))
	if err := report.Err(); err != nil {
		errs = append(errs, fmt.Errorf("/%s: %w", SubrootPath, err))
	} else if report.DriverVersion != driverVersion {
		errs = append(errs, fmt.Errorf("/%s: NVIDIA userspace %s, but the recipe builds %s", SubrootPath, report.DriverVersion, driverVersion))
	}

	if _, err := CheckModules(filepath.Join(rootfs, ModulesPath), driverVersion, kind); err != nil {
		errs = append(errs, err)
	}

	return errors.Join(errs...)
}

// CheckRelease checks that a release image is one Talos release's, where its manifest's
// constraint cannot say so (siderolabs' validator, built on a prerelease machinery, rejects
// an exact "= vX.Y.Z"): the manifest's version ends in -<talosVersion>, and the kernel
// modules are for that release's kernel (constants.DefaultKernelVersion of its machinery)
// and no other.
func CheckRelease(dir, talosVersion, kernelVersion string) error {
	ext, err := extensions.Load(dir)
	if err != nil {
		return fmt.Errorf("talos cannot load the extension %s: %w", dir, err)
	}

	var errs []error

	if v := ext.Manifest.Metadata.Version; !strings.HasSuffix(v, "-"+talosVersion) {
		errs = append(errs, fmt.Errorf("manifest version %q does not name Talos %s (<driver>-%s)", v, talosVersion, talosVersion))
	}

	entries, err := os.ReadDir(filepath.Join(dir, "rootfs", ModulesPath))
	if err != nil {
		errs = append(errs, fmt.Errorf("/%s: %w", ModulesPath, err))
	}

	found := false

	for _, e := range entries {
		if e.Name() == kernelVersion {
			found = true

			continue
		}

		errs = append(errs, fmt.Errorf("/%s/%s: modules for another kernel than Talos %s's %s", ModulesPath, e.Name(), talosVersion, kernelVersion))
	}

	if !found && err == nil {
		errs = append(errs, fmt.Errorf("/%s/%s: missing: no modules for Talos %s's kernel", ModulesPath, kernelVersion, talosVersion))
	}

	return errors.Join(errs...)
}
