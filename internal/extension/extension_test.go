package extension_test

import (
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/blang/semver/v4"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/siderolabs/talos/pkg/machinery/extensions"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/internal/extension"
	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
)

// built returns Options for the development image from make build's outputs.
func built(t *testing.T) extension.Options { return testutil.DevExtension(t) }

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestDevImageRoundTrip builds the development image, writes its OCI archive, reads the
// archive back as an image and lets Talos's own code validate what the image holds.
func TestDevImageRoundTrip(t *testing.T) {
	o := built(t)

	res, err := extension.Assemble(quiet(), o)
	require.NoError(t, err)

	tarPath := res.Dir + ".tar"
	digest, err := extension.WriteImage(res.Dir, tarPath, "talos-nvidia/nvidia-driver-test:1")
	require.NoError(t, err)

	img, err := tarball.ImageFromPath(tarPath, nil)
	require.NoError(t, err)

	got, err := img.Digest()
	require.NoError(t, err)
	assert.Equal(t, digest, got)

	cfg, err := img.ConfigFile()
	require.NoError(t, err)
	assert.Equal(t, "linux", cfg.OS)
	assert.Equal(t, "amd64", cfg.Architecture)

	layers, err := img.Layers()
	require.NoError(t, err)
	assert.Len(t, layers, 1)

	// What imager does with an extension image: flatten it and load /manifest.yaml + /rootfs.
	extracted := filepath.Join(t.TempDir(), "ext")
	require.NoError(t, os.MkdirAll(extracted, 0o755))
	untar(t, mutate.Extract(img), extracted)

	ext, err := extensions.Load(extracted)
	require.NoError(t, err)

	v := semver.MustParse("1.13.5")
	require.NoError(t, ext.Validate(extensions.WithValidateConstraints(), extensions.WithValidateContents(), extensions.WithTalosVersion(&v)))
	require.NoError(t, extension.Validate(extracted, "v1.13.5"), "our stricter checks pass on the image's content too")

	assert.Equal(t, "535.309.01-test", ext.Manifest.Metadata.Version)

	for _, p := range []string{
		"usr/local/glibc/usr/lib64/libnvidia-ml.so.1", "usr/local/glibc/etc/ld.so.cache",
		"usr/local/lib/containers/nvidia-driver/usr/bin/nvidia-driver",
		"usr/local/lib/containers/nvidia-driver/lib64/ld-linux-x86-64.so.2",
		"usr/local/etc/containers/nvidia-driver.yaml", "usr/bin/nvidia-cdi-hook", "usr/bin/ldconfig",
		"usr/local/lib/containers/nvidia-fabricmanager/usr/bin/nvidia-driver",
		"usr/local/lib/containers/nvidia-fabricmanager/lib64/ld-linux-x86-64.so.2",
		"usr/local/etc/containers/nvidia-fabricmanager.yaml",
		"usr/local/lib/modprobe.d/nvidia-driver.conf",
	} {
		_, err := os.Lstat(filepath.Join(extracted, "rootfs", p))
		assert.NoError(t, err, p)
	}

	// The mount point for the host's /dev (docs/driver-root.md): an empty directory, and an
	// image that lost it is refused.
	devDir, err := os.ReadDir(filepath.Join(extracted, "rootfs/usr/local/glibc/dev"))
	require.NoError(t, err, "the subroot's dev/ mount point")
	assert.Empty(t, devDir, "dev/ ships empty")
	require.NoError(t, os.Remove(filepath.Join(extracted, "rootfs/usr/local/glibc/dev")))
	assert.ErrorContains(t, extension.Validate(extracted, "v1.13.5"), "/usr/local/glibc/dev: missing")

	// Talos (a newer release) refuses it: the manifest pins v1.13.5.
	newer := semver.MustParse("1.13.6")
	assert.ErrorContains(t, ext.Validate(extensions.WithValidateConstraints(), extensions.WithTalosVersion(&newer)), "can't be satisfied")

	sizes, err := extension.Measure(res.Dir)
	require.NoError(t, err)

	st, err := os.Stat(tarPath)
	require.NoError(t, err)
	t.Logf("files %.1f MiB, without NVIDIA's payload %.1f MiB, service binary %.1f MiB, image archive %.1f MiB",
		float64(sizes.Total)/(1<<20), float64(sizes.Own())/(1<<20), float64(sizes.Service)/(1<<20), float64(st.Size())/(1<<20))
}

func untar(t *testing.T, r io.ReadCloser, dir string) {
	t.Helper()
	defer r.Close() //nolint:errcheck

	cmd := exec.Command("tar", "-x", "-p", "-C", dir)
	cmd.Stdin = r
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
}

