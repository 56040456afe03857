package driverroot_test

import (
	"debug/elf"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
	"github.com/talos-nvidia/nvidia-driver/pkg/driverroot"
)

func TestCheckDebianSubroot(t *testing.T) {
	report := driverroot.Check(testutil.Subroot(t))

	require.NoError(t, report.Err())
	assert.Regexp(t, `^\d+\.\d+\.\d+$`, report.DriverVersion)
}

func TestCheckEmptySubroot(t *testing.T) {
	report := driverroot.Check(t.TempDir())
	require.False(t, report.OK())

	// Every piece is named with the consumer that needs it.
	want := map[string]string{
		"/usr/lib64/libnvidia-ml.so.1":  driverroot.ConsumerDevicePlugin,
		"/usr/bin/nvidia-smi":           driverroot.ConsumerValidator,
		"/usr/lib64/libcuda.so.1":       driverroot.ConsumerNvcdi,
		"/" + driverroot.LoaderPath:     driverroot.ConsumerService,
		"/usr/lib64/libc.so.6":          driverroot.ConsumerService,
		"/usr/bin/nvidia-persistenced":  driverroot.ConsumerPersistenced,
		"/usr/lib64/libnvidia-cfg.so.1": driverroot.ConsumerPersistenced,
		"/sbin/ldconfig":                driverroot.ConsumerLdcache,
		"/etc/ld.so.cache":              driverroot.ConsumerNvcdi,
		"/run/nvidia-persistenced":      driverroot.ConsumerNvcdi,
		"/dev":                          driverroot.ConsumerDevRoot,
	}

	for path, consumer := range want {
		assert.True(t, hasProblem(report, path, consumer, ""), "no problem reported for %s needed by %s:\n%v", path, consumer, report.Err())
	}
}

func TestCheckMissingSubroot(t *testing.T) {
	report := driverroot.Check(filepath.Join(t.TempDir(), "nope"))

	require.Len(t, report.Problems, 1)
	assert.Contains(t, report.Problems[0].Message, "subroot does not exist")
}

// TestCheckBrokenSubroot breaks a copy of the Debian subroot one way at a time and checks
// that exactly that is reported, naming the path and the consumer.
func TestCheckBrokenSubroot(t *testing.T) {
	base := testutil.Subroot(t)

	cases := []struct {
		name     string
		breakIt  func(t *testing.T, root string)
		path     string
		consumer string
		message  string
	}{
		{
			name:     "NVML only under usr/lib",
			breakIt:  moveLib("libnvidia-ml.so.1", "usr/lib"),
			path:     "/usr/lib64/libnvidia-ml.so.1",
			consumer: driverroot.ConsumerDevicePlugin,
			message:  "misplaced at /usr/lib/libnvidia-ml.so.1",
		},
		{
			name:     "no nvidia-smi",
			breakIt:  remove("usr/bin/nvidia-smi"),
			path:     "/usr/bin/nvidia-smi",
			consumer: driverroot.ConsumerValidator,
			message:  "not found in any of /nvidia-smi, /usr/bin/nvidia-smi",
		},
		{
			name: "nvidia-smi not executable",
			breakIt: func(t *testing.T, root string) {
				require.NoError(t, os.Chmod(filepath.Join(root, "usr/bin/nvidia-smi"), 0o644))
			},
			path:     "/usr/bin/nvidia-smi",
			consumer: driverroot.ConsumerValidator,
			message:  "not executable",
		},
		{
			name:     "no dev directory",
			breakIt:  remove("dev"),
			path:     "/dev",
			consumer: driverroot.ConsumerDevRoot,
			message:  "missing: the empty directory on which the service binds the host's /dev",
		},
		{
			name: "dev is a symlink",
			breakIt: func(t *testing.T, root string) {
				require.NoError(t, os.Remove(filepath.Join(root, "dev")))
				require.NoError(t, os.Symlink("/dev", filepath.Join(root, "dev")))
			},
			path:     "/dev",
			consumer: driverroot.ConsumerDevRoot,
			message:  "must be a directory",
		},
		{
			name:     "dynamic ldconfig",
			breakIt:  copyFile("usr/bin/nvidia-smi", "sbin/ldconfig"),
			path:     "/sbin/ldconfig",
			consumer: driverroot.ConsumerLdcache,
			message:  "must be static, but asks for the interpreter /" + driverroot.LoaderPath,
		},
		{
			name:     "no ld.so.cache",
			breakIt:  remove("etc/ld.so.cache"),
			path:     "/etc/ld.so.cache",
			consumer: driverroot.ConsumerNvcdi,
			message:  "missing: run `ldconfig -r <subroot>`",
		},
		{
			name:     "ld.so.cache not an ld.so.cache",
			breakIt:  writeFile("etc/ld.so.cache", "garbage"),
			path:     "/etc/ld.so.cache",
			consumer: driverroot.ConsumerNvcdi,
			message:  "unreadable: not an ld.so.cache",
		},
		{
			name:     "libtirpc missing",
			breakIt:  remove("usr/lib64/libtirpc.so.3"),
			path:     "/usr/lib64/libtirpc.so.3",
			consumer: driverroot.ConsumerPersistenced,
			message:  "missing: /usr/bin/nvidia-persistenced links against it",
		},
		{
			name: "two driver versions",
			breakIt: func(t *testing.T, root string) {
				lib := filepath.Join(root, "usr/lib64")
				target, err := os.Readlink(filepath.Join(lib, "libcuda.so.1"))
				require.NoError(t, err)
				require.NoError(t, os.Rename(filepath.Join(lib, target), filepath.Join(lib, "libcuda.so.999.1.2")))
				require.NoError(t, os.Remove(filepath.Join(lib, "libcuda.so.1")))
				require.NoError(t, os.Symlink("libcuda.so.999.1.2", filepath.Join(lib, "libcuda.so.1")))
			},
			path:     "/usr/lib64/libcuda.so.1",
			consumer: driverroot.ConsumerNvcdi,
			message:  "version 999.1.2 differs from libnvidia-ml's",
		},
		{
			name:     "no loader",
			breakIt:  remove(driverroot.LoaderPath),
			path:     "/" + driverroot.LoaderPath,
			consumer: driverroot.ConsumerService,
			message:  "glibc loader missing",
		},
		{
			// the subroot of another architecture's extension: its loader's ELF machine
			name:     "loader of another architecture",
			breakIt:  otherMachine(driverroot.LoaderPath),
			path:     "/" + driverroot.LoaderPath,
			consumer: driverroot.ConsumerService,
			message:  "the extension was built for another architecture",
		},
		{
			name:     "no socket directory",
			breakIt:  remove("run/nvidia-persistenced"),
			path:     "/run/nvidia-persistenced",
			consumer: driverroot.ConsumerNvcdi,
			message:  "missing directory",
		},
	}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root := testutil.CopyTree(t, base)
			tc.breakIt(t, root)

			report := driverroot.Check(root)
			assert.True(t, hasProblem(report, tc.path, tc.consumer, tc.message), "want %s (%s) %q, got:\n%v", tc.path, tc.consumer, tc.message, report.Err())
		})
	}
}

