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

// ValidationError holds the problems found in a file: the first MaxProblems of them, and how
// many more there were, so that a large bad file gives a short message in the log and the
// status file.
type ValidationError struct {
	File     string // "" when the data came from no file
	Problems []string
	// More counts the problems past the first MaxProblems.
	More int
}

// MaxProblems is how many problems a ValidationError lists; maxProblemLen bounds each.
const (
	MaxProblems   = 20
	maxProblemLen = 300
)

func (v *ValidationError) Error() string {
	what := "invalid MIG config"
	if v.File != "" {
		what += " " + v.File
	}

	if len(v.Problems) == 1 && v.More == 0 {
		return what + ": " + v.Problems[0]
	}

	msg := fmt.Sprintf("%s (%d problems):\n  - %s", what, len(v.Problems)+v.More, strings.Join(v.Problems, "\n  - "))
	if v.More > 0 {
		msg += fmt.Sprintf("\n  - and %d more", v.More)
	}

	return msg
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

	var verr *ValidationError
	if errors.As(err, &verr) {
		verr.File = name
	}

	if err != nil {
		return nil, err
	}

	cfg.Source = name

	return cfg, nil
}

type parser struct {
	problems []string
	more     int // problems past MaxProblems
}

func (p *parser) addf(format string, args ...any) {
	if len(p.problems) >= MaxProblems {
		p.more++

		return
	}

	msg := fmt.Sprintf(format, args...)
	if len(msg) > maxProblemLen {
		msg = strings.ToValidUTF8(msg[:maxProblemLen], "") + "..."
	}

	p.problems = append(p.problems, msg)
}

func (p *parser) err() error {
	if len(p.problems) == 0 {
		return nil
	}

	return &ValidationError{Problems: p.problems, More: p.more}
}

func line(n *yaml.Node) string { return fmt.Sprintf("line %d", n.Line) }

// Parse reads a mig-parted v1 file strictly: unknown keys, wrong types,
// malformed profiles and bad counts are all reported at once, each with the
// layout, entry and key it concerns.
func Parse(data []byte) (*Config, error) {
	if msg := notUTF8(data); msg != "" {
		return nil, &ValidationError{Problems: []string{msg}}
	}

	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, &ValidationError{Problems: []string{syntaxError(data, err)}}
	}

	p := &parser{}
	cfg := &Config{Layouts: map[string][]Entry{}}

	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return nil, &ValidationError{Problems: []string{"empty document"}}
	}

	// Anchors, aliases and merge keys mean what YAML says: the parser below sees the
	// document with them resolved.
	r := &resolver{p: p, done: map[*yaml.Node]*yaml.Node{}}

	root := r.resolve(doc.Content[0])
	if err := p.err(); err != nil {
		return nil, err
	}

	if root.Kind != yaml.MappingNode {
		return nil, &ValidationError{Problems: []string{fmt.Sprintf("%s: top level must be a map with version and mig-configs", line(root))}}
	}

	var version, configs *yaml.Node

	seenTop := map[string]int{}

	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if first, dup := seenTop[k.Value]; dup {
			p.addf("%s: key %q given twice (first on line %d)", line(k), k.Value, first)

			continue
		}

		seenTop[k.Value] = k.Line

		switch k.Value {
		case "version":
			version = v
		case "mig-configs":
			configs = v
		default:
			p.addf("%s: unknown top-level key %q (want version, mig-configs)", line(k), k.Value)
		}
	}

	switch {
	case version == nil:
		p.addf("version: required (want \"v1\")")
	case version.Kind != yaml.ScalarNode || version.Value != "v1":
		p.addf("%s: version: unsupported %q (want \"v1\")", line(version), version.Value)
	}

	switch {
	case configs == nil:
		p.addf("mig-configs: required")
	case configs.Kind != yaml.MappingNode:
		p.addf("%s: mig-configs: must be a map of layout name to entries", line(configs))
	default:
		for i := 0; i+1 < len(configs.Content); i += 2 {
			k, v := configs.Content[i], configs.Content[i+1]

			name := k.Value
			if name == "" {
				p.addf("%s: mig-configs: empty layout name", line(k))

				continue
			}

			if _, dup := cfg.Layouts[name]; dup {
				p.addf("%s: layout %q: defined twice", line(k), name)

				continue
			}

			cfg.Layouts[name] = p.layout(name, v)
		}
	}

	if err := p.err(); err != nil {
		return nil, err
	}

	return cfg, nil
}

