package recipes_test

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/internal/recipes"
	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
)

// facts is the text of the repository's release facts file.
func facts(t *testing.T) string {
	t.Helper()

	data, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), filepath.FromSlash(recipes.FactsFile)))
	require.NoError(t, err)

	return string(data)
}

// in replaces the first old after the entry of Talos talos with new; the test fails if
// there is none, so that a case cannot pass by mutating nothing.
func in(t *testing.T, text, talos, old, new string) string {
	t.Helper()

	start := strings.Index(text, "  - talos: "+talos+"\n")
	require.GreaterOrEqual(t, start, 0, "no entry for %s", talos)

	i := strings.Index(text[start:], old)
	require.GreaterOrEqual(t, i, 0, "%q not in the entry of %s", old, talos)

	return text[:start+i] + new + text[start+i+len(old):]
}

// TestReleaseFacts: the generator takes the facts only when every entry is complete and
// well-formed, says where each value was read, gives a reason for each inference, and names
// the pkgs and tools its release's machinery says; each check fails with the release and
// the field named.
func TestReleaseFacts(t *testing.T) {
	text := facts(t)

	machinery := map[string]recipes.Machinery{}

	for talos, want := range map[string]recipes.Machinery{
		"v1.14.1": {Tag: "v1.14.1", Pkgs: "v1.14.0-25-gf694e1b", Tools: "v1.14.0-7-ga404efb", Kernel: "6.18.51-talos"},
		"v1.13.9": {Tag: "v1.13.9", Pkgs: "v1.13.0-60-gf541ca4", Tools: "v1.13.0-9-ga201d19", Kernel: "6.18.44-talos"},
		"v1.13.5": {Tag: "v1.13.5", Pkgs: "v1.13.0-36-g6b315f7", Tools: "v1.13.0-6-g9b78252"},
	} {
		m, err := recipes.DownloadMachinery(talos)
		require.NoError(t, err)

		if want.Kernel == "" {
			want.Kernel = m.Kernel
		}

		want.Dir = m.Dir
		assert.Equal(t, want, m)

		machinery[talos] = m
	}

	// The reason of the last inference of v1.14.1, from its "- fields:" to the entry's end.
	lastWhy := regexp.MustCompile(`(?s)(- fields: \[bldrRelease, pkgs\.prefix, tools\.prefix\]\n\s+why: )>-\n.*?\n\n`)
	require.Regexp(t, lastWhy, text)

	// Each case replaces old with new in the entry of talos, or edits the whole text.
	cases := []struct {
		name, talos, old, new string
		edit                  func(text string) string
		other                 func(*recipes.Machinery) // changes the machinery of v1.13.9
		want                  []string
	}{
		{name: "as written"},
		{
			name:  "a checksum missing",
			talos: "v1.13.9", old: "            sha256: f0833df649a72c7cb675a179add564b8f8ed76c2e83faa9f1161f101d82b4fd3\n", new: "",
			want: []string{"Talos v1.13.9: no drivers.production.archive.arm64.sha256"},
		},
		{
			name:  "a driver branch missing",
			talos: "v1.13.5", old: "      production:\n", new: "      beta:\n",
			want: []string{
				"Talos v1.13.5: no drivers.production.version",
				"Talos v1.13.5: no drivers.production.fabricManager.arm64.sha512",
				"Talos v1.13.5: drivers.beta.version (line",
			},
		},
		{
			name:  "a checksum too short",
			talos: "v1.13.9", old: "sha512: 05fac615", new: "sha512: 05fac61",
			want: []string{"Talos v1.13.9: drivers.lts.archive.arm64.sha512 \"05fac61240", "not 128 hexadecimal digits"},
		},
		{
			name:  "a checksum not hexadecimal",
			talos: "v1.14.1", old: "sha256: 93e0487897e843be", new: "sha256: 93e0487897e843bX",
			want: []string{"Talos v1.14.1: drivers.production.archive.amd64.sha256 \"93e0487897e843bX", "not 64 hexadecimal digits"},
		},
		{
			name:  "a fabric manager checksum not hexadecimal",
			talos: "v1.13.5", old: "sha512: 1653a601", new: "sha512: 1653A601",
			want: []string{"Talos v1.13.5: drivers.production.fabricManager.amd64.sha512 \"1653A601", "not 128 hexadecimal digits"},
		},
		{
			name:  "a malformed driver version",
			talos: "v1.13.9", old: "version: 595.91.07", new: "version: 595.91.07-beta",
			want: []string{"Talos v1.13.9: drivers.production.version \"595.91.07-beta\"", "not a driver version"},
		},
		{
			name:  "the Wolfi image by tag",
			talos: "v1.13.5", old: "wolfiBaseRef: sha256:441d6709", new: "wolfiBaseRef: latest # ",
			want: []string{"Talos v1.13.5: wolfiBaseRef \"latest\"", "not sha256: and 64 hexadecimal digits"},
		},
		{
			name:  "another image for the validator",
			talos: "v1.13.5", old: "extensionsValidator: ghcr.io/siderolabs/extensions-validator:", new: "extensionsValidator: ghcr.io/siderolabs/tools:",
			want: []string{"Talos v1.13.5: extensionsValidator \"ghcr.io/siderolabs/tools:84cecb0\"", "not an extensions-validator image"},
		},
		{
			name:  "a malformed bldr release",
			talos: "v1.13.9", old: "bldrRelease: v0.6.2", new: "bldrRelease: 0.6",
			want: []string{"Talos v1.13.9: bldrRelease \"0.6\"", "not a release such as v0.6.2"},
		},
		{
			name:  "a list for a value",
			talos: "v1.13.5", old: "bldrRelease: v0.6.0", new: "bldrRelease: [v0.6.0]",
			want: []string{"Talos v1.13.5: bldrRelease (line", "a value or a mapping expected", "Talos v1.13.5: no bldrRelease"},
		},
		{
			name:  "a field the form does not have",
			talos: "v1.13.9", old: "    bldrRelease:", new: "    nvlsmVersion: 2025.06.5 # siderolabs/extensions v1.13.9, nvidia-gpu/vars.yaml\n    bldrRelease:",
			want: []string{"Talos v1.13.9: nvlsmVersion (line", "not a field of an entry"},
		},
		{
			name:  "a field given twice",
			talos: "v1.13.9", old: "    bldrRelease: v0.6.2", new: "    bldrRelease: v0.6.0 # siderolabs/extensions v1.13.5, Makefile\n    bldrRelease: v0.6.2",
			want: []string{"Talos v1.13.9: bldrRelease (line", "given twice"},
		},
		{
			name:  "a value without its source",
			talos: "v1.13.9", old: "tag: v1.13.0-60-gf541ca4 # siderolabs/extensions v1.13.9 (ec9d5f68fcfb), Makefile (PKGS)", new: "tag: v1.13.0-60-gf541ca4",
			want: []string{"Talos v1.13.9: pkgs.tag (line", "no source: a comment naming the repository, tag or commit, and file"},
		},
		{
			name:  "checksums without their source",
			talos: "v1.13.9", old: "        # siderolabs/extensions v1.13.9 (ec9d5f68fcfb), nvidia-gpu/vars.yaml (NVIDIA_FABRIC_MANAGER_PRODUCTION_<ARCH>_SHA256/512)\n", new: "",
			want: []string{
				"Talos v1.13.9: drivers.production.fabricManager.amd64.sha256 (line", "no source",
				"Talos v1.13.9: drivers.production.fabricManager.arm64.sha512 (line",
			},
		},
		{
			name:  "a source bldr would render",
			talos: "v1.13.9", old: "Makefile (BLDR_RELEASE)", new: "Makefile ({{ .BLDR_RELEASE }})",
			want: []string{"Talos v1.13.9: bldrRelease (line", "its source has {{ or }}"},
		},
		{
			name: "an inference without a reason",
			edit: func(s string) string { return lastWhy.ReplaceAllString(s, "${1}\"\"\n\n") },
			want: []string{"Talos v1.14.1: inferred[2] (line", "bldrRelease, pkgs.prefix, tools.prefix inferred without a reason (why)"},
		},
		{
			name:  "an inference of no field",
			talos: "v1.14.1", old: "fields: [bldrRelease, pkgs.prefix, tools.prefix]", new: "fields: []",
			want: []string{"Talos v1.14.1: inferred[2] (line", "no fields"},
		},
		{
			name:  "an inference of a field the form does not have",
			talos: "v1.14.1", old: "fields: [bldrRelease, pkgs.prefix, tools.prefix]", new: "fields: [bldrRelease, pkgs.prefix, tools.prefixes]",
			want: []string{"Talos v1.14.1: inferred[2] (line", "tools.prefixes: not a field of an entry"},
		},
		{
			name:  "a value inferred twice",
			talos: "v1.14.1", old: "fields: [bldrRelease, pkgs.prefix, tools.prefix]", new: "fields: [bldrRelease, pkgs.prefix, tools.prefix, drivers.lts]",
			want: []string{"Talos v1.14.1: inferred[2] (line", "drivers.lts.archive.amd64.sha256: inferred twice", "drivers.lts.fabricManager.arm64.sha512: inferred twice"},
		},
		{
			name:  "an inference with something else than fields and why",
			talos: "v1.14.1", old: "      - fields: [bldrRelease", new: "      - for: v1.14.1\n        fields: [bldrRelease",
			want: []string{"Talos v1.14.1: inferred[2] (line", "for: not fields (a list) or why (a text)"},
		},
		{
			name:  "the talos release malformed",
			talos: "v1.13.5", old: "  - talos: v1.13.5", new: "  - talos: 1.13",
			want: []string{"the entry at line", "talos \"1.13\": not a Talos release such as v1.13.9"},
		},
		{
			name:  "an entry without its release",
			talos: "v1.13.5", old: "  - talos: v1.13.5", new: "  - release: v1.13.5",
			want: []string{"the entry at line", "talos \"\": not a Talos release"},
		},
		{
			name:  "two entries for one release",
			talos: "v1.13.5", old: "  - talos: v1.13.5", new: "  - talos: v1.13.9",
			want: []string{"Talos v1.13.9: a second entry (line"},
		},
		{
			name:  "pkgs other than the release's",
			talos: "v1.14.1", old: "tag: v1.14.0-25-gf694e1b", new: "tag: v1.14.0-1-geffed43",
			want: []string{"Talos v1.14.1: pkgs.tag v1.14.0-1-geffed43, but the machinery's gendata/data/pkgs says v1.14.0-25-gf694e1b"},
		},
		{
			name:  "tools other than the release's",
			talos: "v1.13.9", old: "tag: v1.13.0-9-ga201d19", new: "tag: v1.13.0-6-g9b78252",
			want: []string{"Talos v1.13.9: tools.tag v1.13.0-6-g9b78252, but the machinery's gendata/data/tools says v1.13.0-9-ga201d19"},
		},
		{
			name:  "the machinery of another release",
			other: func(m *recipes.Machinery) { m.Tag = "v1.13.8" },
			want:  []string{"Talos v1.13.9: its machinery's gendata/data/tag says Talos v1.13.8"},
		},
		{
			name:  "a validator whose Talos version is not known",
			talos: "v1.14.1", old: "extensions-validator:84cecb0", new: "extensions-validator:0000000",
			want: []string{"Talos v1.14.1: extensionsValidator ghcr.io/siderolabs/extensions-validator:0000000: the Talos version it checks constraints against is not known"},
		},
	}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := text

			switch {
			case tc.old != "":
				s = in(t, text, tc.talos, tc.old, tc.new)
			case tc.edit != nil:
				s = tc.edit(text)
				require.NotEqual(t, text, s)
			}

			fs, err := recipes.ParseFacts(recipes.FactsFile, []byte(s))

			errs := []error{err}
			rs := map[string]recipes.Release{}

			if err == nil {
				for _, f := range fs {
					m := machinery[f.Talos]
					if tc.other != nil && f.Talos == "v1.13.9" {
						tc.other(&m)
					}

					r, err := recipes.NewRelease(f, m)
					errs = append(errs, err)
					rs[f.Talos] = r
				}
			}

			err = errors.Join(errs...)

			if tc.want == nil {
				require.NoError(t, err)
				writtenFacts(t, rs)

				return
			}

			require.Error(t, err)

			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}

			if strings.Contains(tc.want[0], "Talos v1.") || strings.Contains(tc.want[0], "the entry at line") {
				// Each error of the facts' form names the file, then the release.
				for _, line := range strings.Split(err.Error(), "\n") {
					if !strings.HasPrefix(line, "Talos ") {
						assert.True(t, strings.HasPrefix(line, recipes.FactsFile+": "), "%q names the file", line)
					}
				}
			}
		})
	}
}

