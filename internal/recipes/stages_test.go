package recipes_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/internal/extension"
	"github.com/talos-nvidia/nvidia-driver/internal/recipes"
	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
)

func chrootAttr(root string) *syscall.SysProcAttr { return &syscall.SysProcAttr{Chroot: root} }

// goBuild builds a static program of this module for the build roots.
func goBuild(t *testing.T, pkg string) string {
	t.Helper()

	out := filepath.Join(t.TempDir(), filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, pkg)
	cmd.Dir = testutil.RepoRoot(t)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")

	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build %s: %s", pkg, b)

	return out
}

// runStage runs every step of a loaded package in root, in bldr's order (prepare, build,
// install, test), with the step's environment; env overrides it.
func runStage(t *testing.T, root string, p *recipes.Pkg, env map[string]string) error {
	t.Helper()

	for _, step := range p.Steps {
		e := map[string]string{"PKG_NAME": p.Name}
		for k, v := range step.Env {
			e[k] = v
		}

		for k, v := range env {
			e[k] = v
		}

		for _, phase := range [][]string{step.Prepare, step.Build, step.Install, step.Test} {
			for _, instr := range phase {
				out, err := chroot(root, p.Shell, instr, e)
				t.Logf("%s: %s\n%s", p.Name, instr, out)

				if err != nil {
					return err
				}
			}
		}
	}

	return nil
}

// stageIsScripts: every instruction of the stages the test runs calls a stage script, so
// that running the scripts is running the recipe's shell.
func stageIsScripts(t *testing.T, p *recipes.Pkg) {
	t.Helper()

	for _, step := range p.Steps {
		for _, phase := range [][]string{step.Prepare, step.Build, step.Install, step.Test} {
			for _, instr := range phase {
				assert.Regexp(t, `^/usr/libexec/nvidia-driver/[a-z]+\.sh( [a-z-]+)?$`, strings.TrimSpace(instr), "%s: the shell lives in stages/scripts", p.Name)
			}
		}
	}

	assert.Contains(t, p.Dependencies, recipes.Dependency{Stage: "nvidia-driver-scripts"}, "%s gets the scripts", p.Name)
}

// TestStageScripts runs the recipes' stage scripts as bldr would run them, in a build root
// of one file system (chroot), on a test archive shaped as NVIDIA's redist archive and made
// from Debian's NVIDIA packages, with a model of nvidia-installer (hack/release/installer-model) in
// the installer's place: the glibc stage, the userspace stage (prepare, installer, escape
// check, fabric manager, ldconfig, its own test), then the final stage of a flavor (the
// modules, the project's validator) for each release. The subroot must pass check-root; a
// recipe that lets the installer write outside it must fail its own install step.
func TestStageScripts(t *testing.T) {
	testutil.RequireRoot(t)

	if testing.Short() {
		t.Skip("builds two test archives and runs the stages")
	}

	top := testutil.RepoRoot(t)
	opts := testutil.DevExtension(t) // make build's outputs, or a skip
	archive := buildTestArchive(t, goBuild(t, "./hack/release/installer-model"))
	validator := goBuild(t, "./hack/release/extension")
	service := testutil.ServiceBinary(t)

	rs := releases(t)
	tr := load(t, nil)
	glibcPkg := tr.Pkg("nvidia-driver-glibc")
	require.NotNil(t, glibcPkg)
	stageIsScripts(t, glibcPkg)

	// nvidia-driver-glibc: its output (/rootfs) becomes part of the userspace stage's root.
	glibcRoot := buildImage(t)
	require.NoError(t, runStage(t, glibcRoot, glibcPkg, nil))

	userspace := func(t *testing.T, branch string, edit func(script string) string) (string, error) {
		t.Helper()

		p := tr.Pkg("nvidia-userspace-" + branch)
		require.NotNil(t, p)
		stageIsScripts(t, p)

		root := buildImage(t)
		run(t, "", "cp", "-a", filepath.Join(glibcRoot, "rootfs"), filepath.Join(root, "rootfs"))
		require.NoError(t, os.MkdirAll(filepath.Join(root, "tmp/build"), 0o755))

		for src, dst := range map[string]string{archive.Driver: p.Steps[0].Sources[0].Destination, archive.FabricManager: p.Steps[0].Sources[1].Destination} {
			run(t, "", "cp", src, filepath.Join(root, "tmp/build", dst))
		}

		if edit != nil {
			script := filepath.Join(root, "usr/libexec/nvidia-driver/userspace.sh")
			data, err := os.ReadFile(script)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(script, []byte(edit(string(data))), 0o755))
		}

		// The archive is Debian's driver version, not the release's.
		return root, runStage(t, root, p, map[string]string{"NVIDIA_DRIVER_VERSION": archive.Version})
	}

	t.Run("an escape fails the install step", func(t *testing.T) {
		// Without the CUDA_ICD override the installer puts nvidia.icd in /etc/OpenCL/vendors
		// (files.c set_destinations), outside the subroot.
		_, err := userspace(t, "production", func(s string) string {
			out := strings.Replace(s, "--override-file-type-destination=CUDA_ICD:${SUBROOT}/etc/OpenCL/vendors \\\n", "", 1)
			require.NotEqual(t, s, out, "the CUDA_ICD override is in userspace.sh")

			return out
		})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "nvidia-installer wrote outside the subroot:\n/etc/OpenCL/vendors/nvidia.icd")
	})

	for _, b := range recipes.Branches {
		t.Run(b, func(t *testing.T) {
			root, err := userspace(t, b, nil)
			require.NoError(t, err)

			subroot := filepath.Join(root, "rootfs", extension.SubrootPath)

			out, err := exec.Command(service, "check-root", subroot).CombinedOutput()
			require.NoError(t, err, "nvidia-driver check-root %s:\n%s", subroot, out)
			assert.Contains(t, string(out), "driver version: "+archive.Version)

			// Every file type the stage overrides landed in the subroot or the firmware directory.
			for _, p := range []string{
				"etc/OpenCL/vendors/nvidia.icd", "etc/vulkan/icd.d/nvidia_icd.json", "usr/share/nvidia/nvoptix.bin",
				"usr/share/nvidia/files.d/sandboxutils-filelist.json", "usr/lib/nvidia/nvidia-pcc-data",
				"usr/share/nvidia/explicit-path/nvidia-explicit", "usr/bin/nvidia-installer", "usr/lib64/libcuda.so.1",
				"usr/share/nvidia/nvswitch/fabricmanager.cfg", "usr/bin/nv-fabricmanager", "etc/ld.so.cache",
			} {
				assert.FileExists(t, filepath.Join(subroot, p))
			}

			assert.FileExists(t, filepath.Join(root, "rootfs", extension.FirmwarePath, archive.Version, "gsp_ga10x.bin"))
			assert.NoDirExists(t, filepath.Join(subroot, "usr/lib/systemd"), "--no-systemd")
			assert.NoDirExists(t, filepath.Join(subroot, "usr/src"), "--no-kernel-module-source")

			// The flavors' final stage on this branch's subroot, for each release.
			for _, f := range recipes.Flavors() {
				if f.Branch != b {
					continue
				}

				for _, r := range rs {
					if f.Modules == "proprietary" && r.Talos != rs[0].Talos {
						continue // one module kind per older release keeps the run short
					}

					t.Run(f.Name+"/"+r.Talos, func(t *testing.T) {
						flavor(t, top, load(t, map[string]string{"TALOS_VERSION": r.Talos}).Pkg(f.Name), f, r, root, archive.Version, validator, opts)
					})
				}
			}
		})
	}
}