// TestBadBuildsFail plants one bad thing per case: the build fails, names the path at fault,
// and leaves no extension behind.
func TestBadBuildsFail(t *testing.T) {
	testutil.RequireRoot(t)

	cases := []struct {
		name  string
		plant func(t *testing.T, o *extension.Options)
		want  []string
	}{
		{
			name:  "file outside the allowed paths",
			plant: func(t *testing.T, o *extension.Options) { o.Overlay = overlay(t, "etc/nvidia/evil.conf", 0o644) },
			want:  []string{`path "/etc/nvidia/evil.conf" is not allowed`},
		},
		{
			name: "world-writable file",
			plant: func(t *testing.T, o *extension.Options) {
				o.Overlay = overlay(t, "usr/local/share/nvidia-driver/notes", 0o666)
			},
			want: []string{"/usr/local/share/nvidia-driver/notes: world-writable (mode -rw-rw-rw-)"},
		},
		{
			name: "world-writable directory in the payload",
			plant: func(t *testing.T, o *extension.Options) {
				o.Payload = testutil.CopyTree(t, o.Payload)
				require.NoError(t, os.Mkdir(filepath.Join(o.Payload, "usr/share/open"), 0o755))
				require.NoError(t, os.Chmod(filepath.Join(o.Payload, "usr/share/open"), 0o777))
			},
			want: []string{"/usr/local/glibc/usr/share/open: world-writable"},
		},
		{
			name: "host program whose interpreter is missing",
			plant: func(t *testing.T, o *extension.Options) {
				o.Hook = compile(t, "int main(void){return 0;}", "-Wl,--dynamic-linker=/usr/local/glibc/lib64/ld-missing.so.2")
			},
			want: []string{"/usr/bin/nvidia-cdi-hook: its ELF interpreter /usr/local/glibc/lib64/ld-missing.so.2 does not exist where the host runs it"},
		},
		{
			name: "host program whose interpreter is only on the build machine",
			plant: func(t *testing.T, o *extension.Options) {
				o.Hook = compile(t, "int main(void){return 0;}")
			},
			want: []string{"/usr/bin/nvidia-cdi-hook: its ELF interpreter /lib64/ld-linux-x86-64.so.2 does not exist where the host runs it"},
		},
		{
			name: "host program of another architecture",
			plant: func(t *testing.T, o *extension.Options) {
				o.Hook = compileWith(t, "aarch64-linux-gnu-gcc", "int main(void){return 0;}", "-static")
			},
			want: []string{"/usr/bin/nvidia-cdi-hook: an EM_AARCH64 file in an amd64 extension"},
		},
		{
			name: "service whose container lacks its loader",
			plant: func(t *testing.T, o *extension.Options) {
				o.ServiceRootfs = testutil.CopyTree(t, o.ServiceRootfs)
				require.NoError(t, os.Remove(filepath.Join(o.ServiceRootfs, "lib64/ld-linux-x86-64.so.2")))
			},
			want: []string{"/usr/local/lib/containers/nvidia-driver/usr/bin/nvidia-driver: its ELF interpreter /lib64/ld-linux-x86-64.so.2 does not exist where service nvidia-driver (in its container) runs it"},
		},
		{
			name: "service whose container lacks libc",
			plant: func(t *testing.T, o *extension.Options) {
				o.ServiceRootfs = testutil.CopyTree(t, o.ServiceRootfs)
				require.NoError(t, os.Remove(filepath.Join(o.ServiceRootfs, "lib/x86_64-linux-gnu/libc.so.6")))
			},
			want: []string{"/usr/local/lib/containers/nvidia-driver/usr/bin/nvidia-driver: needs libc.so.6"},
		},
		{
			name:  "dynamic ldconfig",
			plant: func(t *testing.T, o *extension.Options) { o.Ldconfig = o.Hook },
			want:  []string{"/usr/bin/ldconfig: must be static"},
		},
		{
			name:  "special file",
			plant: func(t *testing.T, o *extension.Options) { o.Overlay = fifoOverlay(t) },
			want:  []string{"usr/local/share/fifo: special file"},
		},
		{
			name: "service YAML with an unknown key",
			plant: func(t *testing.T, o *extension.Options) {
				data, err := os.ReadFile(o.ServiceSpec)
				require.NoError(t, err)
				o.ServiceSpec = filepath.Join(t.TempDir(), "nvidia-driver.yaml")
				require.NoError(t, os.WriteFile(o.ServiceSpec, []byte(strings.Replace(string(data), "restart: always", "restart: always\nrestartt: never", 1)), 0o644))
			},
			want: []string{"/usr/local/etc/containers/nvidia-driver.yaml:", "field restartt not found"},
		},
		{
			name: "payload without NVML",
			plant: func(t *testing.T, o *extension.Options) {
				o.Payload = testutil.CopyTree(t, o.Payload)
				require.NoError(t, os.Remove(filepath.Join(o.Payload, "usr/lib64/libnvidia-ml.so.1")))
			},
			want: []string{"driver payload", "/usr/lib64/libnvidia-ml.so.1"},
		},
		{
			name: "payload without the dev/ mount point",
			plant: func(t *testing.T, o *extension.Options) {
				o.Payload = testutil.CopyTree(t, o.Payload)
				require.NoError(t, os.Remove(filepath.Join(o.Payload, "dev")))
			},
			want: []string{"driver payload", "/dev: missing: the empty directory on which the service binds the host's /dev"},
		},
	}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := built(t)
			tc.plant(t, &o)

			_, err := extension.Assemble(quiet(), o)
			require.Error(t, err)

			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}

			entries, err := os.ReadDir(o.OutDir)
			require.NoError(t, err)
			assert.Empty(t, entries, "a failed build leaves nothing behind")
		})
	}
}

