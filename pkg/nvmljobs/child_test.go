package nvmljobs_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/internal/sim"
	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
	"github.com/talos-nvidia/nvidia-driver/pkg/cdi"
	"github.com/talos-nvidia/nvidia-driver/pkg/driverroot"
	"github.com/talos-nvidia/nvidia-driver/pkg/mig"
	"github.com/talos-nvidia/nvidia-driver/pkg/nvmljobs"
)

// The test binary is also the child: with envChild set it serves one job, as
// `nvidia-driver nvml-job` does, on simulated GPUs (envSim, a sim spec), on NVML loaded from
// the request's subroot ("real"), or misbehaving ("silent", "stubborn"). On simulated GPUs,
// envFault (METHOD:GPU) makes that GPU's first such call fail, envKill (METHOD) kills the
// child with SIGKILL at the first such call, as a crash in the driver's library would, and
// envPause (FILE) makes the first mutating call write the child's pid to FILE and take a
// while, so that a test can stop the child in the middle of a change; envMIGOn puts every
// GPU in MIG mode, without instances, before the job.
const (
	envChild = "NVMLJOBS_TEST_CHILD"
	envSim   = "NVMLJOBS_TEST_SIM"
	envHost  = "NVMLJOBS_TEST_HOST"
	envFault = "NVMLJOBS_TEST_FAULT"
	envKill  = "NVMLJOBS_TEST_KILL"
	envPause = "NVMLJOBS_TEST_PAUSE"
	envMIGOn = "NVMLJOBS_TEST_MIG_ON"
)

func TestMain(m *testing.M) {
	switch os.Getenv(envChild) {
	case "":
		os.Exit(m.Run())
	case "silent": // dies without an answer
		os.Exit(3)
	case "stubborn": // ignores SIGTERM
		signal.Ignore(syscall.SIGTERM)
		time.Sleep(time.Minute)
		os.Exit(0)
	case "real":
		os.Exit(serve(nvmljobs.OnSubroot))
	default:
		os.Exit(serve(simulated))
	}
}

func serve(newLocal func(string, *slog.Logger) *nvmljobs.Local) int {
	// A stray line on stdout, as a library might print once the job runs: it must go to the
	// log, not into the answers.
	withStray := func(subroot string, log *slog.Logger) *nvmljobs.Local {
		fmt.Println(`{"done":{"error":"a stray line"}}`)

		return newLocal(subroot, log)
	}

	if err := nvmljobs.ServeProcess(withStray); err != nil {
		fmt.Fprintln(os.Stderr, err)

		return 1
	}

	return 0
}

// simulated makes the child's GPUs from envSim; after a MIG change it rewrites their /proc
// under envHost, as the driver does.
func simulated(_ string, log *slog.Logger) *nvmljobs.Local {
	node, err := sim.FromSpec(os.Getenv(envSim))
	if err != nil {
		panic(err) // the test's own child: a bad spec is a broken test
	}

	if fault := os.Getenv(envFault); fault != "" {
		method, index, _ := strings.Cut(fault, ":")

		gpu, err := strconv.Atoi(index)
		if err != nil {
			panic(err)
		}

		node.InjectFault(sim.Fault{Method: method, GPU: gpu, Ret: nvml.ERROR_INSUFFICIENT_RESOURCES})
	}

	if kill := os.Getenv(envKill); kill != "" {
		node.OnMutating(func(method string, _ int) {
			if method == kill {
				syscall.Kill(os.Getpid(), syscall.SIGKILL) //nolint:errcheck // it dies here or the test fails
				time.Sleep(time.Minute)
			}
		})
	}

	if pause := os.Getenv(envPause); pause != "" {
		var once sync.Once

		node.OnMutating(func(string, int) {
			once.Do(func() {
				if err := os.WriteFile(pause, []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
					panic(err)
				}

				time.Sleep(500 * time.Millisecond)
			})
		})
	}

	if os.Getenv(envMIGOn) != "" {
		if err := migOn(node); err != nil {
			panic(err)
		}
	}

	writeProc := func() error {
		if ret := node.Init(); ret != nvml.SUCCESS {
			return ret
		}
		defer node.Shutdown() //nolint:errcheck

		return sim.WriteProcFS(os.Getenv(envHost), node)
	}

	return &nvmljobs.Local{Log: log, NVML: node, Resetter: node, AfterMIGChange: writeProc}
}

