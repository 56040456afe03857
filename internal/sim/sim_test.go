package sim_test

import (
	"github.com/talos-nvidia/nvidia-driver/internal/testutil"

	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/internal/sim"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu"
)

// TestTablesMatchGoNVMLMock checks the A100, A30 and H100 tables against go-nvml's
// mock/gpus, an independent source. The mock's H100 has two known errors,
// checked instead against the real H200 (same GH100 die and slice geometry):
// 1g.20gb placements (mock: 7 one-slice slots), and the 3g.40gb and 7g.80gb
// placement sizes (mock: 3 and 7; real Hopper: 4 and 8).
func TestTablesMatchGoNVMLMock(t *testing.T) {
	h200 := testutil.Model(t, "h200")

	for _, tc := range []struct {
		key  string
		mock gpus.Config
	}{
		{"a100-40gb", gpus.A100_SXM4_40GB},
		{"a100-80gb", gpus.A100_SXM4_80GB},
		{"h100-80gb", gpus.H100_SXM5_80GB},
		{"a30", gpus.A30_PCIE_24GB},
	} {
		t.Run(tc.key, func(t *testing.T) {
			m := testutil.Model(t, tc.key)
			assert.Equal(t, tc.mock.PciDeviceId, m.PciDeviceID)
			assert.Equal(t, tc.mock.Architecture, m.Architecture)
			assert.Equal(t, tc.mock.MemoryMB*1024*1024, m.MemoryBytes)
			require.Len(t, m.Profiles, len(tc.mock.MIGProfiles.GpuInstanceProfiles))

			for _, p := range m.Profiles {
				mp, ok := tc.mock.MIGProfiles.GpuInstanceProfiles[p.Index]
				require.True(t, ok, "profile index %d", p.Index)
				assert.Equal(t, mp.SliceCount, p.Info.SliceCount, "slices of %d", p.Index)
				assert.Equal(t, mp.InstanceCount, p.Info.InstanceCount, "instances of %d", p.Index)
				assert.Equal(t, mp.MemorySizeMB, p.Info.MemorySizeMB, "memory of %d", p.Index)

				want := tc.mock.MIGProfiles.GpuInstancePlacements[p.Index]
				if tc.key == "h100-80gb" && (p.Index == nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2 || p.Index == nvml.GPU_INSTANCE_PROFILE_3_SLICE || p.Index == nvml.GPU_INSTANCE_PROFILE_7_SLICE) {
					hp, _ := h200.Profile(p.Index)
					want = hp.Placements
				}

				assert.Equal(t, want, p.Placements, "placements of %d", p.Index)

				// Compute-instance profiles: every size the mock lists is offered with its count.
				node := sim.New(m, 1)
				require.Equal(t, nvml.SUCCESS, node.Init())
				dev := testutil.EnableMIG(t, node, 0)
				info := p.Info
				gi, ret := dev.CreateGpuInstanceWithPlacement(&info, &p.Placements[0])
				require.Equal(t, nvml.SUCCESS, ret)
				for ciIdx, mci := range tc.mock.MIGProfiles.ComputeInstanceProfiles[p.Index] {
					if ciIdx == nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1 {
						continue // a graphics-capable CI profile, not simulated
					}
					ci, ret := gi.GetComputeInstanceProfileInfo(ciIdx, 0)
					require.Equal(t, nvml.SUCCESS, ret, "ci %d of gi %d", ciIdx, p.Index)
					assert.Equal(t, mci.SliceCount, ci.SliceCount)
					assert.Equal(t, mci.InstanceCount, ci.InstanceCount, "ci %d of gi %d", ciIdx, p.Index)
				}
			}
		})
	}
}

type fixture struct {
	PciDeviceID string `json:"pciDeviceId"`
	MemoryBytes uint64 `json:"memoryBytes"`
	Profiles    []struct {
		NvmlProfile int        `json:"nvmlProfile"`
		ID          uint32     `json:"id"`
		Name        string     `json:"name"`
		SliceCount  uint32     `json:"sliceCount"`
		Instances   uint32     `json:"instanceCount"`
		MemoryMB    uint64     `json:"memoryMB"`
		SMs         uint32     `json:"multiprocessors"`
		Placements  [][]uint32 `json:"placements"`
	} `json:"gpuInstanceProfiles"`
	NotSupported    []int `json:"nvmlProfilesNotSupported"`
	InvalidArgument []int `json:"nvmlProfilesInvalidArgument"`
}

