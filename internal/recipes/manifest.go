package recipes

import (
	"bufio"
	"fmt"
	"io"
	"path"
	"strconv"
	"strings"
)

// manifestFields says which optional fields a MANIFEST entry of each file type carries, from
// the capability columns of packageEntryFileTypeTable in nvidia-installer's manifest.c
// (580.119.02): a has_arch (NATIVE or COMPAT32), p has_path (a directory word), s
// is_symlink (a target word), i inherit_path (an INHERIT_PATH_DEPTH:n word; the directory
// is the entry's own, less n leading components).
var manifestFields = map[string]string{
	"KERNEL_MODULE_SRC": "i", "KERNEL_MODULE": "", "CUDA_ICD": "", "OPENGL_LIB": "a", "WINE_LIB": "a", "CUDA_LIB": "ap", "OPENCL_LIB": "ap",
	"OPENCL_WRAPPER_LIB": "ap", "OPENCL_LIB_SYMLINK": "aps", "OPENCL_WRAPPER_SYMLINK": "aps", "TLS_LIB": "ap", "UTILITY_LIB": "a", "GBM_BACKEND_LIB": "a",
	"DOCUMENTATION": "p", "APPLICATION_PROFILE": "p", "MANPAGE": "p", "EXPLICIT_PATH": "p", "OPENGL_SYMLINK": "as", "CUDA_SYMLINK": "aps",
	"UTILITY_LIB_SYMLINK": "as", "GBM_BACKEND_LIB_SYMLINK": "as", "INSTALLER_BINARY": "", "UTILITY_BINARY": "", "UTILITY_BIN_SYMLINK": "s",
	"DOT_DESKTOP": "p", "ICON": "p", "XMODULE_SHARED_LIB": "p", "GLX_MODULE_SHARED_LIB": "p", "GLX_MODULE_SYMLINK": "ps", "VDPAU_LIB": "ap",
	"VDPAU_SYMLINK": "aps", "NVCUVID_LIB": "a", "NVCUVID_LIB_SYMLINK": "as", "ENCODEAPI_LIB": "a", "ENCODEAPI_LIB_SYMLINK": "as", "VGX_LIB": "",
	"VGX_LIB_SYMLINK": "s", "GRID_LIB": "p", "GRID_LIB_SYMLINK": "ps", "NVIDIA_MODPROBE": "p", "NVIDIA_MODPROBE_MANPAGE": "p", "MODULE_SIGNING_KEY": "",
	"XORG_OUTPUTCLASS_CONFIG": "", "DKMS_CONF": "i", "GLVND_LIB": "a", "GLVND_SYMLINK": "as", "GLX_CLIENT_LIB": "a", "GLX_CLIENT_SYMLINK": "as",
	"VULKAN_ICD_JSON": "p", "GLVND_EGL_ICD_JSON": "", "EGL_CLIENT_LIB": "a", "EGL_CLIENT_SYMLINK": "as", "EGL_EXTERNAL_PLATFORM_JSON": "", "FLEXERA_LIB": "p",
	"FLEXERA_LIB_SYMLINK": "ps", "INTERNAL_UTILITY_BINARY": "a", "INTERNAL_UTILITY_LIB": "a", "INTERNAL_UTILITY_DATA": "", "FIRMWARE": "i",
	"SYSTEMD_UNIT": "", "SYSTEMD_UNIT_SYMLINK": "ps", "SYSTEMD_SLEEP_SCRIPT": "", "OPENGL_DATA": "p", "VULKANSC_ICD_JSON": "p",
	"SANDBOXUTILS_FILELIST_JSON": "p",
}

// entryPathTypes are the types whose destination set_destinations (files.c, 580.119.02)
// builds as prefix/dir/<entry path>/name; the others drop the entry's path (or, for
// EXPLICIT_PATH, NVIDIA_MODPROBE and OPENGL_DATA, take it as the whole directory).
var entryPathTypes = map[string]bool{
	"KERNEL_MODULE_SRC": true, "DKMS_CONF": true, "VDPAU_LIB": true, "VDPAU_SYMLINK": true, "CUDA_LIB": true, "CUDA_SYMLINK": true,
	"OPENCL_LIB": true, "OPENCL_WRAPPER_LIB": true, "OPENCL_LIB_SYMLINK": true, "OPENCL_WRAPPER_SYMLINK": true,
	"XMODULE_SHARED_LIB": true, "GLX_MODULE_SHARED_LIB": true, "GLX_MODULE_SYMLINK": true, "TLS_LIB": true,
	"GRID_LIB": true, "GRID_LIB_SYMLINK": true, "FLEXERA_LIB": true, "FLEXERA_LIB_SYMLINK": true, "DOCUMENTATION": true,
	"MANPAGE": true, "NVIDIA_MODPROBE_MANPAGE": true, "ICON": true, "VULKAN_ICD_JSON": true, "VULKANSC_ICD_JSON": true,
	"FIRMWARE": true, "SYSTEMD_UNIT_SYMLINK": true,
}

// ManifestFileTypes lists the file types a MANIFEST may name.
func ManifestFileTypes() []string {
	out := make([]string, 0, len(manifestFields))
	for t := range manifestFields {
		out = append(out, t)
	}

	return out
}

// Manifest is an installer package's MANIFEST (the .run's .manifest).
type Manifest struct {
	Description, Version string
	// KernelModules is the fourth line's list.
	KernelModules []string
	Entries       []ManifestEntry
}

