package recipes_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/internal/recipes"
)

const (
	pkgfile = "# syntax = ghcr.io/siderolabs/bldr:v0.6.2\nformat: v1alpha2\nvars:\n  SHA256: " + sha256 + "\n  SHA512: " + sha512 + "\n"
	sha256  = "269bfbc57d176ea21eede622a5c638c84354ed70ffcc3d092679ce10d3fef409"
	sha512  = "4cab88f79734f32bbf3a2bdf988bb30585f15802063f9244b209c57735cf44cd8275f07886a919736a644166467db1f0ff6bcfe861ebd9c689d4833a0ccd2645"
	// a package with one checksummed source
	final = `name: final
variant: scratch
dependencies:
  - stage: base
steps:
  - sources:
      - url: https://example.com/a.tar.xz
        destination: a.tar.xz
        sha256: "{{ .SHA256 }}"
        sha512: "{{ .SHA512 }}"
finalize:
  - from: /rootfs
    to: /rootfs
`
	base = "name: base\nvariant: alpine\n"
)

func tree(t *testing.T, files map[string]string) string {
	t.Helper()

	root := t.TempDir()

	for p, content := range files {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, p), []byte(content), 0o644))
	}

	return root
}

// with returns the valid tree with some files replaced (an empty content removes the file).
func with(changes map[string]string) map[string]string {
	files := map[string]string{
		"Pkgfile":                    pkgfile,
		"base/pkg.yaml":              base,
		"final/pkg.yaml":             final,
		"final/vars.yaml":            "VERSION: \"1.0-{{ .TALOS }}\"\n",
		"vars.yaml":                  "TALOS: '{{ or (index . \"BUILD_ARG_TALOS\") \"v1.13.9\" }}'\n",
		"final/manifest.yaml.tmpl":   "version: \"{{ .VERSION }}\"\n",
		"final/files/notes.txt.tmpl": "{{ .TALOS }}\n",
	}

	for p, c := range changes {
		if c == "" {
			delete(files, p)
		} else {
			files[p] = c
		}
	}

	return files
}

