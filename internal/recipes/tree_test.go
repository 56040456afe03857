package recipes_test

import (
	"bytes"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/blang/semver/v4"
	"github.com/siderolabs/talos/pkg/machinery/extensions"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/talos-nvidia/nvidia-driver/internal/extension"
	"github.com/talos-nvidia/nvidia-driver/internal/recipes"
	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
)

// releases reads the release data as the generator does: the release facts, each checked
// against its release's machinery module (through the go command).
func releases(t *testing.T) []recipes.Release {
	t.Helper()

	rs, err := recipes.LoadReleases(filepath.Join(testutil.RepoRoot(t), filepath.FromSlash(recipes.FactsFile)))
	require.NoError(t, err)

	return rs
}

// TestRecipesAreCurrent re-renders the generated recipes from the release data and compares
// them with the repository's: edit internal/recipes/templates or the release data, then run
// go run ./hack/release/gen-flavors. A release whose data moved on (other driver versions in
// the facts) fails here.
func TestRecipesAreCurrent(t *testing.T) {
	top := testutil.RepoRoot(t)
	rs := releases(t)

	assert.Equal(t, "v1.14.1", rs[0].Talos, "the newest release with data is the default")

	files, err := recipes.Generate(rs)
	require.NoError(t, err)

	for rel, want := range files {
		got, err := os.ReadFile(filepath.Join(top, rel))
		require.NoError(t, err, "%s missing: run go run ./hack/release/gen-flavors", rel)
		assert.Equal(t, string(want), string(got), "%s is stale: run go run ./hack/release/gen-flavors", rel)
	}

	// Nothing else in the generated directories: a file left from an older layout would be
	// copied into /pkg, or loaded.
	for _, dir := range append([]string{"flavors"}, "stages/nvidia-userspace-lts", "stages/nvidia-userspace-production") {
		err := filepath.WalkDir(filepath.Join(top, dir), func(p string, d os.DirEntry, err error) error {
			require.NoError(t, err)

			rel, _ := filepath.Rel(top, p)
			if !d.IsDir() {
				assert.Contains(t, files, rel, "%s is not generated: remove it or generate it", rel)
			}

			return nil
		})
		require.NoError(t, err)
	}
}

// load loads the repository's tree for one release, as bldr's frontend would with
// --build-arg TALOS_VERSION=<release>, for linux/amd64.
func load(t *testing.T, args map[string]string) *recipes.Tree {
	t.Helper()

	return loadPlatform(t, "", args)
}

// loadPlatform loads it for one platform (docker buildx --platform).
func loadPlatform(t *testing.T, platform string, args map[string]string) *recipes.Tree {
	t.Helper()

	tr, err := recipes.Load(testutil.RepoRoot(t), recipes.Options{BuildArgs: args, Platform: platform})
	require.NoError(t, err, "bldr would not load the tree for %q with build arguments %v", platform, args)

	return tr
}

// TestRecipeTreeLoads loads the whole tree for every release and without build arguments:
// every package once, every stage dependency defined, checksums present, every template
// attached to the package it belongs to, every {{ .X }} resolved, the frontend pinned to the
// bldr release siderolabs/extensions uses for the default release.
func TestRecipeTreeLoads(t *testing.T) {
	rs := releases(t)

	flavors := recipes.Flavors()
	want := []string{"base", "nvidia-driver-binaries", "nvidia-driver-glibc", "nvidia-driver-scripts", "nvidia-userspace-lts", "nvidia-userspace-production"}
	attached := map[string]string{}

	for _, f := range flavors {
		want = append(want, f.Name)
		attached[filepath.Join("flavors", f.Name, "manifest.yaml.tmpl")] = f.Name
	}

	sort.Strings(want)

	for _, a := range recipes.Arches() {
		for _, args := range []map[string]string{nil, {"TALOS_VERSION": rs[0].Talos, "PKGS_PREFIX": "ghcr.io/siderolabs", "PKGS": rs[0].Pkgs, "TAG": "v0.1.0"}, {"TALOS_VERSION": rs[1].Talos}} {
			treeLoads(t, loadPlatform(t, a.Platform, args), rs, args, want, attached)
		}
	}
}

