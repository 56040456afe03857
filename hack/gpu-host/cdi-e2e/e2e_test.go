package main_test

// The GPU end-to-end test's pieces that run without a GPU, each shown failing on its bad
// case: cdi-e2e's subcommands as hack/gpu-host/e2e-gpu.sh calls them (built here, run as programs),
// and the shell functions of hack/gpu-host/e2e-lib.sh and hack/gpu-host/e2e-persistenced.sh with fake inputs.

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
)

// build builds cdi-e2e into a temporary _out/bin and returns that _out.
func build(t *testing.T) string {
	t.Helper()

	out := t.TempDir()
	cmd := exec.Command("go", "build", "-o", filepath.Join(out, "bin", "cdi-e2e"), ".")

	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}

	return out
}

// run runs a program and returns its combined output and exit code.
func run(t *testing.T, env []string, name string, args ...string) (string, int) {
	t.Helper()

	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	b, err := cmd.CombinedOutput()

	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%s: %v", name, err)
	}

	return string(b), code
}

func write(t *testing.T, p, content string, mode os.FileMode) {
	t.Helper()

	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}

	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

func needRoot(t *testing.T) {
	t.Helper()

	if os.Geteuid() != 0 {
		t.Skip("needs root (mount namespaces)")
	}
}

// spec is a CDI spec of one device: a device node (the host's /dev/null), a mount and a hook
// in the common edits, and mountOf0 in the device's own edits.
func spec(mountOf0 string) string {
	s := `cdiVersion: 0.5.0
kind: example.com/gpu
devices:
  - name: "0"
    containerEdits:
      deviceNodes:
        - path: /dev/e2e-gpu0
          hostPath: /dev/null
`
	if mountOf0 != "" {
		s += `      mounts:
        - hostPath: /etc/hostname
          containerPath: ` + mountOf0 + `
          options: [ro, rbind]
`
	}

	return s + `containerEdits:
  deviceNodes:
    - path: /dev/e2e-ctl
      hostPath: /dev/zero
  mounts:
    - hostPath: /etc/hostname
      containerPath: /usr/lib64/libcuda.so.1
      options: [ro, rbind]
  hooks:
    - hookName: createContainer
      path: /usr/bin/nvidia-cdi-hook
      args: [nvidia-cdi-hook, update-ldcache, --folder, /usr/lib64]
`
}

func TestInjectNodesOnly(t *testing.T) {
	out := build(t)
	dir := t.TempDir()
	write(t, filepath.Join(dir, "cdi", "example.yaml"), spec("/usr/lib64/gpu0.conf"), 0o644)

	cfg := func(t *testing.T, extra ...string) oci.Spec {
		t.Helper()

		p := filepath.Join(t.TempDir(), "config.json")
		write(t, p, `{"ociVersion":"1.0.2","process":{"args":["sh"],"cwd":"/","user":{"uid":0,"gid":0}},"root":{"path":"rootfs"},"linux":{}}`, 0o644)

		args := append([]string{"inject", "--spec-dir", filepath.Join(dir, "cdi"), "--config", p, "--device", "example.com/gpu=0", "--rootfs", "/r"}, extra...)
		if o, code := run(t, nil, filepath.Join(out, "bin", "cdi-e2e"), append(args, "--", "true")...); code != 0 {
			t.Fatalf("inject %v: exit %d\n%s", extra, code, o)
		}

		var s oci.Spec

		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}

		if err := json.Unmarshal(b, &s); err != nil {
			t.Fatal(err)
		}

		return s
	}

	devices := func(s oci.Spec) []string {
		var d []string
		for _, n := range s.Linux.Devices {
			d = append(d, n.Path)
		}

		return d
	}

	full := cfg(t)
	if len(full.Mounts) != 2 || full.Hooks == nil || len(devices(full)) != 2 {
		t.Fatalf("full injection: mounts %v, hooks %v, devices %v", full.Mounts, full.Hooks, devices(full))
	}

	ctl := cfg(t, "--nodes-only")
	if got := strings.Join(devices(ctl), " "); got != "/dev/e2e-ctl /dev/e2e-gpu0" {
		t.Errorf("--nodes-only: devices %q, want the common and the device's node", got)
	}

	if len(ctl.Mounts) != 0 || ctl.Hooks != nil {
		t.Errorf("--nodes-only: mounts %v, hooks %v: want none of the spec's", ctl.Mounts, ctl.Hooks)
	}

	if ctl.Linux.Resources == nil || len(ctl.Linux.Resources.Devices) != 2 {
		t.Errorf("--nodes-only: device cgroup rules %+v, want one per node", ctl.Linux.Resources)
	}
}

