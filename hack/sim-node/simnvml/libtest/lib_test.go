// Package libtest tests the simulated libnvidia-ml (hack/sim-node/simnvml) from outside: a test of
// package main would link the library's functions into the test binary, where they would
// answer in place of the library that the test loads.
package libtest_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/hack/sim-node/simnvml/state"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu"
)

// node is the library and the state directory that the tests share: a process loads
// libnvidia-ml.so.1 once (its later dlopens return the first), so every test of this binary
// uses one build and one node of 8 H100s on an NVSwitch board, each test its own GPUs.
type node struct{ so, stateDir string }

// build builds the library and the node into dir.
func build(dir string) (node, error) {
	n := node{so: filepath.Join(dir, "usr/lib64/libnvidia-ml.so.1"), stateDir: filepath.Join(dir, "dev", state.DirName)}

	if out, err := exec.Command("go", "build", "-buildmode=c-shared", "-o", n.so, "..").CombinedOutput(); err != nil {
		return n, fmt.Errorf("building the library: %w: %s", err, out)
	}

	out, err := exec.Command("go", "run", "../node", "-dir", n.stateDir, "-host-root", filepath.Join(dir, "host"),
		"-gpus", "h100-80gb:8", "-nvswitches", "4").CombinedOutput()
	if err != nil {
		return n, fmt.Errorf("making the node: %w: %s", err, out)
	}

	return n, nil
}

// TestLibrary loads the library as the service and NVIDIA's device plugin do (go-nvml's
// dlopen), finds the state next to the driver root it was loaded from (<root>/dev), and
// changes MIG there as a second process would see it.
func TestLibrary(t *testing.T) {
	so, stateDir := shared.so, shared.stateDir
	t.Setenv("SIMNVML_DIR", "")

	lib := nvml.New(nvml.WithLibraryPath(so))
	require.NoError(t, gpu.Init(lib))

	defer lib.Shutdown() //nolint:errcheck

	gpus, err := gpu.List(lib)
	require.NoError(t, err)
	require.Len(t, gpus, 8)
	assert.Equal(t, "NVIDIA H100 80GB HBM3", gpus[0].Name)
	assert.Equal(t, 7, gpus[7].Minor)

	for _, tc := range []struct {
		name string
		call func() nvml.Return
		want nvml.Return
	}{
		{"a handle past the GPUs", func() nvml.Return { _, r := lib.DeviceGetHandleByIndex(8); return r }, nvml.ERROR_INVALID_ARGUMENT},
		{"by PCI bus id", func() nvml.Return { _, r := lib.DeviceGetHandleByPciBusId("0000:0f:00.0"); return r }, nvml.SUCCESS},
		{"by an unknown UUID", func() nvml.Return { _, r := lib.DeviceGetHandleByUUID("GPU-nope"); return r }, nvml.ERROR_NOT_FOUND},
		{"a call not simulated", func() nvml.Return {
			d, _ := lib.DeviceGetHandleByIndex(0)
			_, r := d.GetPowerUsage()

			return r
		}, nvml.ERROR_NOT_SUPPORTED},
		{"fabric registered", func() nvml.Return {
			d, _ := lib.DeviceGetHandleByIndex(0)
			fi, r := d.GetGpuFabricInfo()
			if r == nvml.SUCCESS && fi.State != nvml.GPU_FABRIC_STATE_COMPLETED {
				return nvml.ERROR_UNKNOWN
			}

			return r
		}, nvml.SUCCESS},
	} {
		t.Run(tc.name, func(t *testing.T) { assert.Equal(t, tc.want, tc.call()) })
	}

	// MIG on GPU 1: Hopper resets the GPU on a mode change, so the handle goes stale.
	d, ret := lib.DeviceGetHandleByIndex(1)
	require.Equal(t, nvml.SUCCESS, ret)

	status, ret := d.SetMigMode(nvml.DEVICE_MIG_ENABLE)
	require.Equal(t, nvml.SUCCESS, ret)
	require.Equal(t, nvml.SUCCESS, status)

	_, _, ret = d.GetMigMode()
	assert.Equal(t, nvml.ERROR_GPU_IS_LOST, ret, "a handle from before the reset")

	d, _ = lib.DeviceGetHandleByIndex(1)
	p, ret := d.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_3_SLICE)
	require.Equal(t, nvml.SUCCESS, ret)

	gi, ret := d.CreateGpuInstanceWithPlacement(&p, &nvml.GpuInstancePlacement{Start: 4, Size: 4})
	require.Equal(t, nvml.SUCCESS, ret)

	_, ret = d.CreateGpuInstanceWithPlacement(&p, &nvml.GpuInstancePlacement{Start: 4, Size: 4})
	assert.Equal(t, nvml.ERROR_INSUFFICIENT_RESOURCES, ret, "the placement is taken")

	cp, ret := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	require.Equal(t, nvml.SUCCESS, ret)

	_, ret = gi.CreateComputeInstance(&cp)
	require.Equal(t, nvml.SUCCESS, ret)

	gpus, err = gpu.List(lib)
	require.NoError(t, err)
	require.Len(t, gpus[1].MIGDevices, 1)
	assert.Equal(t, "NVIDIA H100 80GB HBM3 MIG 3g.40gb", gpus[1].MIGDevices[0].Name)

	// What another process reads: the state file, and the capability files of /proc.
	s, err := state.Read(stateDir)
	require.NoError(t, err)
	require.Len(t, s.Node.GPUs[1].Instances, 1)
	assert.Equal(t, uint32(4), s.Node.GPUs[1].Instances[0].Start)

	data, err := json.Marshal(s.Node.GPUs[0])
	require.NoError(t, err)
	assert.NotContains(t, string(data), "instances", "GPU 0 is as it was")

	_, err = os.Stat(filepath.Join(s.HostRoot, "proc/driver/nvidia/capabilities/gpu1/mig/gi1/ci0/access"))
	assert.NoError(t, err, "the instance's capability file")
}

// TestStubsCurrent: stubs.c is what gen.go makes of go-nvml's nvml.h and this package.
func TestStubsCurrent(t *testing.T) {
	before, err := os.ReadFile("../stubs.c")
	require.NoError(t, err)

	cmd := exec.Command("go", "run", "gen.go")
	cmd.Dir = ".."

	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)

	after, err := os.ReadFile("../stubs.c")
	require.NoError(t, err)
	assert.Equal(t, string(before), string(after), "run go generate ./hack/sim-node/simnvml")
}