// TestH200MatchesFixture checks the H200 table against what a real H200 said,
// through the simulator's NVML calls, names included.
func TestH200MatchesFixture(t *testing.T) {
	data, err := os.ReadFile("testdata/h200-mig.json")
	require.NoError(t, err)

	var f fixture
	require.NoError(t, json.Unmarshal(data, &f))

	node := sim.New(testutil.Model(t, "h200"), 1)
	require.Equal(t, nvml.SUCCESS, node.Init())
	dev, _ := node.DeviceGetHandleByIndex(0)

	mem, _ := dev.GetMemoryInfo()
	assert.Equal(t, f.MemoryBytes, mem.Total)

	pci, _ := dev.GetPciInfo()
	assert.Equal(t, f.PciDeviceID, "0x"+hex8(pci.PciDeviceId))

	for _, fp := range f.Profiles {
		info, ret := dev.GetGpuInstanceProfileInfo(fp.NvmlProfile)
		require.Equal(t, nvml.SUCCESS, ret, fp.Name)
		assert.Equal(t, fp.ID, info.Id, fp.Name)
		assert.Equal(t, fp.SliceCount, info.SliceCount, fp.Name)
		assert.Equal(t, fp.Instances, info.InstanceCount, fp.Name)
		assert.Equal(t, fp.MemoryMB, info.MemorySizeMB, fp.Name)
		assert.Equal(t, fp.SMs, info.MultiprocessorCount, fp.Name)

		pls, ret := dev.GetGpuInstancePossiblePlacements(&info)
		require.Equal(t, nvml.SUCCESS, ret)
		var got [][]uint32
		for _, p := range pls {
			got = append(got, []uint32{p.Start, p.Size})
		}
		assert.Equal(t, fp.Placements, got, fp.Name)
	}

	for _, idx := range f.NotSupported {
		_, ret := dev.GetGpuInstanceProfileInfo(idx)
		assert.Equal(t, nvml.ERROR_NOT_SUPPORTED, ret, "profile %d", idx)
	}

	// Where the real H200's enumeration ends (nvml.h: "until the API returns
	// NVML_ERROR_INVALID_ARGUMENT"), and past go-nvml's count.
	require.NotEmpty(t, f.InvalidArgument)
	for _, idx := range append(f.InvalidArgument, nvml.GPU_INSTANCE_PROFILE_COUNT) {
		_, ret := dev.GetGpuInstanceProfileInfo(idx)
		assert.Equal(t, nvml.ERROR_INVALID_ARGUMENT, ret, "profile %d", idx)
	}
}

func hex8(v uint32) string {
	const digits = "0123456789ABCDEF"
	b := make([]byte, 8)
	for i := 7; i >= 0; i-- {
		b[i] = digits[v&0xF]
		v >>= 4
	}
	return string(b)
}

func TestAmpereModeIsPendingUntilReset(t *testing.T) {
	node := sim.New(testutil.Model(t, "a100-80gb"), 2)
	require.Equal(t, nvml.SUCCESS, node.Init())
	dev, _ := node.DeviceGetHandleByIndex(1)

	activation, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE)
	require.Equal(t, nvml.SUCCESS, ret)
	assert.Equal(t, nvml.ERROR_RESET_REQUIRED, activation)

	cur, pending, _ := dev.GetMigMode()
	assert.Equal(t, nvml.DEVICE_MIG_DISABLE, cur)
	assert.Equal(t, nvml.DEVICE_MIG_ENABLE, pending)

	node.SetProcesses(1, nvml.ProcessInfo{Pid: 42})
	require.ErrorIs(t, node.ResetGPU(context.Background(), 1), nvml.ERROR_IN_USE)
	node.SetProcesses(1)
	require.NoError(t, node.ResetGPU(context.Background(), 1))

	_, ret = dev.GetName()
	assert.Equal(t, nvml.ERROR_GPU_IS_LOST, ret, "a handle from before a reset is stale")

	dev, _ = node.DeviceGetHandleByIndex(1)
	cur, _, _ = dev.GetMigMode()
	assert.Equal(t, nvml.DEVICE_MIG_ENABLE, cur)
}

