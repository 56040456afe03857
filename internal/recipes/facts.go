package recipes

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/blang/semver/v4"
	"gopkg.in/yaml.v3"
)

// FactsFile is the release facts file, relative to the repository root: one entry per
// supported Talos release with what the recipes need beyond its machinery module, each value
// with a comment that says where it was read.
const FactsFile = "hack/release/releases.yaml"

// Facts is one release's entry of the facts file.
type Facts struct {
	Talos string
	// Pkgs and Tools are the tags of the Talos packages and tools images the release is
	// built from (siderolabs/extensions' Makefile PKGS, TOOLS); the prefixes are the
	// registry and user of those images (PKGS_PREFIX, TOOLS_PREFIX).
	Pkgs, PkgsPrefix, Tools, ToolsPrefix string
	// BldrRelease is the bldr frontend siderolabs/extensions' Makefile pins (BLDR_RELEASE).
	BldrRelease string
	// Validator is the extensions-validator image of siderolabs' base stage
	// (internal/base/pkg.yaml).
	Validator string
	// WolfiBaseRef is the digest of cgr.dev/chainguard/wolfi-base, the glibc image NVIDIA's
	// installer runs in (siderolabs/extensions' nvidia-gpu/vars.yaml WOLFI_BASE_REF).
	WolfiBaseRef string
	// Drivers by branch (Branches).
	Drivers map[string]Driver
	// Sources say where each value was read, by field (pkgs.tag, drivers.lts.archive.amd64.sha256),
	// as the comments of the facts file say it.
	Sources map[string]string
	// Inferred are the values read at another tag than the one the release was built from.
	Inferred []Inference
}

// Inference names values read at another tag than the release's, and why they are taken
// for it.
type Inference struct {
	// Fields are fields of the entry, or a prefix of some (drivers.lts.archive).
	Fields []string
	Why    string
}

// Source is where the value of a field was read.
func (f Facts) Source(field string) string { return f.Sources[field] }

// IsInferred says whether an inference names the field (or a prefix of it).
func (f Facts) IsInferred(field string) bool {
	for _, inf := range f.Inferred {
		for _, g := range inf.Fields {
			if g == field || strings.HasPrefix(field, g+".") {
				return true
			}
		}
	}

	return false
}

// Origin is where the values of fields were read, for vars.yaml's comments: each source
// once, and INFERRED where a value was read at another tag than the release's.
func (f Facts) Origin(fields ...string) string {
	var out []string

	for _, field := range fields {
		o := f.Sources[field]
		if f.IsInferred(field) {
			o += "; INFERRED for Talos " + f.Talos
		}

		if !slices.Contains(out, o) {
			out = append(out, o)
		}
	}

	return strings.Join(out, "; ")
}

// factField is one value of an entry: its path in the entry, the form it must have, and
// where it goes.
type factField struct {
	path string
	form *regexp.Regexp
	// what the form is, for the error that names a malformed value.
	what string
	set  func(*Facts, string)
}

var (
	tagForm      = regexp.MustCompile(`^v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$`)
	prefixForm   = regexp.MustCompile(`^[a-z0-9.-]+(:\d+)?(/[a-z0-9._-]+)+$`)
	releaseForm  = regexp.MustCompile(`^v\d+\.\d+\.\d+$`)
	imageForm    = regexp.MustCompile(`^[a-z0-9.-]+(:\d+)?(/[a-z0-9._-]+)*/extensions-validator(:[\w.-]+|@sha256:[0-9a-f]{64})$`)
	digestForm   = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	versionForm  = regexp.MustCompile(`^\d+\.\d+(\.\d+)?$`)
	sha256Form   = regexp.MustCompile(`^[0-9a-f]{64}$`)
	sha512Form   = regexp.MustCompile(`^[0-9a-f]{128}$`)
	sourceIsText = regexp.MustCompile(`\{\{|\}\}`)
)

