package recipes

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/blang/semver/v4"
	"gopkg.in/yaml.v3"
)

// MachineryModule is Talos's machinery module: its gendata and constants say which pkgs,
// tools and kernel a Talos release was built with.
const MachineryModule = "github.com/siderolabs/talos/pkg/machinery"

// Files of a release directory (hack/release/gen-flavors/releases/<talos>/), vendored from
// siderolabs' repositories with their provenance in a header.
const (
	ExtensionsVarsFile     = "extensions-nvidia-gpu-vars.yaml"
	ExtensionsMakefileFile = "extensions-Makefile"
	PkgsPkgfileFile        = "pkgs-Pkgfile"
	ExtensionsBaseFile     = "extensions-internal-base-pkg.yaml"
)

// toolsImage is how siderolabs' base stage names the tools image (internal/base/pkg.yaml):
// the recipes' base stage takes it the same way, from the release's TOOLS.
const toolsImage = "{{ .BUILD_ARG_TOOLS_PREFIX }}/tools:{{ .BUILD_ARG_TOOLS }}"

// Branches are NVIDIA's driver branches that Talos builds kernel modules for.
var Branches = []string{"lts", "production"}

// Arch is an architecture the release flavors are built for, as bldr, siderolabs and NVIDIA
// name it.
type Arch struct {
	// Platform is the docker buildx --platform, one of bldr's (Platforms).
	Platform string
	// Name is bldr's ARCH of that platform.
	Name string
	// Siderolabs is the word in siderolabs' variable names: nvidia_driver_lts_<amd64>_sha256
	// in pkgs' Pkgfile, NVIDIA_PKGS_LTS_<AMD64>_SHA256 (upper case) in extensions'
	// nvidia-gpu/vars.yaml.
	Siderolabs string
	// Redist is NVIDIA's platform directory of its redistributable archives, as
	// siderolabs/extensions picks it by ARCH (nvidia-gpu/nvidia-container-toolkit/nvidia-pkgs/
	// <branch>/pkg.yaml, nvidia-gpu/nvidia-fabricmanager/<branch>/pkg.yaml).
	Redist string
	// Loader is the glibc loader's path in the subroot: the architecture's standard
	// interpreter path, which NVIDIA's programs of that architecture ask for.
	Loader string
}

// Arches are the architectures of the release flavors, linux/amd64 first.
func Arches() []Arch {
	return []Arch{
		{Platform: "linux/amd64", Name: "x86_64", Siderolabs: "amd64", Redist: "linux-x86_64", Loader: "lib64/ld-linux-x86-64.so.2"},
		// linux-sbsa: NVIDIA's Arm server (SBSA) builds, siderolabs' arm64 archives: DGX
		// Spark (GB10), GH200, GB200.
		{Platform: "linux/arm64", Name: "aarch64", Siderolabs: "arm64", Redist: "linux-sbsa", Loader: "lib/ld-linux-aarch64.so.1"},
	}
}

// Release is what the recipes need to know about one Talos release.
type Release struct {
	// From the machinery module of the release (gendata/data, constants/constants.go).
	Talos, Pkgs, Tools, Kernel string
	// From siderolabs/extensions at the release's tag: the bldr frontend and pkgs version
	// its Makefile pins, the Wolfi image by digest.
	BldrRelease, ExtensionsPkgs, WolfiBaseRef string
	// ExtensionsTools is the tools version siderolabs/extensions' Makefile pins (TOOLS); it
	// must be the machinery's.
	ExtensionsTools string
	// Validator is the extensions-validator image of siderolabs' base stage
	// (internal/base/pkg.yaml) at the release's tag.
	Validator string
	// ValidatorTalos is the Talos version that validator checks a manifest's constraint
	// against (ValidatorTalos, the function).
	ValidatorTalos string
	// Drivers by branch: versions and archive checksums from siderolabs/pkgs at the
	// release's pkgs version, fabric manager checksums from siderolabs/extensions.
	Drivers map[string]Driver
	// Sources are the provenance headers of the vendored files, by file name
	// (ExtensionsVarsFile, ExtensionsMakefileFile, PkgsPkgfileFile, ExtensionsBaseFile).
	Sources map[string]Provenance
}

