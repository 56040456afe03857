package recipes_test

import (
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
)

// testArchive is what the userspace stages download, made from Debian's NVIDIA packages of
// the development subroot (hack/dev/build-subroot.sh): nvidia_driver-linux-x86_64-<v>-archive/
// with the directories siderolabs' nvidia-pkgs stage and ours copy (bin, etc, firmware, lib,
// sbin, share, supported-gpus, systemd, man/man1, docs, tests/glvnd, LICENSE, CHANGELOG,
// README, MANIFEST), the MANIFEST in the .run's .manifest format (install-from-cwd.c
// parse_manifest) naming the files as the flattened assets/ directory holds them; and the
// fabric manager archive's layout (bin, lib, share/nvidia/nvswitch, etc).
type testArchive struct {
	Driver, FabricManager string // the two .tar.xz files
	Version               string
}

// standIn marks the files the Debian packages have no counterpart for: each exists so that a
// file type the installer routes by a path it hard-codes (or a directory the stage copies)
// is exercised, and says what it is.
func standIn(what string) []byte {
	return []byte("test stand-in, not NVIDIA's file: " + what + "\n")
}

func buildTestArchive(t *testing.T, installer string) testArchive {
	t.Helper()

	testutil.Subroot(t) // downloads the packages into the cache as well

	debs := filepath.Join(testutil.RepoRoot(t), ".cache", "debs")
	if d := os.Getenv("CACHE_DIR"); d != "" {
		debs = filepath.Join(d, "debs")
	}

	work := t.TempDir()
	pkgs := filepath.Join(work, "pkgs")

	for _, p := range []string{"libnvidia-ml1", "nvidia-smi", "libcuda1", "libnvidia-cfg1", "libnvidia-ptxjitcompiler1", "nvidia-persistenced",
		"libtirpc3", "libgssapi-krb5-2", "libkrb5-3", "libk5crypto3", "libcom-err2", "libkrb5support0", "libkeyutils1"} {
		matches, _ := filepath.Glob(filepath.Join(debs, p+"_*.deb")) //nolint:errcheck // the pattern is valid
		require.Len(t, matches, 1, "%s in %s (hack/dev/build-subroot.sh downloads it)", p, debs)
		run(t, "", "dpkg-deb", "-x", matches[0], pkgs)
	}

	nv := filepath.Join(pkgs, "usr/lib/x86_64-linux-gnu/nvidia/current")
	libs, _ := filepath.Glob(filepath.Join(nv, "libnvidia-ml.so.*.*")) //nolint:errcheck // the pattern is valid
	require.Len(t, libs, 1)
	v := strings.TrimPrefix(filepath.Base(libs[0]), "libnvidia-ml.so.")

	top := "nvidia_driver-linux-x86_64-" + v + "-archive"
	a := filepath.Join(work, "driver", top)
	multi := filepath.Join(pkgs, "usr/lib/x86_64-linux-gnu")

	// path in the archive -> source file (or content)
	files := map[string]string{
		"bin/nvidia-installer":                       installer,
		"bin/nvidia-smi":                             filepath.Join(pkgs, "usr/lib/nvidia/current/nvidia-smi"),
		"sbin/nvidia-persistenced":                   filepath.Join(pkgs, "usr/bin/nvidia-persistenced"),
		"man/man1/nvidia-smi.1.gz":                   filepath.Join(pkgs, "usr/lib/nvidia/current/nvidia-smi.1.gz"),
		"systemd/system/nvidia-persistenced.service": filepath.Join(pkgs, "lib/systemd/system/nvidia-persistenced.service"),
		"LICENSE":        filepath.Join(pkgs, "usr/share/doc/libnvidia-ml1/copyright"),
		"docs/copyright": filepath.Join(pkgs, "usr/share/doc/libcuda1/copyright"),
	}

	manifest := []string{
		"NVIDIA Accelerated Graphics Driver for Linux-x86_64 (test archive from Debian's packages)", v, "",
		"nvidia nvidia-uvm nvidia-modeset nvidia-drm nvidia-peermem", "", "", "", "",
		"nvidia-installer 0755 INSTALLER_BINARY",
		"nvidia-smi 0755 UTILITY_BINARY",
		"nvidia-persistenced 0755 UTILITY_BINARY",
		"nvidia-smi.1.gz 0644 MANPAGE man1",
		"LICENSE 0644 DOCUMENTATION NVIDIA_GLX-1.0",
		"NVIDIA_Changelog 0644 DOCUMENTATION NVIDIA_GLX-1.0",
		"README.txt 0644 DOCUMENTATION NVIDIA_GLX-1.0",
		"html/copyright 0644 DOCUMENTATION NVIDIA_GLX-1.0/html",
		"systemd/system/nvidia-persistenced.service 0644 SYSTEMD_UNIT",
		"kernel/nvidia.c 0644 KERNEL_MODULE_SRC INHERIT_PATH_DEPTH:1 MODULE:resman",
		"libcuda.so." + v + " 0755 CUDA_LIB NATIVE / MODULE:gpgpu",
		"libcuda.so.1 0000 CUDA_SYMLINK NATIVE / libcuda.so." + v + " MODULE:gpgpu",
		"libcuda.so 0000 CUDA_SYMLINK NATIVE / libcuda.so.1 MODULE:gpgpu",
		"32/libcuda.so." + v + " 0755 CUDA_LIB COMPAT32 / MODULE:gpgpu",
	}

	for _, lib := range []string{"libnvidia-ml", "libcuda", "libnvidia-cfg", "libnvidia-ptxjitcompiler"} {
		files["lib/"+lib+".so."+v] = filepath.Join(nv, lib+".so."+v)
		if lib != "libcuda" {
			manifest = append(manifest, lib+".so."+v+" 0755 UTILITY_LIB NATIVE", lib+".so.1 0000 UTILITY_LIB_SYMLINK NATIVE "+lib+".so."+v)
		}
	}

	// Debian builds nvidia-persistenced against libtirpc (NVIDIA's links it in): the test
	// archive carries that library chain as utility libraries.
	for _, lib := range []string{"libtirpc.so.3", "libgssapi_krb5.so.2", "libkrb5.so.3", "libk5crypto.so.3", "libcom_err.so.2", "libkrb5support.so.0", "libkeyutils.so.1"} {
		src := filepath.Join(multi, lib)
		if _, err := os.Stat(src); err != nil {
			src = filepath.Join(pkgs, "lib/x86_64-linux-gnu", lib)
		}

		files["lib/"+lib] = src
		manifest = append(manifest, lib+" 0644 UTILITY_LIB NATIVE")
	}

	// One entry of each type whose destination the installer hard-codes and the stage
	// overrides, and the directories the stage copies that Debian has nothing for.
	stand := map[string]string{
		"etc/nvidia.icd":                     "CUDA_ICD",
		"etc/nvidia_icd.json":                "VULKAN_ICD_JSON icd.d",
		"share/nvoptix.bin":                  "OPENGL_DATA /usr/share/nvidia",
		"share/sandboxutils-filelist.json":   "SANDBOXUTILS_FILELIST_JSON /usr/share/nvidia/files.d",
		"share/nvidia-pcc-data":              "INTERNAL_UTILITY_DATA",
		"share/nvidia-explicit":              "EXPLICIT_PATH /usr/share/nvidia-explicit",
		"firmware/gsp_ga10x.bin":             "FIRMWARE INHERIT_PATH_DEPTH:1",
		"supported-gpus/supported-gpus.json": "",
		"tests/glvnd/glvnd_check":            "",
		"README":                             "",
	}

	for p, entry := range stand {
		dst := filepath.Join(a, p)
		require.NoError(t, os.MkdirAll(filepath.Dir(dst), 0o755))
		require.NoError(t, os.WriteFile(dst, standIn(p), 0o644))

		if entry == "" {
			continue
		}

		typ, rest, _ := strings.Cut(entry, " ")
		name := filepath.Base(p)

		if typ == "FIRMWARE" {
			name = "firmware/" + name // the .run keeps firmware/ (the stage copies the directory)
		}

		manifest = append(manifest, strings.TrimSpace(name+" 0644 "+typ+" "+rest))
	}

	for p, src := range files {
		copyFile(t, src, filepath.Join(a, p))
	}

	changelog := filepath.Join(a, "CHANGELOG")
	gunzip(t, filepath.Join(pkgs, "usr/share/doc/libnvidia-ml1/changelog.gz"), changelog)
	require.NoError(t, os.WriteFile(filepath.Join(a, "MANIFEST"), []byte(strings.Join(manifest, "\n")+"\n"), 0o644))

	// The fabric manager archive: Debian's packages of the subroot have no nv-fabricmanager.
	// Its programs are the subroot's nvidia-smi under their names (an ELF program that needs
	// only the subroot's libraries, which is what the stage's test checks of them); its
	// library, topology file and configuration are stand-ins.
	fmTop := "fabricmanager-linux-x86_64-" + v + "-archive"
	fm := filepath.Join(work, "fm", fmTop)

	for _, p := range []string{"bin/nv-fabricmanager", "bin/nvswitch-audit"} {
		copyFile(t, files["bin/nvidia-smi"], filepath.Join(fm, p))
	}

	for p, what := range map[string]string{"lib/libnvfm.so." + v: "libnvfm", "share/nvidia/nvswitch/dgx2_hgx2_topology": "a topology file", "etc/fabricmanager.cfg": "fabricmanager.cfg"} {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(fm, p)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(fm, p), standIn(what), 0o644))
	}

	require.NoError(t, os.Symlink("libnvfm.so."+v, filepath.Join(fm, "lib/libnvfm.so.1")))

	out := testArchive{Driver: filepath.Join(work, "nvidia.tar.xz"), FabricManager: filepath.Join(work, "fabricmanager.tar.xz"), Version: v}
	// xz as NVIDIA's archives are, at the fastest level (the test is not about size)
	t.Setenv("XZ_OPT", "-0 -T2")
	run(t, "", "tar", "-C", filepath.Join(work, "driver"), "-cJf", out.Driver, top)
	run(t, "", "tar", "-C", filepath.Join(work, "fm"), "-cJf", out.FabricManager, fmTop)

	return out
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(dst), 0o755))
	run(t, "", "cp", "-L", "--preserve=mode", src, dst)
}

