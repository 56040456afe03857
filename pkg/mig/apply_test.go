package mig_test

import (
	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
	"log/slog"

	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/internal/sim"
	"github.com/talos-nvidia/nvidia-driver/pkg/mig"
)

// fakePersistenced holds every GPU open like nvidia-persistenced and lets go
// of them while suspended.
type fakePersistenced struct {
	node     *sim.Node
	gpus     int
	suspends int
}

func (f *fakePersistenced) hold(n int) {
	for i := 0; i < f.gpus; i++ {
		f.node.SetClients(i, n)
	}
}

func (f *fakePersistenced) Suspend(context.Context) (func(context.Context) error, error) {
	f.suspends++
	f.hold(0)

	return func(context.Context) error { f.hold(1); return nil }, nil
}

type rig struct {
	node    *sim.Node
	pd      *fakePersistenced
	applier *mig.Applier
	changes [][]int
}

func newRig(t testing.TB, model string, gpus int) *rig {
	return rigOn(t, sim.New(testutil.Model(t, model), gpus), gpus)
}

// rigOn is a rig on a node made by the caller (several models, for one).
func rigOn(t testing.TB, node *sim.Node, gpus int) *rig {
	require.Equal(t, nvml.SUCCESS, node.Init())

	r := &rig{node: node, pd: &fakePersistenced{node: node, gpus: gpus}}
	r.pd.hold(1)
	r.applier = &mig.Applier{
		NVML: node, Persistenced: r.pd, Resetter: node, ProcRoot: t.TempDir(),
		OnChange: func(_ context.Context, changed []int) error { r.changes = append(r.changes, changed); return nil },
	}

	return r
}

// state reads a GPU's state back through NVML.
func (r *rig) state(t testing.TB, i int) (mig.State, int) {
	gpus, err := mig.ReadGPUs(r.node)
	require.NoError(t, err)
	dev, ret := r.node.DeviceGetHandleByIndex(i)
	require.Equal(t, nvml.SUCCESS, ret)
	st, pending, err := mig.ReadState(dev, gpus[i])
	require.NoError(t, err)

	return st, pending
}

// loadDefault reads NVIDIA's default layouts as the GPU Operator ships them: its layouts
// alone, as mig-parted sees the file.
func loadDefault(t testing.TB) *mig.Config {
	data, err := os.ReadFile("testdata/gpu-operator-default-mig-config.yaml")
	require.NoError(t, err)
	cfg, err := mig.Parse(data)
	require.NoError(t, err)

	return cfg
}