// Provenance is the header of a vendored file: where it was copied from and, when the file
// at the tag it is used for was not at hand, that tag and why the copy is taken for it.
type Provenance struct {
	// Repo is siderolabs' repository (siderolabs/pkgs, siderolabs/extensions); Tag and
	// Commit are what the file was copied from, File its path there.
	Repo, Tag, Commit, File string
	// InferredFor is the tag the file stands for when that is not Tag (the header's
	// "# Inferred for <tag>: <why>" line), Why the reason the header gives; both empty for a
	// file copied at the tag it is used for.
	InferredFor, Why string
}

// For is the tag the file stands for: InferredFor if the header infers it, else Tag.
func (p Provenance) For() string {
	if p.InferredFor != "" {
		return p.InferredFor
	}

	return p.Tag
}

// String names the source in vars.yaml's comments: "siderolabs/pkgs v1.13.0-60-gf541ca4", or
// "siderolabs/extensions v1.14.0-rc.1 (inferred for v1.14.1)".
func (p Provenance) String() string {
	if p.InferredFor != "" {
		return p.Repo + " " + p.Tag + " (inferred for " + p.InferredFor + ")"
	}

	return p.Repo + " " + p.Tag
}

// Inferred lists the release's vendored files that stand for a tag they were not copied
// from, in the order of Files.
func (r Release) Inferred() []string {
	var out []string

	for _, f := range Files {
		if r.Sources[f].InferredFor != "" {
			out = append(out, f)
		}
	}

	return out
}

// Files are the vendored files of a release directory.
var Files = []string{PkgsPkgfileFile, ExtensionsVarsFile, ExtensionsMakefileFile, ExtensionsBaseFile}

// validatorTalos is the Talos version each extensions-validator image of siderolabs' base
// stage checks a manifest's constraint against: the gendata tag of the machinery its go.mod
// pins (84cecb0: v1.13.0-alpha.2.0.20260405070107-79fa2e300108, whose gendata tag at
// 79fa2e3 is v1.13.0-alpha.2; hack/release/siderolabs-validator.sh builds it). A release whose base
// stage names another image stops the generator until that image is added here.
var validatorTalos = map[string]string{
	"ghcr.io/siderolabs/extensions-validator:84cecb0": "v1.13.0-alpha.2",
}

// ValidatorTalos is the Talos version a known extensions-validator image checks
// constraints against, or "" for an image not known.
func ValidatorTalos(image string) string { return validatorTalos[image] }

// Driver is one branch's NVIDIA driver of a release.
type Driver struct {
	Version string
	// Archives by Arch.Name.
	Archives map[string]Archives
}

// Archives are the checksums of one architecture's archives of a driver version.
type Archives struct {
	// SHA256 and SHA512 of nvidia_driver-<redist>-<version>-archive.tar.xz.
	SHA256, SHA512 string
	// FabricManagerSHA256/512 of fabricmanager-<redist>-<version>-archive.tar.xz.
	FabricManagerSHA256, FabricManagerSHA512 string
}

// Machinery is the data a machinery module version carries about its release.
type Machinery struct {
	Tag, Pkgs, Tools, Kernel string
	// Dir is the module's directory in the module cache.
	Dir string
}

// DownloadMachinery fetches the machinery module of a Talos release through the go command
// (module proxy and checksum database) and reads its release data.
func DownloadMachinery(version string) (Machinery, error) {
	out, err := exec.Command("go", "mod", "download", "-json", MachineryModule+"@"+version).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s%s", err, ee.Stderr, out)
		}

		return Machinery{}, fmt.Errorf("downloading %s@%s: %w", MachineryModule, version, err)
	}

	var mod struct{ Dir, Error string }
	if err := json.Unmarshal(out, &mod); err != nil {
		return Machinery{}, fmt.Errorf("downloading %s@%s: %w", MachineryModule, version, err)
	}

	if mod.Error != "" || mod.Dir == "" {
		return Machinery{}, fmt.Errorf("downloading %s@%s: %s", MachineryModule, version, mod.Error)
	}

	return ReadMachinery(mod.Dir)
}

// ReadMachinery reads gendata/data/{tag,pkgs,tools} and constants.DefaultKernelVersion from
// a machinery module directory.
func ReadMachinery(dir string) (Machinery, error) {
	m := Machinery{Dir: dir}

	for _, f := range []struct {
		name string
		to   *string
	}{{"tag", &m.Tag}, {"pkgs", &m.Pkgs}, {"tools", &m.Tools}} {
		data, err := os.ReadFile(filepath.Join(dir, "gendata", "data", f.name))
		if err != nil {
			return m, fmt.Errorf("machinery gendata: %w", err)
		}

		*f.to = strings.TrimSpace(string(data))
	}

	kernel, err := stringConst(filepath.Join(dir, "constants", "constants.go"), "DefaultKernelVersion")
	if err != nil {
		return m, err
	}

	m.Kernel = kernel

	return m, nil
}