// TestArm64ServiceContainer: the service's container as hack/dev/stage-service-rootfs.sh stages
// it on arm64 (the loader at /lib/ld-linux-aarch64.so.1, glibc in lib/aarch64-linux-gnu) is
// read as such, and refused beside the amd64 payload and hook: an extension is of one
// architecture. The program is an aarch64 one from Debian's cross compiler; nothing here
// runs it. The whole arm64 extension is assembled and validated by make test-arm64
// (extension-arm64), with the arm64 build of the validator.
func TestArm64ServiceContainer(t *testing.T) {
	const glibc = "/usr/aarch64-linux-gnu/lib" // libc6-arm64-cross (hack/dev/install-test-deps.sh)

	if _, err := exec.LookPath("aarch64-linux-gnu-gcc"); err != nil {
		t.Skip("needs aarch64-linux-gnu-gcc (hack/dev/install-test-deps.sh installs it)")
	}

	for _, tc := range []struct {
		name, without, want string
	}{
		{name: "as staged", want: "/usr/bin/nvidia-cdi-hook: an EM_X86_64 file in an arm64 extension"},
		{name: "without libc", without: "lib/aarch64-linux-gnu/libc.so.6", want: "nvidia-driver: needs libc.so.6"},
		{name: "without the loader", without: "lib/ld-linux-aarch64.so.1", want: "its ELF interpreter /lib/ld-linux-aarch64.so.1 does not exist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := built(t)
			o.ServiceRootfs = testutil.CopyTree(t, o.ServiceRootfs)

			for _, p := range []string{"lib64", "lib/x86_64-linux-gnu", "usr/bin/nvidia-driver"} {
				require.NoError(t, os.RemoveAll(filepath.Join(o.ServiceRootfs, p)))
			}

			bin := filepath.Join(t.TempDir(), "nvidia-driver")
			cc := exec.Command("aarch64-linux-gnu-gcc", "-x", "c", "-o", bin, "-")
			cc.Stdin = strings.NewReader("int main(void) { return 0; }\n")
			out, err := cc.CombinedOutput()
			require.NoError(t, err, "%s", out)

			for dst, src := range map[string]string{
				"usr/bin/nvidia-driver":           bin,
				"lib/ld-linux-aarch64.so.1":       filepath.Join(glibc, "ld-linux-aarch64.so.1"),
				"lib/aarch64-linux-gnu/libc.so.6": filepath.Join(glibc, "libc.so.6"),
			} {
				if dst == tc.without {
					continue
				}

				data, err := os.ReadFile(src)
				require.NoError(t, err)
				require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(o.ServiceRootfs, dst)), 0o755))
				require.NoError(t, os.WriteFile(filepath.Join(o.ServiceRootfs, dst), data, 0o755))
			}

			_, err = extension.Assemble(quiet(), o)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

func overlay(t *testing.T, rel string, mode os.FileMode) string {
	t.Helper()

	dir := t.TempDir()
	p := filepath.Join(dir, rel)
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(t, os.WriteFile(p, []byte("x\n"), 0o644))
	require.NoError(t, os.Chmod(p, mode))

	return dir
}

func fifoOverlay(t *testing.T) string {
	t.Helper()

	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "usr/local/share"), 0o755))
	require.NoError(t, syscall.Mkfifo(filepath.Join(dir, "usr/local/share/fifo"), 0o644))

	return dir
}

// compile builds a small C program with gcc.
func compile(t *testing.T, src string, flags ...string) string {
	t.Helper()

	return compileWith(t, "gcc", src, flags...)
}

