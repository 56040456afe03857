package recipes

import (
	"bytes"
	"embed"
	"errors"
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
// stage of each branch.
func Generate(releases []Release) (map[string][]byte, error) {
	if len(releases) == 0 {
		return nil, errors.New("no releases")
	}

	// vars.yaml has one default of each prefix, which a build argument overrides.
	for _, r := range releases[1:] {
		if r.PkgsPrefix != releases[0].PkgsPrefix || r.ToolsPrefix != releases[0].ToolsPrefix {
			return nil, fmt.Errorf("Talos %s: pkgs.prefix %s and tools.prefix %s, but Talos %s has %s and %s: the recipes take one default of each",
				r.Talos, r.PkgsPrefix, r.ToolsPrefix, releases[0].Talos, releases[0].PkgsPrefix, releases[0].ToolsPrefix)
		}
	}

	tmpl, err := template.New("").Delims("[[", "]]").Funcs(template.FuncMap{"upper": strings.ToUpper, "comment": commentLines, "join": strings.Join}).ParseFS(templates, "templates/*.in")
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
		Branches []string
		Arches   []Arch
		Facts    string
	}{releases[0], releases, Branches, Arches(), FactsFile}); err != nil {
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

// commentLines writes its words as YAML comment lines of at most 100 columns (longer
// words, such as a digest, get a line of their own).
func commentLines(words ...string) string {
	var (
		lines []string
		line  = "#"
	)

	for _, w := range strings.Fields(strings.Join(words, " ")) {
		if len(line)+1+len(w) > 100 && line != "#" {
			lines = append(lines, line)
			line = "#"
		}

		line += " " + w
	}

	return strings.Join(append(lines, line), "\n")
}
