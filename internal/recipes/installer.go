package recipes

import (
	"fmt"
	"path"
	"regexp"
	"strings"
)

// InstallerFlags are the options of one nvidia-installer command line: --name=value as
// name: value, a bare --name as name: "" (booleans: --no-name is its own key). Every
// --override-file-type-destination=TYPE:DIR is in Overrides instead.
type InstallerFlags struct {
	Options   map[string]string
	Overrides map[string]string
}

var installerFlag = regexp.MustCompile(`--([a-z0-9-]+)(=(\S+))?`)

// ParseInstallerFlags reads the options of the nvidia-installer command in a shell script
// (from "nvidia-installer" to the end of its line continuations). vars are expanded as
// ${NAME} in values.
func ParseInstallerFlags(script string, vars map[string]string) (InstallerFlags, error) {
	_, cmd, ok := strings.Cut(script, "nvidia-installer ")
	if !ok {
		return InstallerFlags{}, fmt.Errorf("no nvidia-installer command in the script")
	}

	var lines []string

	for _, l := range strings.Split(cmd, "\n") {
		lines = append(lines, l)
		if !strings.HasSuffix(strings.TrimSpace(l), `\`) {
			break
		}
	}

	var args []string

	for _, a := range installerFlag.FindAllString(strings.Join(lines, " "), -1) {
		for k, val := range vars {
			a = strings.ReplaceAll(a, "${"+k+"}", val)
		}

		args = append(args, a)
	}

	return ParseInstallerArgs(args)
}

// ParseInstallerArgs reads nvidia-installer's arguments as a process gets them.
func ParseInstallerArgs(args []string) (InstallerFlags, error) {
	f := InstallerFlags{Options: map[string]string{}, Overrides: map[string]string{}}

	for _, a := range args {
		name, v, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.HasPrefix(a, "--") || name == "" {
			return f, fmt.Errorf("argument %q: want --name or --name=value", a)
		}

		if name == "override-file-type-destination" {
			t, dir, ok := strings.Cut(v, ":")
			if !ok {
				return f, fmt.Errorf("--override-file-type-destination=%s: want TYPE:DIR", v)
			}

			f.Overrides[t] = dir

			continue
		}

		f.Options[name] = v
	}

	return f, nil
}

// Destination is where nvidia-installer puts files of one MANIFEST type.
type Destination struct {
	// Dir is the directory (below it, a MANIFEST entry's own subdirectory for some types);
	// empty when the type is not installed.
	Dir string
	// FromManifest: the directory is the entry's path in the MANIFEST, an absolute path the
	// command line cannot move but by an override.
	FromManifest bool
	// Dropped says which option keeps the type from being installed.
	Dropped string
}

// installerDefaults are nvidia-installer's defaults (nvidia-installer.h DEFAULT_*, files.c
// get_default_prefixes_and_paths) for the options the destinations use.
var installerDefaults = map[string]string{
	"opengl-prefix": "/usr", "opengl-libdir": "lib64", "utility-prefix": "/usr", "utility-libdir": "lib64",
	"documentation-prefix": "/usr", "x-module-path": "/usr/lib64/xorg/modules", "x-sysconfig-path": "/usr/share/X11/xorg.conf.d",
	"application-profile-path": "/usr/share/nvidia", "xdg-data-dir": "/usr/share",
	"glvnd-egl-config-path": "/usr/share/glvnd/egl_vendor.d", "egl-external-platform-config-path": "/usr/share/egl/egl_external_platform.d",
	"module-signing-key-path": "/usr/share/nvidia",
}

func (f InstallerFlags) opt(name string) string {
	if v, ok := f.Options[name]; ok && v != "" {
		return v
	}

	return installerDefaults[name]
}

// InstallerDestination follows set_destinations() in nvidia-installer's files.c
// (580.119.02) and the removals install-from-cwd.c makes before it (--no-wine-files,
// systemd files unless --systemd, kernel module sources with --no-kernel-module-source),
// for the native architecture: 32-bit files need --install-compat32-libs, which the recipes
// never pass (--no-install-compat32-libs). An override wins over everything
// (set_destinations checks it first). ok is false for a type this model does not know.
func (f InstallerFlags) InstallerDestination(fileType string) (d Destination, ok bool) {
	if dir, over := f.Overrides[fileType]; over {
		return Destination{Dir: path.Clean(dir)}, true
	}

	has := func(o string) bool { _, ok := f.Options[o]; return ok }

	join := func(parts ...string) (Destination, bool) {
		return Destination{Dir: path.Clean(path.Join(parts...))}, true
	}

	switch fileType {
	case "KERNEL_MODULE_SRC", "DKMS_CONF":
		if has("no-kernel-module-source") {
			return Destination{Dropped: "--no-kernel-module-source"}, true
		}

		return join("/usr/src")
	case "KERNEL_MODULE":
		if has("no-kernel-modules") {
			return Destination{Dropped: "--no-kernel-modules"}, true
		}

		return join("/lib/modules")
	case "MODULE_SIGNING_KEY":
		// Added by the installer when it signs modules it builds (is_temporary).
		if has("no-kernel-modules") {
			return Destination{Dropped: "--no-kernel-modules"}, true
		}

		return join(f.opt("module-signing-key-path"))
	case "WINE_LIB":
		if has("no-wine-files") {
			return Destination{Dropped: "--no-wine-files"}, true
		}

		return join("/usr/lib/nvidia/wine")
	case "SYSTEMD_UNIT", "SYSTEMD_UNIT_SYMLINK", "SYSTEMD_SLEEP_SCRIPT":
		if !has("systemd") {
			return Destination{Dropped: "no --systemd"}, true
		}

		return join("/usr/lib/systemd")
	case "OPENGL_LIB", "OPENGL_SYMLINK", "GLVND_LIB", "GLVND_SYMLINK", "GLX_CLIENT_LIB", "GLX_CLIENT_SYMLINK",
		"EGL_CLIENT_LIB", "EGL_CLIENT_SYMLINK", "VDPAU_LIB", "VDPAU_SYMLINK", "CUDA_LIB", "CUDA_SYMLINK",
		"OPENCL_LIB", "OPENCL_WRAPPER_LIB", "OPENCL_LIB_SYMLINK", "OPENCL_WRAPPER_SYMLINK", "TLS_LIB",
		"NVCUVID_LIB", "NVCUVID_LIB_SYMLINK", "ENCODEAPI_LIB", "ENCODEAPI_LIB_SYMLINK", "VGX_LIB", "VGX_LIB_SYMLINK",
		"GRID_LIB", "GRID_LIB_SYMLINK", "FLEXERA_LIB", "FLEXERA_LIB_SYMLINK":
		return join(f.opt("opengl-prefix"), f.opt("opengl-libdir"))
	case "GBM_BACKEND_LIB", "GBM_BACKEND_LIB_SYMLINK":
		// op->gbm_backend_dir defaults to <default libdir>/gbm (files.c), under the OpenGL prefix.
		return join(f.opt("opengl-prefix"), "lib64", "gbm")
	case "UTILITY_LIB", "UTILITY_LIB_SYMLINK":
		return join(f.opt("utility-prefix"), f.opt("utility-libdir"))
	case "INSTALLER_BINARY", "UTILITY_BINARY", "UTILITY_BIN_SYMLINK":
		return join(f.opt("utility-prefix"), "bin")
	case "XMODULE_SHARED_LIB", "GLX_MODULE_SHARED_LIB", "GLX_MODULE_SYMLINK":
		return join(f.opt("x-module-path"))
	case "DOCUMENTATION":
		return join(f.opt("documentation-prefix"), "share/doc")
	case "MANPAGE", "NVIDIA_MODPROBE_MANPAGE":
		return join(f.opt("documentation-prefix"), "share/man")
	case "APPLICATION_PROFILE":
		return join(f.opt("application-profile-path"))
	case "DOT_DESKTOP":
		return join(f.opt("xdg-data-dir"), "applications")
	case "ICON":
		return join(f.opt("xdg-data-dir"), "icons/hicolor")
	case "XORG_OUTPUTCLASS_CONFIG":
		return join(f.opt("x-sysconfig-path"))
	case "GLVND_EGL_ICD_JSON":
		return join(f.opt("glvnd-egl-config-path"))
	case "EGL_EXTERNAL_PLATFORM_JSON":
		return join(f.opt("egl-external-platform-config-path"))
	// Destinations the installer hard-codes: only an override moves them.
	case "EXPLICIT_PATH", "NVIDIA_MODPROBE", "OPENGL_DATA":
		return Destination{FromManifest: true}, true
	case "CUDA_ICD":
		return join("/etc/OpenCL/vendors")
	case "VULKAN_ICD_JSON":
		return join("/etc/vulkan")
	case "VULKANSC_ICD_JSON":
		return join("/etc/vulkansc")
	case "INTERNAL_UTILITY_BINARY", "INTERNAL_UTILITY_LIB", "INTERNAL_UTILITY_DATA":
		return join("/usr/lib/nvidia")
	case "FIRMWARE":
		return join("/lib/firmware/nvidia")
	case "SANDBOXUTILS_FILELIST_JSON":
		return join("/usr/share/nvidia/files.d")
	}

	return Destination{}, false
}