// treeLoads checks one loaded tree (TestRecipeTreeLoads).
func treeLoads(t *testing.T, tr *recipes.Tree, rs []recipes.Release, args map[string]string, want []string, attached map[string]string) {
	t.Helper()

	var names []string
	for _, p := range tr.Pkgs {
		names = append(names, p.Name)
	}

	sort.Strings(names)
	assert.Equal(t, want, names)
	assert.Equal(t, attached, tr.Attached, "templates: only each flavor's manifest")
	assert.Equal(t, "ghcr.io/siderolabs/bldr:"+rs[0].BldrRelease, tr.Pkgfile.Syntax, "Pkgfile's # syntax line")
	assert.Equal(t, "/usr/local/glibc", tr.Pkgfile.Vars["GLIBC_ROOT"], "the subroot path of the Makefile and internal/extension")
	assert.Equal(t, "/"+extension.SubrootPath, tr.Pkgfile.Vars["GLIBC_ROOT"])

	// The root package builds from the module source: bldr copies its directory, the
	// repository root, into /pkg; make builds the hook for the platform's loader.
	bin := tr.Pkg("nvidia-driver-binaries")
	assert.Equal(t, ".", bin.Dir)
	assert.Contains(t, bin.Steps[1].Build[0], `GLIBC_LOADER="`+bin.Vars["GLIBC_LOADER"]+`"`)

	// The final stages are shaped as siderolabs' (internal/base/pkg.yaml and the
	// nvidia-gpu final stages at the release's tag): scratch on the base stage, which
	// is the release's tools image and siderolabs' validator image, merged at /.
	r := rs[0]
	if args["TALOS_VERSION"] != "" {
		r = releaseOf(t, rs, args["TALOS_VERSION"])
	}

	base := tr.Pkg("base")
	require.NotNil(t, base)
	assert.Equal(t, "scratch", base.Variant)
	assert.Equal(t, []recipes.Dependency{{Image: "ghcr.io/siderolabs/tools:" + r.Tools}, {Image: r.Validator}}, base.Dependencies)
	assert.Equal(t, []recipes.Finalize{{From: "/", To: "/"}}, base.Finalize)

	for _, f := range recipes.Flavors() {
		p := tr.Pkg(f.Name)
		assert.Equal(t, "scratch", p.Variant, f.Name)
		assert.Equal(t, recipes.Dependency{Stage: "base"}, p.Dependencies[0], "%s: the base stage is its build root", f.Name)

		for _, d := range p.Dependencies {
			assert.NotContains(t, d.Image, "extensions-validator", "%s: the validator comes with the base stage only", f.Name)
			// bldr pulls each image for the build's platform: a pinned platform would
			// mix architectures
			assert.Empty(t, d.Platform, "%s: a dependency of one platform", f.Name)
		}
	}
}

func releaseOf(t *testing.T, rs []recipes.Release, talos string) recipes.Release {
	t.Helper()

	for _, r := range rs {
		if r.Talos == talos {
			return r
		}
	}

	t.Fatalf("no release %s", talos)

	return recipes.Release{}
}

// TestBuildArgumentsAreDocumented: every build argument the tree reads is in the table of
// docs/extension.md, and every documented one is read.
func TestBuildArgumentsAreDocumented(t *testing.T) {
	top := testutil.RepoRoot(t)

	out, err := exec.Command("git", "-C", top, "ls-files").Output()
	require.NoError(t, err)

	var used []string

	for _, f := range strings.Fields(string(out)) {
		base := filepath.Base(f)
		if base != recipes.PkgYAMLName && base != recipes.VarsYAMLName && base != recipes.PkgfileName && !strings.HasSuffix(base, recipes.TemplateExt) {
			continue
		}

		data, err := os.ReadFile(filepath.Join(top, f))
		require.NoError(t, err)

		for _, a := range recipes.BuildArgs(data) {
			if !slices.Contains(used, a) {
				used = append(used, a)
			}
		}
	}

	doc, err := os.ReadFile(filepath.Join(top, "docs", "extension.md"))
	require.NoError(t, err)

	var documented []string
	for _, m := range regexp.MustCompile("(?m)^\\| `--build-arg ([A-Z_]+)=").FindAllSubmatch(doc, -1) {
		documented = append(documented, string(m[1]))
	}

	sort.Strings(used)
	sort.Strings(documented)
	assert.Equal(t, documented, used, "build arguments read by the recipes vs. documented in docs/extension.md")
}

