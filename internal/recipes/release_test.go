package recipes_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/internal/recipes"
	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
)

// TestReleaseDataMustAgree: the generator takes a release only when its machinery, the
// vendored siderolabs/pkgs lines and the vendored siderolabs/extensions files agree.
func TestReleaseDataMustAgree(t *testing.T) {
	const talos = "v1.13.9"

	src := filepath.Join(testutil.RepoRoot(t), "hack", "release", "gen-flavors", "releases", talos)

	m, err := recipes.DownloadMachinery(talos)
	require.NoError(t, err)
	assert.Equal(t, recipes.Machinery{Tag: talos, Pkgs: "v1.13.0-60-gf541ca4", Tools: "v1.13.0-9-ga201d19", Kernel: "6.18.44-talos", Dir: m.Dir}, m)

	cases := []struct {
		name      string
		file      string
		old, new  string
		machinery func(*recipes.Machinery)
		want      string
	}{
		{name: "as vendored"},
		{
			name: "pkgs and extensions name other checksums",
			file: recipes.PkgsPkgfileFile, old: "93e0487897e843be", new: "0000000000000000",
			want: "production driver amd64 sha256: pkgs says \"0000000000000000",
		},
		{
			name: "pkgs and extensions name other arm64 checksums",
			file: recipes.ExtensionsVarsFile, old: "NVIDIA_PKGS_LTS_ARM64_SHA512: 05fac615", new: "NVIDIA_PKGS_LTS_ARM64_SHA512: 00000000",
			want: "lts driver arm64 sha512: pkgs says \"05fac615240326349e2cc3c999f1a0d2181a0cc88ece6f28b964a16ef70f9d23cc7b4c76cb478a4345f0587de5e9f43a746f7070a8babee91fb9803a9e938fe2\", extensions \"00000000",
		},
		{
			name: "pkgs without the arm64 checksum",
			file: recipes.PkgsPkgfileFile, old: "  nvidia_driver_production_arm64_sha256:", new: "  nvidia_driver_production_arm64_sha256_gone:",
			want: "production driver arm64 sha256: pkgs says \"\", extensions \"f0833df649a72c7c",
		},
		{
			name: "no arm64 fabric manager checksum",
			file: recipes.ExtensionsVarsFile, old: "NVIDIA_FABRIC_MANAGER_PRODUCTION_ARM64_SHA256:", new: "NVIDIA_FABRIC_MANAGER_PRODUCTION_ARM64_SHA256_GONE:",
			want: "no arm64 fabric manager checksums for the production driver",
		},
		{
			name: "pkgs and extensions name other versions",
			file: recipes.ExtensionsVarsFile, old: "NVIDIA_DRIVER_LTS_VERSION: 580.178.04", new: "NVIDIA_DRIVER_LTS_VERSION: 580.167.08",
			want: "lts driver version: pkgs says \"580.178.04\", extensions \"580.167.08\"",
		},
		{
			name: "pkgs lines of another pkgs tag",
			file: recipes.PkgsPkgfileFile, old: "tag v1.13.0-60-gf541ca4", new: "tag v1.13.0-36-g6b315f7",
			want: "vendored from pkgs \"v1.13.0-36-g6b315f7\", Talos v1.13.9 is built from pkgs \"v1.13.0-60-gf541ca4\"",
		},
		{
			name:      "the machinery of another release",
			machinery: func(m *recipes.Machinery) { m.Tag = "v1.13.8" },
			want:      "machinery gendata says Talos v1.13.8",
		},
		{
			name: "extensions built with other tools",
			file: recipes.ExtensionsMakefileFile, old: "TOOLS ?= v1.13.0-9-ga201d19", new: "TOOLS ?= v1.13.0-6-g9b78252",
			want: "siderolabs/extensions builds with tools \"v1.13.0-6-g9b78252\", Talos v1.13.9 with \"v1.13.0-9-ga201d19\"",
		},
		{
			name: "a base stage of another shape",
			file: recipes.ExtensionsBaseFile, old: "variant: scratch", new: "variant: alpine",
			want: "not the base stage the recipes follow",
		},
		{
			name: "base stage of another release",
			file: recipes.ExtensionsBaseFile, old: "tag v1.13.9", new: "tag v1.13.8",
			want: "vendored from extensions \"v1.13.8\", not v1.13.9",
		},
		{
			name: "no provenance header",
			file: recipes.ExtensionsVarsFile, old: "# Vendored from", new: "# Copied from",
			want: "no provenance header",
		},
		{
			name: "the Makefile without provenance",
			file: recipes.ExtensionsMakefileFile, old: "# Vendored from", new: "# Copied from",
			want: "extensions-Makefile: no provenance header",
		},
		{
			name: "inferred without a reason",
			file: recipes.ExtensionsBaseFile, old: "# copied whole", new: "# Inferred for v1.13.9:\n# copied whole",
			want: "inferred for v1.13.9 without a reason",
		},
		{
			name: "inferred for the tag it was copied from",
			file: recipes.ExtensionsBaseFile, old: "# copied whole", new: "# Inferred for v1.13.9: it is.\n# copied whole",
			want: "inferred for v1.13.9, the tag it was copied from",
		},
	}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), talos)
			require.NoError(t, os.MkdirAll(dir, 0o755))

			for _, f := range recipes.Files {
				data, err := os.ReadFile(filepath.Join(src, f))
				require.NoError(t, err)

				if f == tc.file {
					require.Contains(t, string(data), tc.old)
					data = []byte(strings.Replace(string(data), tc.old, tc.new, 1))
				}

				require.NoError(t, os.WriteFile(filepath.Join(dir, f), data, 0o644))
			}

			mm := m
			if tc.machinery != nil {
				tc.machinery(&mm)
			}

			r, err := recipes.ReadRelease(dir, mm)
			if tc.want == "" {
				require.NoError(t, err)
				assert.Equal(t, "v0.6.2", r.BldrRelease)
				assert.Equal(t, "ghcr.io/siderolabs/extensions-validator:84cecb0", r.Validator)
				assert.Equal(t, "v1.13.0", r.Floor())
				assert.Empty(t, r.Inferred(), "every file copied at the tag it stands for")
				assert.Equal(t, recipes.Driver{
					Version: "595.91.07",
					Archives: map[string]recipes.Archives{
						"x86_64": {
							SHA256:              "93e0487897e843be767a3d259dffea8ac32dffff846e83df8d3abbf30be754ae",
							SHA512:              "a7cb28e9025218ea72bb868b3927f5ef08f790a9427de13db2678c3488dce689c6dde788f1162eeb809d99b43ee3b44ebe8688c63033a481d8973b328189d274",
							FabricManagerSHA256: "c91cd6e2fb845a4554d50e061974ebc80f35034f9655e348908783a02e87ddb6",
							FabricManagerSHA512: "a6af44d1f1f46caf1cd858a2638cc517a07a322ec6f5b4497a2e68f4330ebe6527540ecb625bf6172c0cb54d3394f0dfb204af03edef511b0f09a7948f013d7b",
						},
						// siderolabs' NVIDIA_PKGS_PRODUCTION_ARM64_* and NVIDIA_FABRIC_MANAGER_PRODUCTION_ARM64_*
						"aarch64": {
							SHA256:              "f0833df649a72c7cb675a179add564b8f8ed76c2e83faa9f1161f101d82b4fd3",
							SHA512:              "1ad7b483dd576ed49ade0427232b3259cccd030a3d8e937110ec3f850fcd84e7004a563761144f2420bf54e96686ab26e758e857e5b95e2ee80786856ab10607",
							FabricManagerSHA256: "1a5535bdac4b579b1f0a0238ef14dd61ec44f15e368c8b2181aa894f298bb2d2",
							FabricManagerSHA512: "d1e9b73b36439e978423531fa3e6a35dd8bd896a018b497e7840ba83efe29479e496bf1adc287b5e2109f6cd5c5fb319cbba96c96ec24714e358963cafb8afdd",
						},
					},
				}, r.Drivers["production"])
				assert.Equal(t, "580.178.04", r.Drivers["lts"].Version)

				return
			}

			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestInferredReleaseLoads: Talos v1.14.1's data, taken from siderolabs' nearest tags at hand
