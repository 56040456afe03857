package recipes_test

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/internal/extension"
	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
)

// arm64Glibc is Debian's aarch64 glibc of libc6-arm64-cross (hack/dev/install-test-deps.sh).
const arm64Glibc = "/usr/aarch64-linux-gnu/lib"

// glibcFiles are the glibc stage's files, by name.
var glibcFiles = []string{"ld-linux-aarch64.so.1", "libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libresolv.so.2"}

// TestGlibcStageArm64 runs the glibc stage of a linux/arm64 build (stages/glibc/pkg.yaml
// rendered for that platform, stages/scripts/glibc.sh) in build roots of aarch64 files
// under the build machine's static busybox (Wolfi's /bin/sh is busybox too): one shaped as
// Wolfi's glibc package lays itself out (glibc.yaml: slibdir /usr/lib, rtlddir /lib on
// aarch64, rootsbindir /usr/bin, merged /lib, /lib64 and /sbin), one as a multiarch
// distribution with the x86_64 files beside the aarch64 ones. The glibc is Debian's
// aarch64 glibc (libc6-arm64-cross); libz and ldconfig are stand-ins built with the cross
// compiler (no arm64 zlib or static ldconfig here). The subroot must hold only aarch64 files
// in the arm64 layout, and its loader must run an aarch64 program with its libraries, under
// qemu-user (this machine has no binfmt_misc for aarch64). An image without aarch64 files
// fails the step.
func TestGlibcStageArm64(t *testing.T) {
	testutil.RequireRoot(t)

	for _, tool := range []string{"aarch64-linux-gnu-gcc", "qemu-aarch64-static"} {
		if _, err := exec.LookPath(tool); err != nil {
			needTool(t, tool+" (hack/dev/install-test-deps.sh installs it)")
		}
	}

	if _, err := os.Stat(filepath.Join(arm64Glibc, "libc.so.6")); err != nil {
		needTool(t, arm64Glibc+" (libc6-arm64-cross, hack/dev/install-test-deps.sh)")
	}

	busybox := staticBusybox(t)
	standIns := buildArm64StandIns(t)

	p := loadPlatform(t, "linux/arm64", nil).Pkg("nvidia-driver-glibc")
	require.NotNil(t, p)
	stageIsScripts(t, p)
	require.Equal(t, map[string]string{"SUBROOT": "/rootfs/usr/local/glibc", "ARCH": "aarch64", "GLIBC_LOADER": "lib/ld-linux-aarch64.so.1"}, p.Steps[0].Env)

	for _, tc := range []struct {
		name string
		// lib is where the image has glibc's libraries, sbin its ldconfig; decoys are
		// x86_64 files of the same names, at decoys
		lib, sbin, decoys string
		links             map[string]string
		want              string
	}{
		{name: "Wolfi's layout", lib: "usr/lib", sbin: "usr/bin", links: map[string]string{"lib": "usr/lib", "lib64": "usr/lib", "sbin": "usr/bin"}},
		{
			name: "a multiarch layout with x86_64 files", lib: "usr/lib/aarch64-linux-gnu", sbin: "usr/sbin", decoys: "usr/lib/x86_64-linux-gnu",
			links: map[string]string{"lib": "usr/lib", "sbin": "usr/sbin"},
		},
		{name: "an image without aarch64 files", decoys: "usr/lib", sbin: "usr/bin", links: map[string]string{"lib": "usr/lib", "lib64": "usr/lib"}, want: "the build image has no ld-linux-aarch64.so.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := arm64Image(t, busybox, tc.links)

			if tc.lib != "" {
				for _, f := range glibcFiles {
					copyFile(t, filepath.Join(arm64Glibc, f), filepath.Join(root, tc.lib, f))
				}

				copyFile(t, standIns.libz, filepath.Join(root, tc.lib, "libz.so.1"))
			}

			copyFile(t, standIns.ldconfig, filepath.Join(root, tc.sbin, "ldconfig"))

			if tc.decoys != "" {
				// the build machine's x86_64 glibc and libz: the libraries by the same names
				copyFile(t, "/lib64/ld-linux-x86-64.so.2", filepath.Join(root, tc.decoys, "ld-linux-x86-64.so.2"))

				for _, f := range append(glibcFiles[1:], "libz.so.1") {
					copyFile(t, filepath.Join("/lib/x86_64-linux-gnu", f), filepath.Join(root, tc.decoys, f))
				}
			}

			err := runStage(t, root, p, nil)
			if tc.want != "" {
				assert.ErrorContains(t, err, tc.want)

				return
			}

			require.NoError(t, err)

			subroot := filepath.Join(root, "rootfs", extension.SubrootPath)
			checkArm64Subroot(t, subroot)
			runInArm64Subroot(t, subroot, standIns.program)
		})
	}
}