// writtenFacts checks the facts as the repository writes them.
func writtenFacts(t *testing.T, rs map[string]recipes.Release) {
	t.Helper()

	require.Len(t, rs, 3)

	r := rs["v1.13.9"]
	assert.Equal(t, "v0.6.2", r.BldrRelease)
	assert.Equal(t, "ghcr.io/siderolabs/extensions-validator:84cecb0", r.Validator)
	assert.Equal(t, "v1.13.0", r.Floor())
	assert.Equal(t, "6.18.44-talos", r.Kernel)
	assert.Equal(t, "ghcr.io/siderolabs", r.PkgsPrefix)
	assert.Equal(t, "ghcr.io/siderolabs", r.ToolsPrefix)
	assert.Empty(t, r.Inferred, "every value read at the tags v1.13.9 was built from")
	assert.Equal(t, "siderolabs/extensions v1.13.9 (ec9d5f68fcfb), Makefile (BLDR_RELEASE)", r.Source("bldrRelease"))
	assert.Equal(t, "siderolabs/extensions v1.13.9 (ec9d5f68fcfb), nvidia-gpu/vars.yaml (NVIDIA_FABRIC_MANAGER_PRODUCTION_<ARCH>_SHA256/512)",
		r.Source("drivers.production.fabricManager.arm64.sha512"), "a group's source, above its key")
	assert.Equal(t, recipes.Driver{
		Version: "595.91.07",
		Archives: map[string]recipes.Archives{
			"x86_64": {
				SHA256:              "93e0487897e843be767a3d259dffea8ac32dffff846e83df8d3abbf30be754ae",
				SHA512:              "a7cb28e9025218ea72bb868b3927f5ef08f790a9427de13db2678c3488dce689c6dde788f1162eeb809d99b43ee3b44ebe8688c63033a481d8973b328189d274",
				FabricManagerSHA256: "c91cd6e2fb845a4554d50e061974ebc80f35034f9655e348908783a02e87ddb6",
				FabricManagerSHA512: "a6af44d1f1f46caf1cd858a2638cc517a07a322ec6f5b4497a2e68f4330ebe6527540ecb625bf6172c0cb54d3394f0dfb204af03edef511b0f09a7948f013d7b",
			},
			// the facts' arm64, bldr's aarch64
			"aarch64": {
				SHA256:              "f0833df649a72c7cb675a179add564b8f8ed76c2e83faa9f1161f101d82b4fd3",
				SHA512:              "1ad7b483dd576ed49ade0427232b3259cccd030a3d8e937110ec3f850fcd84e7004a563761144f2420bf54e96686ab26e758e857e5b95e2ee80786856ab10607",
				FabricManagerSHA256: "1a5535bdac4b579b1f0a0238ef14dd61ec44f15e368c8b2181aa894f298bb2d2",
				FabricManagerSHA512: "d1e9b73b36439e978423531fa3e6a35dd8bd896a018b497e7840ba83efe29479e496bf1adc287b5e2109f6cd5c5fb319cbba96c96ec24714e358963cafb8afdd",
			},
		},
	}, r.Drivers["production"])
	assert.Equal(t, "580.178.04", r.Drivers["lts"].Version)

	r = rs["v1.13.5"]
	assert.Equal(t, "v0.6.0", r.BldrRelease)
	assert.Equal(t, "580.167.08", r.Drivers["lts"].Version)
	assert.Equal(t, "595.71.05", r.Drivers["production"].Version)
	assert.Equal(t, "sha256:441d6709305552a3411e585ad98aacb9dadda00c80f3267483c38ac6f86f49d4", r.WolfiBaseRef)
	assert.Empty(t, r.Inferred)

	inferredRelease(t, rs["v1.14.1"])
}

