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

	src := filepath.Join(testutil.RepoRoot(t), "hack", "gen-flavors", "releases", talos)

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
