package mig

// What YAML itself decides before the layout rules apply: booleans as mig-parted's YAML 1.1
// reads them, and where in the file a syntax error is; and the helpers of the fields'
// UnmarshalYAML.

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// yaml11Bool reads a boolean as mig-parted does: sigs.k8s.io/yaml decodes with YAML 1.1
// (go.yaml.in/yaml/v2, resolve.go), where y, yes, on, true and n, no, off, false, in lower,
// title or upper case, are booleans, plain or tagged !!bool. Anything else, a quoted string
// or another tag included, is no boolean (mig-parted rejects the file): never false.
func yaml11Bool(n *yaml.Node) (bool, bool) {
	if n.Kind != yaml.ScalarNode {
		return false, false
	}

	tagged := n.Style&yaml.TaggedStyle != 0
	quoted := n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle|yaml.LiteralStyle|yaml.FoldedStyle) != 0

	switch {
	case tagged && n.ShortTag() != "!!bool":
		return false, false
	case !tagged && quoted:
		return false, false
	}

	switch n.Value {
	case "y", "Y", "yes", "Yes", "YES", "on", "On", "ON", "true", "True", "TRUE":
		return true, true
	case "n", "N", "no", "No", "NO", "off", "Off", "OFF", "false", "False", "FALSE":
		return false, true
	}

	return false, false
}

// describeScalar names a value for a message: its text, and its tag where one was written.
func describeScalar(n *yaml.Node) string {
	if n.Kind != yaml.ScalarNode {
		return "a " + map[yaml.Kind]string{yaml.MappingNode: "map", yaml.SequenceNode: "list"}[n.Kind]
	}

	if n.Style&yaml.TaggedStyle != 0 {
		return fmt.Sprintf("%s %q", n.Tag, n.Value)
	}

	return fmt.Sprintf("%q", n.Value)
}

// deref is the node an alias names, or n. Only values in a list or map a field's own
// UnmarshalYAML reads may still be aliases: yaml.v3 resolves the rest.
func deref(n *yaml.Node) *yaml.Node {
	if n.Kind == yaml.AliasNode {
		return n.Alias
	}

	return n
}

// byPlace returns m's keys in the order their values stand in the file.
func byPlace(m map[string]yaml.Node) []string {
	keys := slices.Collect(maps.Keys(m))
	slices.SortFunc(keys, func(a, b string) int {
		return cmp.Or(cmp.Compare(m[a].Line, m[b].Line), cmp.Compare(m[a].Column, m[b].Column), strings.Compare(a, b))
	})

	return keys
}

// typeErrors are a value's problems as yaml.v3 words its own, "line N: ...": returned as a
// yaml.TypeError, they are collected with the rest of the file's and decoding goes on.
type typeErrors []string

func (t *typeErrors) addf(n *yaml.Node, format string, args ...any) {
	*t = append(*t, fmt.Sprintf("line %d: ", n.Line)+fmt.Sprintf(format, args...))
}

func (t typeErrors) err() error {
	if len(t) == 0 {
		return nil
	}

	return &yaml.TypeError{Errors: t}
}

func problem(n *yaml.Node, format string, args ...any) error {
	var t typeErrors
	t.addf(n, format, args...)

	return t.err()
}

// problemsOf is a decoding error as "line N: ..." problems: a TypeError's, or, for an error
// that stopped yaml.v3 (aliases past its bound, a merge key of no map), one at n's line.
func problemsOf(n *yaml.Node, err error) []string {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		return te.Errors
	}

	return []string{fmt.Sprintf("line %d: %s", n.Line, strings.TrimPrefix(err.Error(), "yaml: "))}
}

// notUTF8 says where data stops being UTF-8 (YAML's own error gives no line), or "".
func notUTF8(data []byte) string {
	if utf8.Valid(data) {
		return ""
	}

	lineNo, col := 1, 1

	for i := 0; i < len(data); {
		r, size := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && size <= 1 {
			return fmt.Sprintf("line %d, column %d: not UTF-8 (byte 0x%02X): the file must be UTF-8 text", lineNo, col, data[i])
		}

		if r == '\n' {
			lineNo, col = lineNo+1, 1
		} else {
			col++
		}

		i += size
	}

	return ""
}

var yamlLineRE = regexp.MustCompile(`^yaml: line (\d+): `)

// syntaxError is YAML's error as "line N: not YAML: ...". For a tab in the indentation the
// scanner names the line before the tab's; the line is then the first indented with a tab.
func syntaxError(data []byte, err error) string {
	msg := err.Error()

	m := yamlLineRE.FindStringSubmatch(msg)
	if m == nil {
		return "not YAML: " + strings.TrimPrefix(msg, "yaml: ")
	}

	where, rest := m[1], msg[len(m[0]):]

	if strings.Contains(rest, "tab character") {
		for i, l := range strings.Split(string(data), "\n") {
			if indent := l[:len(l)-len(strings.TrimLeft(l, " \t"))]; strings.Contains(indent, "\t") {
				where = fmt.Sprint(i + 1)

				break
			}
		}

		rest += " (YAML indents with spaces only)"
	}

	return fmt.Sprintf("line %s: not YAML: %s", where, rest)
}