// TestGPUOperatorDefaultLayouts plans and applies every layout of NVIDIA's
// default config that applies to each A100, H100 and H200 model, then applies it
// again as after a restart: no mutating call.
func TestGPUOperatorDefaultLayouts(t *testing.T) {
	cfg := loadDefault(t)
	want := map[string][]string{
		"a100-40gb": {"all-1g.10gb", "all-1g.5gb", "all-1g.5gb.me", "all-2g.10gb", "all-3g.20gb", "all-4g.20gb", "all-7g.40gb", "all-balanced", "all-disabled", "all-enabled"},
		"a100-80gb": {"all-1g.10gb", "all-1g.10gb.me", "all-1g.20gb", "all-2g.20gb", "all-3g.40gb", "all-4g.40gb", "all-7g.80gb", "all-balanced", "all-disabled", "all-enabled"},
		"h100-80gb": {"all-1g.10gb", "all-1g.10gb.me", "all-1g.20gb", "all-2g.20gb", "all-3g.40gb", "all-4g.40gb", "all-7g.80gb", "all-balanced", "all-disabled", "all-enabled"},
		"h200":      {"all-1g.18gb", "all-1g.18gb.me", "all-1g.35gb", "all-2g.35gb", "all-3g.71gb", "all-4g.71gb", "all-7g.141gb", "all-balanced", "all-disabled", "all-enabled"},
	}

	for model, layouts := range want {
		t.Run(model, func(t *testing.T) {
			var applicable []string

			for _, name := range cfg.Names() {
				probe := newRig(t, model, 1)
				gpus, err := mig.ReadGPUs(probe.node)
				require.NoError(t, err)

				plan, err := mig.PlanLayout(cfg, name, gpus)
				if err != nil {
					require.Contains(t, err.Error(), "has no profile", name)

					continue
				}

				r := newRig(t, model, 2)
				if plan.Selected() == 0 {
					// A layout for other models: nothing to do here (TestFilterThatMatchesNoGPU).
					statuses, err := r.applier.Apply(context.Background(), cfg, name)
					require.NoError(t, err, name)
					assert.Zero(t, r.node.MutatingCalls(), name)
					assert.Equal(t, mig.ResultSuccess, statuses[0].Result, name)

					continue
				}

				applicable = append(applicable, name)

				statuses, err := r.applier.Apply(context.Background(), cfg, name)
				require.NoError(t, err)
				for _, st := range statuses {
					require.Equal(t, mig.ResultSuccess, st.Result, "%s: %s", name, st.Message)
				}

				for i := 0; i < 2; i++ {
					st, pending := r.state(t, i)
					assert.Equal(t, plan.GPUs[0].Target.String(), st.String(), name)
					assert.Equal(t, st.MigEnabled, pending == nvml.DEVICE_MIG_ENABLE, name)
				}

				r.node.ResetCounters()
				statuses, err = r.applier.Apply(context.Background(), cfg, name)
				require.NoError(t, err)
				assert.Equal(t, 0, r.node.MutatingCalls(), "%s: restart must not touch the GPU", name)
				assert.Contains(t, statuses[0].Message, "already in layout")
			}

			sort.Strings(applicable)
			assert.Equal(t, layouts, applicable)
		})
	}
}

// TestFilterThatMatchesNoGPU: NVIDIA's all-1g.10gb names A100 and H100 ids only; on an H200
// node it is nothing to do, as for mig-parted: every GPU is left as it is, no call changes
// one, and the log says so once.
func TestFilterThatMatchesNoGPU(t *testing.T) {
	cfg := loadDefault(t)
	r := newRig(t, "h200", 2)

	var logs strings.Builder
	r.applier.Logger = slog.New(slog.NewTextHandler(&logs, nil))

	statuses, err := r.applier.Apply(context.Background(), cfg, "all-1g.10gb")
	require.NoError(t, err)
	require.Len(t, statuses, 2)

	for _, st := range statuses {
		assert.Equal(t, mig.ResultSuccess, st.Result)
		assert.Equal(t, "not selected by the layout; left as it is", st.Message)
	}

	assert.Zero(t, r.node.MutatingCalls())
	assert.Equal(t, 1, strings.Count(logs.String(), `msg="mig layout selects no GPU of this node (its device filters match none); nothing to do" layout=all-1g.10gb gpus="GPU 0: 0x233510DE, GPU 1: 0x233510DE"`), logs.String())
}

// TestGPUOperatorDefaultOnAMixedNode: on a node of an A100-80GB, an H100 and an H200, the
// default file's all-balanced, one entry per device-filter, gives each GPU
// the entry of its own PCI id, as mig-parted walks entries (cmd/nvidia-mig-parted/assert,
// WalkSelectedMigConfigForEachGPU); all-1g.35gb selects the H200 alone and leaves the others.
func TestGPUOperatorDefaultOnAMixedNode(t *testing.T) {
	cfg := loadDefault(t)
	r := rigOn(t, sim.NewNode(testutil.Model(t, "a100-80gb"), testutil.Model(t, "h100-80gb"), testutil.Model(t, "h200")), 3)

	statuses, err := r.applier.Apply(context.Background(), cfg, "all-balanced")
	require.NoError(t, err)
	require.Len(t, statuses, 3)

	for i, want := range []string{
		"MIG on: 2g.20gb@0[2g.20gb] 1g.10gb@2[1g.10gb] 1g.10gb@3[1g.10gb] 3g.40gb@4[3g.40gb]",
		"MIG on: 2g.20gb@0[2g.20gb] 1g.10gb@2[1g.10gb] 1g.10gb@3[1g.10gb] 3g.40gb@4[3g.40gb]",
		"MIG on: 2g.35gb@0[2g.35gb] 1g.18gb@2[1g.18gb] 1g.18gb@3[1g.18gb] 3g.71gb@4[3g.71gb]",
	} {
		require.Equal(t, mig.ResultSuccess, statuses[i].Result, "GPU %d: %s", i, statuses[i].Message)
		st, _ := r.state(t, i)
		assert.Equal(t, want, st.String(), "GPU %d", i)
	}

	statuses, err = r.applier.Apply(context.Background(), cfg, "all-1g.35gb")
	require.NoError(t, err)

	for i, want := range []string{"not selected by the layout; left as it is", "not selected by the layout; left as it is", ""} {
		require.Equal(t, mig.ResultSuccess, statuses[i].Result, "GPU %d: %s", i, statuses[i].Message)
		if want != "" {
			assert.Equal(t, want, statuses[i].Message, "GPU %d", i)
		}
	}

	st, _ := r.state(t, 2)
	assert.Equal(t, "MIG on: 1g.35gb@0[1g.35gb] 1g.35gb@2[1g.35gb] 1g.35gb@4[1g.35gb] 1g.35gb@6[1g.35gb]", st.String())
}