// with an "Inferred for" header line each, loads for both platforms with the versions and
// checksums of siderolabs' release-1.14 data; an inference is read as such, must give a
// reason, and does not stand in for the first provenance line.
func TestInferredReleaseLoads(t *testing.T) {
	const talos = "v1.14.1"

	src := filepath.Join(testutil.RepoRoot(t), "hack", "release", "gen-flavors", "releases", talos)

	m, err := recipes.DownloadMachinery(talos)
	require.NoError(t, err)
	assert.Equal(t, recipes.Machinery{Tag: talos, Pkgs: "v1.14.0-25-gf694e1b", Tools: "v1.14.0-7-ga404efb", Kernel: "6.18.51-talos", Dir: m.Dir}, m)

	cases := []struct {
		name     string
		file     string
		old, new string
		want     string
	}{
		{name: "as vendored"},
		{
			name: "an inference without a reason",
			file: recipes.PkgsPkgfileFile, old: "# Inferred for v1.14.0-25-gf694e1b: the pkgs", new: "# Inferred for v1.14.0-25-gf694e1b:\n# the pkgs",
			want: "inferred for v1.14.0-25-gf694e1b without a reason",
		},
		{
			name: "a malformed inference",
			file: recipes.ExtensionsVarsFile, old: "# Inferred for v1.14.1:", new: "# Inferred v1.14.1:",
			want: "a malformed inference line",
		},
		{
			name: "no inference: the copy stands for the tag it came from",
			file: recipes.ExtensionsBaseFile, old: "# Inferred for v1.14.1:", new: "# Why:",
			want: "vendored from extensions \"v1.14.0-rc.1\", not v1.14.1",
		},
		{
			name: "pkgs inferred for another pkgs",
			file: recipes.PkgsPkgfileFile, old: "# Inferred for v1.14.0-25-gf694e1b:", new: "# Inferred for v1.14.0-15-g2f03590:",
			want: "vendored from pkgs \"v1.14.0-15-g2f03590\", Talos v1.14.1 is built from pkgs \"v1.14.0-25-gf694e1b\"",
		},
		{
			name: "an inference and no provenance line",
			file: recipes.ExtensionsVarsFile, old: "# Vendored from", new: "# Copied from",
			want: "no provenance header",
		},
		{
			name: "the Makefile without provenance",
			file: recipes.ExtensionsMakefileFile, old: "# Vendored from", new: "# Copied from",
			want: "extensions-Makefile: no provenance header",
		},
		{
			name: "extensions pinning rc.1's pkgs",
			file: recipes.ExtensionsMakefileFile, old: "PKGS ?= v1.14.0-25-gf694e1b", new: "PKGS ?= v1.14.0-1-geffed43",
			want: "siderolabs/extensions builds against pkgs \"v1.14.0-1-geffed43\", Talos v1.14.1 against \"v1.14.0-25-gf694e1b\"",
		},
		{
			name: "pkgs and extensions disagree on an arm64 driver checksum",
			file: recipes.PkgsPkgfileFile, old: "nvidia_driver_lts_arm64_sha256: 8e55dfbe", new: "nvidia_driver_lts_arm64_sha256: 00000000",
			want: "lts driver arm64 sha256: pkgs says \"00000000",
		},
		{
			name: "a validator whose Talos version is not known",
			file: recipes.ExtensionsBaseFile, old: "extensions-validator:84cecb0", new: "extensions-validator:0000000",
			want: "extensions-validator ghcr.io/siderolabs/extensions-validator:0000000: the Talos version it checks constraints against is not known",
		},
	}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), talos)
			require.NoError(t, os.MkdirAll(dir, 0o755))

			for _, f := range recipes.Files {
				data, err := os.ReadFile(filepath.Join(src, f))
				require.NoError(t, err)

				if f == tc.file {
					require.Contains(t, string(data), tc.old)
					data = []byte(strings.Replace(string(data), tc.old, tc.new, 1))
				}

				require.NoError(t, os.WriteFile(filepath.Join(dir, f), data, 0o644))
			}

			r, err := recipes.ReadRelease(dir, m)
			if tc.want != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.want)

				return
			}

			require.NoError(t, err)
			inferredRelease(t, r)
		})
	}
}