// migOn puts every GPU of node in MIG mode through NVML, as the all-enabled layout leaves them.
func migOn(node *sim.Node) error {
	if ret := node.Init(); ret != nvml.SUCCESS {
		return ret
	}
	defer node.Shutdown() //nolint:errcheck

	n, ret := node.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return ret
	}

	for i := range n {
		d, ret := node.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return ret
		}

		if _, ret := d.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
			return ret
		}
	}

	return nil
}

func child(t *testing.T, mode string, env ...string) *nvmljobs.Child {
	t.Helper()

	exe, err := os.Executable()
	require.NoError(t, err)

	t.Setenv(envChild, mode)

	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}

	return &nvmljobs.Child{Command: []string{exe}, Subroot: t.TempDir(), Stderr: os.Stderr, StopWait: 200 * time.Millisecond}
}

func TestChildListsGPUs(t *testing.T) {
	c := child(t, "sim", envSim+"=h200:2")

	var log testutil.SyncBuffer

	c.Stderr = &log

	gpus, err := c.ListGPUs(context.Background())
	require.NoError(t, err)
	assert.Contains(t, log.String(), `{"done":{"error":"a stray line"}}`, "what the job prints to stdout goes to the log")
	require.Len(t, gpus, 2)
	assert.Equal(t, "NVIDIA H200", gpus[0].Name)
	assert.NotEqual(t, gpus[0].UUID, gpus[1].UUID)
	assert.Equal(t, 1, gpus[1].Index)
}

func TestChildReadsFabric(t *testing.T) {
	c := child(t, "sim", envSim+"=h200:2")

	states, err := c.FabricStates(context.Background())
	require.NoError(t, err)
	assert.Len(t, states, 2)
}

// TestChildAppliesMIG: the layout is applied in the child, which withdraws the readiness
// file and says so before the first change, and makes the MIG device nodes.
func TestChildAppliesMIG(t *testing.T) {
	host, req := migHost(t, "h200:1")
	ready := filepath.Join(req.ValidationsDir, driverroot.ReadyFile)
	c := child(t, "sim", envSim+"=h200:1", envHost+"="+host)
	changing := 0

	res, err := c.ApplyMIG(context.Background(), req, func() {
		changing++

		assert.NoFileExists(t, ready, "readiness is withdrawn before the service hears of the change")
	})
	require.NoError(t, err)
	assert.Equal(t, 1, changing)
	require.Len(t, res.GPUs, 1)
	assert.Equal(t, mig.ResultSuccess, res.GPUs[0].Result, res.GPUs[0].Message)
	assert.Greater(t, res.DeviceNodes, 1, "the MIG device nodes were made")
	assert.DirExists(t, filepath.Join(host, "dev/nvidia-caps"))
}

// migHost is a host root with the driver's /proc of GPUs spec before any change, and a
// readiness file from an earlier run.
func migHost(t *testing.T, spec string) (host string, req nvmljobs.MIGRequest) {
	t.Helper()
	testutil.RequireRoot(t)

	host = t.TempDir()
	validations := filepath.Join(host, "run/nvidia/validations")
	require.NoError(t, os.MkdirAll(validations, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(validations, driverroot.ReadyFile), []byte("stale\n"), 0o644))

	node, err := sim.FromSpec(spec)
	require.NoError(t, err)
	require.Equal(t, nvml.SUCCESS, node.Init())
	require.NoError(t, sim.WriteProcFS(host, node))
	node.Shutdown() //nolint:errcheck

	return host, nvmljobs.MIGRequest{
		ConfigFile: filepath.Join(host, "no-such-file"), Layout: mig.LayoutAll1g,
		HostRoot: host, ProcRoot: filepath.Join(host, "proc"), ValidationsDir: validations,
	}
}

