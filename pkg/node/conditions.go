package node

// The phase and message of a node that is up are derived from its conditions, as Talos's
// health package derives a service's health from its checks: each part that can degrade
// the node says, as data, whether it does and why, and one function (Up.Derive) composes
// the status from them. Nothing rewrites a message that another part composed.

import (
	"fmt"
	"strings"
)

// Names of the conditions of an up node, in the order its message names them.
const (
	ConditionMIG          = "mig"
	ConditionCDI          = "cdi"
	ConditionReadiness    = "readiness"
	ConditionFabric       = "fabric"
	ConditionPersistenced = "persistenced"
	ConditionLabels       = "labels"
)

// Condition is one part of an up node that can degrade it.
type Condition struct {
	Name string
	// Problem says why the node is degraded by it; "" when it is not.
	Problem string
	// Note is what the message says of it while it is fine (the MIG layout's outcome, the
	// fabric's registration); "" says nothing.
	Note string
}

// OK reports whether the condition leaves the node ready.
func (c Condition) OK() bool { return c.Problem == "" }

// Up is what the status of a node that serves its GPUs derives from.
type Up struct {
	GPUs          int
	DriverVersion string
	Conditions    []Condition
}

// Derive returns the phase and message of the up node: ready when every condition is OK,
// else degraded. The message names the GPUs and the driver, then each condition in order:
// a note after ", ", a problem after "; ", so that what degrades the node reads apart from
// what is only said. Scripts and people grep its "node ready"/"node degraded" head.
func (u Up) Derive() (phase, message string) {
	phase, head := PhaseReady, "node ready"

	for _, c := range u.Conditions {
		if !c.OK() {
			phase, head = PhaseDegraded, "node degraded"

			break
		}
	}

	var b strings.Builder

	fmt.Fprintf(&b, "%s: %d GPU(s), driver %s", head, u.GPUs, u.DriverVersion)

	for _, c := range u.Conditions {
		switch {
		case !c.OK():
			b.WriteString("; " + c.Problem)
		case c.Note != "":
			b.WriteString(", " + c.Note)
		}
	}

	return phase, b.String()
}
