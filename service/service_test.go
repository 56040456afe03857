package main_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
)

// These tests run the built service binary as Talos would run it, and look at the node from
// outside. Each runs in a private mount namespace (the "node role" of this test binary) whose
// throwaway host root is a shared tmpfs; nothing on the machine changes.
const (
	envRole     = "SERVICE_TEST_ROLE"
	envScenario = "SERVICE_TEST_SCENARIO"
)

func TestMain(m *testing.M) {
	if os.Getenv(envRole) == "node" {
		os.Exit(nodeRole())
	}

	os.Exit(m.Run())
}

// outcome is what the node role saw.
type outcome struct {
	Phase       string         `json:"phase"`
	Message     string         `json:"message"`
	Status      map[string]any `json:"status"`
	Ready       bool           `json:"ready"`
	ReadyWhole  bool           `json:"readyWhole"`
	Mounted     bool           `json:"mounted"`
	MountRO     bool           `json:"mountRO"`
	DevEntries  []string       `json:"devEntries"`
	ExitCode    int            `json:"exitCode"`
	StopMillis  int64          `json:"stopMillis"`
	RSSKiB      int            `json:"rssKiB"`
	NVMLMapped  bool           `json:"nvmlMapped"` // the service process maps libnvidia-ml
	ReadyFile   string         `json:"readyFile"`
	NFDFile     string         `json:"nfdFile"`
	Log         string         `json:"log"`
	StatusWhole bool           `json:"statusWhole"`
}

type scenario struct {
	Subroot  string            `json:"subroot"`
	Env      map[string]string `json:"env"`
	Until    string            `json:"until"`    // phase to wait for before SIGTERM; "" = SIGTERM after Delay
	Delay    time.Duration     `json:"delay"`    // used when Until is ""
	FakeProc bool              `json:"fakeProc"` // write /proc files of a loaded driver (without GPUs NVML can use)
	Runs     int               `json:"runs"`     // start the service this many times (a restart), default 1
}

func run(t *testing.T, sc scenario) outcome {
	t.Helper()
	testutil.RequireRoot(t)

	bin := testutil.ServiceBinary(t)
	if _, simulated := sc.Env["NVIDIA_DRIVER_SIMULATE"]; simulated {
		bin = testutil.DemoBinary(t)
	}
	spec, err := json.Marshal(sc)
	require.NoError(t, err)

	cmd := exec.Command("unshare", "--mount", "--propagation", "private", os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envRole+"=node", envScenario+"="+string(spec), "SERVICE_TEST_BIN="+bin, "SERVICE_TEST_SUBROOT="+testutil.Subroot(t), "SERVICE_TEST_TMP="+t.TempDir())
	cmd.Stderr = os.Stderr

	out, err := cmd.Output()
	require.NoError(t, err, "node role: %s", out)

	var o outcome
	require.NoError(t, json.Unmarshal(out, &o), "node role said: %s", out)

	return o
}

func TestBringsUpSimulatedNode(t *testing.T) {
	o := run(t, scenario{Env: map[string]string{"NVIDIA_DRIVER_SIMULATE": "h200:4"}, Until: "ready"})

	assert.Equal(t, "ready", o.Phase, o.Log)
	assert.True(t, o.Ready && o.ReadyWhole, "readiness file written whole")
	assert.True(t, o.Mounted && o.MountRO, "driver root mounted read-only and still there after stop")
	assert.Contains(t, o.DevEntries, "nvidia3")
	assert.Contains(t, o.DevEntries, "nvidiactl")
	assert.Equal(t, 0, o.ExitCode)
	assert.Less(t, o.StopMillis, int64(2000), "stop well inside Talos's 10 s")
	assert.Equal(t, float64(4), float64(len(o.Status["gpus"].([]any))))
	t.Logf("idle RSS after bring-up: %d KiB; stop took %d ms", o.RSSKiB, o.StopMillis)
}

func TestNoKernelDriverWaitsAndChangesNothing(t *testing.T) {
	o := run(t, scenario{Until: "waiting"})

	assert.Equal(t, "waiting", o.Phase)
	assert.Contains(t, o.Message, "waiting for the nvidia kernel module")
	assert.False(t, o.Ready, "no readiness file")
	assert.Empty(t, o.DevEntries, "no device nodes")
	assert.Equal(t, 0, o.ExitCode)
	assert.Less(t, o.StopMillis, int64(2000))
}

