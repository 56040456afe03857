package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/talos-nvidia/nvidia-driver/internal/extension"
)

// DevExtension returns Options for the development image from make build's outputs (the
// Debian subroot as payload), writing into a temporary directory. It skips the test when
// make build has not run, except in CI, which runs it first.
func DevExtension(t *testing.T) extension.Options {
	t.Helper()

	top := RepoRoot(t)
	out := filepath.Join(top, "_out")

	for _, p := range []string{"bin/nvidia-cdi-hook", "bin/ldconfig", "containers/nvidia-driver/usr/bin/nvidia-driver"} {
		if _, err := os.Stat(filepath.Join(out, p)); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s missing: CI runs make build first", p)
			}

			t.Skipf("%s missing: run make build first", p)
		}
	}

	return extension.Options{
		Name: "nvidia-driver-test", VersionSuffix: "-test", TalosVersion: "v1.13.5", TalosConstraint: "= v1.13.5",
		Author: "test", Description: "test build",
		Payload:           Subroot(t),
		ServiceRootfs:     filepath.Join(out, "containers/nvidia-driver"),
		ServiceSpec:       filepath.Join(top, "extension/nvidia-driver.yaml"),
		FabricManagerSpec: filepath.Join(top, "extension/nvidia-fabricmanager.yaml"),
		Hook:              filepath.Join(out, "bin/nvidia-cdi-hook"),
		Ldconfig:          filepath.Join(out, "bin/ldconfig"),
		Overlay:           filepath.Join(top, "extension/rootfs"),
		OutDir:            t.TempDir(),
	}
}

// KernelModule compiles dir/<name>.ko, an object file whose .modinfo says what a kernel
// module's would (version, license, name), so that checks of real modules' .modinfo can
// run without NVIDIA's.
func KernelModule(t *testing.T, dir, name, version, license string) {
	t.Helper()

	src := filepath.Join(t.TempDir(), "mod.c")
	info := "version=" + version + `\0license=` + license + `\0name=` + strings.ReplaceAll(name, "-", "_")
	if err := os.WriteFile(src, []byte(`__attribute__((section(".modinfo"), used)) static const char modinfo[] = "`+info+`";`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}

	if out, err := exec.Command("gcc", "-c", "-o", filepath.Join(dir, name+".ko"), src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v: %s", err, out)
	}
}
