// Package docscheck finds the talosctl command lines the user documentation shows (README.md,
// docs/*.md and the comments of docs/examples) and checks each against a talosctl command
// tree: the subcommand path exists and every flag is one that command takes (its own, or a
// parent's persistent flag), none of them deprecated or hidden, and a whole command line
// (not a code span in prose) has the arguments its command accepts. docscheck_test.go runs it on talosctl v1.14.1's own tree, from
// Talos's module.
package docscheck

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/spf13/cobra"
)

// Command is one talosctl command line found in a file.
type Command struct {
	File string
	Line int
	Text string   // as written, continuation lines joined
	Args []string // the words after talosctl, placeholders as Placeholder
	// Full: a whole command line (a code block's line or a comment), not a code span in
	// prose, which may name a command without its arguments ("`talosctl logs` shows ...").
	Full bool
}

func (c Command) String() string { return fmt.Sprintf("%s:%d: `%s`", c.File, c.Line, c.Text) }

// Placeholder stands for a value the reader fills in (<node>, <your installer>, ...): any
// positional argument or flag value, never a subcommand or a flag.
const Placeholder = "\x00placeholder"

var (
	placeholderRe = regexp.MustCompile(`<[A-Za-z][^<>\n]*>`)
	inlineCodeRe  = regexp.MustCompile("`([^`]+)`")
	fenceRe       = regexp.MustCompile("^\\s*(```|~~~)")
)

// Files returns the files the check reads, relative to root: README.md, docs/*.md and every
// file under docs/examples.
func Files(root string) ([]string, error) {
	files := []string{"README.md"}
	md, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		return nil, fmt.Errorf("docs: %w", err)
	}
	for _, f := range md {
		files = append(files, strings.TrimPrefix(f, root+string(filepath.Separator)))
	}
	err = filepath.WalkDir(filepath.Join(root, "docs", "examples"), func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("docs/examples: %w", err)
	}
	return files, nil
}

// Extract returns the talosctl command lines of a file's text. Markdown (name ending in .md):
// the lines of fenced code blocks, with `\` continuations joined and shell comments dropped
// (a comment line counts as prose), and inline code spans elsewhere, which may wrap lines.
// Any other file (YAML examples): its `#` comments, as prose. In prose a command is a code
// span that starts with talosctl, or a comment whose text does.
func Extract(name, text string) []Command {
	lines := strings.Split(text, "\n")
	var out []Command
	if !strings.HasSuffix(name, ".md") {
		for i, l := range lines {
			if _, c, ok := strings.Cut(l, "#"); ok {
				out = append(out, fromComment(name, i+1, c)...)
			}
		}
		return out
	}
	var para []string // prose lines since the last blank line or fence
	paraStart := 0
	flush := func() {
		out = append(out, fromProse(name, paraStart+1, strings.Join(para, "\n"))...)
		para = nil
	}
	inFence := false
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if fenceRe.MatchString(l) {
			flush()
			inFence = !inFence
			continue
		}
		if !inFence {
			if strings.TrimSpace(l) == "" {
				flush()
				continue
			}
			if para == nil {
				paraStart = i
			}
			para = append(para, l)
			continue
		}
		start := i
		for strings.HasSuffix(strings.TrimRight(l, " \t"), `\`) && i+1 < len(lines) && !fenceRe.MatchString(lines[i+1]) {
			i++
			l = strings.TrimSuffix(strings.TrimRight(l, " \t"), `\`) + " " + strings.TrimSpace(lines[i])
		}
		if c, ok := strings.CutPrefix(strings.TrimSpace(l), "#"); ok {
			out = append(out, fromComment(name, start+1, c)...)
			continue
		}
		out = append(out, fromShell(name, start+1, l, true)...)
	}
	flush()
	return out
}

// fromComment: a comment's text that is a talosctl command line ("#   talosctl patch ..."),
// or else its code spans.
func fromComment(name string, line int, text string) []Command {
	if t := strings.TrimSpace(text); strings.HasPrefix(t, "talosctl ") && !strings.Contains(t, "`") {
		return fromShell(name, line, t, true)
	}
	return fromProse(name, line, text)
}

// fromProse: the code spans of text (line is text's first line) that hold a talosctl command.
func fromProse(name string, line int, text string) []Command {
	var out []Command
	for _, m := range inlineCodeRe.FindAllStringSubmatchIndex(text, -1) {
		span := strings.Join(strings.Fields(text[m[2]:m[3]]), " ")
		out = append(out, fromShell(name, line+strings.Count(text[:m[0]], "\n"), span, false)...)
	}
	return out
}