// factFields are the values every entry must have.
func factFields() []factField {
	fields := []factField{
		{"pkgs.tag", tagForm, "a tag such as v1.13.0-60-gf541ca4", func(f *Facts, v string) { f.Pkgs = v }},
		{"pkgs.prefix", prefixForm, "a registry and user such as ghcr.io/siderolabs", func(f *Facts, v string) { f.PkgsPrefix = v }},
		{"tools.tag", tagForm, "a tag such as v1.13.0-9-ga201d19", func(f *Facts, v string) { f.Tools = v }},
		{"tools.prefix", prefixForm, "a registry and user such as ghcr.io/siderolabs", func(f *Facts, v string) { f.ToolsPrefix = v }},
		{"bldrRelease", releaseForm, "a release such as v0.6.2", func(f *Facts, v string) { f.BldrRelease = v }},
		{"extensionsValidator", imageForm, "an extensions-validator image by tag or digest", func(f *Facts, v string) { f.Validator = v }},
		{"wolfiBaseRef", digestForm, "sha256: and 64 hexadecimal digits", func(f *Facts, v string) { f.WolfiBaseRef = v }},
	}

	for _, b := range Branches {
		fields = append(fields, factField{"drivers." + b + ".version", versionForm, "a driver version such as 580.178.04", func(f *Facts, v string) {
			d := f.Drivers[b]
			d.Version = v
			f.Drivers[b] = d
		}})

		for _, a := range Arches() {
			for _, c := range []struct {
				archive, sum, what string
				form               *regexp.Regexp
				to                 func(*Archives) *string
			}{
				{"archive", "sha256", "64 hexadecimal digits", sha256Form, func(x *Archives) *string { return &x.SHA256 }},
				{"archive", "sha512", "128 hexadecimal digits", sha512Form, func(x *Archives) *string { return &x.SHA512 }},
				{"fabricManager", "sha256", "64 hexadecimal digits", sha256Form, func(x *Archives) *string { return &x.FabricManagerSHA256 }},
				{"fabricManager", "sha512", "128 hexadecimal digits", sha512Form, func(x *Archives) *string { return &x.FabricManagerSHA512 }},
			} {
				path := "drivers." + b + "." + c.archive + "." + a.Siderolabs + "." + c.sum
				fields = append(fields, factField{path, c.form, c.what, func(f *Facts, v string) {
					d := f.Drivers[b]
					if d.Archives == nil {
						d.Archives = map[string]Archives{}
					}

					x := d.Archives[a.Name]
					*c.to(&x) = v
					d.Archives[a.Name] = x
					f.Drivers[b] = d
				}})
			}
		}
	}

	return fields
}

// ReadFacts reads the facts file at path and checks every entry's form: each field there
// with a well-formed value and a source, nothing else, and each inference with its fields
// and a reason. Problems are reported all at once, each naming the release and the field.
func ReadFacts(path string) ([]Facts, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}

	return ParseFacts(path, data)
}

// ParseFacts is ReadFacts of the file's contents; name names it in errors.
func ParseFacts(name string, data []byte) ([]Facts, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}

	if len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode || len(doc.Content[0].Content) != 2 ||
		doc.Content[0].Content[0].Value != "releases" || doc.Content[0].Content[1].Kind != yaml.SequenceNode {
		return nil, fmt.Errorf("%s: not a release facts file: one key, releases, a list of entries", name)
	}

	var (
		out  []Facts
		errs []error
		seen = map[string]bool{}
	)

	for _, n := range doc.Content[0].Content[1].Content {
		f, err := parseFactsEntry(n)
		errs = append(errs, prefixed(name, err...)...)

		if f.Talos != "" && seen[f.Talos] {
			errs = append(errs, fmt.Errorf("%s: Talos %s: a second entry (line %d)", name, f.Talos, n.Line))
		}

		seen[f.Talos] = true

		out = append(out, f)
	}

	if len(out) == 0 {
		errs = append(errs, fmt.Errorf("%s: no releases", name))
	}

	return out, errors.Join(errs...)
}

