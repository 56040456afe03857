package libtest_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Another process of the test binary, started by startClient: it loads the library as
// NVIDIA's device plugin does, says "ready" once its calls are done, and stays until killed.
const envClient = "SIMNVML_TEST_CLIENT"

// shared is the tests' library and node (see node), made by TestMain.
var shared node

func TestMain(m *testing.M) {
	if how := os.Getenv(envClient); how != "" {
		os.Exit(client(how))
	}

	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "simnvml-libtest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)

		return 1
	}
	defer os.RemoveAll(dir) //nolint:errcheck

	if shared, err = build(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)

		return 1
	}

	return m.Run()
}

func client(how string) int {
	lib := nvml.New(nvml.WithLibraryPath(os.Getenv("SIMNVML_TEST_LIBRARY")))

	var ret nvml.Return

	switch how {
	case "init", "init-shutdown":
		ret = lib.Init()
	case "init-no-attach":
		ret = lib.InitWithFlags(nvml.INIT_FLAG_NO_ATTACH)
	}

	if ret == nvml.SUCCESS && how == "init-shutdown" {
		ret = lib.Shutdown()
	}

	if ret != nvml.SUCCESS {
		fmt.Println("client:", ret)

		return 1
	}

	fmt.Println("ready")

	select {}
}

// startClient starts another NVML client and waits until it made its calls; it is killed
// (SIGKILL: nothing of its own lets go) when the test ends.
func startClient(t *testing.T, so, how string) *exec.Cmd {
	t.Helper()

	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), envClient+"="+how, "SIMNVML_TEST_LIBRARY="+so)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())

	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() }) //nolint:errcheck

	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "ready\n", line)

	return cmd
}

// TestAnotherProcessHoldsTheGPUs: a process that initialized NVML (and attached the GPUs)
// holds them open until it exits, however it ends, so a mode change is refused meanwhile
// (activationStatus ERROR_IN_USE, the mode left pending), as the driver refuses it while
// NVIDIA's device plugin runs; a process that did not attach, or gave NVML up, holds nothing.
func TestAnotherProcessHoldsTheGPUs(t *testing.T) {
	so := shared.so
	t.Setenv("SIMNVML_DIR", "")

	for _, tc := range []struct {
		client string
		gpu    int // one of its own: TestLibrary changes GPU 1
		held   bool
	}{
		{"init", 5, true},
		{"init-no-attach", 6, false},
		{"init-shutdown", 7, false},
	} {
		t.Run(tc.client, func(t *testing.T) {
			lib := nvml.New(nvml.WithLibraryPath(so))
			require.Equal(t, nvml.SUCCESS, lib.Init())

			defer lib.Shutdown() //nolint:errcheck

			other := startClient(t, so, tc.client)

			d, ret := lib.DeviceGetHandleByIndex(tc.gpu)
			require.Equal(t, nvml.SUCCESS, ret)

			status, ret := d.SetMigMode(nvml.DEVICE_MIG_ENABLE)
			require.Equal(t, nvml.SUCCESS, ret)

			if !tc.held {
				assert.Equal(t, nvml.SUCCESS, status, "nothing else holds the GPU: the mode changes at once")

				return
			}

			assert.Equal(t, nvml.ERROR_IN_USE, status)

			current, pending, ret := d.GetMigMode()
			require.Equal(t, nvml.SUCCESS, ret)
			assert.Equal(t, []int{nvml.DEVICE_MIG_DISABLE, nvml.DEVICE_MIG_ENABLE}, []int{current, pending}, "the mode is left pending")

			require.NoError(t, other.Process.Kill())
			other.Wait() //nolint:errcheck

			status, ret = d.SetMigMode(nvml.DEVICE_MIG_ENABLE)
			require.Equal(t, nvml.SUCCESS, ret)
			assert.Equal(t, nvml.SUCCESS, status, "the holder is gone: the GPU resets into the mode")
		})
	}
}

// TestEventSets: the device plugin's health check waits on an event set; the simulated GPUs
// raise no event, so a wait times out after the time asked.
func TestEventSets(t *testing.T) {
	so := shared.so
	t.Setenv("SIMNVML_DIR", "")

	lib := nvml.New(nvml.WithLibraryPath(so))
	require.Equal(t, nvml.SUCCESS, lib.Init())

	defer lib.Shutdown() //nolint:errcheck

	set, ret := lib.EventSetCreate()
	require.Equal(t, nvml.SUCCESS, ret)

	d, _ := lib.DeviceGetHandleByIndex(0)
	types, ret := d.GetSupportedEventTypes()
	require.Equal(t, nvml.SUCCESS, ret)
	assert.NotZero(t, types&nvml.EventTypeXidCriticalError)
	require.Equal(t, nvml.SUCCESS, d.RegisterEvents(types, set))

	start := time.Now()
	_, ret = set.Wait(200)
	assert.Equal(t, nvml.ERROR_TIMEOUT, ret)
	assert.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)
	assert.Equal(t, nvml.SUCCESS, set.Free())
}