const custom = `version: v1
mig-configs:
  asymmetric:
    - devices: all
      mig-enabled: true
      mig-devices: {"3g.40gb": 1, "4g.40gb": 1}
  compute:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"1c.3g.40gb": 3, "1g.10gb+me": 1, "2g.20gb": 1}
    - devices: [1]
      mig-enabled: false
  compute-one:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"1c.3g.40gb": 3, "1g.10gb+me": 1, "2g.20gb": 1}
  filtered:
    - device-filter: "0x233510DE"
      devices: all
      mig-enabled: true
      mig-devices: {"7g.141gb": 1}
    - device-filter: ["0x233010DE"]
      devices: all
      mig-enabled: true
      mig-devices: {"2c.7g.80gb": 2, "3c.7g.80gb": 1}
  too-much:
    - devices: all
      mig-enabled: true
      mig-devices: {"4g.40gb": 1, "3g.40gb": 1, "1g.10gb": 1}
`

func TestCustomLayoutsOnH100(t *testing.T) {
	cfg, err := mig.Parse([]byte(custom))
	require.NoError(t, err)
	cfg = cfg.WithBuiltins()

	for _, tc := range []struct {
		layout string
		want   []string
	}{
		{"asymmetric", []string{"MIG on: 4g.40gb@0[4g.40gb] 3g.40gb@4[3g.40gb]", "MIG on: 4g.40gb@0[4g.40gb] 3g.40gb@4[3g.40gb]"}},
		{"compute", []string{"MIG on: 3g.40gb@0[1c.3g.40gb,1c.3g.40gb,1c.3g.40gb] 2g.20gb@4[2g.20gb] 1g.10gb+me@6[1g.10gb+me]", "MIG off"}},
		{"filtered", []string{"MIG on: 7g.80gb@0[2c.7g.80gb,2c.7g.80gb,3c.7g.80gb]", "MIG on: 7g.80gb@0[2c.7g.80gb,2c.7g.80gb,3c.7g.80gb]"}},
		{"all-1g", []string{"MIG on: 1g.10gb@0[1g.10gb] 1g.10gb@1[1g.10gb] 1g.10gb@2[1g.10gb] 1g.10gb@3[1g.10gb] 1g.10gb@4[1g.10gb] 1g.10gb@5[1g.10gb] 1g.10gb@6[1g.10gb]", ""}},
		{"all-max", []string{"MIG on: 7g.80gb@0[7g.80gb]", ""}},
		{"all-enabled", []string{"MIG on, no instances", ""}},
	} {
		t.Run(tc.layout, func(t *testing.T) {
			r := newRig(t, "h100-80gb", 2)
			// Start from something else so that every layout changes the GPU.
			_, err := r.applier.Apply(context.Background(), cfg, "all-balanced")
			require.NoError(t, err)

			statuses, err := r.applier.Apply(context.Background(), cfg, tc.layout)
			require.NoError(t, err)
			for i, st := range statuses {
				require.Equal(t, mig.ResultSuccess, st.Result, st.Message)
				got, _ := r.state(t, i)
				if tc.want[i] != "" {
					assert.Equal(t, tc.want[i], got.String())
				}
			}
		})
	}

	r := newRig(t, "h100-80gb", 1)
	_, err = r.applier.Apply(context.Background(), cfg, "too-much")
	require.EqualError(t, err, `layout "too-much" does not fit: layout "too-much", entry 0: GPU 0 (NVIDIA H100 80GB HBM3): needs 8 compute slices, the GPU has 7`)
	assert.Equal(t, 0, r.node.MutatingCalls())

	var layoutErr *mig.LayoutError
	assert.ErrorAs(t, err, &layoutErr, "a layout that does not fit is final")

	_, err = r.applier.Apply(context.Background(), cfg, "nope")
	require.ErrorContains(t, err, `no layout "nope" (layouts: all-1g, all-balanced,`)
	assert.ErrorAs(t, err, &layoutErr)

	// NVML that cannot be read is no layout error: it may pass, and the service tries again.
	r.node.InjectFault(sim.Fault{Method: "Device.GetMigMode", GPU: 0, Ret: nvml.ERROR_UNKNOWN})
	_, err = r.applier.Apply(context.Background(), cfg, "all-balanced")
	require.ErrorContains(t, err, "reading the GPUs' MIG state")
	assert.False(t, errors.As(err, &layoutErr), "%v", err)
}

