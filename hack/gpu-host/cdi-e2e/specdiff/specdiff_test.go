package specdiff_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"tags.cncf.io/container-device-interface/specs-go"

	"github.com/talos-nvidia/nvidia-driver/hack/gpu-host/cdi-e2e/specdiff"
)

func hook(name string, args ...string) *specs.Hook {
	return &specs.Hook{HookName: name, Path: "/usr/bin/nvidia-cdi-hook", Args: append([]string{"nvidia-cdi-hook"}, args...)}
}

func mount(host, ctr string) *specs.Mount {
	return &specs.Mount{HostPath: host, ContainerPath: ctr, Options: []string{"ro", "nosuid", "nodev", "rbind"}}
}

// pair returns two specs of one driver as the e2e sees them: theirs as nvidia-ctk writes it
// for the host's installed tree (/usr/local/nvidia), ours for the subroot under
// /run/nvidia/driver. They differ only where the layouts do.
func pair() (ours, theirs *specs.Spec) {
	spec := func(lib, bin, root string) *specs.Spec {
		gpu := func(name string) specs.Device {
			return specs.Device{Name: name, ContainerEdits: specs.ContainerEdits{
				DeviceNodes: []*specs.DeviceNode{{Path: "/dev/nvidia0"}, {Path: "/dev/dri/card1"}},
				Hooks: []*specs.Hook{
					hook("createContainer", "create-symlinks", "--link", "../card1::/dev/dri/by-path/pci-0000:18:00.0-card"),
					hook("createRuntime", "apply-cuda-memory-limits", "--driver-root", root, "--gpu-id", "GPU-1"),
				},
				Mounts: []*specs.Mount{mount(root+"/usr/share/nvidia/gpu1.conf", "/usr/share/nvidia/gpu1.conf")},
			}}
		}

		return &specs.Spec{
			Version: "0.5.0", Kind: "nvidia.com/gpu",
			Devices: []specs.Device{gpu("0"), gpu("GPU-1")},
			ContainerEdits: specs.ContainerEdits{
				Env:         []string{"NVIDIA_VISIBLE_DEVICES=void", "NVIDIA_CTK_LIBCUDA_DIR=" + lib},
				DeviceNodes: []*specs.DeviceNode{{Path: "/dev/nvidiactl"}, {Path: "/dev/nvidia-uvm"}},
				Mounts: []*specs.Mount{
					mount(root+lib+"/libcuda.so.580.159.04", lib+"/libcuda.so.580.159.04"),
					mount(root+bin+"/nvidia-smi", bin+"/nvidia-smi"),
					mount(root+"/run/nvidia-persistenced/socket", "/run/nvidia-persistenced/socket"),
				},
				Hooks: []*specs.Hook{
					hook("createContainer", "create-symlinks", "--link", "libcuda.so.1::"+lib+"/libcuda.so"),
					hook("createContainer", "enable-cuda-compat", "--host-driver-version=580.159.04"),
					hook("createContainer", "update-ldcache", "--ldconfig-path", "/sbin/ldconfig", "--folder", lib),
				},
			},
		}
	}

	return spec("/usr/lib64", "/usr/bin", "/run/nvidia/driver"), spec("/usr/local/nvidia/lib64", "/usr/local/nvidia/bin", "")
}

// subroot: the files of the subroot that ours was made from.
var subroot = specdiff.Tree{"libcuda.so.580.159.04": true, "libcuda.so.1": true, "nvidia-smi": true, "socket": true, "gpu1.conf": true, "libnvidia-gpucomp.so.580.159.04": true}