func TestCompareExit(t *testing.T) {
	out := build(t)
	dir := t.TempDir()
	subroot := filepath.Join(dir, "subroot")
	write(t, filepath.Join(subroot, "usr/lib64/libcuda.so.1"), "", 0o644)
	write(t, filepath.Join(subroot, "usr/lib64/gpu0.conf"), "", 0o644)
	write(t, filepath.Join(dir, "theirs.yaml"), spec("/usr/local/nvidia/lib64/gpu0.conf"), 0o644)
	write(t, filepath.Join(dir, "same.yaml"), spec("/usr/lib64/gpu0.conf"), 0o644)
	write(t, filepath.Join(dir, "lacking.yaml"), spec(""), 0o644)

	tests := []struct {
		ours, want string
		code       int
	}{
		{"same.yaml", "compare: OK", 0},
		{"lacking.yaml", "PROBLEM: mount gpu0.conf missing, though the subroot has gpu0.conf (every device)", 1},
	}
	for _, tc := range tests {
		o, code := run(t, nil, filepath.Join(out, "bin", "cdi-e2e"), "compare", "--subroot", subroot,
			filepath.Join(dir, tc.ours), filepath.Join(dir, "theirs.yaml"))
		if code != tc.code || !strings.Contains(o, tc.want) {
			t.Errorf("compare %s: exit %d, want %d with %q:\n%s", tc.ours, code, tc.code, tc.want, o)
		}
	}
}

func TestBenchBounds(t *testing.T) {
	out := build(t)
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"faster b passes", []string{"--a", "sleep 0.3", "--b", "true", "--min-speedup", "1"}, 0, "PASS"},
		{"slower b fails", []string{"--a", "true", "--b", "sleep 0.3", "--min-speedup", "1"}, 1, "FAIL"},
		{"peak RSS over its bound fails", []string{"--a", "true", "--b", "true", "--max-rss-ratio", "0.01"}, 1, "FAIL"},
		{"no bound: measurements only", []string{"--a", "true", "--b", "true"}, 0, "measurements only"},
	}

	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, code := run(t, nil, filepath.Join(out, "bin", "cdi-e2e"), append([]string{"bench", "-n", "3"}, tc.args...)...)
			if code != tc.code || !strings.Contains(o, tc.want) {
				t.Errorf("exit %d, want %d with %q:\n%s", code, tc.code, tc.want, o)
			}
		})
	}
}

// lib runs a bash script with hack/gpu-host/e2e-lib.sh sourced.
func lib(t *testing.T, env []string, script string) (string, int) {
	t.Helper()

	top, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}

	return run(t, env, "bash", "-c", ". "+top+"/hack/gpu-host/e2e-lib.sh; "+script)
}

func TestControlVerdict(t *testing.T) {
	const good = "nodes /dev/nvidia-uvm /dev/nvidia-uvm-tools /dev/nvidia0 /dev/nvidiactl\ncuda False\n" +
		"RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed a driver"

	tests := []struct {
		name, output string
		code         int
	}{
		{"device nodes there, no driver for CUDA", good, 0},
		{"CUDA worked", strings.Replace(good, "cuda False", "cuda True\nsum 1073741824.0", 1), 1},
		{"a device node missing", strings.Replace(good, " /dev/nvidia0", "", 1), 1},
		{"no device rather than no driver", strings.Replace(good, "Found no NVIDIA driver on your system", "No CUDA GPUs are available", 1), 1},
		{"python failed before CUDA", "nodes /dev/nvidia0 /dev/nvidiactl /dev/nvidia-uvm\nModuleNotFoundError: No module named 'torch'", 1},
	}

	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, code := lib(t, []string{"CONTROL_OUT=" + tc.output}, `e2e_control_verdict "$CONTROL_OUT" /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia0`)
			if code != tc.code {
				t.Errorf("exit %d, want %d:\n%s", code, tc.code, o)
			}
		})
	}
}