func TestUnknownProfileNamesWhatTheGPUHas(t *testing.T) {
	cfg, err := mig.Parse([]byte(custom))
	require.NoError(t, err)

	r := newRig(t, "h200", 1)
	_, err = r.applier.Apply(context.Background(), cfg, "asymmetric")
	require.EqualError(t, err, `layout "asymmetric" does not fit: layout "asymmetric", entry 0: `+
		`mig-devices["3g.40gb"]: GPU 0 (NVIDIA H200) has no profile "3g.40gb"; it has 1g.18gb, 1g.18gb+me, 1g.35gb, 2g.35gb, 3g.71gb, 4g.71gb, 7g.141gb; `+
		`mig-devices["4g.40gb"]: GPU 0 (NVIDIA H200) has no profile "4g.40gb"; it has 1g.18gb, 1g.18gb+me, 1g.35gb, 2g.35gb, 3g.71gb, 4g.71gb, 7g.141gb`)
}

// TestSolverNeverFragments: for every multiset of profiles that fits, found
// by brute force on the simulator, the planner finds a placement.
func TestSolverFindsEveryFittingCombination(t *testing.T) {
	for _, model := range sim.Models() {
		r := newRig(t, model, 1)
		gpus, err := mig.ReadGPUs(r.node)
		require.NoError(t, err)

		profiles := gpus[0].Profiles
		counts := make([]int, len(profiles))
		checked := 0

		var rec func(i int)
		rec = func(i int) {
			if i == len(profiles) {
				devices := map[string]int{}
				for j, c := range counts {
					if c > 0 {
						devices[profiles[j].Name] = c
					}
				}

				cfg := &mig.Config{Layouts: map[string][]mig.Entry{"x": {{Layout: "x", AllDevices: true, MigEnabled: true, MigDevices: devices}}}}
				_, perr := mig.PlanLayout(cfg, "x", gpus)
				fits := fitsByBruteForce(profiles, counts)
				assert.Equal(t, fits, perr == nil, "%s %v: %v", model, devices, perr)
				checked++

				return
			}

			for c := 0; c <= int(profiles[i].Info.InstanceCount); c++ {
				counts[i] = c
				rec(i + 1)
			}
			counts[i] = 0
		}
		rec(0)
		require.Greater(t, checked, 100)
	}
}