// checkArm64Subroot: the layout of an arm64 subroot's glibc, every file an aarch64 one.
func checkArm64Subroot(t *testing.T, subroot string) {
	t.Helper()

	want := []string{"lib/ld-linux-aarch64.so.1", "sbin/ldconfig"}
	for _, f := range glibcFiles[1:] {
		want = append(want, "usr/lib64/"+f)
	}

	want = append(want, "usr/lib64/libz.so.1")

	var files []string

	require.NoError(t, filepath.WalkDir(subroot, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Type()&os.ModeSymlink != 0 {
			return err
		}

		rel, _ := filepath.Rel(subroot, p)
		files = append(files, rel)

		f, err := elf.Open(p)
		if !assert.NoError(t, err, rel) {
			return nil
		}

		defer f.Close() //nolint:errcheck

		assert.Equal(t, elf.EM_AARCH64, f.Machine, "%s: an aarch64 file", rel)

		return nil
	}))
	assert.ElementsMatch(t, want, files)

	// the loader's link in the library directory, as on amd64 (usr/lib64/<loader>)
	target, err := os.Readlink(filepath.Join(subroot, "usr/lib64/ld-linux-aarch64.so.1"))
	require.NoError(t, err)
	assert.Equal(t, "../../lib/ld-linux-aarch64.so.1", target)
	assert.FileExists(t, filepath.Join(subroot, "usr/lib64", target))
	assert.NoFileExists(t, filepath.Join(subroot, "lib64/ld-linux-x86-64.so.2"))
}

// runInArm64Subroot runs an aarch64 program with the subroot's loader and libraries, as the
// userspace stage's test step lists its programs (userspace.sh step_test), under qemu-user.
func runInArm64Subroot(t *testing.T, subroot, program string) {
	t.Helper()

	loader := filepath.Join(subroot, "lib/ld-linux-aarch64.so.1")
	libs := filepath.Join(subroot, "usr/lib64")

	out, err := exec.Command("qemu-aarch64-static", loader, "--library-path", libs, "--list", program).CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.NotContains(t, string(out), "not found")

	for _, lib := range []string{"libz.so.1", "libm.so.6", "libc.so.6"} {
		assert.Contains(t, string(out), lib+" => "+filepath.Join(libs, lib), "%s from the subroot", lib)
	}

	out, err = exec.Command("qemu-aarch64-static", loader, "--library-path", libs, program).CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Equal(t, "stand-in libz, cos(0) = 1\n", string(out))
}

type arm64StandIns struct {
	// libz.so.1 (a stand-in exporting zlibVersion), a static "ldconfig", and a program
	// that needs libz, libm and libc
	libz, ldconfig, program string
}

// buildArm64StandIns builds the stand-ins with Debian's aarch64 cross compiler.
func buildArm64StandIns(t *testing.T) arm64StandIns {
	t.Helper()

	dir := t.TempDir()
	write := func(name, src string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(src), 0o644))

		return p
	}

	s := arm64StandIns{libz: filepath.Join(dir, "libz.so.1"), ldconfig: filepath.Join(dir, "ldconfig"), program: filepath.Join(dir, "program")}

	run(t, dir, "aarch64-linux-gnu-gcc", "-shared", "-fPIC", "-Wl,-soname,libz.so.1", "-o", s.libz,
		write("libz.c", "/* test stand-in, not zlib */\nconst char *zlibVersion(void) { return \"stand-in libz\"; }\n"))
	run(t, dir, "aarch64-linux-gnu-gcc", "-static", "-o", s.ldconfig,
		write("ldconfig.c", "/* test stand-in, not glibc's ldconfig */\n#include <stdio.h>\nint main(void) { puts(\"stand-in ldconfig\"); return 0; }\n"))
	run(t, dir, "aarch64-linux-gnu-gcc", "-o", s.program, write("program.c", `#include <math.h>
#include <stdio.h>
#include <stdlib.h>
const char *zlibVersion(void);
int main(int argc, char **argv) { printf("%s, cos(0) = %.0f\n", zlibVersion(), cos(atof(argc > 1 ? argv[1] : "0"))); return 0; }
`), s.libz, "-lm")

	return s
}

// arm64Image is a build root with the build machine's static busybox as its programs.
func arm64Image(t *testing.T, busybox string, links map[string]string) string {
	t.Helper()

	root := filepath.Join(t.TempDir(), "image")

	for _, d := range []string{"usr/bin", "usr/sbin", "usr/lib", "usr/libexec", "etc", "tmp", "dev"} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, d), 0o755))
	}

	require.NoError(t, os.Chmod(filepath.Join(root, "tmp"), 0o1777))

	for link, target := range links {
		require.NoError(t, os.Symlink(target, filepath.Join(root, link)))
	}

	if _, ok := links["bin"]; !ok {
		require.NoError(t, os.Symlink("usr/bin", filepath.Join(root, "bin")))
	}

	copyFile(t, busybox, filepath.Join(root, "usr/bin/busybox"))

	for _, applet := range []string{"sh", "cp", "ln", "mkdir", "chmod"} {
		require.NoError(t, os.Symlink("busybox", filepath.Join(root, "usr/bin", applet)))
	}

	// the scripts stage's output (stages/scripts/pkg.yaml)
	run(t, "", "cp", "-a", filepath.Join(testutil.RepoRoot(t), "stages", "scripts")+"/.", filepath.Join(root, "usr/libexec/nvidia-driver"))

	return root
}

// staticBusybox is the build machine's busybox, if static (busybox-static).
func staticBusybox(t *testing.T) string {
	t.Helper()

	const p = "/bin/busybox"

	f, err := elf.Open(p)
	if err != nil {
		needTool(t, p+" (busybox-static, make deps)")
	}

	defer f.Close() //nolint:errcheck

	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			needTool(t, p+" static (busybox-static, make deps), not a dynamic one")
		}
	}

	return p
}

// needTool skips a test for a missing tool, except in CI (testutil.RequireRoot's rule).
func needTool(t *testing.T, what string) {
	t.Helper()

	if os.Getenv("CI") != "" {
		t.Fatalf("needs %s", what)
	}

	t.Skipf("needs %s", what)
}
