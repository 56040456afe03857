package deploy_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// root is the repository root (tests run in deploy/).
const root = ".."

const chartModule = "github.com/NVIDIA/k8s-device-plugin@v0.19.0"

var (
	toolsOnce sync.Once
	toolsErr  error
	toolsLog  []byte
)

// tool returns the path of a tool that hack/dev/install-deploy-test-deps.sh puts in
// _out/tools, running the script (which builds helm and kustomize from the module proxy
// and unpacks promtool from Debian's package) when it is missing or stale. A failure is
// fatal: CI must never pass by skipping these tests.
func tool(t *testing.T, name string) string {
	t.Helper()
	if err := installTools(); err != nil {
		t.Fatal(err)
	}
	p, err := filepath.Abs(filepath.Join(root, "_out", "tools", name))
	require.NoError(t, err)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s missing after hack/dev/install-deploy-test-deps.sh: %v", name, err)
	}
	return p
}

// installTools runs hack/dev/install-deploy-test-deps.sh once per test binary.
func installTools() error {
	toolsOnce.Do(func() {
		cmd := exec.Command("bash", filepath.Join(root, "hack", "dev", "install-deploy-test-deps.sh"))
		toolsLog, toolsErr = cmd.CombinedOutput()
	})
	if toolsErr != nil {
		return fmt.Errorf("hack/dev/install-deploy-test-deps.sh failed (run it by hand to see why): %w\n%s", toolsErr, toolsLog)
	}
	return nil
}

// run runs a command and returns its stdout, failing the test with stderr on error.
func run(t *testing.T, env []string, name string, args ...string) []byte {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, stderr.String())
	}
	return stdout.Bytes()
}

// chartDir is the nvidia-device-plugin chart inside the device plugin's Go module.
func chartDir(t *testing.T) string {
	t.Helper()
	tool(t, "helm") // the script downloads the module
	out := run(t, nil, "go", "mod", "download", "-json", chartModule)
	var dir string
	for _, line := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && k == `"Dir"` {
			dir = strings.Trim(strings.TrimSpace(v), `",`)
		}
	}
	require.NotEmpty(t, dir, "go mod download -json %s gave no Dir:\n%s", chartModule, out)
	return filepath.Join(dir, "deployments", "helm", "nvidia-device-plugin")
}

// helmTemplate renders the device plugin chart with deploy/device-plugin/values.yaml,
// exactly as `make deploy-render` does.
func helmTemplate(t *testing.T, extra ...string) []byte {
	t.Helper()
	args := append([]string{"template", "nvidia-device-plugin", chartDir(t),
		"--namespace", "nvidia-gpu", "--values", filepath.Join(root, "deploy", "device-plugin", "values.yaml")}, extra...)
	return run(t, nil, tool(t, "helm"), args...)
}

func kustomize(t *testing.T, dir string) []byte {
	t.Helper()
	return run(t, nil, tool(t, "kustomize"), "build", filepath.Join(root, dir))
}