// TestNoGPUWaits: the kernel module looks loaded but NVML (Debian's, with no GPU behind it)
// cannot see a GPU. The service says so once and waits; it does not crash-loop. NVML was
// loaded in the NVML jobs' child processes only: the service that stays up never maps it.
func TestNoGPUWaits(t *testing.T) {
	o := run(t, scenario{Until: "waiting", FakeProc: true, Delay: 1500 * time.Millisecond})

	assert.Equal(t, "waiting", o.Phase)
	assert.Contains(t, o.Message, "waiting for a GPU that NVML can see: the NVIDIA kernel driver is not loaded")
	assert.False(t, o.NVMLMapped, "the service process maps libnvidia-ml")
	assert.False(t, o.Ready)
	assert.Equal(t, 0, o.ExitCode)
	assert.Equal(t, 1, strings.Count(o.Log, "waiting for a GPU"), "the wait is reported once, not once a poll:\n%s", o.Log)
}

func TestBrokenSubrootFailsAndChangesNothing(t *testing.T) {
	o := run(t, scenario{Subroot: "empty", Env: map[string]string{"NVIDIA_DRIVER_SIMULATE": "h200:1"}, Until: "failed"})

	assert.Equal(t, "failed", o.Phase)
	assert.Contains(t, o.Message, "/usr/lib64/libnvidia-ml.so.1")
	assert.Contains(t, o.Message, "needed by gpu-operator validator")
	assert.False(t, o.Mounted, "nothing mounted")
	assert.False(t, o.Ready)
	assert.Empty(t, o.DevEntries)
	assert.Equal(t, 0, o.ExitCode, "exits 0 on SIGTERM, so Talos does not count a failure")
}

// TestBadConfigurationIsReportedAndWaits: a configuration that does not load is reported once,
// in the log and the status file, and the service then waits for SIGTERM and exits 0 (an
// exit would be restarted by Talos's `restart: always`, in a loop), having touched nothing.
func TestBadConfigurationIsReportedAndWaits(t *testing.T) {
	o := run(t, scenario{Env: map[string]string{"NVIDIA_DRIVER_PERSISTENCE_MODE": "sometimes"}, Until: "failed"})

	const want = `NVIDIA_DRIVER_PERSISTENCE_MODE: \"sometimes\" is not a boolean`

	assert.Equal(t, "failed", o.Phase, "still running, and says so: %s", o.Log)
	assert.Contains(t, o.Message, `NVIDIA_DRIVER_PERSISTENCE_MODE: "sometimes" is not a boolean`)
	assert.Equal(t, 1, strings.Count(o.Log, want), "reported once:\n%s", o.Log)
	assert.Equal(t, 0, o.ExitCode, "exits 0 on SIGTERM")
	assert.False(t, o.Mounted)
	assert.Empty(t, o.DevEntries)
	assert.False(t, o.Ready)
}

// TestProductHasNoSimulator: the simulated NVML (and go-nvml's mocks, which panic on calls
// they do not implement) is only in the demo build; the product rejects the demo's setting
// like any unknown one, before touching anything.
func TestProductHasNoSimulator(t *testing.T) {
	list := exec.Command("go", "list", "-deps", "./service")
	list.Dir = testutil.RepoRoot(t)
	out, err := list.Output()
	require.NoError(t, err)
	assert.NotContains(t, string(out), "nvidia-driver/internal/sim\n")
	assert.NotContains(t, string(out), "go-nvml/pkg/nvml/mock")

	// A bad configuration is reported and waited on (TestBadConfigurationIsReportedAndWaits).
	host := t.TempDir()
	var msg strings.Builder
	cmd := exec.Command(testutil.ServiceBinary(t), "run")
	cmd.Env = []string{"NVIDIA_DRIVER_SIMULATE=h200:1", "NVIDIA_DRIVER_HOST_ROOT=" + host}
	cmd.Stdout, cmd.Stderr = &msg, &msg
	require.NoError(t, cmd.Start())

	status := filepath.Join(host, "run/nvidia-driver/status.json")
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if st, err := readJSON(status); err == nil && st["phase"] == "failed" {
			break
		}
	}

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait(), "exits 0 on SIGTERM: %s", msg.String())
	assert.Contains(t, msg.String(), "unknown variable NVIDIA_DRIVER_SIMULATE")
}