func TestCompare(t *testing.T) {
	tests := []struct {
		name string
		// edit changes the pair; nil compares the pair as it is.
		edit func(ours, theirs *specs.Spec)
		// problem: a substring of the one problem expected ("" for none); excused likewise.
		problem, excused string
	}{
		{name: "the same driver in two layouts"},
		{
			name:    "a device's own mount missing",
			edit:    func(o, _ *specs.Spec) { o.Devices[0].ContainerEdits.Mounts = nil },
			problem: "mount gpu1.conf missing, though the subroot has gpu1.conf (device 0)",
		},
		{
			name: "a device's own device node missing",
			edit: func(o, _ *specs.Spec) {
				o.Devices[1].ContainerEdits.DeviceNodes = o.Devices[1].ContainerEdits.DeviceNodes[:1]
			},
			problem: "device node /dev/dri/card1 missing (device GPU-1)",
		},
		{
			name:    "a device's own hook missing",
			edit:    func(o, _ *specs.Spec) { o.Devices[0].ContainerEdits.Hooks = o.Devices[0].ContainerEdits.Hooks[:1] },
			problem: "hook createRuntime apply-cuda-memory-limits --gpu-id GPU-1 missing (device 0)",
		},
		{
			name: "a hook's argument differs",
			edit: func(o, _ *specs.Spec) {
				o.ContainerEdits.Hooks[1] = hook("createContainer", "enable-cuda-compat", "--host-driver-version=580.126.09")
			},
			problem: "hook createContainer enable-cuda-compat --host-driver-version=580.159.04 missing (every device)",
		},
		{
			name: "a link of create-symlinks missing",
			edit: func(o, _ *specs.Spec) {
				o.ContainerEdits.Hooks[0] = hook("createContainer", "create-symlinks", "--link", "libcuda.so.580.159.04::/usr/lib64/libcuda.so.1")
			},
			problem: "hook createContainer create-symlinks --link libcuda.so.1::libcuda.so missing (every device)",
		},
		{
			name: "a common mount missing while the subroot has the file",
			edit: func(_, th *specs.Spec) {
				th.ContainerEdits.Mounts = append(th.ContainerEdits.Mounts,
					mount("/usr/local/nvidia/lib64/libnvidia-gpucomp.so.580.159.04", "/usr/local/nvidia/lib64/libnvidia-gpucomp.so.580.159.04"))
			},
			problem: "mount libnvidia-gpucomp.so.580.159.04 missing, though the subroot has libnvidia-gpucomp.so.580.159.04 (every device)",
		},
		{
			name: "a common mount missing and the subroot lacks the file",
			edit: func(_, th *specs.Spec) {
				th.ContainerEdits.Mounts = append(th.ContainerEdits.Mounts,
					mount("/usr/share/vulkan/icd.d/nvidia_icd.json", "/usr/share/vulkan/icd.d/nvidia_icd.json"))
			},
			excused: "mount nvidia_icd.json: the subroot has no nvidia_icd.json (every device)",
		},
		{
			name: "a link to a library the subroot lacks",
			edit: func(_, th *specs.Spec) {
				th.ContainerEdits.Hooks = append(th.ContainerEdits.Hooks,
					hook("createContainer", "create-symlinks", "--link", "libGLX_nvidia.so.0::/usr/local/nvidia/lib64/libGLX_indirect.so.0"))
			},
			excused: "hook createContainer create-symlinks --link libGLX_nvidia.so.0::libGLX_indirect.so.0: the subroot has no libGLX_nvidia.so.0",
		},
		{
			name:    "the persistenced socket missing though the subroot has it",
			edit:    func(o, _ *specs.Spec) { o.ContainerEdits.Mounts = o.ContainerEdits.Mounts[:2] },
			problem: "mount /run/nvidia-persistenced/socket missing",
		},
		{
			name:    "a device name missing",
			edit:    func(o, _ *specs.Spec) { o.Devices = o.Devices[:1] },
			problem: "device GPU-1 of theirs is not in ours",
		},
		{
			name:    "an environment variable differs",
			edit:    func(o, _ *specs.Spec) { o.ContainerEdits.Env[0] = "NVIDIA_VISIBLE_DEVICES=all" },
			problem: "environment NVIDIA_VISIBLE_DEVICES=all, theirs void",
		},
		{
			name: "a device's mount moved to the common edits still counts",
			edit: func(o, _ *specs.Spec) {
				m := o.Devices[0].ContainerEdits.Mounts
				o.Devices[0].ContainerEdits.Mounts, o.Devices[1].ContainerEdits.Mounts = nil, nil
				o.ContainerEdits.Mounts = append(o.ContainerEdits.Mounts, m...)
			},
		},
		{
			name: "a hook of ours beyond theirs is not a problem",
			edit: func(o, _ *specs.Spec) {
				o.ContainerEdits.Hooks = append(o.ContainerEdits.Hooks, hook("createContainer", "disable-device-node-modification"))
			},
		},
	}

	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ours, theirs := pair()
			if tc.edit != nil {
				tc.edit(ours, theirs)
			}

			r := specdiff.Compare(ours, theirs, subroot)
			check(t, "problems", r.Problems, tc.problem)
			check(t, "excused", r.Excused, tc.excused)

			if r.OK() != (tc.problem == "") {
				t.Errorf("OK() = %t with problems %q", r.OK(), r.Problems)
			}
		})
	}
}

// check wants exactly one entry containing want, or none when want is "".
func check(t *testing.T, what string, got []string, want string) {
	t.Helper()

	if want == "" {
		if len(got) != 0 {
			t.Errorf("%s: want none, got %q", what, got)
		}

		return
	}

	if len(got) != 1 || !strings.Contains(got[0], want) {
		t.Errorf("%s: want one containing %q, got %q", what, want, got)
	}
}

// TestReadTree: the subroot's names at any depth, but not what is mounted or made under dev/.
func TestReadTree(t *testing.T) {
	root := t.TempDir()
	for _, f := range []string{"usr/lib64/libcuda.so.1", "usr/bin/nvidia-smi", "dev/nvidia0", "run/nvidia-persistenced/socket"} {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(f)), 0o755); err != nil {
			t.Fatal(err)
		}

		if err := os.WriteFile(filepath.Join(root, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	tree, err := specdiff.ReadTree(root)
	if err != nil {
		t.Fatal(err)
	}

	for name, want := range map[string]bool{"libcuda.so.1": true, "nvidia-smi": true, "socket": true, "lib64": true, "nvidia0": false} {
		if tree[name] != want {
			t.Errorf("tree[%q] = %t, want %t", name, tree[name], want)
		}
	}

	if _, err := specdiff.ReadTree(filepath.Join(root, "missing")); err == nil {
		t.Error("ReadTree of a missing subroot: no error")
	}
}
