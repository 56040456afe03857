package docs_test

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"
)

// parseYAMLStream decodes every document of text, as kubectl and talosctl read a file.
func parseYAMLStream(text string) error {
	dec := yaml.NewDecoder(strings.NewReader(text))
	for i := 0; ; i++ {
		var doc any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("document %d: %w", i, err)
		}
	}
}

// TestDocsYAMLBlocksParse: every ```yaml block of docs/ and the README is YAML a user can
// paste: it parses, every document of it.
func TestDocsYAMLBlocksParse(t *testing.T) {
	seen := 0
	for _, file := range markdownFiles(t) {
		for _, b := range codeBlocks(t, file) {
			if b.lang != "yaml" {
				continue
			}
			seen++
			assert.NoError(t, parseYAMLStream(b.text), "%s:%d", file, b.line)
		}
	}
	assert.Positive(t, seen)
	// The control: a block with a tab in its indentation (a paste slip) does not parse.
	assert.Error(t, parseYAMLStream("a:\n\tb: 1\n"))
}

var (
	// A Markdown link to a relative target: [text](target), not an image, a URL or a mail.
	mdLink = regexp.MustCompile(`\]\(([^()\s]+)\)`)
	// What GitHub drops from a heading to make its anchor.
	anchorDrop = regexp.MustCompile(`[^\p{L}\p{N} _-]`)
)

// anchors returns the anchors GitHub gives the headings of a Markdown file: lowercase, each
// character but letters, digits, spaces, '-' and '_' dropped, spaces as '-'; a repeated one
// gets -1, -2, ... Headings inside code blocks are none.
func anchors(t *testing.T, file string) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(file)
	require.NoError(t, err)
	out := map[string]bool{}
	count := map[string]int{}
	inCode := false
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inCode = !inCode
			continue
		}
		if inCode || !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.TrimSpace(strings.TrimLeft(line, "#"))
		text = strings.ReplaceAll(text, "`", "")
		a := strings.ReplaceAll(anchorDrop.ReplaceAllString(strings.ToLower(text), ""), " ", "-")
		if n := count[a]; n > 0 {
			out[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			out[a] = true
		}
		count[a]++
	}
	return out
}

// TestDocsLinksResolve: every relative link of docs/ and the README names a file that exists
// and, with #anchor, a heading of that file.
func TestDocsLinksResolve(t *testing.T) {
	seen := 0
	for _, file := range markdownFiles(t) {
		data, err := os.ReadFile(file)
		require.NoError(t, err)
		text := string(data)
		for _, loc := range mdLink.FindAllStringSubmatchIndex(text, -1) {
			target := text[loc[2]:loc[3]]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			seen++
			path, anchor, _ := strings.Cut(target, "#")
			dest := file
			if path != "" {
				dest = filepath.Join(filepath.Dir(file), path)
			}
			where := fmt.Sprintf("%s:%d: %s", file, lineOf(text, loc[0]), target)
			if _, err := os.Stat(dest); !assert.NoError(t, err, where) {
				continue
			}
			if anchor != "" && strings.HasSuffix(dest, ".md") {
				assert.True(t, anchors(t, dest)[anchor], "%s: no heading with that anchor in %s", where, dest)
			}
		}
	}
	assert.Positive(t, seen)
}

// TestAnchorsAsGitHubMakesThem: the anchor rule on headings the docs have.
func TestAnchorsAsGitHubMakesThem(t *testing.T) {
	dir := t.TempDir()
	page := filepath.Join(dir, "p.md")
	require.NoError(t, os.WriteFile(page, []byte("# A\n## 3. The machine config patch\n### DCGM exporter: what was checked, and what never ran\n### The manifest's Talos constraint\n## Status: what has run, and where\n```sh\n# not a heading\n```\n## A\n"), 0o644))
	got := anchors(t, page)
	for _, want := range []string{"a", "a-1", "3-the-machine-config-patch", "dcgm-exporter-what-was-checked-and-what-never-ran", "the-manifests-talos-constraint", "status-what-has-run-and-where"} {
		assert.True(t, got[want], want)
	}
	assert.False(t, got["not-a-heading"])
}
