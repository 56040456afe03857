package mig

// What YAML itself decides before the layout rules apply: booleans as mig-parted's YAML 1.1
// reads them, anchors, aliases and merge keys, and where in the file a syntax error is.

import (
	"errors"
	"fmt"
	"regexp"
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

// maxResolvedNodes bounds the nodes that resolving aliases and merge keys may make: a file of
// aliases of aliases (a "billion laughs") is an error, not a hang.
const maxResolvedNodes = 1 << 20

// resolver gives a document with aliases replaced by what they name and merge keys (<<)
// expanded as the YAML merge key type says (yaml.org/type/merge.html): a map's own keys win
// over merged ones, and of several merged maps the first wins. Each node is resolved once.
type resolver struct {
	p     *parser
	done  map[*yaml.Node]*yaml.Node
	nodes int
}

func (r *resolver) resolve(n *yaml.Node) *yaml.Node {
	if out, ok := r.done[n]; ok {
		return out
	}

	if r.nodes++; r.nodes > maxResolvedNodes {
		if r.nodes == maxResolvedNodes+1 {
			r.p.addf("%s: the document's aliases expand to more than %d nodes", line(n), maxResolvedNodes)
		}

		return &yaml.Node{Kind: yaml.ScalarNode, Line: n.Line, Column: n.Column}
	}

	var out *yaml.Node

	switch n.Kind {
	case yaml.AliasNode:
		out = r.resolve(n.Alias)
	case yaml.SequenceNode:
		c := *n
		c.Content = make([]*yaml.Node, len(n.Content))

		for i, item := range n.Content {
			c.Content[i] = r.resolve(item)
		}

		out = &c
	case yaml.MappingNode:
		out = r.mapping(n)
	default:
		out = n
	}

	r.done[n] = out

	return out
}

func isMergeKey(k *yaml.Node) bool {
	return k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge"
}

func (r *resolver) mapping(n *yaml.Node) *yaml.Node {
	c := *n
	c.Content = nil

	own := map[string]bool{}

	var merged []*yaml.Node

	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := r.resolve(n.Content[i]), n.Content[i+1]
		if !isMergeKey(k) {
			own[k.Value] = true
			c.Content = append(c.Content, k, r.resolve(v))

			continue
		}

		switch rv := r.resolve(v); rv.Kind {
		case yaml.MappingNode:
			merged = append(merged, rv)
		case yaml.SequenceNode:
			for _, item := range rv.Content {
				if item.Kind != yaml.MappingNode {
					r.p.addf("%s: <<: a merge key takes a map or a list of maps, got %s in the list", line(item), describeScalar(item))

					continue
				}

				merged = append(merged, item)
			}
		default:
			r.p.addf("%s: <<: a merge key takes a map or a list of maps, got %s", line(v), describeScalar(rv))
		}
	}

	for _, m := range merged {
		for i := 0; i+1 < len(m.Content); i += 2 {
			if k := m.Content[i]; !own[k.Value] {
				own[k.Value] = true
				c.Content = append(c.Content, k, m.Content[i+1])
			}
		}
	}

	return &c
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

	var te *yaml.TypeError
	if errors.As(err, &te) {
		return "not YAML: " + strings.Join(te.Errors, "; ")
	}

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
