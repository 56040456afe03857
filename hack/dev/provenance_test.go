package dev_test

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The provenance rule (docs/development.md): the project keeps no file or code copied from a
// repository snapshot and no script, target or documented recipe that builds one; what it
// builds comes from the Go module proxy or Debian's packages. These patterns catch the forms
// that broke it before: a copied file's "Vendored from" header, git commands that take an
// upstream tree out of a clone, a CHECKOUT argument, a go.mod replace onto a directory outside
// the tree, and the path where fetched snapshots live on the build machine.
var provenanceRules = []struct {
	name string
	re   *regexp.Regexp
}{
	{"a copied upstream file's header", regexp.MustCompile(`(?i)\bvendored from\b`)},
	{"a build from a git clone", regexp.MustCompile(`\bgit(\s+-C\s+\S+)?\s+(clone|archive|worktree\s+add)\s+([-"'$]|\S*[/:@])`)},
	{"a tag checked in a clone", regexp.MustCompile(`\bgit\b[^|;&\n]*\srev-parse\b[^|;&\n]*\^\{commit\}`)},
	{"a checkout taken as an argument", regexp.MustCompile(`\b[A-Z][A-Z0-9_]*_CHECKOUT\b`)},
	{"a go.mod replace onto an outside directory", regexp.MustCompile(`^\s*(replace\s+)?\S+(\s+v\S+)?\s+=>\s+/`)},
	{"a fetched snapshot's path", regexp.MustCompile(`\.mirror/`)},
}

// provenanceProblems returns "file:line: rule: text" for each line of content that breaks a rule.
func provenanceProblems(name string, content []byte) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(content))
	sc.Buffer(make([]byte, 0, 64*1024), 4*1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		for _, r := range provenanceRules {
			if r.name == "a go.mod replace onto an outside directory" && filepath.Base(name) != "go.mod" {
				continue
			}
			if r.re.MatchString(line) {
				out = append(out, fmt.Sprintf("%s:%d: %s: %s", name, n, r.name, strings.TrimSpace(line)))
			}
		}
	}
	return out
}

// TestProvenanceRuleCatches: each rule flags the form it is for, and leaves alone the words
// that merely look alike (a clean checkout of this repository, containerd's snapshotter).
func TestProvenanceRuleCatches(t *testing.T) {
	for _, c := range []struct{ file, line string }{
		{"a.yaml", "# Vendored from siderolabs/extensions, tag v1.14.0 (commit 5732907), file nvidia-gpu/vars.yaml"},
		{"a.go", "// vendored from NVIDIA/k8s-device-plugin"},
		{"b.sh", `git -C "$1" archive "$commit" | tar -x -C "$src"`},
		{"b.sh", "git clone --depth 1 https://example.com/x.git"},
		{"b.md", "    git worktree add ../gpu-operator v26.7.0"},
		{"b.sh", `got=$(git -C "$checkout" rev-parse --verify -q "$tag^{commit}")`},
		{"c.mk", "\thack/gpu-operator/build.sh $(GPU_OPERATOR_CHECKOUT)"},
		{"c.md", "hack/release/siderolabs-validator.sh VALIDATOR_CHECKOUT [TALOS_CHECKOUT]"},
		{"go.mod", "replace github.com/NVIDIA/gpu-operator => /work/src/gpu-operator"},
		{"go.mod", "\tgithub.com/siderolabs/talos v1.14.1 => /tmp/talos"},
		{"d.sh", "src=/work/.mirror/NVIDIA+gpu-operator/git"},
	} {
		assert.Len(t, provenanceProblems(c.file, []byte(c.line)), 1, "%s: %q not flagged", c.file, c.line)
	}
	for _, c := range []struct{ file, line string }{
		{".ci/run", "# CI: a clean checkout on a fresh Debian machine, as root."},
		{"a.sh", `# containerd's overlayfs snapshotter cannot put its layers on an overlay filesystem`},
		{"a.sh", `files=$(git ls-files '*.go')`},
		{"go.mod", "replace github.com/siderolabs/talos/pkg/machinery => github.com/siderolabs/talos/pkg/machinery v1.14.1"},
		{"go.mod", "replace example.com/ours => ./hack/ours"},
		{"a.go", `dir, err := os.MkdirTemp("", "nvidia-driver-checkout")`},
		{"a.md", "An upstream tree from anywhere else (a git clone, a snapshot) may be read"},
	} {
		assert.Empty(t, provenanceProblems(c.file, []byte(c.line)), "%s: %q flagged", c.file, c.line)
	}
}

// TestProvenanceRuleHolds runs the rules over every file git tracks in this repository.
func TestProvenanceRuleHolds(t *testing.T) {
	top, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	ls := exec.Command("git", "ls-files", "-z")
	ls.Dir = top
	out, err := ls.Output()
	require.NoError(t, err, "git ls-files in %s", top)

	self := filepath.Join("hack", "dev", "provenance_test.go")
	var problems []string
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		if name == "" || name == self || strings.HasSuffix(name, "go.sum") {
			continue
		}
		content, err := os.ReadFile(filepath.Join(top, name))
		if os.IsNotExist(err) {
			continue // deleted in the work tree, not yet in the index
		}
		require.NoError(t, err)
		if bytes.IndexByte(content, 0) >= 0 {
			continue // binary
		}
		problems = append(problems, provenanceProblems(name, content)...)
	}
	assert.Empty(t, problems, "the provenance rule (docs/development.md): no copied upstream file, no build from a snapshot:\n%s",
		strings.Join(problems, "\n"))
}