// inferredRelease checks the facts of Talos v1.14.1, read at siderolabs' nearest tags at hand.
func inferredRelease(t *testing.T, r recipes.Release) {
	t.Helper()

	assert.Equal(t, "v0.6.2", r.BldrRelease)
	assert.Equal(t, "ghcr.io/siderolabs/extensions-validator:84cecb0", r.Validator)
	assert.Equal(t, "v1.13.0-alpha.2", r.ValidatorTalos)
	// siderolabs' validator 84cecb0 checks against 1.13.0: the range starts there, not at v1.14.0
	assert.Equal(t, "v1.13.0", r.Floor())
	assert.Equal(t, "sha256:5ec604f42453ccad5058c32094de2347b4bf8f67980465a8f1505ccec4fc6883", r.WolfiBaseRef)

	require.Len(t, r.Inferred, 3)

	for _, inf := range r.Inferred {
		assert.NotEmpty(t, inf.Why, inf.Fields)
	}

	assert.Contains(t, r.Inferred[0].Why, "f694e1b")
	assert.Contains(t, r.Inferred[2].Why, "v0.6.3")

	// Its pkgs and tools are its own; every value of siderolabs' files is inferred.
	for _, f := range []string{"pkgs.tag", "tools.tag"} {
		assert.False(t, r.IsInferred(f), f)
		assert.Contains(t, r.Source(f), "siderolabs/talos v1.14.1, Makefile", f)
	}

	for _, f := range []string{"pkgs.prefix", "tools.prefix", "bldrRelease", "extensionsValidator", "wolfiBaseRef", "drivers.lts.version", "drivers.production.archive.arm64.sha512", "drivers.lts.fabricManager.amd64.sha256"} {
		assert.True(t, r.IsInferred(f), f)
		assert.Contains(t, r.Source(f), "v1.14.0", f)
		assert.Contains(t, r.Origin(f), "; INFERRED for Talos v1.14.1", f)
	}

	assert.Equal(t, "siderolabs/pkgs v1.14.0-1-geffed43 (effed4398f9b), Pkgfile (nvidia_driver_lts_<arch>_sha256/512); the same in "+
		"siderolabs/extensions v1.14.0-rc.1 (5732907953bd), nvidia-gpu/vars.yaml (NVIDIA_PKGS_LTS_<ARCH>_SHA256/512); INFERRED for Talos v1.14.1",
		r.Origin("drivers.lts.archive.amd64.sha256", "drivers.lts.archive.amd64.sha512"), "one source for both checksums")

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

// TestGenerateTakesOnePrefix: vars.yaml has one default PKGS_PREFIX and TOOLS_PREFIX, so
// releases whose facts name others stop the generator.
func TestGenerateTakesOnePrefix(t *testing.T) {
	rs := releases(t)

	_, err := recipes.Generate(rs)
	require.NoError(t, err)

	other := append([]recipes.Release(nil), rs...)
	other[2].PkgsPrefix = "registry.example/siderolabs"

	_, err = recipes.Generate(other)
	require.ErrorContains(t, err, "Talos "+other[2].Talos+": pkgs.prefix registry.example/siderolabs and tools.prefix ghcr.io/siderolabs, but Talos v1.14.1 has ghcr.io/siderolabs and ghcr.io/siderolabs")
}
