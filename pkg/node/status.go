package node

import (
	"time"

	"github.com/talos-nvidia/nvidia-driver/pkg/atomicfile"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu"
	"github.com/talos-nvidia/nvidia-driver/pkg/mig"
)

// Phases of the node, in the order a healthy bring-up passes them.
const (
	PhaseStarting = "starting"
	PhaseWaiting  = "waiting" // for something outside the service: the kernel driver, a GPU
	PhaseFailed   = "failed"  // needs a person: the message says what
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

// statusFile keeps the latest status and writes it whole on every change.
type statusFile struct{ *atomicfile.JSONFile[Status] }

func newStatusFile(path, subroot string) *statusFile {
	return &statusFile{atomicfile.NewJSONFile(path, Status{Subroot: subroot})}
}

func (s *statusFile) update(f func(*Status)) (Status, error) {
	return s.Update(func(st *Status) { f(st); st.Updated = time.Now().UTC() })
}

func (s *statusFile) get() Status { return s.Get() }

// ReportInvalidConfig writes the status of a service whose configuration did not load: failed,
// with the error, and nothing else, because nothing was done.
func ReportInvalidConfig(path, subroot string, err error) error {
	s := newStatusFile(path, subroot)

	_, werr := s.update(func(st *Status) {
		st.Phase = PhaseFailed
		st.Message = err.Error() + "\nnothing was changed; the service waits for a corrected ExtensionServiceConfig (Talos restarts it when the document changes)"
	})

	return werr
}