// TestHopperModeChangeResetsOrStaysPending follows nvml.h's nvmlDeviceSetMigMode: a GPU held
// open cannot be unbound, so activationStatus is IN_USE, the call succeeds, the current mode
// stays and the requested one is pending; an idle GPU is reset by the call.
func TestHopperModeChangeResetsOrStaysPending(t *testing.T) {
	node := sim.New(testutil.Model(t, "h100-80gb"), 1)
	require.Equal(t, nvml.SUCCESS, node.Init())
	dev, _ := node.DeviceGetHandleByIndex(0)

	node.Hold(sim.Holder{PID: 77, Name: "nv-hostengine", GPUs: []int{0}})
	activation, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE)
	assert.Equal(t, nvml.SUCCESS, ret)
	assert.Equal(t, nvml.ERROR_IN_USE, activation)
	cur, pending, _ := dev.GetMigMode()
	assert.Equal(t, []int{0, 1}, []int{cur, pending}, "current stays, pending set")
	require.ErrorIs(t, node.ResetGPU(context.Background(), 0), nvml.ERROR_IN_USE)

	node.Release(77)
	activation, ret = dev.SetMigMode(nvml.DEVICE_MIG_ENABLE)
	require.Equal(t, nvml.SUCCESS, ret)
	assert.Equal(t, nvml.SUCCESS, activation)

	_, ret = dev.GetName()
	assert.Equal(t, nvml.ERROR_GPU_IS_LOST, ret, "the call reset the GPU: old handles are stale")

	dev, _ = node.DeviceGetHandleByIndex(0)
	cur, pending, _ = dev.GetMigMode()
	assert.Equal(t, []int{1, 1}, []int{cur, pending})
}

// TestBoardsThatCannotReset: pass-through needs a VM reboot (activationStatus
// RESET_REQUIRED, no reset); NVSwitch boards cannot reset one GPU; a reboot activates the
// pending mode and drops every instance.
func TestBoardsThatCannotReset(t *testing.T) {
	for _, tc := range []struct {
		name  string
		model string
		board sim.Board
	}{
		{"pass-through hopper", "h100-80gb", sim.Board{PassThrough: true}},
		{"nvswitch a100", "a100-80gb", sim.Board{NoPerGPUReset: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := sim.New(testutil.Model(t, tc.model), 2)
			node.SetBoard(tc.board)
			require.Equal(t, nvml.SUCCESS, node.Init())
			dev, _ := node.DeviceGetHandleByIndex(0)

			activation, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE)
			require.Equal(t, nvml.SUCCESS, ret)
			assert.Equal(t, nvml.ERROR_RESET_REQUIRED, activation)
			require.ErrorIs(t, node.ResetGPU(context.Background(), 0), sim.ErrResetNotSupported)

			cur, pending, _ := dev.GetMigMode()
			assert.Equal(t, []int{0, 1}, []int{cur, pending})

			node.Reboot()
			_, _, ret = dev.GetMigMode()
			assert.Equal(t, nvml.ERROR_UNINITIALIZED, ret, "a reboot ends the NVML session")
			require.Equal(t, nvml.SUCCESS, node.Init())
			dev, _ = node.DeviceGetHandleByIndex(0)
			cur, pending, _ = dev.GetMigMode()
			assert.Equal(t, []int{1, 1}, []int{cur, pending}, "the mode survives, now current")

			p, _ := dev.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_7_SLICE)
			_, ret = dev.CreateGpuInstance(&p)
			require.Equal(t, nvml.SUCCESS, ret)
			node.Reboot()
			require.Equal(t, nvml.SUCCESS, node.Init())
			assert.Empty(t, node.State(0).Instances, "instances never survive a reboot")
			assert.Equal(t, nvml.DEVICE_MIG_ENABLE, node.State(0).MigMode)
		})
	}
}

// TestMinorsMayChangeOnReset: nvml.h says a mode change may reset the device and change its
// minor number.
func TestMinorsMayChangeOnReset(t *testing.T) {
	node := sim.New(testutil.Model(t, "h200"), 2)
	node.SetBoard(sim.Board{MinorsChangeOnReset: true})
	require.Equal(t, nvml.SUCCESS, node.Init())
	dev, _ := node.DeviceGetHandleByIndex(1)
	before, _ := dev.GetMinorNumber()

	_, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE)
	require.Equal(t, nvml.SUCCESS, ret)
	dev, _ = node.DeviceGetHandleByIndex(1)
	after, _ := dev.GetMinorNumber()
	assert.NotEqual(t, before, after)
}