// fitsByBruteForce tries every assignment of placements, independently of the planner.
func fitsByBruteForce(profiles []mig.GIProfileInfo, counts []int) bool {
	var items []mig.GIProfileInfo
	compute := uint32(0)
	for j, c := range counts {
		for k := 0; k < c; k++ {
			items = append(items, profiles[j])
			compute += profiles[j].Info.SliceCount
		}
	}

	if compute > 7 {
		return false
	}

	var rec func(i int, used uint32) bool
	rec = func(i int, used uint32) bool {
		if i == len(items) {
			return true
		}
		for _, pl := range items[i].Placements {
			m := uint32((1<<pl.Size)-1) << pl.Start
			if used&m == 0 && rec(i+1, used|m) {
				return true
			}
		}
		return false
	}

	return rec(0, 0)
}

func TestPendingWhenProcessesUseTheGPU(t *testing.T) {
	for _, model := range []string{"a100-80gb", "h100-80gb"} {
		t.Run(model, func(t *testing.T) {
			r := newRig(t, model, 2)
			r.node.SetProcesses(1, nvml.ProcessInfo{Pid: 4242})

			statuses, err := r.applier.Apply(context.Background(), mig.Builtin(), mig.LayoutAllBalanced)
			require.NoError(t, err)
			assert.Equal(t, mig.ResultSuccess, statuses[0].Result, statuses[0].Message)
			assert.Equal(t, mig.ResultPending, statuses[1].Result)
			assert.Contains(t, statuses[1].Message, "held open by pid 4242")
			assert.Equal(t, 2, r.node.Calls(sim.MSetMigMode), "GPU 1's new mode is only set pending")

			st, pending := r.state(t, 1)
			assert.False(t, st.MigEnabled, "the workload keeps its GPU")
			assert.Equal(t, nvml.DEVICE_MIG_ENABLE, pending, "the next boot activates it")
			assert.Equal(t, [][]int{{0}}, r.changes)
		})
	}
}

func TestAmpereResetsOnlyWithPersistencedSuspended(t *testing.T) {
	r := newRig(t, "a100-40gb", 1)
	statuses, err := r.applier.Apply(context.Background(), mig.Builtin(), mig.LayoutAllMax)
	require.NoError(t, err)
	require.Equal(t, mig.ResultSuccess, statuses[0].Result, statuses[0].Message)
	assert.Equal(t, 1, r.node.Calls(sim.MResetGPU))
	assert.Equal(t, 1, r.node.Clients(0), "persistenced resumed")

	// Without suspension, persistenced holds the GPU (invisible in this /proc): NVML keeps a
	// Hopper mode change pending (activationStatus IN_USE), and so does the applier.
	h := newRig(t, "h100-80gb", 1)
	h.applier.Persistenced = nil
	statuses, err = h.applier.Apply(context.Background(), mig.Builtin(), mig.LayoutAllMax)
	require.NoError(t, err)
	assert.Equal(t, mig.ResultPending, statuses[0].Result)
	assert.Contains(t, statuses[0].Message, "NVML cannot unbind the GPU, it is in use")
	st, pending := h.state(t, 0)
	assert.False(t, st.MigEnabled, "the current mode stays")
	assert.Equal(t, nvml.DEVICE_MIG_ENABLE, pending, "the pending mode is kept")
}

