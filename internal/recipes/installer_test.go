package recipes_test

import (
	"bufio"
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

// installerSource is NVIDIA's nvidia-installer at the newest 580 tag published as source:
// its MANIFEST file types and its options (testdata, extracted from manifest.c and
// option_table.h).
const installerSource = "testdata/nvidia-installer-580.119.02.txt"

// installerOptions are the long options of one build of nvidia-installer.
type installerOptions map[string]bool

func readInstallerSource(t *testing.T) (types []string, options installerOptions) {
	t.Helper()

	types, options, _ = readInstallerSourceArch(t)

	return types, options
}

// readInstallerSourceArch also returns the options only the x86_64 build has (booleans with
// their --no- form).
func readInstallerSourceArch(t *testing.T) (types []string, options, x86_64Only installerOptions) {
	t.Helper()

	f, err := os.Open(installerSource)
	require.NoError(t, err)

	defer f.Close()

	options, x86_64Only = installerOptions{}, installerOptions{}

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
		case "x86_64": // after the options
			x86_64Only[name] = true
			if options["no-"+name] {
				x86_64Only["no-"+name] = true
			}
		}
	}

	require.NoError(t, sc.Err())
	require.Len(t, types, 65, "manifest.c's packageEntryFileTypeTable")
	require.Len(t, x86_64Only, 5, "option_table.h's #if defined(NV_X86_64) block: the compat32 options")

	return types, options, x86_64Only
}

// x86_64Opts are the options userspace.sh adds on x86_64 only (its x86_64_opts array).
var x86_64Opts = regexp.MustCompile(`(?m)^\s*if \[ "\$ARCH" = x86_64 \]; then x86_64_opts=\(([^)]*)\); fi$`)

// installerArgs are the nvidia-installer options of userspace.sh for a build of arch: its
// command line, and the x86_64 ones there.
func installerArgs(t *testing.T, script, arch string, vars map[string]string) recipes.InstallerFlags {
	t.Helper()

	m := x86_64Opts.FindStringSubmatch(script)
	require.NotNil(t, m, "userspace.sh sets x86_64_opts on x86_64")
	require.True(t, strings.Contains(script, `"${x86_64_opts[@]}" \`+"\n"), "userspace.sh gives the installer x86_64_opts")

	line := script
	if arch == "x86_64" {
		// as if written on the command line
		line = strings.Replace(script, `"${x86_64_opts[@]}" \`, m[1]+` \`, 1)
	}

	flags, err := recipes.ParseInstallerFlags(line, vars)
	require.NoError(t, err)

	return flags
}

// TestInstallerFilesStayInTheSubroot: for every file type of the installer's MANIFEST table,
// the userspace stage's command line puts it in the subroot or the firmware directory, or
// keeps the installer from installing it; and every option on it is one the installer has.
func TestInstallerFilesStayInTheSubroot(t *testing.T) {
	types, options, x86_64Only := readInstallerSourceArch(t)

	script, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "stages", "scripts", "userspace.sh"))
	require.NoError(t, err)

	for _, a := range recipes.Arches() {
		tr := loadPlatform(t, a.Platform, nil)

		for _, b := range recipes.Branches {
			t.Run(a.Name+"/"+b, func(t *testing.T) {
				p := tr.Pkg("nvidia-userspace-" + b)
				require.NotNil(t, p)

				step := p.Steps[0]
				subroot := step.Env["SUBROOT"]
				require.Equal(t, "/rootfs/usr/local/glibc", subroot)
				require.Equal(t, a.Name, step.Env["ARCH"], "the step's ARCH is the platform's")

				firmware := "/rootfs/usr/lib/firmware/nvidia/" + p.Vars["NVIDIA_DRIVER_"+strings.ToUpper(b)+"_VERSION"]

				// The step runs the installer through the stage script.
				require.Contains(t, step.Install, "/usr/libexec/nvidia-driver/userspace.sh install")

				flags := installerArgs(t, string(script), step.Env["ARCH"], map[string]string{"SUBROOT": subroot, "firmware": firmware})

				for o := range flags.Options {
					assert.True(t, options[o], "--%s is not an option of nvidia-installer 580.119.02", o)
					assert.False(t, a.Name != "x86_64" && x86_64Only[o], "--%s: only the installer's x86_64 build has it, its %s build rejects it", o, a.Name)
				}

				// NVIDIA's x86_64 archive has 32-bit libraries, which the subroot leaves out.
				_, noCompat32 := flags.Options["no-install-compat32-libs"]
				assert.Equal(t, a.Name == "x86_64", noCompat32, "--no-install-compat32-libs on x86_64 only")

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