func gunzip(t *testing.T, src, dst string) {
	t.Helper()

	f, err := os.Open(src)
	require.NoError(t, err)

	defer f.Close() //nolint:errcheck

	zr, err := gzip.NewReader(f)
	require.NoError(t, err)

	out, err := os.Create(dst)
	require.NoError(t, err)

	defer out.Close() //nolint:errcheck

	_, err = io.Copy(out, zr) //nolint:gosec // a package's changelog
	require.NoError(t, err)
}

// run runs a command on the build machine, failing the test with its output.
func run(t *testing.T, dir string, name string, args ...string) string {
	t.Helper()

	cmd := exec.Command(name, args...)
	cmd.Dir = dir

	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s %s: %s", name, strings.Join(args, " "), out)

	return string(out)
}

// buildImage makes a build root standing in for the stages' image (Wolfi, by digest): one
// directory tree, so the install step's `find / -xdev` sees all of it, with the build
// machine's bash, coreutils, findutils, grep, tar and xz, their libraries, glibc's static
// ldconfig and libz (the glibc stage's apk install of zlib), /usr merged as Debian's.
func buildImage(t *testing.T) string {
	t.Helper()

	root := filepath.Join(t.TempDir(), "image")

	for _, d := range []string{"usr/bin", "usr/sbin", "usr/lib", "usr/lib64", "etc", "tmp", "dev", "var/lib", "usr/libexec"} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, d), 0o755))
	}

	require.NoError(t, os.Chmod(filepath.Join(root, "tmp"), 0o1777))

	for _, l := range []string{"bin", "sbin", "lib", "lib64"} {
		require.NoError(t, os.Symlink("usr/"+l, filepath.Join(root, l)))
	}

	run(t, "", "mknod", "-m", "0666", filepath.Join(root, "dev/null"), "c", "1", "3")

	tools := []string{"bash", "sh", "env", "cp", "mkdir", "ln", "rm", "chmod", "touch", "find", "tar", "xz", "grep", "readlink",
		"cat", "install", "cut", "tr", "head", "true", "mv", "ls", "sed", "basename", "dirname", "sort"}

	var paths []string

	for _, tool := range tools {
		p, err := exec.LookPath(tool)
		require.NoError(t, err, "the build machine's %s", tool)

		paths = append(paths, p)
	}

	for _, p := range paths {
		out, err := exec.Command("ldd", p).Output()
		if err != nil {
			continue // static
		}

		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			switch {
			case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
				paths = append(paths, f[2])
			case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
				paths = append(paths, f[0])
			}
		}
	}

	// glibc as the image has it (Wolfi's glibc package; here the build machine's, Debian's),
	// its static ldconfig, and libz (the glibc stage's apk install of zlib).
	paths = append(paths, "/sbin/ldconfig", "/lib/x86_64-linux-gnu/libz.so.1")
	for _, lib := range []string{"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libresolv.so.2"} {
		paths = append(paths, "/lib/x86_64-linux-gnu/"+lib)
	}

	for _, p := range paths {
		dst := filepath.Join(root, p)
		if _, err := os.Lstat(dst); err == nil {
			continue
		}

		require.NoError(t, os.MkdirAll(filepath.Dir(dst), 0o755))
		run(t, "", "cp", "-L", "--preserve=mode", p, dst)
	}

	// The nvidia-driver-scripts stage's output.
	scripts := filepath.Join(root, "usr/libexec/nvidia-driver")
	run(t, "", "cp", "-a", filepath.Join(testutil.RepoRoot(t), "stages", "scripts")+"/.", scripts)

	return root
}

// chroot runs one instruction of a step as bldr does (convert/node.go stepScripts: the
// package's shell -c instruction, in the step's directory /tmp/build, with the step's
// environment and PKG_NAME), inside root.
func chroot(root, shell, instruction string, env map[string]string) (string, error) {
	cmd := exec.Command(shell, "-c", instruction)
	cmd.SysProcAttr = chrootAttr(root)
	cmd.Dir = "/tmp/build"
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}

	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}

	if err := os.MkdirAll(filepath.Join(root, "tmp/build"), 0o755); err != nil {
		return "", err
	}

	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s -c %q: %w\n%s", shell, instruction, err, out)
	}

	return string(out), nil
}