// TestFaultMatrix fails each mutating call once, at each point it is made,
// and checks that the GPU ends in its previous layout.
func TestFaultMatrix(t *testing.T) {
	cfg, err := mig.Parse([]byte(custom))
	require.NoError(t, err)
	cfg = cfg.WithBuiltins()

	for _, tc := range []struct{ model, from, to string }{
		{"a100-80gb", "all-disabled", "all-balanced"},
		{"a100-80gb", "all-balanced", "all-disabled"},
		{"h100-80gb", "all-disabled", "compute-one"},
		{"h100-80gb", "asymmetric", "compute-one"},
		{"h100-80gb", "all-balanced", "filtered"},
	} {
		// A clean run counts the calls each method gets.
		clean := newRig(t, tc.model, 1)
		_, err := clean.applier.Apply(context.Background(), cfg, tc.from)
		require.NoError(t, err)
		prev, _ := clean.state(t, 0)
		clean.node.ResetCounters()
		_, err = clean.applier.Apply(context.Background(), cfg, tc.to)
		require.NoError(t, err)

		cases := 0
		for _, method := range sim.MutatingMethods {
			for nth := 1; nth <= clean.node.Calls(method); nth++ {
				cases++
				t.Run(fmt.Sprintf("%s/%s-to-%s/%s#%d", tc.model, tc.from, tc.to, method, nth), func(t *testing.T) {
					r := newRig(t, tc.model, 1)
					_, err := r.applier.Apply(context.Background(), cfg, tc.from)
					require.NoError(t, err)

					r.node.InjectFault(sim.Fault{Method: method, GPU: 0, Nth: nth, Ret: nvml.ERROR_UNKNOWN})
					statuses, err := r.applier.Apply(context.Background(), cfg, tc.to)
					require.NoError(t, err)

					if method == sim.MResetGPU {
						// A reset that fails leaves the mode pending for the next boot.
						assert.Equal(t, mig.ResultPendingReboot, statuses[0].Result)
						assert.Contains(t, statuses[0].Message, "reboot to finish")
						_, pending := r.state(t, 0)
						assert.NotEqual(t, prev.MigEnabled, pending == nvml.DEVICE_MIG_ENABLE, "the pending mode is kept")

						return
					}

					assert.Equal(t, mig.ResultFailed, statuses[0].Result)
					assert.Contains(t, statuses[0].Message, "rolled back to the previous layout", statuses[0].Message)

					st, pending := r.state(t, 0)
					assert.Equal(t, prev.String(), st.String())
					assert.Equal(t, st.MigEnabled, pending == nvml.DEVICE_MIG_ENABLE, "no mode left pending")
					assert.Equal(t, 1, r.node.Clients(0), "persistenced resumed")

					// The next start converges.
					statuses, err = r.applier.Apply(context.Background(), cfg, tc.to)
					require.NoError(t, err)
					assert.Equal(t, mig.ResultSuccess, statuses[0].Result, statuses[0].Message)
				})
			}
		}
		require.Greater(t, cases, 0)
	}
}

// TestBoardsThatCannotResetEndPendingReboot: in pass-through (activationStatus
// RESET_REQUIRED, no reset) and on an NVSwitch A100 board (no reset of one GPU), the new mode
// stays pending and is kept: pending-reboot, "reboot to finish". After a reboot the layout
// completes with instances only, and a GPU already in its layout gets no call.
func TestBoardsThatCannotResetEndPendingReboot(t *testing.T) {
	for _, tc := range []struct {
		name, model string
		board       sim.Board
	}{
		{"pass-through h100", "h100-80gb", sim.Board{PassThrough: true}},
		{"nvswitch a100", "a100-80gb", sim.Board{NoPerGPUReset: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, tc.model, 2)
			r.node.SetBoard(tc.board)

			statuses, err := r.applier.Apply(context.Background(), mig.Builtin(), mig.LayoutAllMax)
			require.NoError(t, err)

			for i, st := range statuses {
				assert.Equal(t, mig.ResultPendingReboot, st.Result, st.Message)
				assert.Contains(t, st.Message, "reboot to finish")
				assert.False(t, st.Changed)

				cur, pending := r.state(t, i)
				assert.False(t, cur.MigEnabled)
				assert.Equal(t, nvml.DEVICE_MIG_ENABLE, pending, "the pending mode is kept")
			}

			assert.Empty(t, r.changes, "nothing a workload sees changed")
			assert.Equal(t, 1, r.node.Clients(0), "persistenced resumed")

			r.node.Reboot()
			require.Equal(t, nvml.SUCCESS, r.node.Init())
			r.node.ResetCounters()

			statuses, err = r.applier.Apply(context.Background(), mig.Builtin(), mig.LayoutAllMax)
			require.NoError(t, err)

			for _, st := range statuses {
				assert.Equal(t, mig.ResultSuccess, st.Result, st.Message)
			}

			assert.Zero(t, r.node.Calls(sim.MSetMigMode))
			assert.Zero(t, r.node.Calls(sim.MResetGPU))
			assert.Equal(t, 4, r.node.MutatingCalls(), "one GPU and one compute instance per GPU")

			r.node.ResetCounters()
			_, err = r.applier.Apply(context.Background(), mig.Builtin(), mig.LayoutAllMax)
			require.NoError(t, err)
			assert.Zero(t, r.node.MutatingCalls())
		})
	}
}