// stringConst finds a string constant's value in a Go file without compiling it.
func stringConst(path, name string) (string, error) {
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		return "", err
	}

	for _, decl := range f.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}

		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec) //nolint:forcetypeassert // const specs are value specs

			for i, n := range vs.Names {
				if n.Name != name || i >= len(vs.Values) {
					continue
				}

				if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					return strconv.Unquote(lit.Value)
				}
			}
		}
	}

	return "", fmt.Errorf("%s: no string constant %s", path, name)
}

// ReleaseDirs lists the release directories under dir, newest Talos release first.
func ReleaseDirs(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}

	var out []string

	for _, e := range entries {
		if _, err := semver.ParseTolerant(e.Name()); e.IsDir() && err == nil {
			out = append(out, e.Name())
		}
	}

	sort.Slice(out, func(i, j int) bool {
		return semver.MustParse(strings.TrimPrefix(out[i], "v")).GT(semver.MustParse(strings.TrimPrefix(out[j], "v")))
	})

	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no release directories (named after a Talos release, e.g. v1.13.9)", dir)
	}

	return out, nil
}

// ReadRelease combines a release directory's vendored files with the release's machinery
// data and checks that they agree: the machinery's tag is the directory's, siderolabs'
// extensions and pkgs are the ones that release was built from, and both name the same
// driver versions and, for every architecture (Arches), archive checksums.
func ReadRelease(dir string, m Machinery) (Release, error) {
	talos := filepath.Base(dir)
	r := Release{Talos: talos, Pkgs: m.Pkgs, Tools: m.Tools, Kernel: m.Kernel, Drivers: map[string]Driver{}, Sources: map[string]Provenance{}}

	var errs []error

	if m.Tag != talos {
		errs = append(errs, fmt.Errorf("%s: machinery gendata says Talos %s", dir, m.Tag))
	}

	ext, err := readYAMLVars(filepath.Join(dir, ExtensionsVarsFile), "")
	if err != nil {
		return r, err
	}

	mk, err := readMakefileVars(filepath.Join(dir, ExtensionsMakefileFile))
	if err != nil {
		return r, err
	}

	pkgs, err := readYAMLVars(filepath.Join(dir, PkgsPkgfileFile), "vars")
	if err != nil {
		return r, err
	}

	r.BldrRelease, r.ExtensionsPkgs, r.ExtensionsTools, r.WolfiBaseRef = mk["BLDR_RELEASE"], mk["PKGS"], mk["TOOLS"], ext["WOLFI_BASE_REF"]

	validator, err := readBase(filepath.Join(dir, ExtensionsBaseFile))
	if err != nil {
		errs = append(errs, err)
	}

	r.Validator = validator

	if r.ValidatorTalos = validatorTalos[validator]; validator != "" && r.ValidatorTalos == "" {
		errs = append(errs, fmt.Errorf("%s: extensions-validator %s: the Talos version it checks constraints against is not known (recipes.validatorTalos)", filepath.Join(dir, ExtensionsBaseFile), validator))
	}

	if r.ExtensionsTools != m.Tools {
		errs = append(errs, fmt.Errorf("%s: siderolabs/extensions builds with tools %q, Talos %s with %q", filepath.Join(dir, ExtensionsMakefileFile), r.ExtensionsTools, talos, m.Tools))
	}

	if r.ExtensionsPkgs != m.Pkgs {
		errs = append(errs, fmt.Errorf("%s: siderolabs/extensions builds against pkgs %q, Talos %s against %q", filepath.Join(dir, ExtensionsMakefileFile), r.ExtensionsPkgs, talos, m.Pkgs))
	}

	// Each file must say where it was copied from, and stand for this release's tag (pkgs'
	// for the Pkgfile): copied at that tag, or inferred for it with a reason.
	for _, f := range Files {
		want, what := talos, "extensions"
		if f == PkgsPkgfileFile {
			want, what = m.Pkgs, "pkgs"
		}

		p, err := ReadProvenance(filepath.Join(dir, f))
		if err != nil {
			errs = append(errs, err)

			continue
		}

		r.Sources[f] = p

		switch {
		case p.Repo != "siderolabs/"+what:
			errs = append(errs, fmt.Errorf("%s: vendored from %s, not siderolabs/%s", filepath.Join(dir, f), p.Repo, what))
		case p.For() != want && what == "pkgs":
			errs = append(errs, fmt.Errorf("%s: vendored from pkgs %q, Talos %s is built from pkgs %q", filepath.Join(dir, f), p.For(), talos, m.Pkgs))
		case p.For() != want:
			errs = append(errs, fmt.Errorf("%s: vendored from extensions %q, not %s", filepath.Join(dir, f), p.For(), talos))
		}
	}

	for _, b := range Branches {
		up := strings.ToUpper(b)
		d := Driver{Version: pkgs["nvidia_driver_"+b+"_version"], Archives: map[string]Archives{}}

		if d.Version == "" || d.Version != ext["NVIDIA_DRIVER_"+up+"_VERSION"] {
			errs = append(errs, fmt.Errorf("%s: %s driver version: pkgs says %q, extensions %q", dir, b, d.Version, ext["NVIDIA_DRIVER_"+up+"_VERSION"]))
		}

		for _, a := range Arches() {
			arch, upArch := a.Siderolabs, strings.ToUpper(a.Siderolabs)
			c := Archives{
				SHA256:              pkgs["nvidia_driver_"+b+"_"+arch+"_sha256"],
				SHA512:              pkgs["nvidia_driver_"+b+"_"+arch+"_sha512"],
				FabricManagerSHA256: ext["NVIDIA_FABRIC_MANAGER_"+up+"_"+upArch+"_SHA256"],
				FabricManagerSHA512: ext["NVIDIA_FABRIC_MANAGER_"+up+"_"+upArch+"_SHA512"],
			}

			for _, pair := range []struct{ what, pkgs, ext string }{
				{"sha256", c.SHA256, ext["NVIDIA_PKGS_"+up+"_"+upArch+"_SHA256"]},
				{"sha512", c.SHA512, ext["NVIDIA_PKGS_"+up+"_"+upArch+"_SHA512"]},
			} {
				if pair.pkgs == "" || pair.pkgs != pair.ext {
					errs = append(errs, fmt.Errorf("%s: %s driver %s %s: pkgs says %q, extensions %q", dir, b, arch, pair.what, pair.pkgs, pair.ext))
				}
			}

			if c.FabricManagerSHA256 == "" || c.FabricManagerSHA512 == "" {
				errs = append(errs, fmt.Errorf("%s: no %s fabric manager checksums for the %s driver", filepath.Join(dir, ExtensionsVarsFile), arch, b))
			}

			d.Archives[a.Name] = c
		}

		r.Drivers[b] = d
	}

	for what, v := range map[string]string{"BLDR_RELEASE": r.BldrRelease, "WOLFI_BASE_REF": r.WolfiBaseRef, "TOOLS": r.ExtensionsTools} {
		if v == "" {
			errs = append(errs, fmt.Errorf("%s: no %s", dir, what))
		}
	}

	return r, errors.Join(errs...)
}

