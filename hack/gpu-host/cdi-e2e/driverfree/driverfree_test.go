package driverfree_test

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/talos-nvidia/nvidia-driver/hack/gpu-host/cdi-e2e/driverfree"
)

// write makes root/rel with content, and its directories.
func write(t *testing.T, root, rel, content string) {
	t.Helper()

	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}

	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func link(t *testing.T, root, rel, target string) {
	t.Helper()

	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}

	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}

// elf is the start of any ELF file: what the loader would take.
const elf = "\x7fELF\x02\x01\x01"

func TestCheck(t *testing.T) {
	// The host's driver tree, as hack/gpu-host/e2e-gpu.sh hashes it: /usr/local/nvidia/{lib64,bin}.
	tree := t.TempDir()
	write(t, tree, "lib64/libnvidia-gpucomp.so.580.159.04", "NVIDIA gpucomp")
	write(t, tree, "lib64/libGL.so.1", "NVIDIA's libglvnd libGL")
	write(t, tree, "bin/nvidia-debugdump", "NVIDIA debugdump")

	m, err := driverfree.MakeManifest(filepath.Join(tree, "lib64"), filepath.Join(tree, "bin"))
	if err != nil {
		t.Fatal(err)
	}

	// The manifest travels as a file between the two halves of the e2e.
	var buf bytes.Buffer
	if err := m.Write(&buf); err != nil {
		t.Fatal(err)
	}

	if m, err = driverfree.ReadManifest(&buf); err != nil || len(m) != 3 {
		t.Fatalf("manifest read back: %d entries, %v", len(m), err)
	}

	// outside holds a real libcuda.so.1 outside the root: a link that climbs out of the root
	// must not reach it (the container cannot).
	outside := t.TempDir()
	write(t, outside, "libcuda.so.1", elf)

	tests := []struct {
		name string
		make func(t *testing.T, root string)
		want []driverfree.Finding
	}{
		{
			name: "a host root without the driver",
			make: func(t *testing.T, root string) {
				// A host's own libGL (not NVIDIA's contents), the host tree hidden (its
				// mount point empty), links into it dangling, a wrapper script calling it,
				// ld.so.conf naming it.
				write(t, root, "usr/lib/x86_64-linux-gnu/libGL.so.1", "Debian's libGL")
				link(t, root, "usr/bin/nvidia-smi", "/usr/local/nvidia/bin/nvidia-smi")
				write(t, root, "usr/sbin/nvidia-smi", "#!/bin/sh\nexec /usr/local/nvidia/bin/nvidia-smi \"$@\"\n")
				link(t, root, "usr/lib64/libcuda.so.1", "../../../../../../../.."+outside+"/libcuda.so.1")
				write(t, root, "etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n")
				write(t, root, "etc/ld.so.conf.d/nvidia.conf", "/usr/local/nvidia/lib64\n")
				if err := os.MkdirAll(filepath.Join(root, "usr/local/nvidia/lib64"), 0o755); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "libcuda.so.1 in the loader's default directory",
			make: func(t *testing.T, root string) { write(t, root, "usr/lib/x86_64-linux-gnu/libcuda.so.1", elf) },
			want: []driverfree.Finding{{Path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1", Why: "the driver's libcuda.so.1"}},
		},
		{
			name: "nvidia-smi on PATH",
			make: func(t *testing.T, root string) { write(t, root, "usr/local/bin/nvidia-smi", elf) },
			want: []driverfree.Finding{{Path: "/usr/local/bin/nvidia-smi", Why: "the driver's nvidia-smi"}},
		},
		{
			name: "a copy of the tree's library in a directory that ld.so.conf.d names, through a link",
			make: func(t *testing.T, root string) {
				write(t, root, "etc/ld.so.conf", "include ld.so.conf.d/*.conf\n")
				write(t, root, "etc/ld.so.conf.d/nvidia.conf", "# the driver\n/opt/nvidia/lib\n")
				write(t, root, "opt/nvidia/lib/libnvidia-gpucomp.so.580.159.04", "NVIDIA gpucomp")
				link(t, root, "opt/nvidia/lib/libnvidia-gpucomp.so", "/opt/nvidia/lib/libnvidia-gpucomp.so.580.159.04")
			},
			want: []driverfree.Finding{
				{Path: "/opt/nvidia/lib/libnvidia-gpucomp.so", Why: "the same contents as the driver tree's libnvidia-gpucomp.so.580.159.04"},
				{Path: "/opt/nvidia/lib/libnvidia-gpucomp.so.580.159.04", Why: "the same contents as the driver tree's libnvidia-gpucomp.so.580.159.04"},
			},
		},
		{
			name: "the tree's libraries in a directory only ld.so.cache names",
			make: func(t *testing.T, root string) {
				write(t, root, "etc/ld.so.cache", "glibc-ld.so.cache1.1\x00libGL.so.1\x00/srv/gl/libGL.so.1\x00")
				write(t, root, "srv/gl/libGL.so.1", "NVIDIA's libglvnd libGL")
			},
			want: []driverfree.Finding{{Path: "/srv/gl/libGL.so.1", Why: "the same contents as the driver tree's libGL.so.1"}},
		},
		{
			name: "a tree's program in the tree's own path, named by the caller",
			make: func(t *testing.T, root string) {
				write(t, root, "usr/local/nvidia/bin/nvidia-debugdump", "NVIDIA debugdump")
			},
			want: []driverfree.Finding{{Path: "/usr/local/nvidia/bin/nvidia-debugdump", Why: "the same contents as the driver tree's nvidia-debugdump"}},
		},
	}

	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			write(t, root, "usr/lib/x86_64-linux-gnu/libc.so.6", "glibc")
			tc.make(t, root)

			got, err := driverfree.Check(root, m, "/usr/local/nvidia/lib64", "/usr/local/nvidia/bin")
			if err != nil {
				t.Fatal(err)
			}

			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestReadManifestRejectsBadLines(t *testing.T) {
	for _, in := range []string{"nohash\n", "abc libcuda.so.1\n"} {
		if _, err := driverfree.ReadManifest(bytes.NewBufferString(in)); err == nil {
			t.Errorf("ReadManifest(%q): no error", in)
		}
	}
}