// TestModeChangeThatMovesMinors: nvml.h allows a mode change to change the GPU's minor
// number; the applier finds the GPU again by UUID and completes the layout.
func TestModeChangeThatMovesMinors(t *testing.T) {
	r := newRig(t, "h200", 2)
	r.node.SetBoard(sim.Board{MinorsChangeOnReset: true})

	statuses, err := r.applier.Apply(context.Background(), mig.Builtin(), mig.LayoutAllBalanced)
	require.NoError(t, err)

	for i, st := range statuses {
		require.Equal(t, mig.ResultSuccess, st.Result, st.Message)
		got, _ := r.state(t, i)
		assert.Len(t, got.Instances, 4)
	}

	gpus, err := mig.ReadGPUs(r.node)
	require.NoError(t, err)
	assert.NotEqual(t, 0, gpus[0].Minor, "the minor moved")
	assert.Equal(t, [][]int{{0, 1}}, r.changes, "device nodes are redone for both")
}

// TestInstanceChangeWaitsForComputeProcesses: rearranging instances never destroys one a
// process runs on; the GPU is left alone and the process named.
func TestInstanceChangeWaitsForComputeProcesses(t *testing.T) {
	r := newRig(t, "h100-80gb", 1)
	_, err := r.applier.Apply(context.Background(), mig.Builtin(), mig.LayoutAllBalanced)
	require.NoError(t, err)

	r.node.SetProcesses(0, nvml.ProcessInfo{Pid: 999, GpuInstanceId: 1, ComputeInstanceId: 0})
	r.node.ResetCounters()

	statuses, err := r.applier.Apply(context.Background(), mig.Builtin(), mig.LayoutAllMax)
	require.NoError(t, err)
	assert.Equal(t, mig.ResultPending, statuses[0].Result)
	assert.Contains(t, statuses[0].Message, "its instances must change but the GPU is held open by pid 999")
	assert.Zero(t, r.node.MutatingCalls())
}

// TestPendingChangeIsCancelledWhileHeld: a GPU in MIG mode with a disable pending (asked for
// while held) takes a MIG layout without a reset: setting the current mode again needs no
// unbind, so the monitoring clients that hold it do not matter.
func TestPendingChangeIsCancelledWhileHeld(t *testing.T) {
	r := newRig(t, "h100-80gb", 1)
	_, err := r.applier.Apply(context.Background(), mig.Builtin(), mig.LayoutAllEnabled)
	require.NoError(t, err)

	r.node.Hold(sim.Holder{PID: 4200, Name: "dcgm-exporter", GPUs: []int{0}})
	host := t.TempDir()
	require.NoError(t, sim.WriteProcFS(host, r.node))
	r.applier.ProcRoot = filepath.Join(host, "proc")

	dev, _ := r.node.DeviceGetHandleByIndex(0)
	activation, ret := dev.SetMigMode(nvml.DEVICE_MIG_DISABLE)
	require.Equal(t, nvml.SUCCESS, ret)
	require.Equal(t, nvml.ERROR_IN_USE, activation)

	statuses, err := r.applier.Apply(context.Background(), mig.Builtin(), mig.LayoutAllMax)
	require.NoError(t, err)
	require.Equal(t, mig.ResultSuccess, statuses[0].Result, statuses[0].Message)

	st, pending := r.state(t, 0)
	assert.Equal(t, "MIG on: 7g.80gb@0[7g.80gb]", st.String())
	assert.Equal(t, nvml.DEVICE_MIG_ENABLE, pending, "the pending disable is gone")

	// Disabling for real does wait for the holder, named from /proc.
	statuses, err = r.applier.Apply(context.Background(), mig.Builtin(), mig.LayoutAllDisabled)
	require.NoError(t, err)
	assert.Equal(t, mig.ResultPending, statuses[0].Result)
	assert.Contains(t, statuses[0].Message, "MIG mode must change (enabled to disabled) but the GPU is held open by dcgm-exporter (pid 4200)")
}
