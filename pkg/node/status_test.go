package node_test

import (
	"encoding/json"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/pkg/config"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu"
	"github.com/talos-nvidia/nvidia-driver/pkg/mig"
	"github.com/talos-nvidia/nvidia-driver/pkg/node"
)

// jsonKeys returns the top-level keys of v's JSON.
func jsonKeys(t *testing.T, v any) []string {
	t.Helper()

	b, err := json.Marshal(v)
	require.NoError(t, err)

	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(b, &m))

	return slices.Sorted(maps.Keys(m))
}

// TestStatusContract: the status file's paths, field names and phase strings are what its
// readers (hack/ scripts, the harness, the docs) read. A change here breaks them: it needs
// the next node.StatusContract and the readers changed with it.
func TestStatusContract(t *testing.T) {
	require.Equal(t, 1, node.StatusContract, "a new version: update the readers, then this test")

	var host config.Config // no host root: the paths as on the node

	assert.Equal(t, host.StatusFile(), node.StatusPath)
	assert.Equal(t, host.ValidationsDir(), node.ReadinessDir)

	assert.Equal(t, []string{"starting", "waiting", "failed", "ready", "degraded", "stopped"},
		[]string{node.PhaseStarting, node.PhaseWaiting, node.PhaseFailed, node.PhaseReady, node.PhaseDegraded, node.PhaseStopped})
	assert.Equal(t, []string{"registered", "waiting", "degraded"}, []string{node.FabricRegistered, node.FabricWaiting, node.FabricDegraded})

	full := node.Status{
		Phase: node.PhaseDegraded, Message: "node degraded: 1 GPU(s), driver 1", Updated: time.Unix(0, 0), Subroot: "/usr/local/glibc",
		DriverVersion: "1", DriverRoot: "/run/nvidia/driver", GPUs: []gpu.GPU{{}}, DeviceNodes: 3, MIG: []mig.Status{{}},
		Persistenced: "ready", Fabric: &node.Fabric{State: node.FabricDegraded}, CDISpec: "/run/cdi/nvidia.yaml",
	}
	assert.Equal(t, []string{"cdiSpec", "deviceNodes", "driverRoot", "driverVersion", "fabric", "gpus", "message", "mig", "persistenced", "phase", "subroot", "updated"},
		jsonKeys(t, full))
	assert.Equal(t, []string{"message", "phase", "subroot", "updated"}, jsonKeys(t, node.Status{}), "only these while nothing is known")
	assert.Subset(t, jsonKeys(t, full.Fabric), []string{"state", "message"})
}
