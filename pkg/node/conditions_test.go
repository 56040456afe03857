package node_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/talos-nvidia/nvidia-driver/pkg/node"
)

// TestUpDerive: each combination of conditions gives the phase and message the status file
// says, byte for byte: the "node ready"/"node degraded" head that scripts and docs grep, the
// notes after ", " and the problems after "; ", in the conditions' order.
func TestUpDerive(t *testing.T) {
	const head = ": 2 GPU(s), driver 570.172.08"

	var (
		migOK       = node.Condition{Name: node.ConditionMIG, Note: `MIG layout "first-three": success`}
		migFailed   = node.Condition{Name: node.ConditionMIG, Problem: `MIG layout "split": failed (GPU 1 failed: rolled back)`}
		migUnusable = node.Condition{Name: node.ConditionMIG, Problem: `MIG layout "frist-two" not applied, the GPUs are served as they are: no layout "frist-two"`}
		cdiOK       = node.Condition{Name: node.ConditionCDI}
		cdiNone     = node.Condition{Name: node.ConditionCDI, Problem: "no device to serve: GPU 0,1 in MIG mode without MIG instances"}
		fabricOK    = node.Condition{Name: node.ConditionFabric, Note: "NVLink fabric: 8 GPU(s) registered with the NVLink fabric by nv-fabricmanager"}
		fabricBad   = node.Condition{Name: node.ConditionFabric, Problem: "NVLink fabric degraded: no fabric manager runs"}
		noFabric    = node.Condition{Name: node.ConditionFabric}
		pstOK       = node.Condition{Name: node.ConditionPersistenced}
		pstDown     = node.Condition{Name: node.ConditionPersistenced, Problem: "nvidia-persistenced is not running (restarting: exit status 1)"}
	)

	for _, tc := range []struct {
		name  string
		conds []node.Condition
		phase string
		msg   string
	}{
		{"no conditions", nil, node.PhaseReady, "node ready" + head},
		{"all OK, nothing to say", []node.Condition{{Name: node.ConditionMIG}, cdiOK, noFabric, pstOK}, node.PhaseReady, "node ready" + head},
		{"notes only", []node.Condition{migOK, cdiOK, fabricOK, pstOK}, node.PhaseReady,
			`node ready` + head + `, MIG layout "first-three": success, NVLink fabric: 8 GPU(s) registered with the NVLink fabric by nv-fabricmanager`},
		{"MIG layout unusable", []node.Condition{migUnusable, cdiOK, noFabric, pstOK}, node.PhaseDegraded,
			`node degraded` + head + `; MIG layout "frist-two" not applied, the GPUs are served as they are: no layout "frist-two"`},
		{"MIG layout failed on a GPU", []node.Condition{migFailed, cdiOK, noFabric, pstOK}, node.PhaseDegraded,
			`node degraded` + head + `; MIG layout "split": failed (GPU 1 failed: rolled back)`},
		{"no device to serve", []node.Condition{{Name: node.ConditionMIG}, cdiNone, noFabric, pstOK}, node.PhaseDegraded,
			"node degraded" + head + "; no device to serve: GPU 0,1 in MIG mode without MIG instances"},
		{"a note, then the fabric's problem", []node.Condition{migOK, cdiOK, fabricBad, pstOK}, node.PhaseDegraded,
			`node degraded` + head + `, MIG layout "first-three": success; NVLink fabric degraded: no fabric manager runs`},
		{"the last condition alone degrades the node", []node.Condition{migOK, cdiOK, fabricOK, pstDown}, node.PhaseDegraded,
			`node degraded` + head + `, MIG layout "first-three": success, NVLink fabric: 8 GPU(s) registered with the NVLink fabric by nv-fabricmanager` +
				`; nvidia-persistenced is not running (restarting: exit status 1)`},
		{"every problem, in order", []node.Condition{migFailed, cdiNone, fabricBad, pstDown}, node.PhaseDegraded,
			`node degraded` + head + `; MIG layout "split": failed (GPU 1 failed: rolled back); no device to serve: GPU 0,1 in MIG mode without MIG instances` +
				`; NVLink fabric degraded: no fabric manager runs; nvidia-persistenced is not running (restarting: exit status 1)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			phase, msg := node.Up{GPUs: 2, DriverVersion: "570.172.08", Conditions: tc.conds}.Derive()

			assert.Equal(t, tc.phase, phase)
			assert.Equal(t, tc.msg, msg)
		})
	}
}
