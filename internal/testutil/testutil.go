// Package testutil holds what several packages' tests share: the Debian-built subroot
// fixture, the built binaries, and root checks.
package testutil

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"golang.org/x/sys/unix"

	"github.com/talos-nvidia/nvidia-driver/internal/sim"
)

// RepoRoot returns the repository's top directory: the nearest directory above the test's
// working directory (its package's) whose go.mod is the project's. The source path that
// runtime.Caller reports cannot be used: make builds everything with -trimpath.
func RepoRoot(t testing.TB) string {
	t.Helper()

	dir, err := os.Getwd()
	if err != nil {
		t.Fatalf("locating the repository: %v", err)
	}

	for {
		if mod, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil &&
			strings.HasPrefix(string(mod), "module "+projectModule+"\n") {
			return dir
		}

		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("no go.mod of %s above the test's directory", projectModule)
		}

		dir = parent
	}
}

// projectModule is the product's module path, the first line of the top go.mod.
const projectModule = "github.com/talos-nvidia/nvidia-driver"

// RequireRoot skips a test that needs root, except in CI, where it fails: CI runs as root
// and a skipped test there would hide a broken setup.
func RequireRoot(t testing.TB) {
	t.Helper()

	if os.Geteuid() == 0 {
		return
	}

	if os.Getenv("CI") != "" {
		t.Fatal("this test needs root, and CI runs as root")
	}

	t.Skip("needs root (mounts, mknod)")
}

// Subroot returns the Debian-built development subroot, building it once if it is missing.
// Packages' tests run in parallel processes, so the build is serialized with a file lock.
func Subroot(t testing.TB) string {
	t.Helper()

	top := RepoRoot(t)
	// the subroot of the architecture the test runs as (make test-arm64 runs arm64 tests
	// under qemu-user against the arm64 subroot)
	name, env := "subroot-debian", "SUBROOT_ARCH=amd64"
	if runtime.GOARCH != "amd64" {
		name, env = "subroot-debian-"+runtime.GOARCH, "SUBROOT_ARCH="+runtime.GOARCH
	}

	dir := filepath.Join(top, "_out", name)

	if subrootCurrent(dir) {
		return dir
	}

	withLock(t, filepath.Join(top, "_out", ".subroot.lock"), func() {
		if subrootCurrent(dir) {
			return
		}

		cmd := exec.Command(filepath.Join(top, "hack", "dev", "build-subroot.sh"), "debian", dir)
		cmd.Env = append(os.Environ(), env)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building the Debian subroot fixture: %v\n%s", err, out)
		}
	})

	return dir
}

// subrootCurrent: built, and with the layout's newest piece (the dev/ mount point), so an
// older fixture left in _out is rebuilt rather than failing every check.
func subrootCurrent(dir string) bool {
	for _, p := range []string{"usr/lib64/libnvidia-ml.so.1", "dev"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			return false
		}
	}

	return true
}

// ServiceBinary builds the service from the working tree (cached by go build) into
// _out/test/ and returns its path, so a test never runs a stale binary.
func ServiceBinary(t testing.TB) string {
	t.Helper()

	return buildService(t, "nvidia-driver")
}

// DemoBinary builds the demo build of the service (-tags simulate, as `make demo` does): the
// product plus simulated GPUs chosen with NVIDIA_DRIVER_SIMULATE=MODEL:COUNT.
func DemoBinary(t testing.TB) string {
	t.Helper()

	// A -tags flag replaces the tags of GOFLAGS: make's GO_TAGS come along, so that every other
	// package is the one the other builds compiled.
	tags := "simulate"
	if common := os.Getenv("GO_TAGS"); common != "" {
		tags = common + "," + tags
	}

	return buildService(t, "nvidia-driver-demo", "-tags", tags)
}

func buildService(t testing.TB, name string, flags ...string) string {
	t.Helper()

	top := RepoRoot(t)
	path := filepath.Join(top, "_out", "test", name)

	withLock(t, filepath.Join(top, "_out", ".build.lock"), func() {
		// -trimpath as make builds the service, so the two builds share Go's cache.
		args := append(append([]string{"build", "-trimpath"}, flags...), "-o", path, "./service")
		cmd := exec.Command("go", args...)
		cmd.Dir = top
		cmd.Env = append(os.Environ(), "CGO_CFLAGS=-O2 -Wno-deprecated-declarations")

		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building %s: %v\n%s", name, err, out)
		}
	})

	return path
}

func withLock(t testing.TB, path string, f func()) {
	t.Helper()

	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}

	lock, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close() //nolint:errcheck

	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	defer unix.Flock(int(lock.Fd()), unix.LOCK_UN) //nolint:errcheck

	f()
}

// CopyTree copies src (symlinks kept) to a new temporary directory and returns it.
func CopyTree(t testing.TB, src string) string {
	t.Helper()

	dst := filepath.Join(t.TempDir(), filepath.Base(src))
	if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("copying %s: %v\n%s", src, err, out)
	}

	return dst
}

// Model returns a simulated GPU model by key, failing the test on an unknown one.
func Model(t testing.TB, key string) sim.ModelSpec {
	t.Helper()

	m, err := sim.LookupModel(key)
	if err != nil {
		t.Fatal(err)
	}

	return m
}

// EnableMIG turns MIG on for GPU i of a simulated node, resetting the GPU where the model
// needs a reset to activate it (Ampere), and returns the GPU's handle after that.
func EnableMIG(t testing.TB, node *sim.Node, i int) nvml.Device {
	t.Helper()

	dev, _ := node.DeviceGetHandleByIndex(i)

	activation, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE)
	if ret != nvml.SUCCESS {
		t.Fatalf("SetMigMode(GPU %d): %v", i, ret)
	}

	if activation == nvml.ERROR_RESET_REQUIRED {
		if err := node.ResetGPU(context.Background(), i); err != nil {
			t.Fatalf("resetting GPU %d: %v", i, err)
		}
	}

	dev, _ = node.DeviceGetHandleByIndex(i)

	return dev
}

// SyncBuffer is a log sink that goroutines write while a test reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()

	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()

	return s.b.String()
}

// TalosRunc returns runc at the version Talos v1.14.1 ships (machinery constants RuncVersion
// 1.5.1, the module hack/k8s-node/runtime's pin), as hack/k8s-node/build.sh builds it for the
// Kubernetes node and the v1.14.1 Talos node: one build for all of them. Debian's runc (1.1.5) is not a stand-in: it
// signals every process of a container on `kill --all`, which runc 1.2 and later no
// longer do.
func TalosRunc(t testing.TB) string {
	t.Helper()

	top := RepoRoot(t)
	out := filepath.Join(top, "_out", "k8s-node")

	// The fast loop (make check) runs no upstream program: the tests that run the service
	// under runc 1.4 take minutes, and building it more.
	if testing.Short() {
		t.Skip("-short: runs runc 1.4 (make test runs it)")
	}

	// build.sh locks its output and rebuilds only what its stamps say changed.
	cmd := exec.Command(filepath.Join(top, "hack", "k8s-node", "build.sh"), out, "runtime")
	if msg, err := cmd.CombinedOutput(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("building runc 1.4 (hack/dev/install-test-deps.sh installs libseccomp-dev): %v\n%s", err, msg)
		}

		t.Skipf("cannot build runc 1.4 (hack/dev/install-test-deps.sh installs libseccomp-dev): %v\n%s", err, msg)
	}

	return filepath.Join(out, "bin", "runc")
}