func TestReportText(t *testing.T) {
	var b strings.Builder

	require.NoError(t, driverroot.Check(t.TempDir()).WriteText(&b))
	assert.Contains(t, b.String(), "result: UNUSABLE")
	assert.Contains(t, b.String(), "needed by: gpu-operator validator")
}

func hasProblem(r driverroot.Report, path, consumer, message string) bool {
	for _, p := range r.Problems {
		if p.Path == path && p.Consumer == consumer && strings.Contains(p.Message, message) {
			return true
		}
	}

	return false
}

func remove(rel string) func(*testing.T, string) {
	return func(t *testing.T, root string) { require.NoError(t, os.RemoveAll(filepath.Join(root, rel))) }
}

func writeFile(rel, content string) func(*testing.T, string) {
	return func(t *testing.T, root string) {
		require.NoError(t, os.WriteFile(filepath.Join(root, rel), []byte(content), 0o644))
	}
}

func copyFile(from, to string) func(*testing.T, string) {
	return func(t *testing.T, root string) {
		data, err := os.ReadFile(filepath.Join(root, from))
		require.NoError(t, err)
		require.NoError(t, os.Remove(filepath.Join(root, to)))
		require.NoError(t, os.WriteFile(filepath.Join(root, to), data, 0o755))
	}
}

// otherMachine rewrites an ELF file's e_machine (offset 18, little endian) to the other of
// x86-64 and aarch64.
func otherMachine(rel string) func(*testing.T, string) {
	return func(t *testing.T, root string) {
		p := filepath.Join(root, rel)
		data, err := os.ReadFile(p)
		require.NoError(t, err)

		other := elf.EM_X86_64
		if elf.Machine(binary.LittleEndian.Uint16(data[18:])) == elf.EM_X86_64 {
			other = elf.EM_AARCH64
		}

		binary.LittleEndian.PutUint16(data[18:], uint16(other))
		require.NoError(t, os.Remove(p))
		require.NoError(t, os.WriteFile(p, data, 0o755))
	}
}

// moveLib moves a library (its symlink and real file) to another directory of the subroot.
func moveLib(name, dir string) func(*testing.T, string) {
	return func(t *testing.T, root string) {
		lib := filepath.Join(root, "usr/lib64")
		require.NoError(t, os.MkdirAll(filepath.Join(root, dir), 0o755))

		target, err := os.Readlink(filepath.Join(lib, name))
		require.NoError(t, err)
		require.NoError(t, os.Rename(filepath.Join(lib, target), filepath.Join(root, dir, target)))
		require.NoError(t, os.Rename(filepath.Join(lib, name), filepath.Join(root, dir, name)))
	}
}
