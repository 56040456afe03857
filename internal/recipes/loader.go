package recipes

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"text/template"

	"gopkg.in/yaml.v3"
)

// Options says how the tree is loaded.
type Options struct {
	// BuildArgs are docker buildx --build-arg values. bldr's frontend adds each to the
	// template context as BUILD_ARG_<name> (pkgfile/build.go, "push build arguments as
	// BUILD_ARGS_ prefixed variables").
	BuildArgs map[string]string
	// Platform is docker buildx's --platform, one of bldr's (Platforms); empty is
	// DefaultPlatform.
	Platform string
}

// Tree is a loaded recipe tree.
type Tree struct {
	Root string
	// Platform is the platform it was loaded for (Options.Platform, or DefaultPlatform).
	Platform string
	Pkgfile  Pkgfile
	// Pkgs are in the order bldr's filesystem walk finds them.
	Pkgs []*Pkg
	// Attached maps each template (path relative to Root) to the package it belongs to.
	Attached map[string]string
}

// Pkg returns the package named name, or nil.
func (t *Tree) Pkg(name string) *Pkg {
	for _, p := range t.Pkgs {
		if p.Name == name {
			return p
		}
	}

	return nil
}

// DefaultPlatform is the platform of a load without Options.Platform.
const DefaultPlatform = "linux/amd64"

// Platform is one of bldr's target platforms (environment/platform.go): the variables it
// puts into every context. bldr's frontend loads the tree once per requested platform, with
// that platform as both build and target platform (pkgfile/build.go platformContextCache.get):
// ARCH, TARGET, CFLAGS and CXXFLAGS are the target's, BUILD and HOST the build platform's.
type Platform struct {
	ID, Arch, Target, Build, Host, CFlags string
}

// Platforms are bldr's platforms (environment/platform.go LinuxAmd64, LinuxArm64).
func Platforms() []Platform {
	return []Platform{
		{ID: "linux/amd64", Arch: "x86_64", Target: "x86_64-talos-linux-musl", Build: "x86_64-linux-musl", Host: "x86_64-linux-musl", CFlags: "-O2 -g0 -march=x86-64-v2 -mtune=generic"},
		{ID: "linux/arm64", Arch: "aarch64", Target: "aarch64-talos-linux-musl", Build: "aarch64-linux-musl", Host: "aarch64-linux-musl", CFlags: "-O2 -g0"},
	}
}

// DefaultVars are the variables bldr puts into every context before the build arguments
// and the Pkgfile's vars, for a build of platform (environment/default.go,
// environment/platform.go, environment/options.go GetVariables; "" is DefaultPlatform).
func DefaultVars(platform string) (map[string]string, error) {
	if platform == "" {
		platform = DefaultPlatform
	}

	for _, p := range Platforms() {
		if p.ID == platform {
			return map[string]string{
				"LDFLAGS": "-s", "VENDOR": "talos", "SYSROOT": "/talos", "PATH": "/bin:/usr/bin:/sbin:/usr/sbin",
				"BUILD": p.Build, "HOST": p.Host,
				"ARCH": p.Arch, "TARGET": p.Target, "CFLAGS": p.CFlags, "CXXFLAGS": p.CFlags,
			}, nil
		}
	}

	// environment/platform.go Platform.Set
	return nil, fmt.Errorf("platform %q is not defined", platform)
}

// funcs are the template functions the tree may use. bldr offers sprig's hermetic set
// (sprig.HermeticTxtFuncMap); these behave as sprig's do. Any other function is an error
// here, so that the tree stays within what is checked.
var funcs = template.FuncMap{
	// sprig functions.go: "fail": func(msg string) (string, error)
	"fail": func(msg string) (string, error) { return "", errors.New(msg) },
}

// syntaxLine is the "# syntax = IMAGE" directive BuildKit reads from the Pkgfile's first line.
var syntaxLine = regexp.MustCompile(`^#\s*syntax\s*=\s*(\S+)\s*$`)

