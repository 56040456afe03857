package extension

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
)

// KindModule is the module whose license says which kind of NVIDIA's modules an extension
// carries.
const KindModule = "nvidia"

// ModInfo is what a kernel module's .modinfo section says.
type ModInfo struct {
	Path    string `json:"path"` // relative to the modules directory
	Name    string `json:"name"`
	Version string `json:"version"`
	License string `json:"license"`
}

// ReadModInfo parses the .modinfo section of a kernel module (an ELF relocatable object):
// NUL-separated key=value strings. No modinfo binary needed.
func ReadModInfo(path string) (ModInfo, error) {
	f, err := elf.Open(path)
	if err != nil {
		return ModInfo{}, fmt.Errorf("%s: not a readable kernel module: %w", path, err)
	}
	defer f.Close() //nolint:errcheck

	sec := f.Section(".modinfo")
	if sec == nil {
		return ModInfo{}, fmt.Errorf("%s: no .modinfo section: not a kernel module", path)
	}

	data, err := sec.Data()
	if err != nil {
		return ModInfo{}, fmt.Errorf("%s: reading .modinfo: %w", path, err)
	}

	mi := ModInfo{Path: path}

	for _, kv := range bytes.Split(data, []byte{0}) {
		k, v, ok := strings.Cut(string(kv), "=")
		if !ok {
			continue
		}

		switch k {
		case "name":
			mi.Name = v
		case "version":
			mi.Version = v
		case "license":
			mi.License = v
		}
	}

	if mi.Name == "" {
		mi.Name = strings.ReplaceAll(strings.TrimSuffix(filepath.Base(path), ".ko"), "-", "_")
	}

	return mi, nil
}

// CheckModules checks NVIDIA's kernel modules under dir (a /usr/lib/modules tree): nvidia.ko
// must be there, every nvidia*.ko must declare the userspace driver's version, and nvidia.ko
// must declare the license of the expected kind. Modules of another version could not talk
// to the userspace (NVML fails with "driver/library version mismatch"); the other kind would
// not be what the extension's name promises.
//
// Only nvidia.ko's license tells the kinds apart: the open build's nvidia-peermem.ko declares
// "Linux-OpenIB" (open-gpu-kernel-modules kernel-open/nvidia-peermem/nvidia-peermem.c), and
// the other modules of either kind are not guaranteed to follow nvidia.ko's license.
func CheckModules(dir, driverVersion string, kind ModuleKind) ([]ModInfo, error) {
	var (
		mods []ModInfo
		errs []error
	)

	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}

		name := d.Name()
		if d.IsDir() || !strings.HasPrefix(name, "nvidia") || !strings.Contains(name, ".ko") {
			return nil
		}

		rel, _ := filepath.Rel(dir, path) //nolint:errcheck // under dir

		if !strings.HasSuffix(name, ".ko") {
			errs = append(errs, fmt.Errorf("/%s: compressed module: cannot read its .modinfo; ship it uncompressed", filepath.Join(ModulesPath, rel)))

			return nil
		}

		mi, err := ReadModInfo(path)
		if err != nil {
			errs = append(errs, fmt.Errorf("/%s: %w", filepath.Join(ModulesPath, rel), errors.Unwrap(err)))

			return nil
		}

		mi.Path = rel
		mods = append(mods, mi)

		if mi.Version != driverVersion {
			errs = append(errs, fmt.Errorf("/%s: module version %q differs from the userspace driver's %s", filepath.Join(ModulesPath, rel), mi.Version, driverVersion))
		}

		if want := kind.License(); mi.Name == KindModule && mi.License != want {
			errs = append(errs, fmt.Errorf("/%s: license %q, but %s modules declare %q", filepath.Join(ModulesPath, rel), mi.License, kind, want))
		}

		return nil
	})
	if err != nil {
		errs = append(errs, fmt.Errorf("reading kernel modules: %w", err))
	}

	found := false

	for _, m := range mods {
		if m.Name == KindModule {
			found = true
		}
	}

	if !found && err == nil {
		errs = append(errs, fmt.Errorf("/%s: no nvidia.ko under it", ModulesPath))
	}

	if len(errs) > 0 {
		return mods, fmt.Errorf("kernel modules do not match the payload:\n%w", errors.Join(errs...))
	}

	return mods, nil
}