// flavor runs a flavor's final stage: a build root with the userspace stage's /rootfs, the
// binaries stage's output (stages/scripts/binaries-install.sh on make build's outputs), the
// release's modules (test objects with NVIDIA's .modinfo fields) and the rendered manifest in
// /pkg. siderolabs' extensions-validator is not built here (hack/release/siderolabs-validator.sh
// runs it by hand): a stand-in at /extensions-validator records the arguments the step
// gives it; the project's validator runs for real.
func flavor(t *testing.T, top string, p *recipes.Pkg, f recipes.Flavor, r recipes.Release, userspaceRoot, version, validator string, opts extension.Options) {
	t.Helper()
	require.NotNil(t, p)
	stageIsScripts(t, p)

	root := buildImage(t)
	run(t, "", "cp", "-a", filepath.Join(userspaceRoot, "rootfs"), filepath.Join(root, "rootfs"))
	run(t, top, "stages/scripts/binaries-install.sh", filepath.Dir(filepath.Dir(opts.Hook)), filepath.Join(root, "rootfs"), filepath.Join(root, "opt/nvidia-driver"))
	run(t, "", "install", "-m", "0755", validator, filepath.Join(root, "opt/nvidia-driver/bin/extension"))

	modules := filepath.Join(root, "usr/lib/modules", r.Kernel, "extra")
	for _, m := range []string{"nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm"} {
		testutil.KernelModule(t, modules, m, version, f.License)
	}

	require.NoError(t, os.MkdirAll(filepath.Join(root, "pkg"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "pkg/manifest.yaml"), p.Templates["manifest.yaml"], 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(root, "extensions-validator"),
		[]byte("#!/bin/sh\n# stand-in for siderolabs' extensions-validator\necho \"$@\" > /tmp/extensions-validator.args\n"), 0o755))

	require.NoError(t, runStage(t, root, p, map[string]string{"NVIDIA_DRIVER_VERSION": version}))

	// The no-registry route, once a release (the default flavor: the route is the same).
	if f.Name == recipes.Flavors()[0].Name {
		tarRoute(t, root, p, r.Talos)
	}

	args, err := os.ReadFile(filepath.Join(root, "tmp/extensions-validator.args"))
	require.NoError(t, err)
	assert.Equal(t, "validate --rootfs=/tmp/extension --pkg-name="+f.Name+"\n", string(args))

	// The module check of the step fails on another kind's modules.
	other := "NVIDIA"
	if f.License == other {
		other = "Dual MIT/GPL"
	}

	testutil.KernelModule(t, filepath.Join(root, "rootfs/usr/lib/modules", r.Kernel, "extra"), "nvidia", version, other)

	_, err = chroot(root, p.Shell, "/usr/libexec/nvidia-driver/flavor.sh test-modules", flavorEnv(p, version))
	assert.ErrorContains(t, err, "license "+other)
}

func flavorEnv(p *recipes.Pkg, version string) map[string]string {
	e := map[string]string{"PKG_NAME": p.Name}
	for k, v := range p.Steps[0].Env {
		e[k] = v
	}

	e["NVIDIA_DRIVER_VERSION"] = version

	return e
}
