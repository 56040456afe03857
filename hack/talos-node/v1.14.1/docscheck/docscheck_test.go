package docscheck

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	// talosctl's main package imports cmd for its init, which adds every command to the
	// root; the root itself is unexported, so it is reached from one of its commands.
	_ "github.com/siderolabs/talos/cmd/talosctl/cmd"
	"github.com/siderolabs/talos/cmd/talosctl/cmd/talos"
)

// repoRoot: this package is hack/talos-node/v1.14.1/docscheck.
const repoRoot = "../../../.."

func talosctl(t *testing.T) *cobra.Command {
	t.Helper()
	root := talos.Commands[0].Root()
	if root.Name() != "talosctl" {
		t.Fatalf("talosctl's root command is %q", root.Name())
	}
	return root
}

// TestDocs: every talosctl command line of README.md, docs/*.md and docs/examples names a
// subcommand and flags of talosctl v1.14.1.
func TestDocs(t *testing.T) {
	root := talosctl(t)
	files, err := Files(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(repoRoot, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range Extract(f, string(data)) {
			n++
			if testing.Verbose() {
				t.Logf("%s: %q", c, c.Args)
			}
			if err := Check(root, c); err != nil {
				t.Errorf("%s: %v", c, err)
			}
		}
	}
	if n < 50 {
		t.Errorf("only %d talosctl commands found in %d files: is the extraction broken?", n, len(files))
	}
	t.Logf("%d talosctl commands in %d files", n, len(files))
}

// TestCheck: the check on command lines of each kind, and on the slips it is for: a made-up
// subcommand (at the top or under another), a made-up flag (long, short, before the
// subcommand), a flag of another command, a deprecated flag, missing arguments.
func TestCheck(t *testing.T) {
	root := talosctl(t)
	for _, tc := range []struct {
		line string
		full bool
		err  string // empty: passes
	}{
		{line: "talosctl -n 10.0.0.21 logs -f ext-nvidia-driver", full: true},
		{line: "talosctl -n <node> upgrade --image <your installer>", full: true},
		{line: "talosctl --nodes 10.0.0.21,10.0.0.22 patch machineconfig --patch @gpu.yaml", full: true},
		{line: "talosctl patch mc --nodes 10.0.0.21 --patch=@gpu.yaml", full: true},
		{line: "talosctl gen config c https://cp:6443 --output-types worker -o w.yaml --with-secrets s.yaml", full: true},
		{line: `talosctl gen secureboot uki --common-name "a key"`, full: true},
		{line: "talosctl image talos-bundle v1.14.1", full: true},
		{line: "talosctl -n 10.0.0.21 get extensions -o yaml", full: true},
		{line: "talosctl service ... restart"},
		{line: "talosctl logs"}, // a code span naming the command
		{line: "talosctl -n 10.0.0.21 get-extensions", full: true, err: `unknown command "get-extensions" for "talosctl"`},
		{line: "talosctl image talos-bundel v1.14.1", full: true, err: `talosctl image has no subcommand "talos-bundel"`},
		{line: "talosctl -n 10.0.0.21 upgrade --imag registry/installer:v1", full: true, err: "talosctl upgrade has no flag --imag"},
		{line: "talosctl -n 10.0.0.21 logs -z ext-nvidia-driver", full: true, err: "talosctl logs has no flag -z"},
		{line: "talosctl --node 10.0.0.21 reboot", full: true, err: "talosctl reboot has no flag --node"},
		{line: "talosctl gen config c https://cp:6443 --nodes 10.0.0.21", full: true, err: "talosctl gen config has no flag --nodes"},
		{line: "talosctl -n 10.0.0.21 upgrade --preserve --image i", full: true, err: "talosctl upgrade: --preserve is deprecated or hidden"},
		{line: "talosctl -n 10.0.0.21 logs", full: true, err: "talosctl logs: accepts 1 arg(s), received 0"},
		{line: "talosctl -n 10.0.0.21", full: true, err: "no talosctl subcommand"},
	} {
		cmds := fromShell("sample", 1, tc.line, tc.full)
		if len(cmds) != 1 {
			t.Errorf("%q: %d commands found, want 1", tc.line, len(cmds))
			continue
		}
		err := Check(root, cmds[0])
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%q: %v", tc.line, err)
		case tc.err != "" && err == nil:
			t.Errorf("%q: passed, want %q", tc.line, tc.err)
		case tc.err != "" && !strings.Contains(err.Error(), tc.err):
			t.Errorf("%q: %v, want %q", tc.line, err, tc.err)
		}
	}
}

// TestExtract: the command lines of a page: a code block's lines with continuations joined,
// comments and pipes cut, a comment that is a command, code spans in prose (one across a line
// break), placeholders; the program's name alone and prose that starts with it are not
// commands. And a YAML example's comments.
func TestExtract(t *testing.T) {
	page := "talosctl v1.14.1, one node at a time: `talosctl upgrade` and `talosctl`\n" +
		"then `talosctl -n <node>\nreboot`.\n" +
		"\n" +
		"```sh\n" +
		"talosctl gen config c https://cp:6443 \\\n" +
		"  --output-types worker   # a comment --not-a-flag\n" +
		"# then: talosctl is run as `talosctl get members`\n" +
		"#   talosctl patch mc --nodes <node> --patch @p.yaml\n" +
		"kubectl get nodes && talosctl -n 10.0.0.21 read /proc/modules | grep nvidia\n" +
		"```\n"
	yaml := "# Apply with:\n#   talosctl patch machineconfig --nodes <node> --patch @mig.yaml\nkind: ExtensionServiceConfig # `talosctl get extensionserviceconfigs`\n"
	want := []string{
		`page.md:1: ["upgrade"] false`,
		`page.md:2: ["-n" "<>" "reboot"] false`,
		`page.md:6: ["gen" "config" "c" "https://cp:6443" "--output-types" "worker"] true`,
		`page.md:8: ["get" "members"] false`,
		`page.md:9: ["patch" "mc" "--nodes" "<>" "--patch" "@p.yaml"] true`,
		`page.md:10: ["-n" "10.0.0.21" "read" "/proc/modules"] true`,
		`p.yaml:2: ["patch" "machineconfig" "--nodes" "<>" "--patch" "@mig.yaml"] true`,
		`p.yaml:3: ["get" "extensionserviceconfigs"] false`,
	}
	var got []string
	for _, c := range append(Extract("page.md", page), Extract("p.yaml", yaml)...) {
		args := slices.Clone(c.Args)
		for i, a := range args {
			if a == Placeholder {
				args[i] = "<>"
			}
		}
		got = append(got, fmt.Sprintf("%s:%d: %q %v", c.File, c.Line, args, c.Full))
	}
	if !slices.Equal(got, want) {
		t.Errorf("got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