func (p *parser) layout(name string, n *yaml.Node) []Entry {
	if n.Kind != yaml.SequenceNode {
		p.addf("%s: layout %q: must be a list of entries", line(n), name)

		return nil
	}

	if len(n.Content) == 0 {
		p.addf("%s: layout %q: has no entries", line(n), name)
	}

	entries := make([]Entry, 0, len(n.Content))

	for i, en := range n.Content {
		e := Entry{Layout: name, Index: i}
		at := func(key string) string { return fmt.Sprintf("layout %q, entry %d, %s", name, i, key) }

		if en.Kind != yaml.MappingNode {
			p.addf("%s: %s: must be a map", line(en), e.where())

			continue
		}

		var devices, enabled, migDevices *yaml.Node

		seen := map[string]int{}

		for j := 0; j+1 < len(en.Content); j += 2 {
			k, v := en.Content[j], en.Content[j+1]
			if first, dup := seen[k.Value]; dup {
				p.addf("%s: %s: key %q given twice (first on line %d)", line(k), e.where(), k.Value, first)

				continue
			}

			seen[k.Value] = k.Line

			switch k.Value {
			case "devices":
				devices = v
			case "device-filter":
				e.Filter = p.filter(at("device-filter"), v)
			case "mig-enabled":
				enabled = v
			case "mig-devices":
				migDevices = v
			default:
				p.addf("%s: %s: unknown key %q (want devices, device-filter, mig-enabled, mig-devices)", line(k), e.where(), k.Value)
			}
		}

		if devices == nil {
			p.addf("%s: %s: required", line(en), at("devices"))
		} else {
			e.AllDevices, e.Devices, e.DeviceLines = p.devices(at("devices"), devices)
		}

		enabledValid := false

		if enabled == nil {
			p.addf("%s: %s: required", line(en), at("mig-enabled"))
		} else if b, ok := yaml11Bool(enabled); !ok {
			p.addf("%s: %s: must be a boolean (true or false), got %s", line(enabled), at("mig-enabled"), describeScalar(enabled))
		} else {
			enabledValid = true
			e.MigEnabled = b
		}

		// mig-parted's rules (api/spec/v1/spec.go, MigConfigSpec.UnmarshalJSON): mig-devices is
		// required when mig-enabled is true, and must be empty when it is false.
		switch {
		case migDevices != nil:
			e.MigDevices = p.migDevices(at("mig-devices"), migDevices)
			if enabledValid && !e.MigEnabled && len(e.MigDevices) > 0 {
				p.addf("%s: %s: set while mig-enabled is false", line(migDevices), at("mig-devices"))
			}
		case enabledValid && e.MigEnabled:
			p.addf("%s: %s: required when mig-enabled is true (write mig-devices: {} for MIG on with no instances)", line(en), at("mig-devices"))
		}

		entries = append(entries, e)
	}

	return entries
}

func (p *parser) devices(at string, n *yaml.Node) (bool, []int, []int) {
	switch n.Kind {
	case yaml.ScalarNode:
		if n.Value == "all" {
			return true, nil, nil
		}

		p.addf("%s: %s: want \"all\" or a list of GPU indices, got %q", line(n), at, n.Value)

		return false, nil, nil
	case yaml.SequenceNode:
		if len(n.Content) == 0 {
			p.addf("%s: %s: empty list", line(n), at)
		}

		seen := map[int]bool{}

		var out, lines []int

		for i, c := range n.Content {
			v, err := strconv.Atoi(c.Value)
			if c.Kind != yaml.ScalarNode || c.ShortTag() != "!!int" || err != nil {
				p.addf("%s: %s[%d]: want a GPU index, got %q", line(c), at, i, c.Value)

				continue
			}

			if v < 0 {
				p.addf("%s: %s[%d]: GPU index %d is negative", line(c), at, i, v)

				continue
			}

			if seen[v] {
				p.addf("%s: %s[%d]: GPU index %d listed twice", line(c), at, i, v)

				continue
			}

			seen[v] = true
			out = append(out, v)
			lines = append(lines, c.Line)
		}

		return false, out, lines
	default:
		p.addf("%s: %s: want \"all\" or a list of GPU indices", line(n), at)

		return false, nil, nil
	}
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

func (p *parser) filter(at string, n *yaml.Node) []uint32 {
	var items []*yaml.Node

	switch n.Kind {
	case yaml.ScalarNode:
		items = []*yaml.Node{n}
	case yaml.SequenceNode:
		items = n.Content
		if len(items) == 0 {
			p.addf("%s: %s: empty list", line(n), at)
		}
	default:
		p.addf("%s: %s: want a PCI device id or a list of them", line(n), at)

		return nil
	}

	var out []uint32

	for _, c := range items {
		if c.Kind != yaml.ScalarNode {
			p.addf("%s: %s: want a PCI device id such as \"0x233510DE\"", line(c), at)

			continue
		}

		// mig-parted reads YAML as YAML 1.1 (sigs.k8s.io/yaml), where an unquoted 0x233510DE is
		// a number, and its device-filter takes only strings: it rejects the file.
		if c.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) == 0 && c.ShortTag() == "!!int" {
			p.addf("%s: %s: %s is read as a number; quote it: \"%s\"", line(c), at, c.Value, c.Value)

			continue
		}

		id, err := ParseDeviceID(c.Value)
		if err != nil {
			p.addf("%s: %s: %q: %v", line(c), at, c.Value, err)

			continue
		}

		out = append(out, id)
	}

	return out
}

func (p *parser) migDevices(at string, n *yaml.Node) map[string]int {
	if n.Kind != yaml.MappingNode {
		p.addf("%s: %s: must be a map of profile name to count", line(n), at)

		return nil
	}

	out := map[string]int{}

	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		key := fmt.Sprintf("%s[%q]", at, k.Value)

		if _, err := ParseProfile(k.Value); err != nil {
			p.addf("%s: %s: %v", line(k), key, err)
		}

		if _, dup := out[k.Value]; dup {
			p.addf("%s: %s: listed twice", line(k), key)

			continue
		}

		count, err := strconv.Atoi(v.Value)
		if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!int" || err != nil {
			p.addf("%s: %s: count must be an integer, got %q", line(v), key, v.Value)

			continue
		}

		if count < 0 || count > 7 {
			p.addf("%s: %s: count %d out of range 0..7", line(v), key, count)

			continue
		}

		out[k.Value] = count
	}

	// mig-parted (pkg/types/mig_config.go, AssertValidFormat): counts that are all 0 are an
	// error; an empty map is not.
	if len(out) > 0 && 2*len(out) == len(n.Content) {
		for _, c := range out {
			if c > 0 {
				return out
			}
		}

		p.addf("%s: %s: every count is 0 (write mig-devices: {} for MIG on with no instances)", line(n), at)
	}

	return out
}