// inferredRelease checks the data of Talos v1.14.1 as ReadRelease reads it.
func inferredRelease(t *testing.T, r recipes.Release) {
	t.Helper()

	assert.Equal(t, "v0.6.2", r.BldrRelease)
	assert.Equal(t, "ghcr.io/siderolabs/extensions-validator:84cecb0", r.Validator)
	assert.Equal(t, "v1.13.0-alpha.2", r.ValidatorTalos)
	// siderolabs' validator 84cecb0 checks against 1.13.0: the range starts there, not at v1.14.0
	assert.Equal(t, "v1.13.0", r.Floor())
	assert.Equal(t, "sha256:5ec604f42453ccad5058c32094de2347b4bf8f67980465a8f1505ccec4fc6883", r.WolfiBaseRef)
	assert.Equal(t, []string{recipes.PkgsPkgfileFile, recipes.ExtensionsVarsFile, recipes.ExtensionsMakefileFile, recipes.ExtensionsBaseFile}, r.Inferred())
	assert.Equal(t, recipes.Provenance{
		Repo: "siderolabs/pkgs", Tag: "v1.14.0-1-geffed43", Commit: "effed4398f9bda2126d37b1547c519bb121c82e6", File: "Pkgfile",
		InferredFor: "v1.14.0-25-gf694e1b", Why: r.Sources[recipes.PkgsPkgfileFile].Why,
	}, r.Sources[recipes.PkgsPkgfileFile])
	assert.Contains(t, r.Sources[recipes.PkgsPkgfileFile].Why, "f694e1bfb5c5bedd69b030ef00e9784986e64de3")

	for _, f := range []string{recipes.ExtensionsVarsFile, recipes.ExtensionsMakefileFile, recipes.ExtensionsBaseFile} {
		p := r.Sources[f]
		assert.Equal(t, []string{"siderolabs/extensions", "v1.14.0-rc.1", "5732907953bd27b8aafbe5cb9c4d6eaceabc6d1d", "v1.14.1"}, []string{p.Repo, p.Tag, p.Commit, p.InferredFor}, f)
		assert.NotEmpty(t, p.Why, f)
	}

	assert.Equal(t, map[string]recipes.Driver{
		"lts": {
			Version: "580.178.04",
			Archives: map[string]recipes.Archives{
				"x86_64": {
					SHA256:              "269bfbc57d176ea21eede622a5c638c84354ed70ffcc3d092679ce10d3fef409",
					SHA512:              "4cab88f79734f32bbf3a2bdf988bb30585f15802063f9244b209c57735cf44cd8275f07886a919736a644166467db1f0ff6bcfe861ebd9c689d4833a0ccd2645",
					FabricManagerSHA256: "c599d3418672fee3eb4cb0fa98009f946196b5a601e25bb3874005c53b2d348c",
					FabricManagerSHA512: "c7407515568012636dfe5060a8bc77f869c52c35bf1f1187a91ded957b6dcce0b40d18265b969014a98fd822ece510bb157a4e0bb4b017e00811784072e34955",
				},
				"aarch64": {
					SHA256:              "8e55dfbe85b1aa9fbd2e323ed203470ebf6001f614d1f8cb4fa0671ea979a557",
					SHA512:              "05fac615240326349e2cc3c999f1a0d2181a0cc88ece6f28b964a16ef70f9d23cc7b4c76cb478a4345f0587de5e9f43a746f7070a8babee91fb9803a9e938fe2",
					FabricManagerSHA256: "890a434acc9365dd156fd8228add517c19e370f15b551f85fce26f3b6fa26061",
					FabricManagerSHA512: "c771926f7119528775cda14900cb30cead1cdaa04280fd9ed1601da4d309a69af2ef7542b56afa8e4b1b86ba5b56f95ab5b93f0bf222315804a15bac964be678",
				},
			},
		},
		"production": {
			Version: "595.91.07",
			Archives: map[string]recipes.Archives{
				"x86_64": {
					SHA256:              "93e0487897e843be767a3d259dffea8ac32dffff846e83df8d3abbf30be754ae",
					SHA512:              "a7cb28e9025218ea72bb868b3927f5ef08f790a9427de13db2678c3488dce689c6dde788f1162eeb809d99b43ee3b44ebe8688c63033a481d8973b328189d274",
					FabricManagerSHA256: "c91cd6e2fb845a4554d50e061974ebc80f35034f9655e348908783a02e87ddb6",
					FabricManagerSHA512: "a6af44d1f1f46caf1cd858a2638cc517a07a322ec6f5b4497a2e68f4330ebe6527540ecb625bf6172c0cb54d3394f0dfb204af03edef511b0f09a7948f013d7b",
				},
				"aarch64": {
					SHA256:              "f0833df649a72c7cb675a179add564b8f8ed76c2e83faa9f1161f101d82b4fd3",
					SHA512:              "1ad7b483dd576ed49ade0427232b3259cccd030a3d8e937110ec3f850fcd84e7004a563761144f2420bf54e96686ab26e758e857e5b95e2ee80786856ab10607",
					FabricManagerSHA256: "1a5535bdac4b579b1f0a0238ef14dd61ec44f15e368c8b2181aa894f298bb2d2",
					FabricManagerSHA512: "d1e9b73b36439e978423531fa3e6a35dd8bd896a018b497e7840ba83efe29479e496bf1adc287b5e2109f6cd5c5fb319cbba96c96ec24714e358963cafb8afdd",
				},
			},
		},
	}, r.Drivers)
}