// Load reads the tree at root as bldr does and reports every problem it finds at once.
func Load(root string, opts Options) (*Tree, error) {
	t := &Tree{Root: root, Platform: opts.Platform, Attached: map[string]string{}}
	if t.Platform == "" {
		t.Platform = DefaultPlatform
	}

	var errs []error

	pf, err := loadPkgfile(root)
	if err != nil {
		return nil, err
	}

	t.Pkgfile = pf

	base, err := DefaultVars(opts.Platform)
	if err != nil {
		return nil, err
	}

	for k, v := range opts.BuildArgs {
		base["BUILD_ARG_"+k] = v
	}

	for k, v := range pf.Vars {
		base[k] = v
	}

	w, err := walk(root)
	if err != nil {
		return nil, err
	}

	// vars.yaml files, parents first (solver/filesystem_loader.go sorts them by directory).
	sort.SliceStable(w.vars, func(i, j int) bool { return filepath.Dir(w.vars[i]) < filepath.Dir(w.vars[j]) })

	contexts := map[string]map[string]string{}

	for _, rel := range w.vars {
		dir := filepath.Dir(rel)

		text, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			errs = append(errs, err)

			continue
		}

		out, err := render(rel, text, resolve(base, contexts, dir))
		if err != nil {
			errs = append(errs, fmt.Errorf("error loading variables %q: %w", rel, err))

			continue
		}

		vars := map[string]string{}
		if err := yaml.Unmarshal(out, &vars); err != nil {
			errs = append(errs, fmt.Errorf("error loading variables %q: %w", rel, err))

			continue
		}

		contexts[dir] = vars
	}

	for _, rel := range w.pkgs {
		p, err := loadPkg(root, rel, resolve(base, contexts, filepath.Dir(rel)))
		if err != nil {
			errs = append(errs, fmt.Errorf("error loading %q: %w", rel, err))

			continue
		}

		t.Pkgs = append(t.Pkgs, p)
	}

	errs = append(errs, t.attachTemplates(w)...)
	errs = append(errs, t.checkNames()...)
	errs = append(errs, t.checkStages()...)

	return t, errors.Join(errs...)
}

func loadPkgfile(root string) (Pkgfile, error) {
	var pf Pkgfile

	data, err := os.ReadFile(filepath.Join(root, PkgfileName))
	if err != nil {
		// bldr validate skips a missing Pkgfile; bldr's frontend, which builds, cannot
		// (solver/buildkit_loader.go: "error loading Pkgfile").
		return pf, fmt.Errorf("%s: %w: the bldr frontend needs one at the root of the build context", PkgfileName, err)
	}

	if err := yaml.Unmarshal(data, &pf); err != nil {
		return pf, fmt.Errorf("error parsing %q: %w", PkgfileName, err)
	}

	if pf.Format != SupportedFormat {
		return pf, fmt.Errorf("error parsing %q: unsupported format: %q, supported formats: [%q]", PkgfileName, pf.Format, SupportedFormat)
	}

	first, _, _ := bytes.Cut(data, []byte("\n"))
	if m := syntaxLine.FindSubmatch(first); m != nil {
		pf.Syntax = string(m[1])
	}

	return pf, nil
}

// walked lists a tree's recipe files, relative to its root, in bldr's filesystem order
// (filepath.Walk: lexical), and the directories in BuildKit's top-down order.
type walked struct {
	pkgs, vars, templates []string
}

// walk follows solver/filesystem_loader.go walkFunc: directories whose name starts with a
// dot are skipped, every other file named pkg.yaml or vars.yaml or ending in .tmpl is taken,
// wherever it is.
func walk(root string) (walked, error) {
	var w walked

	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}

		if d.IsDir() {
			if path != root && strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}

			return nil
		}

		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}

		switch {
		case d.Name() == PkgYAMLName:
			w.pkgs = append(w.pkgs, rel)
		case d.Name() == VarsYAMLName:
			w.vars = append(w.vars, rel)
		case strings.HasSuffix(d.Name(), TemplateExt):
			w.templates = append(w.templates, rel)
		}

		return nil
	})

	return w, err
}

