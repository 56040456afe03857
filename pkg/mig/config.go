// Package mig reads MIG layouts (NVIDIA mig-parted's v1 format plus built-in
// generic layouts), plans them per GPU with explicit placements, and applies
// a plan idempotently with rollback.
package mig

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/talos-nvidia/nvidia-driver/pkg/document"
)

// Config is a parsed layout file: named layouts, each a list of entries.
type Config struct {
	// Source names the file, for messages ("" for the built-in layouts alone).
	Source  string
	Layouts map[string][]Entry
	// Overridden lists the built-in layouts that the file defines itself, sorted: the
	// file's win (mig-parted has no built-ins, so NVIDIA's files define all-disabled,
	// all-enabled and all-balanced themselves).
	Overridden []string
}

// Entry is one item of a layout: which GPUs it selects and what they get.
type Entry struct {
	Layout string
	Index  int // position in the layout, for messages

	AllDevices bool
	Devices    []int // GPU indices when not AllDevices
	// DeviceLines are the lines of Devices in the file, for messages.
	DeviceLines []int
	Filter      []uint32 // PCI device ids (device<<16 | vendor); empty matches any

	MigEnabled bool
	// MigDevices maps a profile name (as written) to its count.
	MigDevices map[string]int
	// Generic is set for built-in layouts that are computed from each GPU's
	// own profiles (all-1g, all-balanced, all-max).
	Generic string
	// builtin marks the entries of the built-in layouts (a file's layout of the same name
	// overrides them).
	builtin bool
}

func (e Entry) where() string { return fmt.Sprintf("layout %q, entry %d", e.Layout, e.Index) }

// Names returns the layout names, sorted.
func (c *Config) Names() []string {
	names := make([]string, 0, len(c.Layouts))
	for n := range c.Layouts {
		names = append(names, n)
	}

	sort.Strings(names)

	return names
}

// Select returns the entries of one layout.
func (c *Config) Select(name string) ([]Entry, error) {
	entries, ok := c.Layouts[name]
	if !ok {
		return nil, fmt.Errorf("no layout %q (layouts: %s)", name, strings.Join(c.Names(), ", "))
	}

	return entries, nil
}

// LoadFile reads the layouts file at path and adds the built-in layouts; a file that does not
// exist gives the built-in layouts alone (a node without an ExtensionServiceConfig file). A
// file larger than document.MaxFileSize is refused before it is parsed.
func LoadFile(path string) (*Config, error) {
	data, err := document.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return Builtin(), nil
	}

	if err != nil {
		return nil, fmt.Errorf("reading the MIG layouts: %w", err)
	}

	cfg, err := ParseFile(path, data)
	if err != nil {
		return nil, err
	}

	return cfg.WithBuiltins(), nil
}

// ParseFile is Parse for the contents of the file name: errors and later planning messages
// name it.
func ParseFile(name string, data []byte) (*Config, error) {
	cfg, err := Parse(data)
	if err != nil {
		var inv *document.Invalid
		if errors.As(err, &inv) {
			inv.File = name
		}

		return nil, err
	}

	cfg.Source = name

	return cfg, nil
}

// invalid collects the problems of a layouts file (the planner's too: GPU indices the node
// lacks are found only there).
func invalid(file string) *document.Invalid { return &document.Invalid{What: "MIG config", File: file} }

// file is a layouts file as written. Its layouts stay nodes: each entry is decoded on its own,
// so that its problems name it. Keys yaml.v3 knows no field for are kept, to be named.
type file struct {
	Version yaml.Node            `yaml:"version"`
	Configs yaml.Node            `yaml:"mig-configs"`
	Unknown map[string]yaml.Node `yaml:",inline"`
}

// entry is one entry as written: nil is a key not given. Each field checks its own value and
// reports its problems as yaml.v3 reports its own (a yaml.TypeError, "line N: ...").
type entry struct {
	Devices    *devices             `yaml:"devices"`
	Filter     filter               `yaml:"device-filter"`
	Enabled    *boolean             `yaml:"mig-enabled"`
	MigDevices *migDevices          `yaml:"mig-devices"`
	Unknown    map[string]yaml.Node `yaml:",inline"`
	Decoded    decoded              `yaml:",inline"`
}

// decoded is set when yaml.v3 decodes the map of the struct it is inlined in: yaml.v3 calls an
// inlined UnmarshalYAML with that map before the fields.
type decoded struct{ ok bool }

func (d *decoded) UnmarshalYAML(*yaml.Node) error {
	d.ok = true

	return nil
}