// TestSIGTERMDuringBringUp stops the service at many moments of its bring-up: it must exit 0
// quickly every time, and every file it wrote must be whole.
func TestSIGTERMDuringBringUp(t *testing.T) {
	var worst int64

	for i := range 15 {
		delay := time.Duration(i) * 2 * time.Millisecond
		o := run(t, scenario{Env: map[string]string{"NVIDIA_DRIVER_SIMULATE": "h200:8"}, Delay: delay})

		assert.Equal(t, 0, o.ExitCode, "delay %v", delay)
		assert.True(t, o.StatusWhole, "status file whole at delay %v", delay)
		assert.NotContains(t, o.Log, "context canceled", "a stop is logged as a stop, not as a wait or an error, at delay %v", delay)

		if o.Ready {
			assert.True(t, o.ReadyWhole, "readiness file whole at delay %v", delay)
		}

		worst = max(worst, o.StopMillis)
	}

	assert.Less(t, worst, int64(2000))
	t.Logf("slowest stop: %d ms", worst)
}

func nodeRole() int {
	o, err := nodeSteps()
	if err != nil {
		fmt.Fprintln(os.Stderr, "node role:", err)

		return 1
	}

	if err := json.NewEncoder(os.Stdout).Encode(o); err != nil {
		return 1
	}

	return 0
}

func nodeSteps() (outcome, error) {
	var (
		o   outcome
		sc  scenario
		tmp = os.Getenv("SERVICE_TEST_TMP")
	)

	if err := json.Unmarshal([]byte(os.Getenv(envScenario)), &sc); err != nil {
		return o, err
	}

	host := filepath.Join(tmp, "host")
	if err := os.MkdirAll(host, 0o755); err != nil {
		return o, err
	}

	if err := unix.Mount("tmpfs", host, "tmpfs", 0, ""); err != nil {
		return o, err
	}

	if err := unix.Mount("", host, "", unix.MS_SHARED, ""); err != nil {
		return o, err
	}

	subroot := os.Getenv("SERVICE_TEST_SUBROOT")
	if sc.Subroot == "empty" {
		subroot = filepath.Join(tmp, "empty-subroot")
		if err := os.MkdirAll(subroot, 0o755); err != nil {
			return o, err
		}
	}

	if sc.FakeProc {
		files := map[string]string{
			"proc/devices":               "Character devices:\n195 nvidia-frontend\n\nBlock devices:\n",
			"proc/driver/nvidia/version": "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  535.309.01\n",
		}
		for rel, content := range files {
			p := filepath.Join(host, rel)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return o, err
			}

			if err := os.WriteFile(p, []byte(content), 0o444); err != nil {
				return o, err
			}
		}
	}

	// nvcdi reads MIG minors from /proc/driver/nvidia-caps itself: point this namespace's at
	// the simulated driver's.
	if err := unix.Mount("tmpfs", "/proc/driver", "tmpfs", 0, ""); err != nil {
		return o, err
	}

	if err := os.Symlink(filepath.Join(host, "proc/driver/nvidia-caps"), "/proc/driver/nvidia-caps"); err != nil {
		return o, err
	}

	// Earlier runs stand for the service before a restart; the last one is looked at.
	var before []string

	for i := 1; i < max(sc.Runs, 1); i++ {
		first, err := runOnce(sc, host, subroot, filepath.Join(tmp, fmt.Sprintf("service-%d.log", i)))
		if err != nil {
			return first, err
		}

		before = append(before, first.ReadyFile)
	}

	last, err := runOnce(sc, host, subroot, filepath.Join(tmp, "service.log"))
	if len(before) > 0 && before[len(before)-1] != "" && before[len(before)-1] == last.ReadyFile {
		last.Log += "\nreadiness unchanged by the restart"
	}

	return last, err
}