// parseFactsEntry reads one entry; its errors name the release (or, without one, the line).
func parseFactsEntry(n *yaml.Node) (Facts, []error) {
	f := Facts{Drivers: map[string]Driver{}, Sources: map[string]string{}}

	if n.Kind != yaml.MappingNode {
		return f, []error{fmt.Errorf("line %d: an entry is a mapping", n.Line)}
	}

	var (
		errs     []error
		inferred *yaml.Node
		rest     = &yaml.Node{Kind: yaml.MappingNode}
	)

	for i := 0; i+1 < len(n.Content); i += 2 {
		switch k, v := n.Content[i], n.Content[i+1]; k.Value {
		case "talos":
			f.Talos = v.Value
		case "inferred":
			inferred = v
		default:
			rest.Content = append(rest.Content, k, v)
		}
	}

	where := fmt.Sprintf("the entry at line %d", n.Line)

	if v, err := semver.ParseTolerant(f.Talos); err != nil || !releaseForm.MatchString(f.Talos) || v.String() != strings.TrimPrefix(f.Talos, "v") {
		return f, []error{fmt.Errorf("%s: talos %q: not a Talos release such as v1.13.9", where, f.Talos)}
	}

	where = "Talos " + f.Talos

	leaves := map[string]leaf{}
	errs = append(errs, flatten(rest, "", "", leaves)...)

	known := map[string]bool{}

	for _, fd := range factFields() {
		known[fd.path] = true

		l, ok := leaves[fd.path]

		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("no %s", fd.path))
		case !fd.form.MatchString(l.value):
			errs = append(errs, fmt.Errorf("%s %q (line %d): not %s", fd.path, l.value, l.line, fd.what))
		case l.source == "":
			errs = append(errs, fmt.Errorf("%s (line %d): no source: a comment naming the repository, tag or commit, and file it was read from", fd.path, l.line))
		case sourceIsText.MatchString(l.source):
			errs = append(errs, fmt.Errorf("%s (line %d): its source has {{ or }}, which bldr would take for a template in vars.yaml", fd.path, l.line))
		default:
			fd.set(&f, l.value)
			f.Sources[fd.path] = l.source
		}
	}

	var unknown []string

	for p := range leaves {
		if !known[p] {
			unknown = append(unknown, p)
		}
	}

	sort.Strings(unknown)

	for _, p := range unknown {
		errs = append(errs, fmt.Errorf("%s (line %d): not a field of an entry (hack/release/releases.yaml says which are)", p, leaves[p].line))
	}

	if inferred != nil {
		inf, err := parseInferred(inferred, known)
		errs = append(errs, err...)
		f.Inferred = inf
	}

	return f, prefixed(where, errs...)
}

// prefixed puts prefix before each error.
func prefixed(prefix string, errs ...error) []error {
	var out []error

	for _, err := range errs {
		if err != nil {
			out = append(out, fmt.Errorf("%s: %w", prefix, err))
		}
	}

	return out
}

// leaf is a scalar value of an entry, with its source.
type leaf struct {
	value, source string
	line          int
}

// flatten collects the scalars of a mapping by dotted path. A value's source is the comment
// on its line or above its key, else that of the nearest key above that holds it.
func flatten(n *yaml.Node, prefix, source string, out map[string]leaf) []error {
	var errs []error

	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]

		path := k.Value
		if prefix != "" {
			path = prefix + "." + k.Value
		}

		src := firstOf(comment(k.HeadComment), comment(k.LineComment), source)

		if _, dup := out[path]; dup {
			errs = append(errs, fmt.Errorf("%s (line %d): given twice", path, k.Line))

			continue
		}

		switch v.Kind {
		case yaml.ScalarNode:
			out[path] = leaf{value: v.Value, source: firstOf(comment(v.LineComment), src), line: v.Line}
		case yaml.MappingNode:
			errs = append(errs, flatten(v, path, src, out)...)
		default:
			errs = append(errs, fmt.Errorf("%s (line %d): a value or a mapping expected", path, v.Line))
		}
	}

	return errs
}

