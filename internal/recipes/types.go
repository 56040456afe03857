// Package recipes loads the repository's bldr recipe tree (Pkgfile, vars.yaml, pkg.yaml,
// *.tmpl) the way bldr's loader reads it, and checks what bldr checks when it loads and
// resolves packages, plus what bldr lets through silently (a {{ .X }} that renders as
// "<no value>", a template attached to a package it was not meant for, unknown keys).
//
// It is not bldr: bldr's loader lives in internal packages of github.com/siderolabs/bldr
// (not importable) and the module is not served by the module proxy here. Each rule names the
// bldr v0.6.2 source file it follows, so that the next bldr release can be checked against it.
package recipes

import (
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
)

// File names bldr looks for (internal/pkg/constants/build.go).
const (
	PkgfileName  = "Pkgfile"
	PkgYAMLName  = "pkg.yaml"
	VarsYAMLName = "vars.yaml"
	TemplateExt  = ".tmpl"
	// SupportedFormat is the only Pkgfile format bldr accepts (types/v1alpha2/pkgfile.go).
	SupportedFormat = "v1alpha2"
)

// Pkgfile is the root Pkgfile (types/v1alpha2/pkgfile.go).
type Pkgfile struct {
	Format string            `yaml:"format"`
	Vars   map[string]string `yaml:"vars,omitempty"`
	Labels map[string]string `yaml:"labels,omitempty"`
	// Syntax is the frontend image named on the "# syntax = IMAGE" first line, which
	// docker buildx uses to run bldr as a BuildKit frontend.
	Syntax string `yaml:"-"`
}

// Pkg is one pkg.yaml (types/v1alpha2/pkg.go), decoded strictly: bldr ignores unknown
// keys, so a typo there would silently drop a step.
type Pkg struct {
	Name          string       `yaml:"name"`
	Variant       string       `yaml:"variant"`
	Shell         string       `yaml:"shell,omitempty"`
	BuildPlatform string       `yaml:"buildPlatform,omitempty"`
	Install       []string     `yaml:"install,omitempty"`
	Dependencies  []Dependency `yaml:"dependencies,omitempty"`
	Steps         []Step       `yaml:"steps,omitempty"`
	Finalize      []Finalize   `yaml:"finalize,omitempty"`

	// Dir is the package's directory relative to the tree root ("." for the root): what
	// bldr copies into /pkg (convert/node.go, context()).
	Dir string `yaml:"-"`
	// Vars is the context the package was rendered with.
	Vars map[string]string `yaml:"-"`
	// Templates are the *.tmpl files attached to it, rendered, by path relative to Dir
	// without the extension.
	Templates map[string][]byte `yaml:"-"`
}

// Dependency is an image or a stage (types/v1alpha2/deps.go).
type Dependency struct {
	Image    string `yaml:"image,omitempty"`
	Stage    string `yaml:"stage,omitempty"`
	From     string `yaml:"from,omitempty"`
	To       string `yaml:"to,omitempty"`
	Platform string `yaml:"platform,omitempty"`
	Runtime  bool   `yaml:"runtime,omitempty"`
}

// Step is one build step (types/v1alpha2/steps.go).
type Step struct {
	Env        map[string]string `yaml:"env,omitempty"`
	CachePaths []string          `yaml:"cachePaths,omitempty"`
	Sources    []Source          `yaml:"sources,omitempty"`
	Prepare    []string          `yaml:"prepare,omitempty"`
	Build      []string          `yaml:"build,omitempty"`
	Install    []string          `yaml:"install,omitempty"`
	Test       []string          `yaml:"test,omitempty"`
	SBOM       map[string]any    `yaml:"sbom,omitempty"`
	// Network is none (bldr's default when unset), default or host
	// (types/v1alpha2/network_mode.go).
	Network string `yaml:"network,omitempty"`
}

// Source is a download with its checksums (types/v1alpha2/source.go).
type Source struct {
	URL         string `yaml:"url"`
	Destination string `yaml:"destination"`
	SHA256      string `yaml:"sha256"`
	SHA512      string `yaml:"sha512"`
}

// Finalize is a copy into the package's output (types/v1alpha2/types.go).
type Finalize struct {
	From string `yaml:"from,omitempty"`
	To   string `yaml:"to,omitempty"`
}

// validate applies bldr's Pkg.Validate (types/v1alpha2/pkg.go and the Validate methods of
// deps.go, steps.go, source.go, variant.go, network_mode.go), plus a hex check of the
// checksums (bldr checks only their length; BuildKit rejects a non-hex digest later).
func (p *Pkg) validate() error {
	var errs []error

	if p.Name == "" {
		errs = append(errs, errors.New("package name can't be empty"))
	}

	switch p.Variant {
	case "alpine", "scratch":
	case "":
		errs = append(errs, errors.New("variant should be set"))
	default:
		errs = append(errs, fmt.Errorf("unknown variant %q", p.Variant))
	}

	if len(p.Steps) > 0 && len(p.Finalize) == 0 {
		errs = append(errs, errors.New("finalize steps are missing, this is going to lead to empty build"))
	}

	for _, d := range p.Dependencies {
		switch {
		case d.Image != "" && d.Stage != "":
			errs = append(errs, fmt.Errorf("dependency can't have both image & stage set: %q, %q", d.Image, d.Stage))
		case d.Image == "" && d.Stage == "":
			errs = append(errs, errors.New("either image or stage should be set for the dependency"))
		}
	}

	for i, s := range p.Steps {
		switch s.Network {
		case "", "none", "default", "host":
		default:
			errs = append(errs, fmt.Errorf("step %d: unknown networkmode %q", i, s.Network))
		}

		for _, src := range s.Sources {
			errs = append(errs, src.validate()...)
		}
	}

	return errors.Join(errs...)
}

func (s Source) validate() []error {
	var errs []error

	if s.URL == "" {
		errs = append(errs, errors.New("source.url can't be empty"))
	} else if _, err := url.Parse(s.URL); err != nil {
		errs = append(errs, fmt.Errorf("error parsing source.url %q: %w", s.URL, err))
	}

	if s.Destination == "" {
		errs = append(errs, fmt.Errorf("source %s: source.destination can't be empty", s.URL))
	}

	for _, c := range []struct {
		name, value string
		size        int
	}{{"sha256", s.SHA256, 64}, {"sha512", s.SHA512, 128}} {
		switch _, err := hex.DecodeString(c.value); {
		case c.value == "":
			errs = append(errs, fmt.Errorf("source %s: source.%s can't be empty", s.URL, c.name))
		case len(c.value) != c.size:
			errs = append(errs, fmt.Errorf("source %s: source.%s should be %d chars long", s.URL, c.name, c.size))
		case err != nil:
			errs = append(errs, fmt.Errorf("source %s: source.%s is not hexadecimal", s.URL, c.name))
		}
	}

	return errs
}
