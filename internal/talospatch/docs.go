package talospatch

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// Releases a docs patch is written for (DocPatch.Release).
const (
	Release113  = "1.13" // the v1alpha1 keys of 1.13 (.machine, .cluster), or named under talos-1.13/
	Release114  = "1.14" // 1.14's documents (KubeNodeConfig, KubeletConfig, ...), or named under talos-1.14/
	ReleaseBoth = ""     // ExtensionServiceConfig documents alone: the same on both
)

var (
	v1alpha1Keys = regexp.MustCompile(`(?m)^(machine|cluster):`)
	documentKind = regexp.MustCompile(`(?m)^kind: (\w+Config)\s*$`)
	namedExample = regexp.MustCompile(`^# docs/examples/(talos-1\.1[34]/)?`)
)

// DocPatch is a machine config patch shown in a YAML block of a page of docs/ or the README.
type DocPatch struct {
	Where   string // file:line of the block's fence
	Text    string
	Release string // Release113, Release114 or ReleaseBoth
	// Example is the docs/examples file the block says it is (its first line
	// "# docs/examples/NAME"), "" for a patch shown only in the page.
	Example string
}

// DocRelease says whether text is a Talos machine config patch and which release's config it
// is written for.
func DocRelease(text string) (release string, isPatch bool) {
	first, _, _ := strings.Cut(text, "\n")
	switch m := namedExample.FindStringSubmatch(first); {
	case m != nil && m[1] == "talos-1.13/":
		return Release113, true
	case m != nil && m[1] == "talos-1.14/":
		return Release114, true
	}

	if v1alpha1Keys.MatchString(text) {
		return Release113, true
	}

	kinds := documentKind.FindAllStringSubmatch(text, -1)
	if len(kinds) == 0 || !strings.Contains(text, "apiVersion: v1alpha1") {
		return "", false
	}

	for _, k := range kinds {
		if k[1] != "ExtensionServiceConfig" {
			return Release114, true
		}
	}

	return ReleaseBoth, true
}

// DocPatchesFor returns the patches of DocPatches that a config of release takes: those
// written for it and those written for both releases.
func DocPatchesFor(root, release string) ([]DocPatch, error) {
	all, err := DocPatches(root)
	if err != nil {
		return nil, err
	}

	var out []DocPatch

	for _, p := range all {
		if p.Release == release || p.Release == ReleaseBoth {
			out = append(out, p)
		}
	}

	return out, nil
}

// DocPatches returns every machine config patch in the YAML blocks of root/docs/*.md and
// root/README.md.
func DocPatches(root string) ([]DocPatch, error) {
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		return nil, fmt.Errorf("listing docs: %w", err)
	}

	pages = append(pages, filepath.Join(root, "README.md"))

	var out []DocPatch

	for _, page := range pages {
		blocks, err := yamlBlocks(page)
		if err != nil {
			return nil, err
		}

		for _, b := range blocks {
			release, ok := DocRelease(b.Text)
			if !ok {
				continue
			}

			first, _, _ := strings.Cut(b.Text, "\n")
			example, _ := strings.CutPrefix(first, "# docs/examples/")
			if example == first {
				example = ""
			}

			b.Release, b.Example = release, example
			out = append(out, b)
		}
	}

	return out, nil
}

// yamlBlocks returns the ```yaml blocks of a Markdown page.
func yamlBlocks(page string) ([]DocPatch, error) {
	f, err := os.Open(page)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", page, err)
	}
	defer f.Close()

	var (
		out    []DocPatch
		cur    *DocPatch
		indent string // the fence's: a block under a list item is indented with it
	)

	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)

		switch {
		case cur == nil && trimmed == "```yaml":
			cur = &DocPatch{Where: fmt.Sprintf("%s:%d", filepath.Base(page), n)}
			indent = line[:len(line)-len(strings.TrimLeft(line, " "))]
		case cur != nil && trimmed == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.Text += strings.TrimPrefix(line, indent) + "\n"
		}
	}

	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", page, err)
	}

	if cur != nil {
		return nil, fmt.Errorf("%s: unclosed code block", cur.Where)
	}

	return out, nil
}