// readBase reads siderolabs' base stage and returns its extensions-validator image. The
// stage must be what the recipes' own base stage copies: scratch, the tools image of the
// build's TOOLS, the validator, everything finalized at /.
func readBase(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}

	var p Pkg
	if err := yaml.Unmarshal(data, &p); err != nil {
		return "", yamlErr(path, err)
	}

	var validator string

	images := map[string]bool{}

	for _, d := range p.Dependencies {
		images[d.Image] = true

		if strings.Contains(d.Image, "/extensions-validator:") || strings.Contains(d.Image, "/extensions-validator@") {
			validator = d.Image
		}
	}

	if p.Name != "base" || p.Variant != "scratch" || len(p.Dependencies) != 2 || !images[toolsImage] || validator == "" ||
		len(p.Finalize) != 1 || p.Finalize[0] != (Finalize{From: "/", To: "/"}) {
		return "", fmt.Errorf("%s: not the base stage the recipes follow (scratch; the images %s and extensions-validator; finalize / to /): compare stages/base/pkg.yaml", path, toolsImage)
	}

	return validator, nil
}

func readYAMLVars(path, under string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}

	if under == "" {
		out := map[string]string{}

		return out, yamlErr(path, yaml.Unmarshal(data, &out))
	}

	var doc map[string]map[string]string
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, yamlErr(path, err)
	}

	return doc[under], nil
}

func yamlErr(path string, err error) error {
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}

	return nil
}

// readMakefileVars reads "NAME ?= value" and "NAME := value" lines.
func readMakefileVars(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}

	out := map[string]string{}

	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if m := makeVar.FindStringSubmatch(sc.Text()); m != nil {
			out[m[1]] = m[2]
		}
	}

	return out, sc.Err()
}

