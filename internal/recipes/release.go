package recipes

import (
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/blang/semver/v4"
)

// MachineryModule is Talos's machinery module: its gendata and constants say which pkgs,
// tools and kernel a Talos release was built with.
const MachineryModule = "github.com/siderolabs/talos/pkg/machinery"

// Branches are NVIDIA's driver branches that Talos builds kernel modules for.
var Branches = []string{"lts", "production"}

// Arch is an architecture the release flavors are built for, as bldr, siderolabs and NVIDIA
// name it.
type Arch struct {
	// Platform is the docker buildx --platform, one of bldr's (Platforms).
	Platform string
	// Name is bldr's ARCH of that platform.
	Name string
	// Siderolabs is siderolabs' word for it (nvidia_driver_lts_<amd64>_sha256 in their pkgs'
	// Pkgfile), and the key of its checksums in the release facts (FactsFile).
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

// Release is what the recipes need to know about one Talos release: its facts
// (FactsFile), checked against its machinery module, and what that module says.
type Release struct {
	Facts
	// Kernel is the machinery's constants.DefaultKernelVersion.
	Kernel string
	// ValidatorTalos is the Talos version the release's extensions-validator checks a
	// manifest's constraint against (ValidatorTalos, the function).
	ValidatorTalos string
}

// validatorTalos is the Talos version each extensions-validator image of siderolabs' base
// stage checks a manifest's constraint against: the gendata tag of the machinery its go.mod
// pins (84cecb0: v1.13.0-alpha.2.0.20260405070107-79fa2e300108, whose gendata tag at
// 79fa2e3 is v1.13.0-alpha.2). A release whose facts name another image stops the generator
// until that image is added here.
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
