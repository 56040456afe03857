package recipes

import (
	"bytes"
	"embed"
	"fmt"
	"path/filepath"
	"strings"
	"text/template"
)

// templates are Go templates with [[ ]] delimiters that write bldr files, whose own {{ }}
// templates bldr renders. They are named *.in so that bldr never takes them for its *.tmpl.
//
//go:embed templates/*.in
var templates embed.FS

// Flavor is one extension: a driver branch with one kind of kernel modules.
type Flavor struct {
	Name    string
	Branch  string // lts or production
	Modules string // open or proprietary
	// ModulesImage is the Talos packages image with these modules, signed for the release.
	ModulesImage string
	// License is what nvidia.ko of this kind declares.
	License string
}

// Flavors are the four extensions, the default first.
func Flavors() []Flavor {
	return []Flavor{
		{Name: "nvidia-driver-production-open", Branch: "production", Modules: "open", ModulesImage: "nvidia-open-gpu-kernel-modules-production-pkg", License: "Dual MIT/GPL"},
		{Name: "nvidia-driver-production", Branch: "production", Modules: "proprietary", ModulesImage: "nonfree-kmod-nvidia-production-pkg", License: "NVIDIA"},
		{Name: "nvidia-driver-lts-open", Branch: "lts", Modules: "open", ModulesImage: "nvidia-open-gpu-kernel-modules-lts-pkg", License: "Dual MIT/GPL"},
		{Name: "nvidia-driver-lts", Branch: "lts", Modules: "proprietary", ModulesImage: "nonfree-kmod-nvidia-lts-pkg", License: "NVIDIA"},
	}
}

// Upper is a branch's name in variable names (NVIDIA_DRIVER_LTS_VERSION).
func (f Flavor) Upper() string { return strings.ToUpper(f.Branch) }

// Generate renders the generated part of the recipe tree, by path relative to the
// repository root: the root vars.yaml with every release's data (releases[0] is the
// default), each flavor's pkg.yaml, vars.yaml and manifest.yaml.tmpl, and the userspace
// stage of each branch. A missing release (its machinery is known, siderolabs' files are
// not vendored) gets a branch that fails the build naming it and what to add.
func Generate(releases []Release, missing []Machinery) (map[string][]byte, error) {
	tmpl, err := template.New("").Delims("[[", "]]").Funcs(template.FuncMap{"upper": strings.ToUpper}).ParseFS(templates, "templates/*.in")
	if err != nil {
		return nil, err
	}

	out := map[string][]byte{}

	exec := func(path, name string, data any) error {
		var b bytes.Buffer
		if err := tmpl.ExecuteTemplate(&b, name, data); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}

		out[path] = b.Bytes()

		return nil
	}

	if err := exec(VarsYAMLName, "releases.vars.yaml.in", struct {
		Default  Release
		Releases []Release
		Missing  []Machinery
		Branches []string
		Arches   []Arch
	}{releases[0], releases, missing, Branches, Arches()}); err != nil {
		return nil, err
	}

	for _, b := range Branches {
		if err := exec(filepath.Join("stages", "nvidia-userspace-"+b, PkgYAMLName), "userspace.pkg.yaml.in", Flavor{Branch: b}); err != nil {
			return nil, err
		}
	}

	for _, f := range Flavors() {
		data := struct {
			Flavor
			Default string
		}{f, releases[0].Talos}

		for file, name := range map[string]string{PkgYAMLName: "flavor.pkg.yaml.in", VarsYAMLName: "flavor.vars.yaml.in", "manifest.yaml" + TemplateExt: "flavor.manifest.yaml.in"} {
			if err := exec(filepath.Join("flavors", f.Name, file), name, data); err != nil {
				return nil, err
			}
		}
	}

	return out, nil
}