// TestFlavorsMatchTheirRelease checks each flavor of each release against that release's
// data: the driver version and both checksums of NVIDIA's archive and the fabric manager's,
// the Talos packages image of the modules, the kind of modules, and the manifest that
// Talos reads.
func TestFlavorsMatchTheirRelease(t *testing.T) {
	// NVIDIA's platform directories, as siderolabs/extensions names them by ARCH
	// (nvidia-gpu/nvidia-container-toolkit/nvidia-pkgs/<branch>/pkg.yaml)
	redist := map[string]string{"x86_64": "linux-x86_64", "aarch64": "linux-sbsa"}

	for _, r := range releases(t) {
		manifests := map[string][]byte{}

		for _, a := range recipes.Arches() {
			tr := loadPlatform(t, a.Platform, map[string]string{"TALOS_VERSION": r.Talos})
			flavorsMatch(t, tr, r, a, redist[a.Name], manifests)
		}
	}
}

// flavorsMatch checks the flavors of one release loaded for one platform
// (TestFlavorsMatchTheirRelease); the manifest of each flavor must be the same on every
// platform.
func flavorsMatch(t *testing.T, tr *recipes.Tree, r recipes.Release, a recipes.Arch, redist string, manifests map[string][]byte) {
	t.Helper()

	require.Equal(t, a.Name, tr.Pkg("base").Vars["ARCH"], "bldr's ARCH of %s", a.Platform)

	for _, f := range recipes.Flavors() {
		t.Run(r.Talos+"/"+a.Platform+"/"+f.Name, func(t *testing.T) {
			d := r.Drivers[f.Branch]
			c := d.Archives[a.Name]
			require.NotEmpty(t, c.SHA256, "%s checksums", a.Name)

			p := tr.Pkg(f.Name)
			require.NotNil(t, p)

			assert.Equal(t, d.Version, p.Vars["NVIDIA_DRIVER_VERSION"])
			assert.Equal(t, r.Pkgs, p.Vars["PKGS_VERSION"])
			assert.Equal(t, r.Kernel, p.Vars["KERNEL_VERSION"])
			assert.Equal(t, extension.ModuleKind(f.Modules).License(), p.Vars["NVIDIA_MODULES_LICENSE"], "the license nvidia.ko of this kind declares")
			// siderolabs/pkgs names the images of the two kinds so (nvidia-gpu/nvidia-modules and
			// nonfree/kmod-nvidia in siderolabs/extensions pull them).
			kindImage := map[string]string{"open": "nvidia-open-gpu-kernel-modules-", "proprietary": "nonfree-kmod-nvidia-"}[f.Modules] + f.Branch + "-pkg"
			assert.Contains(t, tr.Images(f.Name), "ghcr.io/siderolabs/"+kindImage+":"+r.Pkgs, "kernel modules of the flavor's kind, signed for this release")
			assert.Contains(t, tr.Images(f.Name), "cgr.dev/chainguard/wolfi-base@"+r.WolfiBaseRef)

			us := tr.Pkg("nvidia-userspace-" + f.Branch)
			require.NotNil(t, us)
			assert.Contains(t, p.Dependencies, recipes.Dependency{Stage: us.Name})
			require.Len(t, us.Steps[0].Sources, 2)
			assert.Equal(t, recipes.Source{
				URL:         "https://developer.download.nvidia.com/compute/nvidia-driver/redist/nvidia_driver/" + redist + "/nvidia_driver-" + redist + "-" + d.Version + "-archive.tar.xz",
				Destination: "nvidia.tar.xz", SHA256: c.SHA256, SHA512: c.SHA512,
			}, us.Steps[0].Sources[0])
			assert.Equal(t, recipes.Source{
				URL:         "https://developer.download.nvidia.com/compute/nvidia-driver/redist/fabricmanager/" + redist + "/fabricmanager-" + redist + "-" + d.Version + "-archive.tar.xz",
				Destination: "fabricmanager.tar.xz", SHA256: c.FabricManagerSHA256, SHA512: c.FabricManagerSHA512,
			}, us.Steps[0].Sources[1])
			assert.Equal(t, map[string]string{
				"SUBROOT": "/rootfs/usr/local/glibc", "NVIDIA_DRIVER_VERSION": d.Version, "ARCH": a.Name, "GLIBC_LOADER": a.Loader,
			}, us.Steps[0].Env, "the userspace stage's step environment")

			// The manifest has no architecture: the same bytes on every platform.
			if prev, ok := manifests[f.Name]; ok {
				assert.Equal(t, string(prev), string(p.Templates["manifest.yaml"]), "%s: the manifest differs between platforms", f.Name)
			}

			manifests[f.Name] = p.Templates["manifest.yaml"]

			var m extensions.Manifest
			require.NoError(t, yaml.Unmarshal(p.Templates["manifest.yaml"], &m))
			assert.Equal(t, f.Name, m.Metadata.Name)
			assert.Equal(t, d.Version+"-"+r.Talos, m.Metadata.Version)
			assert.Equal(t, ">= "+r.Floor()+" <= "+r.Talos, m.Metadata.Compatibility.Talos.Version)

			ext := extensions.New(t.TempDir(), f.Name, m)
			this := semver.MustParse(strings.TrimPrefix(r.Talos, "v"))
			next, nextMinor := this, this
			next.Patch++
			nextMinor.Minor++
			// The Talos version siderolabs' extensions-validator of the release checks with:
			// its machinery's gendata tag (84cecb0: v1.13.0-alpha.2 at 79fa2e3, for 1.13 and
			// 1.14 alike). "= <release>" fails it.
			require.Equal(t, recipes.ValidatorTalos(r.Validator), r.ValidatorTalos)
			validator := semver.MustParse(strings.TrimPrefix(r.ValidatorTalos, "v"))

			constraint := func(v semver.Version) error {
				return ext.Validate(extensions.WithValidateConstraints(), extensions.WithTalosVersion(&v))
			}

			assert.NoError(t, constraint(this), "Talos's imager of the release")
			assert.NoError(t, constraint(validator), "siderolabs' validator")
			assert.Error(t, constraint(next), "modules are signed for one Talos build")
			assert.Error(t, constraint(nextMinor), "modules are signed for one Talos build")

			em := m
			em.Metadata.Compatibility.Talos.Version = "= " + r.Talos
			exact := extensions.New(t.TempDir(), f.Name, em)
			assert.ErrorContains(t, exact.Validate(extensions.WithValidateConstraints(), extensions.WithTalosVersion(&validator)), "version constraint = "+r.Talos+" can't be satisfied with Talos version 1.13.0-alpha.2",
				"why the constraint is a range: siderolabs' validator")
		})
	}
}