// Parse reads a mig-parted v1 file strictly: unknown keys, keys given twice, wrong types,
// malformed profiles and bad counts are all reported at once, each with its line and the
// layout and entry it concerns. yaml.v3 resolves anchors, aliases and merge keys (an alias
// bomb is an error, not a hang).
func Parse(data []byte) (*Config, error) {
	p := invalid("")

	if msg := notUTF8(data); msg != "" {
		p.Add(errors.New(msg))

		return nil, p
	}

	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		p.Add(errors.New(syntaxError(data, err)))

		return nil, p
	}

	if len(doc.Content) == 0 {
		p.Addf("empty document")

		return nil, p
	}

	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		p.Addf("line %d: top level must be a map with version and mig-configs", root.Line)

		return nil, p
	}

	// Only a key given twice (or a bad merge key) fails this: the file's fields are nodes.
	var f file
	if err := root.Decode(&f); err != nil {
		for _, msg := range problemsOf(root, err) {
			p.Add(errors.New(msg))
		}

		return nil, p
	}

	for _, k := range byPlace(f.Unknown) {
		p.Addf("line %d: unknown top-level key %q (want version, mig-configs)", f.Unknown[k].Line, k)
	}

	switch v := deref(&f.Version); {
	case v.Kind == 0:
		p.Addf("version: required (want \"v1\")")
	case v.Kind != yaml.ScalarNode || v.Value != "v1":
		p.Addf("line %d: version: unsupported %q (want \"v1\")", v.Line, v.Value)
	}

	var layouts map[string]yaml.Node

	switch configs := deref(&f.Configs); {
	case configs.Kind == 0:
		p.Addf("mig-configs: required")
	case configs.Kind != yaml.MappingNode:
		p.Addf("line %d: mig-configs: must be a map of layout name to entries", configs.Line)
	default:
		if err := configs.Decode(&layouts); err != nil {
			for _, msg := range problemsOf(configs, err) {
				p.Add(errors.New(msg))
			}
		}
	}

	cfg := &Config{Layouts: map[string][]Entry{}}

	for _, name := range byPlace(layouts) {
		n := layouts[name]
		cfg.Layouts[name] = parseLayout(p, name, &n)
	}

	if err := p.Err(); err != nil {
		return nil, err
	}

	return cfg, nil
}

func parseLayout(p *document.Invalid, name string, n *yaml.Node) []Entry {
	list := deref(n)

	switch {
	case name == "":
		p.Addf("line %d: mig-configs: empty layout name", n.Line)

		return nil
	case list.Kind != yaml.SequenceNode:
		p.Addf("line %d: layout %q: must be a list of entries", n.Line, name)

		return nil
	case len(list.Content) == 0:
		p.Addf("line %d: layout %q: has no entries", n.Line, name)
	}

	entries := make([]Entry, 0, len(list.Content))
	for i, en := range list.Content {
		entries = append(entries, parseEntry(p, Entry{Layout: name, Index: i}, en))
	}

	return entries
}

func parseEntry(p *document.Invalid, e Entry, n *yaml.Node) Entry {
	if deref(n).Kind != yaml.MappingNode {
		p.Addf("line %d: %s: must be a map", n.Line, e.where())

		return e
	}

	var s entry
	if err := n.Decode(&s); err != nil {
		for _, msg := range problemsOf(n, err) {
			line, what, _ := strings.Cut(msg, ": ")
			p.Addf("%s: %s, %s", line, e.where(), what)
		}
	}

	// A map with a key given twice is not decoded at all: its keys are not missing.
	if !s.Decoded.ok {
		return e
	}

	for _, k := range byPlace(s.Unknown) {
		p.Addf("line %d: %s: unknown key %q (want devices, device-filter, mig-enabled, mig-devices)", s.Unknown[k].Line, e.where(), k)
	}

	if s.Devices == nil {
		p.Addf("line %d: %s, devices: required", n.Line, e.where())
	} else {
		e.AllDevices, e.Devices, e.DeviceLines = s.Devices.all, s.Devices.list, s.Devices.lines
	}

	e.Filter = s.Filter

	if s.MigDevices != nil {
		e.MigDevices = s.MigDevices.counts
	}

	// mig-parted's rules (api/spec/v1/spec.go, MigConfigSpec.UnmarshalJSON): mig-devices is
	// required when mig-enabled is true, and must be empty when it is false.
	switch {
	case s.Enabled == nil:
		p.Addf("line %d: %s, mig-enabled: required", n.Line, e.where())
	case !s.Enabled.ok:
	case !s.Enabled.v && len(e.MigDevices) > 0:
		p.Addf("line %d: %s, mig-devices: set while mig-enabled is false", s.MigDevices.line, e.where())
	case s.Enabled.v && s.MigDevices == nil:
		p.Addf("line %d: %s, mig-devices: required when mig-enabled is true (write mig-devices: {} for MIG on with no instances)", n.Line, e.where())
	}

	e.MigEnabled = s.Enabled != nil && s.Enabled.v

	return e
}

// devices is "all" or a list of GPU indices, each with its line.
type devices struct {
	all         bool
	list, lines []int
}