// compileWith compiles src with the C compiler cc (aarch64-linux-gnu-gcc for a program of
// another architecture: make deps installs it for make test-arm64).
func compileWith(t *testing.T, cc, src string, flags ...string) string {
	t.Helper()

	dir := t.TempDir()
	c := filepath.Join(dir, "prog.c")
	require.NoError(t, os.WriteFile(c, []byte(src), 0o644))

	bin := filepath.Join(dir, "prog")
	args := append([]string{"-o", bin, c}, flags...)
	out, err := exec.Command(cc, args...).CombinedOutput()
	require.NoError(t, err, "%s", out)

	return bin
}

func TestKernelModulesMustMatchThePayload(t *testing.T) {
	testutil.RequireRoot(t)

	const kver = "6.18.1-talos"

	cases := []struct {
		name    string
		kind    extension.ModuleKind
		modules map[string][2]string // name: version, license
		want    []string
	}{
		{
			name:    "open modules of the payload's version",
			kind:    extension.ModulesOpen,
			modules: map[string][2]string{"nvidia": {"535.309.01", "Dual MIT/GPL"}, "nvidia-uvm": {"535.309.01", "Dual MIT/GPL"}},
		},
		{
			name:    "proprietary modules of the payload's version",
			kind:    extension.ModulesProprietary,
			modules: map[string][2]string{"nvidia": {"535.309.01", "NVIDIA"}, "nvidia-modeset": {"535.309.01", "NVIDIA"}},
		},
		{
			// NVIDIA's open build: nvidia-peermem.ko declares Linux-OpenIB.
			name: "open modules with nvidia-peermem",
			kind: extension.ModulesOpen,
			modules: map[string][2]string{
				"nvidia": {"535.309.01", "Dual MIT/GPL"}, "nvidia-uvm": {"535.309.01", "Dual MIT/GPL"},
				"nvidia-peermem": {"535.309.01", "Linux-OpenIB"},
			},
		},
		{
			name:    "open modules named proprietary",
			kind:    extension.ModulesProprietary,
			modules: map[string][2]string{"nvidia": {"535.309.01", "Dual MIT/GPL"}, "nvidia-peermem": {"535.309.01", "Linux-OpenIB"}},
			want:    []string{"/usr/lib/modules/" + kver + "/extras/nvidia.ko: license \"Dual MIT/GPL\", but proprietary modules declare \"NVIDIA\""},
		},
		{
			name:    "nvidia-peermem of another version",
			kind:    extension.ModulesOpen,
			modules: map[string][2]string{"nvidia": {"535.309.01", "Dual MIT/GPL"}, "nvidia-peermem": {"580.178.04", "Linux-OpenIB"}},
			want:    []string{"/usr/lib/modules/" + kver + "/extras/nvidia-peermem.ko: module version \"580.178.04\" differs from the userspace driver's"},
		},
		{
			name:    "modules of another version",
			kind:    extension.ModulesOpen,
			modules: map[string][2]string{"nvidia": {"535.309.01", "Dual MIT/GPL"}, "nvidia-uvm": {"580.159.04", "Dual MIT/GPL"}},
			want:    []string{"/usr/lib/modules/" + kver + "/extras/nvidia-uvm.ko: module version \"580.159.04\" differs from the userspace driver's 535.309.01"},
		},
		{
			name:    "proprietary modules in an open flavor",
			kind:    extension.ModulesOpen,
			modules: map[string][2]string{"nvidia": {"535.309.01", "NVIDIA"}},
			want:    []string{"/usr/lib/modules/" + kver + "/extras/nvidia.ko: license \"NVIDIA\", but open modules declare \"Dual MIT/GPL\""},
		},
		{
			name:    "no nvidia.ko",
			kind:    extension.ModulesProprietary,
			modules: map[string][2]string{"nvidia-uvm": {"535.309.01", "NVIDIA"}},
			want:    []string{"/usr/lib/modules: no nvidia.ko under it"},
		},
	}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := built(t)
			o.Modules, o.ModuleKind = t.TempDir(), tc.kind

			for name, vl := range tc.modules {
				testutil.KernelModule(t, filepath.Join(o.Modules, kver, "extras"), name, vl[0], vl[1])
			}

			res, err := extension.Assemble(quiet(), o)
			if len(tc.want) == 0 {
				require.NoError(t, err)
				assert.Len(t, res.Modules, len(tc.modules))
				assert.FileExists(t, filepath.Join(res.Dir, "rootfs/usr/lib/modules", kver, "extras/nvidia.ko"))

				return
			}

			require.Error(t, err)

			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}