var (
	makeVar = regexp.MustCompile(`^([A-Z_]+)\s*[?:]=\s*(\S+)\s*$`)
	// provenance is the first header line of a vendored file.
	provenance = regexp.MustCompile(`^# Vendored from (siderolabs/\S+), tag (\S+) \(commit ([0-9a-f]{40})\), file ([^\s:,]+)`)
	// inferred is a header line of a file that stands for a tag it was not copied from: the
	// tag, then why it is believed to be the same there (the reason may go on over the next
	// comment lines).
	inferred = regexp.MustCompile(`^# Inferred for (\S+?):(.*)$`)
)

// ReadProvenance reads a vendored file's header: its first line names repository, tag,
// commit and file; a later line of the leading comment block may say "# Inferred for <tag>:
// <why>" when the file at that tag was not at hand. A file without the first line, or with
// an inference that gives no reason, is refused.
func ReadProvenance(path string) (Provenance, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Provenance{}, err
	}

	lines := strings.Split(string(data), "\n")

	m := provenance.FindStringSubmatch(lines[0])
	if m == nil {
		return Provenance{}, fmt.Errorf("%s: no provenance header (repository, tag, commit, file)", path)
	}

	p := Provenance{Repo: m[1], Tag: m[2], Commit: m[3], File: m[4]}

	for _, l := range lines[1:] {
		if !strings.HasPrefix(l, "#") {
			break
		}

		if i := inferred.FindStringSubmatch(l); i != nil {
			if p.InferredFor != "" {
				return p, fmt.Errorf("%s: two \"Inferred for\" lines", path)
			}

			p.InferredFor, p.Why = i[1], strings.TrimSpace(i[2])
			if p.Why == "" {
				return p, fmt.Errorf("%s: inferred for %s without a reason (\"# Inferred for <tag>: <why>\")", path, p.InferredFor)
			}

			if p.InferredFor == p.Tag {
				return p, fmt.Errorf("%s: inferred for %s, the tag it was copied from", path, p.Tag)
			}
		} else if strings.HasPrefix(strings.ToLower(l), "# inferred") {
			return p, fmt.Errorf("%s: a malformed inference line %q (\"# Inferred for <tag>: <why>\")", path, l)
		}
	}

	return p, nil
}

// LoadReleases reads every release directory under dir, newest first, with each release's
// machinery data downloaded through the go command. A directory without siderolabs' files
// (a README.md that names them) is a missing release: its machinery data only, so the
// recipes can name it.
func LoadReleases(dir string) (releases []Release, missing []Machinery, err error) {
	names, err := ReleaseDirs(dir)
	if err != nil {
		return nil, nil, err
	}

	for _, n := range names {
		m, err := DownloadMachinery(n)
		if err != nil {
			return nil, nil, err
		}

		if _, err := os.Stat(filepath.Join(dir, n, ExtensionsVarsFile)); errors.Is(err, os.ErrNotExist) {
			if m.Tag != n {
				return nil, nil, fmt.Errorf("%s: machinery gendata says Talos %s", filepath.Join(dir, n), m.Tag)
			}

			missing = append(missing, m)

			continue
		}

		r, err := ReadRelease(filepath.Join(dir, n), m)
		if err != nil {
			return nil, nil, err
		}

		releases = append(releases, r)
	}

	if len(releases) == 0 {
		return nil, nil, fmt.Errorf("%s: no release with siderolabs' files", dir)
	}

	return releases, missing, nil
}

// Floor is the lowest Talos version the manifest's constraint admits: the first release of
// r's minor line (v1.13.0 for v1.13.9), or, if lower, the core version of the Talos that the
// release's extensions-validator checks against (v1.13.0 for 84cecb0's v1.13.0-alpha.2:
// extensions.validateConstraints drops the prerelease), which must pass the constraint for
// siderolabs' validator to take the image (v1.13.0 for v1.14.1 with 84cecb0).
func (r Release) Floor() string {
	v, err := semver.ParseTolerant(r.Talos)
	if err != nil {
		return r.Talos
	}

	floor := semver.Version{Major: v.Major, Minor: v.Minor}

	if w, err := semver.ParseTolerant(r.ValidatorTalos); err == nil {
		if core := (semver.Version{Major: w.Major, Minor: w.Minor, Patch: w.Patch}); core.LT(floor) {
			floor = core
		}
	}

	return "v" + floor.String()
}