// fakeSMI puts an nvidia-smi on PATH that prints the file STATE (the GPUs' modes as
// --query-gpu prints them), or fails when it is missing.
func fakeSMI(t *testing.T) (path, state string) {
	t.Helper()

	dir := t.TempDir()
	state = filepath.Join(dir, "state")
	write(t, filepath.Join(dir, "bin", "nvidia-smi"), "#!/bin/sh\nexec cat "+state+"\n", 0o755)

	return filepath.Join(dir, "bin") + ":" + os.Getenv("PATH"), state
}

func TestModesUnchanged(t *testing.T) {
	path, state := fakeSMI(t)
	env := []string{"PATH=" + path}
	const on = "0, 00000000:18:00.0, Enabled, Disabled\n"

	tests := []struct {
		name, after string
		code        int
	}{
		{"unchanged", on, 0},
		{"persistence mode changed", "0, 00000000:18:00.0, Disabled, Disabled\n", 1},
		{"MIG mode changed", "0, 00000000:18:00.0, Enabled, Enabled\n", 1},
		{"nvidia-smi fails after", "", 1},
	}

	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			write(t, state, on, 0o644)

			script := `before=$(e2e_gpu_state) || exit 9; `
			if tc.after == "" {
				script += `rm ` + state + `; `
			} else {
				script += `printf '%s' '` + tc.after + `' >` + state + `; `
			}

			o, code := lib(t, env, script+`e2e_modes_unchanged "$before"`)
			if code != tc.code {
				t.Errorf("exit %d, want %d:\n%s", code, tc.code, o)
			}
		})
	}
}

// TestRootfsDriverVisible: e2e_rootfs as hack/gpu-host/e2e-gpu.sh and hack/gpu-host/e2e-workload.sh call it,
// on a fake host root, in a mount namespace of its own.
func TestRootfsDriverVisible(t *testing.T) {
	needRoot(t)

	out := build(t)

	tests := []struct {
		name string
		// file is made in the host root, with ELF contents.
		file string
		code int
	}{
		{"a host root without the driver", "usr/lib/x86_64-linux-gnu/libc.so.6", 0},
		{"libcuda.so.1 in the host root's library directory", "usr/lib/x86_64-linux-gnu/libcuda.so.1", 1},
		{"nvidia-smi in the host root's /usr/bin", "usr/bin/nvidia-smi", 1},
	}

	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			host, w := t.TempDir(), t.TempDir()
			write(t, filepath.Join(host, tc.file), "\x7fELF\x02\x01\x01", 0o755)

			o, code := lib(t, []string{"HARNESS_HOST_ROOT=" + host, "W=" + w, "out=" + out},
				`exec unshare --mount --propagation private bash -c '. "$0"; mount -t tmpfs e2e "$W" && e2e_rootfs' "$(pwd)/../../../hack/gpu-host/e2e-lib.sh"`)
			if code != tc.code {
				t.Errorf("exit %d, want %d:\n%s", code, tc.code, o)
			}
		})
	}
}

// TestPersistencedScriptFails: hack/gpu-host/e2e-persistenced.sh exits non-zero when its test driver
// fails, and when the GPUs' modes differ afterwards, with a fake driver and nvidia-smi.
func TestPersistencedScriptFails(t *testing.T) {
	needRoot(t)

	path, state := fakeSMI(t)
	subroot := t.TempDir()

	for _, f := range []string{"lib64/ld-linux-x86-64.so.2", "usr/bin/nvidia-persistenced", "usr/lib64/libnvidia-cfg.so.1"} {
		write(t, filepath.Join(subroot, f), "", 0o644)
	}

	tests := []struct {
		name, driver string
		code         int
	}{
		{"the driver passes", "exit 0", 0},
		{"the driver fails", "exit 3", 3},
		{"the driver passes but the persistence mode changed", "echo '0, 00000000:18:00.0, Disabled, Disabled' >" + state, 1},
	}

	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			write(t, state, "0, 00000000:18:00.0, Enabled, Disabled\n", 0o644)
			bin := filepath.Join(t.TempDir(), "persistenced-e2e")
			write(t, bin, "#!/bin/sh\n"+tc.driver+"\n", 0o755)

			o, code := run(t, []string{"PATH=" + path}, "../../../hack/gpu-host/e2e-persistenced.sh", subroot, bin, "--", "--kills", "1")
			if code != tc.code {
				t.Errorf("exit %d, want %d:\n%s", code, tc.code, o)
			}
		})
	}
}