func (d *devices) UnmarshalYAML(n *yaml.Node) error {
	var errs typeErrors

	switch n.Kind {
	case yaml.ScalarNode:
		d.all = n.Value == "all"
		if !d.all {
			errs.addf(n, "devices: want \"all\" or a list of GPU indices, got %q", n.Value)
		}
	case yaml.SequenceNode:
		if len(n.Content) == 0 {
			errs.addf(n, "devices: empty list")
		}

		seen := map[int]bool{}

		for i, c := range n.Content {
			c = deref(c)

			v, err := strconv.Atoi(c.Value)

			switch {
			case c.Kind != yaml.ScalarNode || c.ShortTag() != "!!int" || err != nil:
				errs.addf(c, "devices[%d]: want a GPU index, got %q", i, c.Value)
			case v < 0:
				errs.addf(c, "devices[%d]: GPU index %d is negative", i, v)
			case seen[v]:
				errs.addf(c, "devices[%d]: GPU index %d listed twice", i, v)
			default:
				seen[v] = true
				d.list = append(d.list, v)
				d.lines = append(d.lines, c.Line)
			}
		}
	default:
		errs.addf(n, "devices: want \"all\" or a list of GPU indices")
	}

	return errs.err()
}

// filter is device-filter: a PCI device id or a list of them.
type filter []uint32

func (f *filter) UnmarshalYAML(n *yaml.Node) error {
	var errs typeErrors

	items := []*yaml.Node{n}

	switch n.Kind {
	case yaml.ScalarNode:
	case yaml.SequenceNode:
		items = n.Content
		if len(items) == 0 {
			errs.addf(n, "device-filter: empty list")
		}
	default:
		errs.addf(n, "device-filter: want a PCI device id or a list of them")

		return errs.err()
	}

	for _, c := range items {
		c = deref(c)

		switch id, err := ParseDeviceID(c.Value); {
		case c.Kind != yaml.ScalarNode:
			errs.addf(c, "device-filter: want a PCI device id such as \"0x233510DE\"")
		// mig-parted reads YAML as YAML 1.1 (sigs.k8s.io/yaml), where an unquoted 0x233510DE is
		// a number, and its device-filter takes only strings: it rejects the file.
		case c.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) == 0 && c.ShortTag() == "!!int":
			errs.addf(c, "device-filter: %s is read as a number; quote it: \"%s\"", c.Value, c.Value)
		case err != nil:
			errs.addf(c, "device-filter: %q: %v", c.Value, err)
		default:
			*f = append(*f, id)
		}
	}

	return errs.err()
}

// ParseDeviceID reads a PCI id as mig-parted writes it: 0x, device, vendor (0x233510DE).
func ParseDeviceID(s string) (uint32, error) {
	if !strings.HasPrefix(s, "0x") && !strings.HasPrefix(s, "0X") {
		return 0, errors.New("want 0x followed by hex digits, such as 0x233510DE")
	}

	v, err := strconv.ParseUint(s[2:], 16, 32)
	if err != nil || len(s) < 3 {
		return 0, errors.New("want 0x followed by up to 8 hex digits, such as 0x233510DE")
	}

	return uint32(v), nil
}

// boolean is mig-enabled, read as mig-parted reads it (yaml11Bool); ok is false for a value
// that is no boolean.
type boolean struct{ v, ok bool }

func (b *boolean) UnmarshalYAML(n *yaml.Node) error {
	if b.v, b.ok = yaml11Bool(n); !b.ok {
		return problem(n, "mig-enabled: must be a boolean (true or false), got %s", describeScalar(n))
	}

	return nil
}

// migDevices is mig-devices: profile name to count.
type migDevices struct {
	counts map[string]int
	line   int
}

func (m *migDevices) UnmarshalYAML(n *yaml.Node) error {
	m.line = n.Line

	if n.Kind != yaml.MappingNode {
		return problem(n, "mig-devices: must be a map of profile name to count")
	}

	// yaml.v3 refuses a profile given twice and resolves merge keys.
	var raw map[string]yaml.Node
	if err := n.Decode(&raw); err != nil {
		return &yaml.TypeError{Errors: problemsOf(n, err)}
	}

	var errs typeErrors

	m.counts = map[string]int{}
	positive := false

	for _, name := range byPlace(raw) {
		at := raw[name]
		v := deref(&at)
		key := fmt.Sprintf("mig-devices[%q]", name)

		if _, err := ParseProfile(name); err != nil {
			errs.addf(&at, "%s: %v", key, err)
		}

		switch count, err := strconv.Atoi(v.Value); {
		case v.Kind != yaml.ScalarNode || v.ShortTag() != "!!int" || err != nil:
			errs.addf(&at, "%s: count must be an integer, got %q", key, v.Value)
		case count < 0 || count > 7:
			errs.addf(&at, "%s: count %d out of range 0..7", key, count)
		default:
			m.counts[name] = count
			positive = positive || count > 0
		}
	}

	// mig-parted (pkg/types/mig_config.go, AssertValidFormat): counts that are all 0 are an
	// error; an empty map is not.
	if len(errs) == 0 && len(m.counts) > 0 && !positive {
		errs.addf(n, "mig-devices: every count is 0 (write mig-devices: {} for MIG on with no instances)")
	}

	return errs.err()
}