// parseInferred reads an entry's inferred list: each item's fields are fields of the entry
// (or prefixes of some), named once in the list, with a reason.
func parseInferred(n *yaml.Node, known map[string]bool) ([]Inference, []error) {
	if n.Kind != yaml.SequenceNode {
		return nil, []error{fmt.Errorf("inferred (line %d): a list of {fields, why} expected", n.Line)}
	}

	var (
		out   []Inference
		errs  []error
		named = map[string]bool{}
	)

	for i, item := range n.Content {
		at := fmt.Sprintf("inferred[%d] (line %d)", i, item.Line)

		if item.Kind != yaml.MappingNode {
			errs = append(errs, fmt.Errorf("%s: {fields, why} expected", at))

			continue
		}

		var inf Inference

		for j := 0; j+1 < len(item.Content); j += 2 {
			switch k, v := item.Content[j], item.Content[j+1]; {
			case k.Value == "why" && v.Kind == yaml.ScalarNode:
				inf.Why = strings.TrimSpace(v.Value)
			case k.Value == "fields" && v.Kind == yaml.SequenceNode:
				for _, fv := range v.Content {
					inf.Fields = append(inf.Fields, fv.Value)
				}
			default:
				errs = append(errs, fmt.Errorf("%s: %s: not fields (a list) or why (a text)", at, k.Value))
			}
		}

		if len(inf.Fields) == 0 {
			errs = append(errs, fmt.Errorf("%s: no fields", at))
		}

		if inf.Why == "" {
			errs = append(errs, fmt.Errorf("%s: %s inferred without a reason (why)", at, strings.Join(inf.Fields, ", ")))
		}

		for _, field := range inf.Fields {
			covered := covers(field, known)

			if len(covered) == 0 {
				errs = append(errs, fmt.Errorf("%s: %s: not a field of an entry", at, field))
			}

			for _, c := range covered {
				if named[c] {
					errs = append(errs, fmt.Errorf("%s: %s: inferred twice", at, c))
				}

				named[c] = true
			}
		}

		out = append(out, inf)
	}

	return out, errs
}

// covers lists the known fields that field names: itself, or those under it.
func covers(field string, known map[string]bool) []string {
	var out []string

	for k := range known {
		if k == field || strings.HasPrefix(k, field+".") {
			out = append(out, k)
		}
	}

	sort.Strings(out)

	return out
}

// comment is a YAML comment's text: its lines without "#", joined by spaces.
func comment(c string) string {
	var words []string

	for _, l := range strings.Split(c, "\n") {
		if l = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), "#")); l != "" {
			words = append(words, l)
		}
	}

	return strings.Join(words, " ")
}

func firstOf(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}

	return ""
}

// NewRelease checks a release's facts against its machinery module: the machinery is that
// release's, the pkgs and tools tags are the ones it was built from, and the validator image
// is one whose Talos version is known (validatorTalos).
func NewRelease(f Facts, m Machinery) (Release, error) {
	r := Release{Facts: f, Kernel: m.Kernel, ValidatorTalos: validatorTalos[f.Validator]}

	var errs []error

	if m.Tag != f.Talos {
		errs = append(errs, fmt.Errorf("its machinery's gendata/data/tag says Talos %s", m.Tag))
	}

	if f.Pkgs != m.Pkgs {
		errs = append(errs, fmt.Errorf("pkgs.tag %s, but the machinery's gendata/data/pkgs says %s: its kernel modules are signed for that build only", f.Pkgs, m.Pkgs))
	}

	if f.Tools != m.Tools {
		errs = append(errs, fmt.Errorf("tools.tag %s, but the machinery's gendata/data/tools says %s", f.Tools, m.Tools))
	}

	if r.ValidatorTalos == "" {
		errs = append(errs, fmt.Errorf("extensionsValidator %s: the Talos version it checks constraints against is not known (recipes.validatorTalos)", f.Validator))
	}

	return r, errors.Join(prefixed("Talos "+f.Talos, errs...)...)
}

// LoadReleases reads the facts file at path and checks each release against its machinery
// module, downloaded through the go command; newest release first.
func LoadReleases(path string) ([]Release, error) {
	facts, err := ReadFacts(path)
	if err != nil {
		return nil, err
	}

	var (
		out  []Release
		errs []error
	)

	for _, f := range facts {
		m, err := DownloadMachinery(f.Talos)
		if err != nil {
			return nil, err
		}

		r, err := NewRelease(f, m)
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			errs = append(errs, prefixed(path, j.Unwrap()...)...)

			continue
		}

		out = append(out, r)
	}

	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	sort.Slice(out, func(i, j int) bool {
		return semver.MustParse(strings.TrimPrefix(out[i].Talos, "v")).GT(semver.MustParse(strings.TrimPrefix(out[j].Talos, "v")))
	})

	return out, nil
}
