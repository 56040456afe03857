package gpu_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu"
)

// holder starts a real process in its own PID namespace (as a pod's is) with the files open,
// and returns its pid as this machine's /proc shows it.
func holder(t *testing.T, files ...*os.File) int {
	t.Helper()

	cmd := exec.Command("unshare", "--pid", "--fork", "--kill-child", "sleep", "30")
	cmd.ExtraFiles = files
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() }) //nolint:errcheck

	// unshare forks sleep: find the child.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid), "task", strconv.Itoa(cmd.Process.Pid), "children"))
		if err == nil && len(data) > 0 {
			var pid int
			if _, err := fmt.Sscan(string(data), &pid); err == nil {
				comm, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
				if string(comm) == "sleep\n" {
					return pid
				}
			}
		}
	}

	t.Fatal("the holder did not start")

	return 0
}

// TestHoldersFromRealProcesses: processes are found by their /proc/<pid>/fd links, by the
// device's name (/dev/nvidia7 in the holder's namespace) or by its number (195:7 under any
// name); processes of the caller's own PID namespace are left out (unshare itself holds the
// same files), as are holders of other GPUs.
func TestHoldersFromRealProcesses(t *testing.T) {
	testutil.RequireRoot(t)

	dir := t.TempDir()
	byName, err := os.Create(filepath.Join(dir, "nvidia7"))
	require.NoError(t, err)

	dev := filepath.Join(dir, "gpu-seven")
	require.NoError(t, unix.Mknod(dev, unix.S_IFCHR|0o600, int(unix.Mkdev(gpu.DeviceMajor, 7))))
	fd, err := unix.Open(dev, unix.O_PATH|unix.O_CLOEXEC, 0) // no driver here: O_PATH does not open the device
	require.NoError(t, err)
	byNumber := os.NewFile(uintptr(fd), dev)

	other, err := os.Create(filepath.Join(dir, "nvidia3"))
	require.NoError(t, err)

	a := holder(t, byName)
	b := holder(t, byNumber)
	c := holder(t, other)

	got, err := gpu.Holders("/proc", 7)
	require.NoError(t, err)

	want := []gpu.Holder{{PID: a, Name: "sleep"}, {PID: b, Name: "sleep"}}
	if b < a {
		want[0], want[1] = want[1], want[0]
	}

	assert.Equal(t, want, got)

	got, err = gpu.Holders("/proc", 3)
	require.NoError(t, err)
	assert.Equal(t, []gpu.Holder{{PID: c, Name: "sleep"}}, got)
	assert.Equal(t, "sleep (pid 12), pid 13", gpu.HolderList([]gpu.Holder{{PID: 12, Name: "sleep"}, {PID: 13}}))
}