// resolve merges the variables of dir's ancestors, root first, over base
// (filesystem_loader.go resolveContext).
func resolve(base map[string]string, contexts map[string]map[string]string, dir string) map[string]string {
	out := make(map[string]string, len(base))
	for k, v := range base {
		out[k] = v
	}

	prefix := "."
	parts := strings.Split(dir, string(filepath.Separator))

	for i := 0; i <= len(parts); i++ {
		if i > 0 {
			prefix = filepath.Join(parts[:i]...)
		}

		for k, v := range contexts[prefix] {
			out[k] = v
		}
	}

	return out
}

// render executes a bldr template. bldr renders a missing variable as "<no value>" and
// carries on; here it is an error naming the variable.
func render(name string, text []byte, vars map[string]string) ([]byte, error) {
	tmpl, err := template.New(name).Funcs(funcs).Option("missingkey=error").Parse(string(text))
	if err != nil {
		return nil, err
	}

	var b bytes.Buffer
	if err := tmpl.Execute(&b, vars); err != nil {
		if strings.Contains(err.Error(), "map has no entry for key") {
			return nil, fmt.Errorf("%w (bldr would render it as <no value>: define it in a vars.yaml or pass it as a build argument)", err)
		}

		return nil, err
	}

	return b.Bytes(), nil
}

func loadPkg(root, rel string, vars map[string]string) (*Pkg, error) {
	text, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		return nil, err
	}

	out, err := render(rel, text, vars)
	if err != nil {
		return nil, err
	}

	p := &Pkg{Dir: filepath.Dir(rel), Vars: vars, Templates: map[string][]byte{}}

	dec := yaml.NewDecoder(bytes.NewReader(out))
	dec.KnownFields(true)

	if err := dec.Decode(p); err != nil {
		return nil, err
	}

	if err := p.validate(); err != nil {
		return nil, err
	}

	return p, nil
}

// attachTemplates gives each template to its package. bldr has two rules that must agree:
// bldr validate attaches a template to the package with the nearest directory above it
// (filesystem_loader.go attachTemplate), bldr's frontend to the package it loaded last in
// its top-down walk (buildkit_loader.go). A template with no package above it fails both.
func (t *Tree) attachTemplates(w walked) []error {
	var errs []error

	byDir := map[string]*Pkg{}
	for _, p := range t.Pkgs {
		byDir[p.Dir] = p
	}

	frontend, hidden := frontendAttachments(t.Root, byDir)
	for _, rel := range hidden {
		errs = append(errs, fmt.Errorf("%s: in a hidden directory: bldr's frontend loads it, bldr validate skips it", rel))
	}

	for _, rel := range w.templates {
		var (
			closest  *Pkg
			shortest string
		)

		for _, p := range t.Pkgs {
			r, err := filepath.Rel(p.Dir, filepath.Dir(rel))
			if err != nil || strings.HasPrefix(r, "..") {
				continue
			}

			if closest == nil || len(r) < len(shortest) {
				closest, shortest = p, r
			}
		}

		if closest == nil {
			errs = append(errs, fmt.Errorf("error attaching template %q: no suitable package found for template %q", rel, rel))

			continue
		}

		if f := frontend[rel]; f != closest {
			name := "no package"
			if f != nil {
				name = "package " + f.Name
			}

			errs = append(errs, fmt.Errorf("template %q: bldr validate attaches it to package %s, bldr's frontend to %s", rel, closest.Name, name))

			continue
		}

		text, err := os.ReadFile(filepath.Join(t.Root, rel))
		if err != nil {
			errs = append(errs, err)

			continue
		}

		out, err := render(rel, text, closest.Vars)
		if err != nil {
			errs = append(errs, fmt.Errorf("error attaching template %q: failed to template file: %w", rel, err))

			continue
		}

		closest.Templates[strings.TrimSuffix(filepath.Join(shortest, filepath.Base(rel)), TemplateExt)] = out
		t.Attached[rel] = closest.Name
	}

	return errs
}