func runOnce(sc scenario, host, subroot, logPath string) (outcome, error) {
	var o outcome

	logFile, err := os.Create(logPath)
	if err != nil {
		return o, err
	}
	defer logFile.Close() //nolint:errcheck

	cmd := exec.Command(os.Getenv("SERVICE_TEST_BIN"), "run")
	cmd.Env = []string{"PATH=/usr/bin:/bin", "NVIDIA_DRIVER_HOST_ROOT=" + host, "NVIDIA_DRIVER_SUBROOT=" + subroot, "NVIDIA_DRIVER_PERSISTENCED=false"}

	for k, v := range sc.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}

	cmd.Stdout, cmd.Stderr = logFile, logFile

	if err := cmd.Start(); err != nil {
		return o, err
	}

	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	statusPath := filepath.Join(host, "run/nvidia-driver/status.json")
	readyPath := filepath.Join(host, "run/nvidia/validations/nvidia-driver.ready")

	var waitErr error

	done := false

	if sc.Until != "" {
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) && !done {
			if st, err := readJSON(statusPath); err == nil && st["phase"] == sc.Until {
				break
			}

			select {
			case waitErr = <-exited:
				done = true
			case <-time.After(10 * time.Millisecond):
			}
		}
	}

	if !done && sc.Until == "" {
		// The delay counts from the service's first log line: its signal handler is in place
		// by then. A SIGTERM during the Go runtime's own start-up would kill any program.
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
			if data, _ := os.ReadFile(logPath); len(data) > 0 { //nolint:errcheck
				break
			}

			time.Sleep(time.Millisecond)
		}

		select {
		case waitErr = <-exited:
			done = true
		case <-time.After(sc.Delay):
		}
	}

	if !done {
		if data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid)); err == nil {
			for _, line := range strings.Split(string(data), "\n") {
				if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
					o.RSSKiB, _ = strconv.Atoi(strings.Fields(v)[0]) //nolint:errcheck
				}
			}
		}

		if maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", cmd.Process.Pid)); err == nil {
			o.NVMLMapped = strings.Contains(string(maps), "libnvidia-ml")
		}

		// The status as it was while running.
		if st, err := readJSON(statusPath); err == nil {
			o.Status = st
			o.Phase, _ = st["phase"].(string)     //nolint:errcheck
			o.Message, _ = st["message"].(string) //nolint:errcheck
		}

		start := time.Now()

		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			return o, err
		}

		select {
		case waitErr = <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill() //nolint:errcheck

			return o, fmt.Errorf("the service did not stop within 10 s")
		}

		o.StopMillis = time.Since(start).Milliseconds()
	}

	if ee, ok := waitErr.(*exec.ExitError); ok {
		o.ExitCode = ee.ExitCode()
	} else if waitErr != nil {
		return o, waitErr
	}

	_, statusErr := readJSON(statusPath)
	o.StatusWhole = statusErr == nil || os.IsNotExist(statusErr)

	if data, err := os.ReadFile(readyPath); err == nil {
		o.Ready = true
		o.ReadyFile = string(data)
		_, err := readJSON(readyPath)
		o.ReadyWhole = err == nil
	}

	if data, err := os.ReadFile(filepath.Join(host, nfdDir, "nvidia-driver")); err == nil {
		o.NFDFile = string(data)
	}

	infos, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(filepath.Join(host, "run/nvidia/driver")))
	if err != nil {
		return o, err
	}

	if len(infos) > 0 {
		o.Mounted = true
		o.MountRO = strings.HasPrefix(infos[len(infos)-1].Options, "ro")
	}

	if entries, err := os.ReadDir(filepath.Join(host, "dev")); err == nil {
		for _, e := range entries {
			o.DevEntries = append(o.DevEntries, e.Name())
		}
	}

	logData, _ := os.ReadFile(logPath) //nolint:errcheck
	o.Log = string(logData)

	return o, nil
}

const nfdDir = "etc/kubernetes/node-feature-discovery/features.d"

// TestMIGLayoutLabelsAndStableReadiness: a simulated node with a MIG layout comes up, its
// Node Feature Discovery labels say so, and a restart that changes nothing leaves the
// readiness file's bytes alone (the device plugin restarts when they change).
func TestMIGLayoutLabelsAndStableReadiness(t *testing.T) {
	sc := scenario{
		Env: map[string]string{
			"NVIDIA_DRIVER_SIMULATE": "h200:2", "NVIDIA_DRIVER_MIG_LAYOUT": "all-balanced",
			"NVIDIA_DRIVER_NFD_FEATURES_DIR": "/" + nfdDir,
		},
		Until: "ready",
		Runs:  2,
	}
	o := run(t, sc)

	require.Equal(t, "ready", o.Phase, o.Log)
	assert.Contains(t, o.NFDFile, "nvidia.com/mig.config=all-balanced")
	assert.Contains(t, o.NFDFile, "nvidia.com/mig.config.state=success")
	assert.Contains(t, o.NFDFile, "nvidia.com/gpu.product=NVIDIA-H200")
	// MIG on: NVIDIA's device plugin cannot share MIG devices through MPS.
	assert.Contains(t, o.NFDFile, "nvidia.com/mps.capable=false")
	// The readiness file lists the devices, the MIG devices of the layout, and no layout name.
	assert.Contains(t, o.ReadyFile, `"name": "NVIDIA H200 MIG 3g.71gb"`)
	assert.NotContains(t, o.ReadyFile, "all-balanced")
	assert.Contains(t, o.Log, "msg=setting key=migLayout from=env", "the log says what the configuration changed")
	assert.Contains(t, o.Log, "readiness unchanged by the restart", "the second run must leave the readiness file as it was")
}