func TestPlacementRules(t *testing.T) {
	node := sim.New(testutil.Model(t, "h100-80gb"), 1)
	require.Equal(t, nvml.SUCCESS, node.Init())
	dev := testutil.EnableMIG(t, node, 0)

	p1, _ := dev.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE)
	p4, _ := dev.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_4_SLICE)
	p3, _ := dev.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_3_SLICE)
	pme, _ := dev.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1)

	// Creation without placement takes the first free slot: a 4g no longer fits.
	_, ret := dev.CreateGpuInstance(&p1)
	require.Equal(t, nvml.SUCCESS, ret)
	_, ret = dev.CreateGpuInstance(&p4)
	assert.Equal(t, nvml.ERROR_INSUFFICIENT_RESOURCES, ret, "fragmented")

	// Placements not in the table are invalid; overlapping ones are refused.
	_, ret = dev.CreateGpuInstanceWithPlacement(&p3, &nvml.GpuInstancePlacement{Start: 2, Size: 4})
	assert.Equal(t, nvml.ERROR_INVALID_ARGUMENT, ret)
	_, ret = dev.CreateGpuInstanceWithPlacement(&p3, &nvml.GpuInstancePlacement{Start: 0, Size: 4})
	assert.Equal(t, nvml.ERROR_INSUFFICIENT_RESOURCES, ret)
	_, ret = dev.CreateGpuInstanceWithPlacement(&p3, &nvml.GpuInstancePlacement{Start: 4, Size: 4})
	require.Equal(t, nvml.SUCCESS, ret)

	// Instance count: one +me at most.
	_, ret = dev.CreateGpuInstanceWithPlacement(&pme, &nvml.GpuInstancePlacement{Start: 1, Size: 1})
	require.Equal(t, nvml.SUCCESS, ret)
	_, ret = dev.CreateGpuInstanceWithPlacement(&pme, &nvml.GpuInstancePlacement{Start: 2, Size: 1})
	assert.Equal(t, nvml.ERROR_INSUFFICIENT_RESOURCES, ret)

	// MIG devices enumerate only compute instances; GIs without CIs have none.
	n, _ := dev.GetMaxMigDeviceCount()
	assert.Equal(t, 7, n)
	_, ret = dev.GetMigDeviceHandleByIndex(0)
	assert.Equal(t, nvml.ERROR_NOT_FOUND, ret)

	gis, _ := dev.GetGpuInstances(&p3)
	require.Len(t, gis, 1)
	ciInfo, _ := gis[0].GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 0)
	for i := 0; i < 3; i++ {
		_, ret = gis[0].CreateComputeInstance(&ciInfo)
		require.Equal(t, nvml.SUCCESS, ret)
	}
	_, ret = gis[0].CreateComputeInstance(&ciInfo)
	assert.Equal(t, nvml.ERROR_INSUFFICIENT_RESOURCES, ret)
	assert.Equal(t, nvml.ERROR_IN_USE, gis[0].Destroy(), "a GI with CIs cannot be destroyed")

	md, ret := dev.GetMigDeviceHandleByIndex(0)
	require.Equal(t, nvml.SUCCESS, ret)
	name, _ := md.GetName()
	assert.Equal(t, "NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb", name)
	parent, _ := md.GetDeviceHandleFromMigDeviceHandle()
	uuid, _ := parent.GetUUID()
	gpuUUID, _ := dev.GetUUID()
	assert.Equal(t, gpuUUID, uuid)
	isMig, _ := md.IsMigDeviceHandle()
	assert.True(t, isMig)
}

func TestFaultInjectionAndCounters(t *testing.T) {
	node := sim.New(testutil.Model(t, "h200"), 2)
	require.Equal(t, nvml.SUCCESS, node.Init())

	node.InjectFault(sim.Fault{Method: "Device.GetName", GPU: 1, Nth: 2, Ret: nvml.ERROR_UNKNOWN})
	d0, _ := node.DeviceGetHandleByIndex(0)
	d1, _ := node.DeviceGetHandleByIndex(1)

	_, ret := d0.GetName()
	assert.Equal(t, nvml.SUCCESS, ret, "other GPU unaffected")
	_, ret = d1.GetName()
	assert.Equal(t, nvml.SUCCESS, ret, "first call passes")
	_, ret = d1.GetName()
	assert.Equal(t, nvml.ERROR_UNKNOWN, ret, "second call fails")
	_, ret = d1.GetName()
	assert.Equal(t, nvml.SUCCESS, ret, "fails once")

	assert.Equal(t, 0, node.MutatingCalls())
	_, _ = d0.SetMigMode(nvml.DEVICE_MIG_ENABLE)
	assert.Equal(t, 1, node.MutatingCalls())
	assert.Equal(t, 1, node.Calls(sim.MSetMigMode))
}