// frontendAttachments replays buildkit_loader.go walk: in each directory (entries sorted,
// as BuildKit's ReadDir returns them) vars.yaml, then pkg.yaml, then templates, then the
// subdirectories; a template goes to the last package loaded. The frontend reads what its
// include patterns let through and excludes _out/ (pkgfile/build.go fetchPkgs), but it does
// not skip hidden directories as bldr validate does: recipe files there are returned in
// hidden, as the two loaders would disagree on them.
func frontendAttachments(root string, byDir map[string]*Pkg) (attached map[string]*Pkg, hidden []string) {
	attached = map[string]*Pkg{}

	var last *Pkg

	var visit func(dir string, inHidden bool)
	visit = func(dir string, inHidden bool) {
		entries, err := os.ReadDir(filepath.Join(root, dir))
		if err != nil {
			return
		}

		if p := byDir[dir]; p != nil {
			last = p
		}

		for _, e := range entries {
			rel := filepath.Join(dir, e.Name())
			recipe := e.Name() == PkgYAMLName || e.Name() == VarsYAMLName || strings.HasSuffix(e.Name(), TemplateExt)

			switch {
			case e.IsDir() || !recipe:
			case inHidden:
				hidden = append(hidden, rel)
			case strings.HasSuffix(e.Name(), TemplateExt):
				attached[rel] = last
			}
		}

		for _, e := range entries {
			if e.IsDir() && !(dir == "." && e.Name() == "_out") {
				visit(filepath.Join(dir, e.Name()), inHidden || strings.HasPrefix(e.Name(), "."))
			}
		}
	}

	visit(".", false)

	return attached, hidden
}

// checkNames applies solver/packages.go NewPackages: a package name is defined once.
func (t *Tree) checkNames() []error {
	var errs []error

	seen := map[string]*Pkg{}

	for _, p := range t.Pkgs {
		if dup, ok := seen[p.Name]; ok {
			errs = append(errs, fmt.Errorf("package %q already exists, duplicate in dirs %q and %q", p.Name, p.Dir, dup.Dir))

			continue
		}

		seen[p.Name] = p
	}

	return errs
}

// checkStages resolves every package as solver/packages.go Resolve does for a build
// target: each stage dependency must be defined, with no cycle.
func (t *Tree) checkStages() []error {
	var errs []error

	for _, p := range t.Pkgs {
		if err := t.resolveStages(p.Name, nil); err != nil {
			errs = append(errs, err)
		}
	}

	return errs
}

func (t *Tree) resolveStages(name string, path []string) error {
	p := t.Pkg(name)
	if p == nil {
		return fmt.Errorf("package %q not defined", name)
	}

	if slices.Contains(path, name) {
		return fmt.Errorf("circular dependency detected %v -> %q", path, name)
	}

	path = append(path, name)

	for _, d := range p.Dependencies {
		if d.Stage == "" {
			continue
		}

		if err := t.resolveStages(d.Stage, path); err != nil {
			return fmt.Errorf("error resolving dependency %q of %q: %w", d.Stage, name, err)
		}
	}

	return nil
}

// Images lists the image dependencies of pkg and of the stages it depends on.
func (t *Tree) Images(name string) []string {
	var out []string

	seen := map[string]bool{}

	var visit func(string)
	visit = func(n string) {
		if seen[n] {
			return
		}

		seen[n] = true

		p := t.Pkg(n)
		if p == nil {
			return
		}

		for _, d := range p.Dependencies {
			if d.Image != "" {
				out = append(out, d.Image)
			} else {
				visit(d.Stage)
			}
		}
	}

	visit(name)

	return out
}

// BuildArgs lists the build arguments a file's templates read (index . "BUILD_ARG_X" or
// .BUILD_ARG_X), so that a test can hold them to the documented list.
func BuildArgs(text []byte) []string {
	var out []string

	sc := bufio.NewScanner(bytes.NewReader(text))
	for sc.Scan() {
		for _, m := range buildArgRef.FindAllStringSubmatch(sc.Text(), -1) {
			if !slices.Contains(out, m[1]) {
				out = append(out, m[1])
			}
		}
	}

	return out
}

var buildArgRef = regexp.MustCompile(`BUILD_ARG_([A-Z0-9_]+)`)