func readJSON(path string) (map[string]any, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}

	var m map[string]any

	return m, json.Unmarshal(data, &m)
}

// Without MIG the node's GPUs can be shared through MPS: the label that NVIDIA's chart
// schedules its MPS control daemon by is "true".
func TestMPSCapableLabelWithoutMIG(t *testing.T) {
	o := run(t, scenario{
		Env:   map[string]string{"NVIDIA_DRIVER_SIMULATE": "h200:2", "NVIDIA_DRIVER_NFD_FEATURES_DIR": "/" + nfdDir},
		Until: "ready",
	})

	require.Equal(t, "ready", o.Phase, o.Log)
	assert.Contains(t, o.NFDFile, "nvidia.com/mps.capable=true\n")
	assert.NotContains(t, o.NFDFile, "mig.config")
}

// TestSIGTERMAtStartExitsZero: the service, as PID 1 of its own PID namespace (as Talos runs
// it), gets SIGTERM at moments from its exec on; it exits 0 each time, within a second.
// Before pkg/stopsignal, a SIGTERM before the Go runtime's handlers was dropped by the
// kernel (the service ran on until killed) and one before main's exited 2 (issue 32).
func TestSIGTERMAtStartExitsZero(t *testing.T) {
	testutil.RequireRoot(t)

	bin := testutil.ServiceBinary(t)
	codes := map[int]int{}

	for i := range 40 {
		delay := time.Duration(i%20) * 500 * time.Microsecond
		code, took := sigtermAsPID1(t, bin, delay)
		codes[code]++

		assert.Equal(t, 0, code, "SIGTERM %v after exec", delay)
		assert.Less(t, took, time.Second, "SIGTERM %v after exec", delay)
	}

	t.Logf("exit codes: %v", codes)
}

// sigtermAsPID1 starts bin as PID 1 of a new PID namespace, with a bad configuration (so that
// it touches nothing), sends it SIGTERM delay after it has exec'd, and returns its exit code
// and how long it took to exit.
func sigtermAsPID1(t *testing.T, bin string, delay time.Duration) (int, time.Duration) {
	t.Helper()

	cmd := exec.Command("unshare", "--pid", "--fork", "--kill-child", bin, "run")
	cmd.Env = []string{"NVIDIA_DRIVER_HOST_ROOT=" + t.TempDir(), "NVIDIA_DRIVER_CDI=maybe"}
	require.NoError(t, cmd.Start())

	// The forked child, once it runs bin's code: it catches SIGTERM. Before that (execve, the
	// loader mapping the libraries) the kernel drops a SIGTERM to a PID 1 whatever the
	// program: there is no handler yet.
	var pid int

	for deadline := time.Now().Add(5 * time.Second); pid == 0 && time.Now().Before(deadline); {
		data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", cmd.Process.Pid, cmd.Process.Pid)) //nolint:errcheck
		if f := strings.Fields(string(data)); len(f) > 0 && catchesSIGTERM(f[0]) {
			if exe, err := os.Readlink("/proc/" + f[0] + "/exe"); err == nil && exe == bin {
				pid, _ = strconv.Atoi(f[0]) //nolint:errcheck
			}
		}

		time.Sleep(50 * time.Microsecond)
	}

	require.NotZero(t, pid, "the service did not start")

	time.Sleep(delay)

	start := time.Now()
	require.NoError(t, syscall.Kill(pid, syscall.SIGTERM))

	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	var err error
	select {
	case err = <-exited:
	case <-time.After(3 * time.Second):
		cmd.Process.Kill() //nolint:errcheck
		<-exited

		return -1, time.Since(start)
	}

	took := time.Since(start)

	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), took
	}

	require.NoError(t, err)

	return 0, took
}

// catchesSIGTERM reports whether process pid has a handler for SIGTERM (SigCgt).
func catchesSIGTERM(pid string) bool {
	data, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return false
	}

	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "SigCgt:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)

			return err == nil && mask&(1<<(uint(syscall.SIGTERM)-1)) != 0
		}
	}

	return false
}
