package node

import (
	"log/slog"
	"time"

	"github.com/talos-nvidia/nvidia-driver/pkg/gpu"
	"github.com/talos-nvidia/nvidia-driver/pkg/mig"
	"github.com/talos-nvidia/nvidia-driver/pkg/report"
)

// The status contract, version StatusContract: what the status and readiness files promise
// their readers (hack/gpu-host/e2e-gpu.sh, hack/k8s-node/*.sh, internal/harness, service tests, the
// docs' `talosctl read`, people), in one place:
//   - the status file is at StatusPath (config.StatusFile under the host root), written whole
//     and atomically on every change, as the JSON of Status;
//   - its top-level field names are Status's JSON tags, those after subroot left out while
//     unknown; fabric has state (the Fabric* strings, fabric.go) and message;
//   - phase is one of the Phase* strings;
//   - the message of a node that is up starts "node ready: " or "node degraded: " and names
//     the node's conditions (Up.Derive);
//   - the readiness files, driverroot.ReadyFile (the readinessSummary JSON) and
//     driverroot.OperatorReadyFile, are in ReadinessDir (config.ValidationsDir) while the
//     node serves its GPUs.
//
// Adding a field, a condition or a clause to a message keeps the version; renaming or
// removing a field or a phase, or moving a file, needs the next one, with its readers changed
// in the same commit. TestStatusContract holds the code to this.
const StatusContract = 1

// Where the contract's files are on the node. The config package, which this one imports,
// builds the same paths under the host root: a test holds the two together.
const (
	StatusPath   = "/run/nvidia-driver/status.json"
	ReadinessDir = "/run/nvidia/validations"
)

// Phases of the node, in the order a healthy bring-up passes them.
//
// A fault that can clear by itself is never failed: before the node serves its GPUs it waits,
// retrying ("waiting for …" or "retrying …: why"), since nothing is served yet; once it serves
// them, what it only adds (the NFD labels) degrades it, retried, since the GPUs are served
// all the same. Failed is kept for what no retry can clear.
const (
	PhaseStarting = "starting"
	// PhaseWaiting: for something outside the service (the kernel driver, a GPU), or
	// retrying a step of its own that a fault on the host path stops (a link where a directory
	// belongs, a read-only /run): the driver root's mount, the /dev bind, the readiness files.
	PhaseWaiting = "waiting"
	// PhaseFailed: needs a person and is not retried (a broken subroot, a module flavor that
	// cannot drive the GPUs, a bad document): the message says what.
	PhaseFailed   = "failed"
	PhaseReady    = "ready"
	PhaseDegraded = "degraded" // up and serving its GPUs, without something the message names
	PhaseStopped  = "stopped"
)

// Status is what the service reports, in its log and as JSON in the status file.
type Status struct {
	Phase         string       `json:"phase"`
	Message       string       `json:"message"`
	Updated       time.Time    `json:"updated"`
	Subroot       string       `json:"subroot"`
	DriverVersion string       `json:"driverVersion,omitempty"`
	DriverRoot    string       `json:"driverRoot,omitempty"` // the mount, once made
	GPUs          []gpu.GPU    `json:"gpus,omitempty"`
	DeviceNodes   int          `json:"deviceNodes,omitempty"`
	MIG           []mig.Status `json:"mig,omitempty"`
	Persistenced  string       `json:"persistenced,omitempty"`
	Fabric        *Fabric      `json:"fabric,omitempty"`
	CDISpec       string       `json:"cdiSpec,omitempty"`
}

// newStatus is the node's status, kept in its file; a report logs at its phase's level.
func newStatus(log *slog.Logger, path, subroot string) *report.Status[Status] {
	return report.New(log, path, Status{Subroot: subroot}, report.Shape[Status]{
		Key:    "phase",
		Set:    func(s *Status, phase, msg string) { s.Phase, s.Message = phase, msg },
		Stamp:  func(s *Status, at time.Time) { s.Updated = at },
		Levels: map[string]slog.Level{PhaseFailed: slog.LevelError, PhaseWaiting: slog.LevelWarn, PhaseDegraded: slog.LevelWarn},
	})
}

// ReportInvalidConfig writes the status of a service whose configuration did not load: failed,
// with the error, and nothing else, because nothing was done.
func ReportInvalidConfig(path, subroot string, err error) error {
	return newStatus(slog.New(slog.DiscardHandler), path, subroot).Write(func(st *Status) {
		st.Phase = PhaseFailed
		st.Message = err.Error() + "\nnothing was changed; the service waits for a corrected ExtensionServiceConfig (Talos restarts it when the document changes)"
	})
}