// TestReleaseDataIsEnforced: a release without data, or a pkgs version other than the
// release's, stops bldr at load time with a message that says why.
func TestReleaseDataIsEnforced(t *testing.T) {
	rs := releases(t)

	for _, tc := range []struct {
		args map[string]string
		want string
	}{
		{map[string]string{"TALOS_VERSION": "v1.14.2"}, "Talos v1.14.2: no release data here; supported: v1.14.1 v1.13.9 v1.13.5"},
		{map[string]string{"PKGS": "v1.13.0-60-gf541ca4"}, "--build-arg PKGS=v1.13.0-60-gf541ca4, but Talos v1.14.1 is built from pkgs " + rs[0].Pkgs},
		{map[string]string{"TALOS_VERSION": "v1.13.9", "PKGS": "v1.14.0-25-gf694e1b"}, "--build-arg PKGS=v1.14.0-25-gf694e1b, but Talos v1.13.9 is built from pkgs v1.13.0-60-gf541ca4"},
		{map[string]string{"TALOS_VERSION": "v1.14.1", "TOOLS": "v1.14.0-2-g83caedf"}, "--build-arg TOOLS=v1.14.0-2-g83caedf, but Talos v1.14.1 is built with tools v1.14.0-7-ga404efb"},
	} {
		_, err := recipes.Load(testutil.RepoRoot(t), recipes.Options{BuildArgs: tc.args})
		require.Error(t, err)
		assert.Contains(t, err.Error(), tc.want)
	}
}