// ManifestEntry is one file line of a MANIFEST.
type ManifestEntry struct {
	// File is the path in the package directory; Name its last element.
	File, Name string
	Mode       uint32
	Type       string
	// Arch is NATIVE or COMPAT32 for the types that carry one.
	Arch string
	// Path is the entry's directory word, or the one it inherits.
	Path string
	// Target is a symbolic link's target.
	Target string
}

// ParseManifest reads a MANIFEST as nvidia-installer's parse_manifest (install-from-cwd.c,
// 580.119.02) does: eight header lines (description, version, one ignored, the kernel
// modules, four ignored), then one entry a line up to the first empty line. A malformed
// entry is an error naming its line, as the installer's "Invalid .manifest file; error on
// line N" is.
func ParseManifest(r io.Reader) (Manifest, error) {
	var m Manifest

	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)

	line := 0

	for ; line < 8; line++ {
		if !sc.Scan() {
			return m, fmt.Errorf("MANIFEST line %d: want 8 header lines: %w", line+1, eofErr(sc.Err()))
		}

		switch line {
		case 0:
			m.Description = sc.Text()
		case 1:
			m.Version = strings.TrimSpace(sc.Text())
		case 3:
			m.KernelModules = strings.Fields(sc.Text())
		}
	}

	for sc.Scan() {
		line++

		if sc.Text() == "" {
			break
		}

		e, err := parseEntry(strings.Fields(sc.Text()))
		if err != nil {
			return m, fmt.Errorf("MANIFEST line %d: %w", line, err)
		}

		m.Entries = append(m.Entries, e)
	}

	return m, sc.Err()
}

func eofErr(err error) error {
	if err != nil {
		return err
	}

	return io.ErrUnexpectedEOF
}

func parseEntry(words []string) (ManifestEntry, error) {
	var e ManifestEntry

	next := func(what string) (string, error) {
		if len(words) == 0 {
			return "", fmt.Errorf("%s %s: no %s", e.File, e.Type, what)
		}

		w := words[0]
		words = words[1:]

		return w, nil
	}

	var err error

	if e.File, err = next("file name"); err != nil {
		return e, err
	}

	mode, err := next("mode")
	if err != nil {
		return e, err
	}

	m, err := strconv.ParseUint(mode, 8, 32)
	if err != nil {
		return e, fmt.Errorf("%s: mode %q is not octal", e.File, mode)
	}

	e.Mode = uint32(m)

	if e.Type, err = next("file type"); err != nil {
		return e, err
	}

	fields, ok := manifestFields[e.Type]
	if !ok {
		return e, fmt.Errorf("%s: unknown file type %q", e.File, e.Type)
	}

	if strings.Contains(fields, "a") {
		if e.Arch, err = next("architecture"); err != nil {
			return e, err
		}

		if e.Arch != "NATIVE" && e.Arch != "COMPAT32" {
			return e, fmt.Errorf("%s: architecture %q, want NATIVE or COMPAT32", e.File, e.Arch)
		}
	}

	switch {
	case strings.Contains(fields, "p"):
		if e.Path, err = next("path"); err != nil {
			return e, err
		}
	case strings.Contains(fields, "i"):
		depth, err := next("INHERIT_PATH_DEPTH")
		if err != nil {
			return e, err
		}

		n, err := strconv.Atoi(strings.TrimPrefix(depth, "INHERIT_PATH_DEPTH:"))
		if !strings.HasPrefix(depth, "INHERIT_PATH_DEPTH:") || err != nil {
			return e, fmt.Errorf("%s: %q, want INHERIT_PATH_DEPTH:n", e.File, depth)
		}

		parts := strings.Split(path.Dir(e.File), "/")
		if !strings.Contains(e.File, "/") || n > len(parts) {
			return e, fmt.Errorf("%s: INHERIT_PATH_DEPTH:%d, deeper than its directory", e.File, n)
		}

		e.Path = strings.Join(parts[n:], "/")
	}

	if strings.Contains(fields, "s") {
		if e.Target, err = next("symbolic link target"); err != nil {
			return e, err
		}
	}

	e.Name = path.Base(e.File)

	return e, nil
}

// EntryDestination is where the installer puts one entry (set_destinations, files.c):
// override/name when the type's destination is overridden; <entry path>/name for the types
// whose MANIFEST path is their directory; else the type's directory, the entry's path for the
// types that keep it, and the name. dropped names the option that keeps it from being
// installed; 32-bit entries are dropped by --no-install-compat32-libs.
func (f InstallerFlags) EntryDestination(e ManifestEntry) (dst, dropped string, err error) {
	if _, over := f.Overrides[e.Type]; !over && e.Arch == "COMPAT32" {
		if _, ok := f.Options["no-install-compat32-libs"]; ok {
			return "", "--no-install-compat32-libs", nil
		}

		return "", "", fmt.Errorf("%s: a 32-bit file, which this model does not place: pass --no-install-compat32-libs", e.File)
	}

	d, ok := f.InstallerDestination(e.Type)

	switch {
	case !ok:
		return "", "", fmt.Errorf("%s: file type %s has no destination in the model", e.File, e.Type)
	case d.Dropped != "":
		return "", d.Dropped, nil
	case d.FromManifest:
		return path.Join(e.Path, e.Name), "", nil
	}

	if _, over := f.Overrides[e.Type]; !over && entryPathTypes[e.Type] {
		return path.Join(d.Dir, e.Path, e.Name), "", nil
	}

	return path.Join(d.Dir, e.Name), "", nil
}
