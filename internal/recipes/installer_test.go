package recipes_test

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/internal/recipes"
	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
)

// installerSource is NVIDIA's nvidia-installer at the newest 580 tag published as source:
// its MANIFEST file types and its options (testdata, extracted from manifest.c and
// option_table.h).
const installerSource = "testdata/nvidia-installer-580.119.02.txt"

func readInstallerSource(t *testing.T) (types []string, options map[string]bool) {
	t.Helper()

	f, err := os.Open(installerSource)
	require.NoError(t, err)

	defer f.Close()

	options = map[string]bool{}

	sc := bufio.NewScanner(f)
	for sc.Scan() {
		kind, name, _ := strings.Cut(sc.Text(), " ")

		switch kind {
		case "type":
			types = append(types, name)
		case "option":
			options[name] = true
		case "boolean":
			options[name], options["no-"+name] = true, true
		}
	}

	require.NoError(t, sc.Err())
	require.Len(t, types, 65, "manifest.c's packageEntryFileTypeTable")

	return types, options
}

// TestInstallerFilesStayInTheSubroot: for every file type of the installer's MANIFEST table,
// the userspace stage's command line puts it in the subroot or the firmware directory, or
// keeps the installer from installing it; and every option on it is one the installer has.
func TestInstallerFilesStayInTheSubroot(t *testing.T) {
	types, options := readInstallerSource(t)
	tr := load(t, nil)

	for _, b := range recipes.Branches {
		t.Run(b, func(t *testing.T) {
			p := tr.Pkg("nvidia-userspace-" + b)
			require.NotNil(t, p)

			step := p.Steps[0]
			subroot := step.Env["SUBROOT"]
			require.Equal(t, "/rootfs/usr/local/glibc", subroot)

			firmware := "/rootfs/usr/lib/firmware/nvidia/" + p.Vars["NVIDIA_DRIVER_"+strings.ToUpper(b)+"_VERSION"]

			// The step runs the installer through the stage script.
			require.Contains(t, step.Install, "/usr/libexec/nvidia-driver/userspace.sh install")

			script, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "stages", "scripts", "userspace.sh"))
			require.NoError(t, err)

			flags, err := recipes.ParseInstallerFlags(string(script), map[string]string{
				"SUBROOT": subroot, "firmware": firmware,
			})
			require.NoError(t, err)

			for o := range flags.Options {
				assert.True(t, options[o], "--%s is not an option of nvidia-installer 580.119.02", o)
			}

			for typ := range flags.Overrides {
				assert.Contains(t, types, typ, "override of a file type the installer does not have")
			}

			for _, typ := range types {
				d, ok := flags.InstallerDestination(typ)
				if !assert.True(t, ok, "%s: a file type the model (installer.go) does not know: add its set_destinations rule", typ) {
					continue
				}

				switch {
				case d.Dropped != "":
				case d.FromManifest:
					t.Errorf("%s: goes where its MANIFEST entry says (an absolute path): override it", typ)
				case within(d.Dir, subroot), within(d.Dir, firmware):
				default:
					t.Errorf("%s: installed to %s, outside the subroot %s and %s", typ, d.Dir, subroot, firmware)
				}
			}
		})
	}
}

// TestInstallerModelFindsEscapes: the model reports what the installer's defaults would do,
// so the test above can fail: without the recipe's overrides, the hard-coded destinations
// lie outside any prefix.
func TestInstallerModelFindsEscapes(t *testing.T) {
	flags, err := recipes.ParseInstallerFlags("./nvidia-installer --silent --utility-prefix=/s/usr --no-kernel-modules \\\n  --override-file-type-destination=FIRMWARE:/fw\nnext", nil)
	require.NoError(t, err)

	for typ, want := range map[string]recipes.Destination{
		"SANDBOXUTILS_FILELIST_JSON": {Dir: "/usr/share/nvidia/files.d"},
		"INTERNAL_UTILITY_LIB":       {Dir: "/usr/lib/nvidia"},
		"CUDA_ICD":                   {Dir: "/etc/OpenCL/vendors"},
		"EXPLICIT_PATH":              {FromManifest: true},
		"UTILITY_BINARY":             {Dir: "/s/usr/bin"},
		"FIRMWARE":                   {Dir: "/fw"},
		"KERNEL_MODULE":              {Dropped: "--no-kernel-modules"},
		"SYSTEMD_UNIT":               {Dropped: "no --systemd"},
		"OPENGL_LIB":                 {Dir: "/usr/lib64"},
	} {
		got, ok := flags.InstallerDestination(typ)
		assert.True(t, ok, typ)
		assert.Equal(t, want, got, typ)
	}

	_, ok := flags.InstallerDestination("NO_SUCH_TYPE")
	assert.False(t, ok)
}

func within(dir, root string) bool {
	rel, err := filepath.Rel(root, dir)

	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

// TestManifestModelKnowsEveryType: the MANIFEST parser's field table has exactly the
// installer's file types.
func TestManifestModelKnowsEveryType(t *testing.T) {
	types, _ := readInstallerSource(t)
	assert.ElementsMatch(t, types, recipes.ManifestFileTypes())
}

// TestParseManifest: entries as parse_manifest reads them, and its errors with their line.
func TestParseManifest(t *testing.T) {
	header := "NVIDIA driver\n580.119.02\n\nnvidia nvidia-uvm\n\n\n\n\n"

	m, err := recipes.ParseManifest(strings.NewReader(header +
		"libcuda.so.1 0000 CUDA_SYMLINK NATIVE / libcuda.so.580.119.02 MODULE:gpgpu\n" +
		"firmware/gsp_ga10x.bin 0644 FIRMWARE INHERIT_PATH_DEPTH:1\n" +
		"nvidia-smi 0755 UTILITY_BINARY\n\nignored after the empty line\n"))
	require.NoError(t, err)
	assert.Equal(t, "580.119.02", m.Version)
	assert.Equal(t, []string{"nvidia", "nvidia-uvm"}, m.KernelModules)
	assert.Equal(t, []recipes.ManifestEntry{
		{File: "libcuda.so.1", Name: "libcuda.so.1", Mode: 0, Type: "CUDA_SYMLINK", Arch: "NATIVE", Path: "/", Target: "libcuda.so.580.119.02"},
		{File: "firmware/gsp_ga10x.bin", Name: "gsp_ga10x.bin", Mode: 0o644, Type: "FIRMWARE", Path: ""},
		{File: "nvidia-smi", Name: "nvidia-smi", Mode: 0o755, Type: "UTILITY_BINARY"},
	}, m.Entries)

	for line, want := range map[string]string{
		"libcuda.so 0755 CUDA_LIB NATIVE\n":            "line 9: libcuda.so CUDA_LIB: no path",
		"x 0755 NO_SUCH_TYPE\n":                        `line 9: x: unknown file type "NO_SUCH_TYPE"`,
		"x 07z5 UTILITY_BINARY\n":                      `line 9: x: mode "07z5" is not octal`,
		"libx.so 0755 UTILITY_LIB AMD64\n":             `line 9: libx.so: architecture "AMD64"`,
		"gsp.bin 0644 FIRMWARE INHERIT_PATH_DEPTH:1\n": "line 9: gsp.bin: INHERIT_PATH_DEPTH:1, deeper than its directory",
	} {
		_, err := recipes.ParseManifest(strings.NewReader(header + line))
		assert.ErrorContains(t, err, want, line)
	}

	_, err = recipes.ParseManifest(strings.NewReader("NVIDIA driver\n580\n"))
	assert.ErrorContains(t, err, "line 3: want 8 header lines")
}