// TestValidatorsAreTheReleases': the project validates with the Talos code of the machinery
// module in go.mod. For that to stand for each release, the extension validation code
// (pkg/machinery/extensions) must be the same file for file in the release's module.
func TestValidatorsAreTheReleases(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", recipes.MachineryModule).Output()
	require.NoError(t, err)

	ours := strings.TrimSpace(string(out))

	// Known differences, each with what covers it: a package of the release's machinery
	// that is not go.mod's, by release.
	known := map[string]map[string]string{
		// 1.14's services.Spec adds runnerMode (default container) and preShutdown (host
		// mode only), which the services leave unset; hack/talos-machinery/talos114 (make test) parses every
		// service YAML strictly as 1.14's Spec and validates the extension with 1.14's code.
		// extensions/*.go (Load, Validate, the constraint check) is the same.
		"v1.14.1": {"services": "hack/talos-machinery/talos114"},
	}

	for _, r := range releases(t) {
		m, err := recipes.DownloadMachinery(r.Talos)
		require.NoError(t, err)

		want, got := filesUnder(t, filepath.Join(ours, "extensions")), filesUnder(t, filepath.Join(m.Dir, "extensions"))

		for pkg := range known[r.Talos] {
			assert.NotEqual(t, only(want, pkg), only(got, pkg), "%s: %s/ is go.mod's again: drop the exception", r.Talos, pkg)

			for _, files := range []map[string]string{want, got} {
				for f := range only(files, pkg) {
					delete(files, f)
				}
			}
		}

		assert.Equal(t, want, got,
			"machinery %s validates extensions differently from go.mod's %s: validate with the release's code", r.Talos, ours)
	}
}

// only is the part of files under the directory dir.
func only(files map[string]string, dir string) map[string]string {
	out := map[string]string{}

	for f, data := range files {
		if strings.HasPrefix(f, dir+string(filepath.Separator)) {
			out[f] = data
		}
	}

	return out
}

// TestReleaseImagesPassTalosValidators assembles, for each release and flavor, the image
// that make extension assembles from a payload (the Debian subroot, with kernel modules of
// the flavor's kind carrying its .modinfo) under the flavor's manifest, and validates it as
// the recipe's test step does, with Talos's validators for that release.
func TestReleaseImagesPassTalosValidators(t *testing.T) {
	testutil.RequireRoot(t)

	for _, r := range releases(t) {
		kver := r.Kernel

		tr := load(t, map[string]string{"TALOS_VERSION": r.Talos})

		for _, f := range recipes.Flavors() {
			t.Run(r.Talos+"/"+f.Name, func(t *testing.T) {
				var m extension.Manifest
				require.NoError(t, yaml.Unmarshal(tr.Pkg(f.Name).Templates["manifest.yaml"], &m))

				o := testutil.DevExtension(t)
				o.Name, o.Version, o.TalosVersion = m.Metadata.Name, m.Metadata.Version, r.Talos
				o.TalosConstraint, o.Author, o.Description = m.Metadata.Compatibility.Talos.Version, m.Metadata.Author, m.Metadata.Description
				o.Modules, o.ModuleKind = t.TempDir(), extension.ModuleKind(f.Modules)

				payload := "535.309.01" // the Debian subroot's userspace
				extras := filepath.Join(o.Modules, kver, "extras")
				testutil.KernelModule(t, extras, "nvidia", payload, f.License)
				testutil.KernelModule(t, extras, "nvidia-uvm", payload, f.License)
				testutil.KernelModule(t, extras, "nvidia-peermem", payload, "Linux-OpenIB")

				res, err := extension.Assemble(quiet(), o)
				require.NoError(t, err)
				assert.Equal(t, payload, res.DriverVersion)
				require.NoError(t, extension.ValidateRelease(res.Dir, r.Talos, o.ModuleKind, payload))
				require.NoError(t, extension.CheckRelease(res.Dir, r.Talos, r.Kernel))
				assert.ErrorContains(t, extension.CheckRelease(res.Dir, r.Talos, "6.18.1-talos"), "modules for another kernel")
				assert.ErrorContains(t, extension.CheckRelease(res.Dir, "v1.13.1", r.Kernel), "does not name Talos v1.13.1")

				other := map[string]extension.ModuleKind{"open": extension.ModulesProprietary, "proprietary": extension.ModulesOpen}[f.Modules]
				assert.ErrorContains(t, extension.ValidateRelease(res.Dir, r.Talos, other, payload), "nvidia.ko: license")
			})
		}
	}
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// filesUnder lists the files under dir with their contents.
func filesUnder(t *testing.T, dir string) map[string]string {
	t.Helper()

	out := map[string]string{}

	require.NoError(t, filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}

		data, err := os.ReadFile(p)
		rel, _ := filepath.Rel(dir, p)
		out[rel] = string(bytes.TrimSpace(data))

		return err
	}))

	return out
}