func TestUnsimulatedCallPanicsWithItsName(t *testing.T) {
	node := sim.New(testutil.Model(t, "h200"), 1)
	require.Equal(t, nvml.SUCCESS, node.Init())
	dev, _ := node.DeviceGetHandleByIndex(0)
	assert.PanicsWithValue(t, "Device.GetPowerUsageFunc: method is nil but Device.GetPowerUsage was just called", func() { _, _ = dev.GetPowerUsage() })
}

// TestHoldersShowInProc: a simulated node's holders and compute processes appear in its
// /proc as the kernel shows them, so gpu.Holders finds them as on a node; a released holder
// disappears at the next write.
func TestHoldersShowInProc(t *testing.T) {
	node := sim.New(testutil.Model(t, "h200"), 2)
	require.Equal(t, nvml.SUCCESS, node.Init())
	node.Hold(sim.Holder{PID: 4100, Name: "nvidia-device-plugin", GPUs: []int{0, 1}})
	node.Hold(sim.Holder{PID: 4200, Name: "dcgm-exporter", GPUs: []int{1}})
	node.SetProcesses(0, nvml.ProcessInfo{Pid: 555})

	host := t.TempDir()
	require.NoError(t, sim.WriteProcFS(host, node))

	got, err := gpu.Holders(filepath.Join(host, "proc"), 0)
	require.NoError(t, err)
	assert.Equal(t, []gpu.Holder{{PID: 555}, {PID: 4100, Name: "nvidia-device-plugin"}}, got)

	got, err = gpu.Holders(filepath.Join(host, "proc"), 1)
	require.NoError(t, err)
	assert.Equal(t, []gpu.Holder{{PID: 4100, Name: "nvidia-device-plugin"}, {PID: 4200, Name: "dcgm-exporter"}}, got)

	node.Release(4100)
	require.NoError(t, sim.WriteProcFS(host, node))
	got, err = gpu.Holders(filepath.Join(host, "proc"), 1)
	require.NoError(t, err)
	assert.Equal(t, []gpu.Holder{{PID: 4200, Name: "dcgm-exporter"}}, got)
}

// TestProcFSWritesAreWhole: a reader of the simulated /proc never sees a file in part while
// WriteProcFS rewrites it (issue 32: a kill during a MIG change left gpus/*/information
// truncated, and every later start waited on it).
func TestProcFSWritesAreWhole(t *testing.T) {
	node := sim.New(testutil.Model(t, "h200"), 2)
	require.Equal(t, nvml.SUCCESS, node.Init())

	host := t.TempDir()
	versions := []string{"570.1.1", "580.2.2"}

	node.DriverVersion = versions[0]
	require.NoError(t, sim.WriteProcFS(host, node))

	minorsPath := filepath.Join(host, "proc/driver/nvidia-caps/mig-minors")
	minors, err := os.ReadFile(minorsPath)
	require.NoError(t, err)

	versionPath := filepath.Join(host, "proc/driver/nvidia/version")

	var (
		stop    atomic.Bool
		partial atomic.Int64
		wg      sync.WaitGroup
	)

	wg.Add(1)

	go func() {
		defer wg.Done()

		for !stop.Load() {
			if data, err := os.ReadFile(minorsPath); err != nil || !bytes.Equal(data, minors) {
				partial.Add(1)
			}

			data, err := os.ReadFile(versionPath)
			if err != nil || !bytes.HasSuffix(data, []byte("Simulated\nGCC version:  gcc\n")) {
				partial.Add(1)
			}
		}
	}()

	for i := range 200 {
		node.DriverVersion = versions[i%2]
		require.NoError(t, sim.WriteProcFS(host, node))
	}

	stop.Store(true)
	wg.Wait()

	assert.Zero(t, partial.Load(), "reads of a file in part")
}