// TestChildMIGChangeThatFailsHalfWay: the second GPU's instances cannot be made; the answer
// still comes, with each GPU's outcome (the first changed, the second rolled back), no
// error (the service decides to try again from the statuses), and the device nodes the
// first GPU's instances need.
func TestChildMIGChangeThatFailsHalfWay(t *testing.T) {
	host, req := migHost(t, "h200:2")
	c := child(t, "sim", envSim+"=h200:2", envHost+"="+host, envFault+"="+sim.MCreateGpuInstanceWithPlacement+":1")
	changing := 0

	res, err := c.ApplyMIG(context.Background(), req, func() { changing++ })
	require.NoError(t, err)
	assert.Equal(t, 1, changing)
	require.Len(t, res.GPUs, 2)
	assert.Equal(t, mig.ResultSuccess, res.GPUs[0].Result, res.GPUs[0].Message)
	assert.True(t, res.GPUs[0].Changed)
	assert.Equal(t, mig.ResultFailed, res.GPUs[1].Result)
	assert.Contains(t, res.GPUs[1].Message, "rolled back to the previous layout")
	assert.Greater(t, res.DeviceNodes, 1, "the first GPU's MIG device nodes were made")
	assert.DirExists(t, filepath.Join(host, "dev/nvidia-caps"))
}

// TestChildThatDiesDuringMIGChange: the child dies in the middle of the change. The service
// heard that GPUs change, and gets an error that says the child gave no answer: not a
// LayoutError, so it tries again.
func TestChildThatDiesDuringMIGChange(t *testing.T) {
	host, req := migHost(t, "h200:2")
	c := child(t, "sim", envSim+"=h200:2", envHost+"="+host, envKill+"="+sim.MCreateGpuInstanceWithPlacement)
	changing := 0

	res, err := c.ApplyMIG(context.Background(), req, func() { changing++ })
	require.Error(t, err)
	assert.Equal(t, 1, changing)
	assert.Contains(t, err.Error(), "NVML job apply-mig: the child process gave no answer: signal: killed")

	var layoutErr *mig.LayoutError
	assert.False(t, errors.As(err, &layoutErr), "a dead child is not a layout that cannot work")
	assert.Empty(t, res.GPUs)
}

// TestChildStoppedAsTalosStopsMidMIGChange: Talos stops the service by signalling every
// process of its container at once, so the child gets SIGTERM while the service's context
// ends. The child finishes what it was doing with the GPU (the job ends its changes, it is
// not killed between two NVML calls), and its answer still reaches the service, with each
// GPU's outcome for the status, well before StopWait.
func TestChildStoppedAsTalosStopsMidMIGChange(t *testing.T) {
	host, req := migHost(t, "h200:1")
	paused := filepath.Join(t.TempDir(), "pid")
	c := child(t, "sim", envSim+"=h200:1", envHost+"="+host, envPause+"="+paused)
	c.StopWait = 10 * time.Second

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	type outcome struct {
		res nvmljobs.MIGResult
		err error
	}

	done := make(chan outcome, 1)

	go func() {
		res, err := c.ApplyMIG(ctx, req, nil)
		done <- outcome{res, err}
	}()

	var pid int

	require.Eventually(t, func() bool {
		data, err := os.ReadFile(paused)
		if err != nil || len(data) == 0 {
			return false
		}

		pid, err = strconv.Atoi(string(data))

		return err == nil
	}, 10*time.Second, 5*time.Millisecond, "the change never started")

	start := time.Now()

	require.NoError(t, syscall.Kill(pid, syscall.SIGTERM))
	cancel()

	got := <-done
	require.NoError(t, got.err)
	assert.Less(t, time.Since(start), 5*time.Second, "the child was not killed after StopWait")
	require.Len(t, got.res.GPUs, 1)
	assert.True(t, got.res.GPUs[0].Changed, got.res.GPUs[0].Message)
	assert.NotEmpty(t, got.res.GPUs[0].Result)
}