// TestLoaderRejectsBadTrees: each case is one mistake that bldr's loader (or its frontend,
// at build time) stops at, or that it lets through as "<no value>". This runs our loader,
// not bldr (docs/extension.md: bldr's loaders were run on the tree by hand).
func TestLoaderRejectsBadTrees(t *testing.T) {
	cases := []struct {
		name    string
		changes map[string]string
		args    map[string]string
		want    []string
	}{
		{name: "the valid tree"},
		{
			name:    "empty checksums",
			changes: map[string]string{"final/pkg.yaml": strings.NewReplacer(`"{{ .SHA256 }}"`, `""`, `"{{ .SHA512 }}"`, `""`).Replace(final)},
			want:    []string{`error loading "final/pkg.yaml"`, "source.sha256 can't be empty", "source.sha512 can't be empty"},
		},
		{
			name:    "a checksum of the wrong length",
			changes: map[string]string{"final/pkg.yaml": strings.Replace(final, `"{{ .SHA256 }}"`, `"abc"`, 1)},
			want:    []string{"source.sha256 should be 64 chars long"},
		},
		{
			name:    "one package defined twice",
			changes: map[string]string{"pkg.yaml": strings.Replace(final, "name: final", "name: base", 1)},
			want:    []string{`package "base" already exists, duplicate in dirs`},
		},
		{
			name:    "an undefined stage",
			changes: map[string]string{"base/pkg.yaml": ""},
			want:    []string{`error resolving dependency "base" of "final": package "base" not defined`},
		},
		{
			name:    "a circular dependency",
			changes: map[string]string{"base/pkg.yaml": base + "dependencies:\n  - stage: final\n"},
			want:    []string{"circular dependency detected"},
		},
		{
			name:    "a template no package is above",
			changes: map[string]string{"hack/templates/pkg.yaml.tmpl": "name: x\n"},
			want:    []string{`no suitable package found for template "hack/templates/pkg.yaml.tmpl"`},
		},
		{
			// bldr validate gives it to the root package, bldr's frontend to the last one loaded.
			name:    "a template the two loaders attach differently",
			changes: map[string]string{"pkg.yaml": strings.Replace(base, "name: base", "name: top", 1), "zz/readme.tmpl": "x\n"},
			want:    []string{`template "zz/readme.tmpl": bldr validate attaches it to package top, bldr's frontend to package final`},
		},
		{
			name:    "a recipe file in a hidden directory",
			changes: map[string]string{".cache/pkg.yaml": base},
			want:    []string{".cache/pkg.yaml: in a hidden directory"},
		},
		{
			name:    "no Pkgfile",
			changes: map[string]string{"Pkgfile": ""},
			want:    []string{"Pkgfile: open", "the bldr frontend needs one"},
		},
		{
			name:    "a Pkgfile of another format",
			changes: map[string]string{"Pkgfile": strings.Replace(pkgfile, "v1alpha2", "v1alpha1", 1)},
			want:    []string{`unsupported format: "v1alpha1", supported formats: ["v1alpha2"]`},
		},
		{
			name:    "an undefined variable",
			changes: map[string]string{"base/pkg.yaml": base + "dependencies:\n  - image: \"{{ .BUILD_ARG_PKGS_PREFIX }}/x:1\"\n"},
			want:    []string{`map has no entry for key "BUILD_ARG_PKGS_PREFIX"`, "bldr would render it as <no value>"},
		},
		{
			name:    "the same variable as a build argument",
			changes: map[string]string{"base/pkg.yaml": base + "dependencies:\n  - image: \"{{ .BUILD_ARG_PKGS_PREFIX }}/x:1\"\n"},
			args:    map[string]string{"PKGS_PREFIX": "registry.example/siderolabs"},
		},
		{
			name:    "an undefined variable in a template",
			changes: map[string]string{"final/manifest.yaml.tmpl": "version: {{ .NOPE }}\n"},
			want:    []string{`error attaching template "final/manifest.yaml.tmpl"`, `map has no entry for key "NOPE"`},
		},
		{
			name:    "a misspelt key",
			changes: map[string]string{"base/pkg.yaml": base + "dependancies: []\n"},
			want:    []string{"field dependancies not found"},
		},
		{
			name:    "steps without finalize",
			changes: map[string]string{"final/pkg.yaml": strings.Split(final, "finalize:")[0]},
			want:    []string{"finalize steps are missing"},
		},
		{
			name:    "an unknown variant",
			changes: map[string]string{"base/pkg.yaml": "name: base\nvariant: debian\n"},
			want:    []string{`unknown variant "debian"`},
		},
		{
			name:    "a step's unknown network mode",
			changes: map[string]string{"base/pkg.yaml": base + "steps:\n  - network: bridge\nfinalize:\n  - from: /\n    to: /\n"},
			want:    []string{`unknown networkmode "bridge"`},
		},
		{
			name:    "a failing vars.yaml",
			changes: map[string]string{"vars.yaml": "{{ fail \"no release data\" }}\n"},
			want:    []string{`error loading variables "vars.yaml"`, "no release data"},
		},
	}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := recipes.Load(tree(t, with(tc.changes)), recipes.Options{BuildArgs: tc.args})
			if len(tc.want) == 0 {
				require.NoError(t, err)
				assert.Equal(t, "ghcr.io/siderolabs/bldr:v0.6.2", tr.Pkgfile.Syntax)

				return
			}

			require.Error(t, err)

			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

// TestVarsInheritance: a directory's vars.yaml is rendered with its parents' variables and
// overrides them; templates get their package's variables and keep their relative path.
func TestVarsInheritance(t *testing.T) {
	tr, err := recipes.Load(tree(t, with(nil)), recipes.Options{BuildArgs: map[string]string{"TALOS": "v1.13.5"}})
	require.NoError(t, err)

	p := tr.Pkg("final")
	require.NotNil(t, p)
	assert.Equal(t, "final", p.Dir)
	assert.Equal(t, "1.0-v1.13.5", p.Vars["VERSION"])
	assert.Equal(t, "x86_64", p.Vars["ARCH"], "bldr's platform variables")
	assert.Equal(t, "version: \"1.0-v1.13.5\"\n", string(p.Templates["manifest.yaml"]))
	assert.Equal(t, "v1.13.5\n", string(p.Templates["files/notes.txt"]))
	assert.Equal(t, map[string]string{"final/manifest.yaml.tmpl": "final", "final/files/notes.txt.tmpl": "final"}, tr.Attached)

	tr, err = recipes.Load(tree(t, with(nil)), recipes.Options{})
	require.NoError(t, err)
	assert.Equal(t, "1.0-v1.13.9", tr.Pkg("final").Vars["VERSION"], "the default when the build argument is not given")
	assert.Equal(t, "linux/amd64", tr.Platform)
}

// TestPlatformVars: each platform's variables are bldr v0.6.2's (environment/platform.go,
// the same in v0.6.3), in vars.yaml as in pkg.yaml; a platform bldr does not have is refused
// as bldr refuses it.
func TestPlatformVars(t *testing.T) {
	files := with(map[string]string{"final/vars.yaml": "VERSION: \"1.0-{{ .TALOS }}-{{ .ARCH }}\"\n"})

	for platform, want := range map[string]map[string]string{
		"linux/amd64": {
			"ARCH": "x86_64", "TARGET": "x86_64-talos-linux-musl", "BUILD": "x86_64-linux-musl", "HOST": "x86_64-linux-musl",
			"CFLAGS": "-O2 -g0 -march=x86-64-v2 -mtune=generic", "CXXFLAGS": "-O2 -g0 -march=x86-64-v2 -mtune=generic",
			"VERSION": "1.0-v1.13.9-x86_64",
		},
		"linux/arm64": {
			"ARCH": "aarch64", "TARGET": "aarch64-talos-linux-musl", "BUILD": "aarch64-linux-musl", "HOST": "aarch64-linux-musl",
			"CFLAGS": "-O2 -g0", "CXXFLAGS": "-O2 -g0",
			"VERSION": "1.0-v1.13.9-aarch64",
		},
	} {
		tr, err := recipes.Load(tree(t, files), recipes.Options{Platform: platform})
		require.NoError(t, err, platform)
		assert.Equal(t, platform, tr.Platform)

		for k, v := range want {
			assert.Equal(t, v, tr.Pkg("final").Vars[k], "%s %s", platform, k)
		}
	}

	_, err := recipes.Load(tree(t, files), recipes.Options{Platform: "linux/riscv64"})
	assert.ErrorContains(t, err, `platform "linux/riscv64" is not defined`)

	// The release flavors' architectures are bldr's platforms, by bldr's ARCH.
	for _, a := range recipes.Arches() {
		vars, err := recipes.DefaultVars(a.Platform)
		require.NoError(t, err)
		assert.Equal(t, a.Name, vars["ARCH"], a.Platform)
	}
}