// fromShell: the talosctl commands of one shell line, each segment between |, ;, &&, || and
// $( ) whose program is talosctl (or a path ending in /talosctl), up to a comment or a
// redirection. full: whether the line is a whole command line (Command.Full).
func fromShell(name string, line int, text string, full bool) []Command {
	words := words(placeholderRe.ReplaceAllString(text, Placeholder))
	var out []Command
	for i := 0; i < len(words); i++ {
		w := words[i]
		if w != "talosctl" && !strings.HasSuffix(w, "/talosctl") {
			continue
		}
		// only a segment's program: the first word, or one after an operator
		if i > 0 && !isOperator(words[i-1]) {
			continue
		}
		var args []string
		for i++; i < len(words) && !isOperator(words[i]) && !strings.HasPrefix(words[i], "#"); i++ {
			if strings.HasPrefix(words[i], ">") || strings.HasPrefix(words[i], "2>") {
				break
			}
			args = append(args, words[i])
		}
		i--
		if len(args) == 0 {
			continue // the program's name alone, in prose
		}
		out = append(out, Command{File: name, Line: line, Text: strings.TrimSpace(text), Args: args, Full: full})
	}
	return out
}

func isOperator(w string) bool {
	switch w {
	case "|", ";", "&&", "||", "$(", "(", ")", "`":
		return true
	}
	return false
}

// words splits a shell line into words: quotes group and are dropped, operators are words of
// their own.
func words(s string) []string {
	var out []string
	var cur strings.Builder
	inWord := false
	end := func() {
		if inWord {
			out = append(out, cur.String())
			cur.Reset()
			inWord = false
		}
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n':
			end()
		case c == '\'' || c == '"':
			j := strings.IndexByte(s[i+1:], c)
			if j < 0 {
				j = len(s) - i - 1
			}
			cur.WriteString(s[i+1 : i+1+j])
			inWord = true
			i += j + 1
		case strings.HasPrefix(s[i:], "$("), strings.HasPrefix(s[i:], "&&"), strings.HasPrefix(s[i:], "||"):
			end()
			out = append(out, s[i:i+2])
			i++
		case c == '|' || c == ';' || c == '(' || c == ')' || c == '`':
			end()
			out = append(out, string(c))
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	end()
	return out
}

// Check resolves a command's subcommand path in root's tree and checks each flag: an error
// names an unknown or deprecated subcommand or flag. Flags may come before the subcommand
// (talosctl -n <node> logs ...), as cobra takes them; a flag takes the next word as its value
// unless it is a boolean or written --flag=value.
func Check(root *cobra.Command, c Command) error {
	args := c.Args
	cmd, _, err := root.Find(args)
	if err != nil {
		return fmt.Errorf("resolving the subcommand: %w", err)
	}
	if cmd == root {
		return fmt.Errorf("no talosctl subcommand in %q", args)
	}
	cmd.InheritedFlags() // merges the parents' persistent flags into cmd.Flags()
	var positional []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			positional = append(positional, a)
			continue
		}
		name, _, hasValue := strings.Cut(a, "=")
		if long, ok := strings.CutPrefix(name, "--"); ok {
			f := cmd.Flags().Lookup(long)
			if f == nil {
				return fmt.Errorf("%s has no flag --%s", cmd.CommandPath(), long)
			}
			// talosctl marks its deprecated flags hidden (helpers.MarkFlagDeprecated)
			if f.Deprecated != "" || f.Hidden {
				return fmt.Errorf("%s: --%s is deprecated or hidden", cmd.CommandPath(), long)
			}
			if !hasValue && f.NoOptDefVal == "" {
				i++
			}
			continue
		}
		// -abc: shorthands, the last of which may take the next word (or the rest) as its value
		short := name[1:]
		for j := 0; j < len(short); j++ {
			f := cmd.Flags().ShorthandLookup(short[j : j+1])
			if f == nil {
				return fmt.Errorf("%s has no flag -%s", cmd.CommandPath(), short[j:j+1])
			}
			if f.ShorthandDeprecated != "" || f.Deprecated != "" || f.Hidden {
				return fmt.Errorf("%s: -%s is deprecated or hidden", cmd.CommandPath(), short[j:j+1])
			}
			if f.NoOptDefVal == "" {
				if j == len(short)-1 && !hasValue {
					i++
				}
				break
			}
		}
	}
	if cmd.Deprecated != "" || cmd.Hidden {
		return fmt.Errorf("%s is deprecated or hidden", cmd.CommandPath())
	}
	// The words that named the path come first among the positional ones.
	depth := strings.Count(cmd.CommandPath(), " ")
	if depth > len(positional) {
		return fmt.Errorf("%s: the path is not in the words %q", cmd.CommandPath(), args)
	}
	rest := positional[depth:]
	if len(rest) > 0 && cmd.HasSubCommands() && !cmd.Runnable() && rest[0] != Placeholder && rest[0] != "..." && rest[0] != "…" {
		return fmt.Errorf("%s has no subcommand %q", cmd.CommandPath(), rest[0])
	}
	if c.Full {
		if err := cmd.ValidateArgs(rest); err != nil {
			return fmt.Errorf("%s: %w", cmd.CommandPath(), err)
		}
	}
	return nil
}