// TestChildLayoutErrorIsKnown: a layout that cannot be planned comes back as a LayoutError
// (the service does not retry it), and nothing changed.
func TestChildLayoutErrorIsKnown(t *testing.T) {
	c := child(t, "sim", envSim+"=h200:1")
	called := false

	_, err := c.ApplyMIG(context.Background(), nvmljobs.MIGRequest{ConfigFile: "/nonexistent", Layout: "no-such-layout"}, func() { called = true })

	var layoutErr *mig.LayoutError
	require.ErrorAs(t, err, &layoutErr)
	assert.Contains(t, err.Error(), "no-such-layout")
	assert.False(t, called)
}

// TestChildReadErrorIsRetried: an NVML error while reading the GPUs' MIG state is no layout
// error: the service tries again.
func TestChildReadErrorIsRetried(t *testing.T) {
	c := child(t, "sim", envSim+"=h200:1", envFault+"=Device.GetMigMode:0")

	_, err := c.ApplyMIG(context.Background(), nvmljobs.MIGRequest{ConfigFile: "/nonexistent", Layout: mig.LayoutAll1g}, nil)

	var layoutErr *mig.LayoutError
	require.Error(t, err)
	assert.False(t, errors.As(err, &layoutErr), "a read error is retried, not taken for a bad layout: %v", err)
	assert.Contains(t, err.Error(), "reading the GPUs' MIG state")
}

// TestChildNVMLErrorsReachTheService: NVML that cannot be loaded (an empty subroot) is the
// real go-nvml's error, in words a person can act on.
func TestChildNVMLErrorsReachTheService(t *testing.T) {
	c := child(t, "real")

	_, err := c.ListGPUs(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "loading NVML (usr/lib64/libnvidia-ml.so.1) failed")
	assert.False(t, errors.Is(err, nvmljobs.ErrNoGPU))
}

func TestChildWithoutAnswer(t *testing.T) {
	c := child(t, "silent")

	_, err := c.ListGPUs(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "NVML job list-gpus: the child process gave no answer: exit status 3")
}

// TestChildStopsWithTheService: a child that does not stop on SIGTERM is killed StopWait
// later; the job returns the context's error.
func TestChildStopsWithTheService(t *testing.T) {
	c := child(t, "stubborn")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()

	start := time.Now()
	_, err := c.ListGPUs(ctx)

	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), 5*time.Second)
}

// TestChildTimeout: a job that hangs is stopped after Timeout, and the error says so; the
// service's own context is still alive, so it will try again.
func TestChildTimeout(t *testing.T) {
	c := child(t, "stubborn")
	c.Timeout = 200 * time.Millisecond

	_, err := c.FabricStates(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "NVML job fabric-states: no answer within 200ms; the child process was stopped")
}

// TestChildNoDeviceForCDIIsKnown: GPUs in MIG mode without instances give nvcdi no device;
// the child's answer says so as cdi.ErrNoDevices, which the service tells apart from a
// failure (nothing to wait for: it reports the node has no device to serve).
func TestChildNoDeviceForCDIIsKnown(t *testing.T) {
	c := child(t, "sim", envSim+"=h200:2", envMIGOn+"=1")
	dir := t.TempDir()

	err := c.WriteCDI(context.Background(), nvmljobs.CDIRequest{Options: cdi.DefaultOptions(dir), Path: filepath.Join(dir, "nvidia.yaml")})
	require.ErrorIs(t, err, cdi.ErrNoDevices)
	assert.NoFileExists(t, filepath.Join(dir, "nvidia.yaml"))
}
