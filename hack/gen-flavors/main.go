// Command gen-flavors renders the release recipes of the nvidia-driver extension (bldr
// pkg.yaml, vars.yaml and manifest.yaml, in siderolabs/extensions' conventions) for the four
// flavors, NVIDIA's production and LTS branches with the open and the proprietary kernel
// modules, from one template. The Talos release comes from the machinery module that go.mod
// pins (gendata), so the recipes, the manifest's compatibility and our validation agree.
//
//	go run ./hack/gen-flavors [-check]
//
// writes flavors/<name>/{manifest.yaml,pkg.yaml,vars.yaml} and the default flavor's files
// at the top of the repository; -check only compares and fails if a file is stale.
package main

import (
	"bytes"
	"embed"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"text/template"

	"github.com/siderolabs/talos/pkg/machinery/constants"
	"github.com/siderolabs/talos/pkg/machinery/gendata"
)

//go:embed templates/*.tmpl
var templates embed.FS

// Flavor is one release recipe.
type Flavor struct {
	Name          string
	Branch        string // production or lts
	Modules       string // open or proprietary
	DriverVersion string
	// ModulesImage is the Talos packages image with these modules, signed for the release.
	ModulesImage string
	// RunSHA256 and RunSHA512 are the checksums of NVIDIA's .run installer. Empty: the recipe
	// fails closed (bldr refuses the download) until they are filled in from NVIDIA.
	RunSHA256, RunSHA512 string
}

// Release is what every flavor of one build shares.
type Release struct {
	TalosVersion  string
	PkgsVersion   string
	KernelVersion string
}

// Driver branches pinned by siderolabs/extensions for Talos 1.13 (nvidia-gpu vars; verify
// against the release-1.13 branch before building a release: the recipe's test step fails
// if the modules' version differs from the installer's).
const (
	productionVersion = "595.58.03"
	ltsVersion        = "580.126.16"
)

// Flavors lists the four release flavors; the first is the default (top-level files).
func Flavors() []Flavor {
	return []Flavor{
		{Name: "nvidia-driver-production-open", Branch: "production", Modules: "open", DriverVersion: productionVersion, ModulesImage: "nvidia-open-gpu-kernel-modules-production-pkg"},
		{Name: "nvidia-driver-production", Branch: "production", Modules: "proprietary", DriverVersion: productionVersion, ModulesImage: "nonfree-kmod-nvidia-production-pkg"},
		{Name: "nvidia-driver-lts-open", Branch: "lts", Modules: "open", DriverVersion: ltsVersion, ModulesImage: "nvidia-open-gpu-kernel-modules-lts-pkg"},
		{Name: "nvidia-driver-lts", Branch: "lts", Modules: "proprietary", DriverVersion: ltsVersion, ModulesImage: "nonfree-kmod-nvidia-lts-pkg"},
	}
}

// CurrentRelease is the Talos release of the machinery module in go.mod.
func CurrentRelease() Release {
	return Release{TalosVersion: gendata.VersionTag, PkgsVersion: gendata.VersionPkgs, KernelVersion: constants.DefaultKernelVersion}
}

// Render returns every generated file, by path relative to the repository root.
func Render(rel Release, flavors []Flavor) (map[string][]byte, error) {
	tmpl, err := template.New("").Delims("[[", "]]").ParseFS(templates, "templates/*.tmpl")
	if err != nil {
		return nil, err
	}

	out := map[string][]byte{}

	for i, f := range flavors {
		data := struct {
			Release
			Flavor
		}{rel, f}

		for _, name := range []string{"manifest.yaml", "pkg.yaml", "vars.yaml"} {
			var b bytes.Buffer
			if err := tmpl.ExecuteTemplate(&b, name+".tmpl", data); err != nil {
				return nil, fmt.Errorf("%s/%s: %w", f.Name, name, err)
			}

			out[filepath.Join("flavors", f.Name, name)] = b.Bytes()

			if i == 0 {
				out[name] = b.Bytes()
			}
		}
	}

	return out, nil
}

func main() {
	check := flag.Bool("check", false, "fail if a generated file is stale")
	root := flag.String("root", ".", "repository root")
	flag.Parse()

	files, err := Render(CurrentRelease(), Flavors())
	if err != nil {
		fmt.Fprintln(os.Stderr, "gen-flavors:", err)
		os.Exit(1)
	}

	stale := 0

	for rel, data := range files {
		p := filepath.Join(*root, rel)

		if *check {
			if old, err := os.ReadFile(p); err != nil || !bytes.Equal(old, data) {
				fmt.Fprintf(os.Stderr, "gen-flavors: %s is stale: run go run ./hack/gen-flavors\n", rel)
				stale++
			}

			continue
		}

		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "gen-flavors:", err)
			os.Exit(1)
		}

		if err := os.WriteFile(p, data, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "gen-flavors:", err)
			os.Exit(1)
		}
	}

	if stale > 0 {
		os.Exit(1)
	}
}
