package sim

import (
	"encoding/json"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NodeState is what a simulated node keeps across processes: what the kernel driver and the
// GPUs hold on a real node (MIG modes, instances, minors, fabric registration), so that
// several processes that load the simulated NVML (hack/sim-node/simnvml) see the same GPUs, as
// processes on a real node all see the driver's state. Per-process things are not part of
// it: NVML's init count, fault injection, call counters, holders and compute processes.
type NodeState struct {
	DriverVersion string `json:"driverVersion"`
	CudaVersion   int    `json:"cudaVersion"`
	Board         Board  `json:"board"`
	// Fabric is set on an NVSwitch board: whether the GPUs registered with the fabric.
	Fabric *FabricState `json:"fabric,omitempty"`
	GPUs   []GPUState   `json:"gpus"`
	// NextMinor is the minor the next reset gives where minors move (Board.MinorsChangeOnReset).
	NextMinor int `json:"nextMinor,omitempty"`
}

// FabricState is the NVSwitch fabric registration of a node's GPUs (see Fabric).
type FabricState struct {
	// Registered: a fabric manager ran and the GPUs completed registration, with Status.
	Registered bool        `json:"registered"`
	Status     nvml.Return `json:"status,omitempty"`
}

// GPUState is one GPU of a NodeState.
type GPUState struct {
	Model      string `json:"model"` // a key of pkg/gpu/models
	UUID       string `json:"uuid"`
	BusID      string `json:"busId"`
	Minor      int    `json:"minor"`
	MigMode    int    `json:"migMode"`
	PendingMig int    `json:"pendingMigMode"`
	// Generation counts the GPU's resets: a handle from before a reset is stale after it.
	Generation int             `json:"generation"`
	Instances  []GIStateRecord `json:"instances,omitempty"`
}

// GIStateRecord is one GPU instance of a GPUState.
type GIStateRecord struct {
	ID        int             `json:"id"`
	ProfileID uint32          `json:"profileId"`
	Start     uint32          `json:"start"`
	Size      uint32          `json:"size"`
	Compute   []CIStateRecord `json:"compute,omitempty"`
}

// CIStateRecord is one compute instance of a GIStateRecord.
type CIStateRecord struct {
	ID    int    `json:"id"`
	Start uint32 `json:"start"`
	Size  uint32 `json:"size"`
}

// SaveState returns the node's persistent state.
func (n *Node) SaveState() NodeState {
	n.mu.Lock()
	defer n.mu.Unlock()

	st := NodeState{
		DriverVersion: n.DriverVersion, CudaVersion: n.CudaVersion, NextMinor: n.nextMinor,
		Board: Board{PassThrough: n.passThrough, NoPerGPUReset: n.noPerGPUReset, MinorsChangeOnReset: n.minorsMoveReset},
	}

	if n.fabric != nil {
		registered := n.fabric.Manager != nil && n.fabric.Manager()
		st.Fabric = &FabricState{Registered: registered, Status: n.fabric.Status}
	}

	for _, g := range n.gpus {
		gs := GPUState{
			Model: g.model.Key, UUID: g.uuid, BusID: g.busID, Minor: g.minor,
			MigMode: g.mode, PendingMig: g.pending, Generation: g.generation,
		}

		for _, id := range g.giIDs() {
			s := g.gis[id]
			rec := GIStateRecord{ID: id, ProfileID: s.profile.Info.Id, Start: s.placement.Start, Size: s.placement.Size}

			for _, cid := range s.ciIDs() {
				c := s.cis[cid]
				rec.Compute = append(rec.Compute, CIStateRecord{ID: cid, Start: c.placement.Start, Size: c.placement.Size})
			}

			gs.Instances = append(gs.Instances, rec)
		}

		st.GPUs = append(st.GPUs, gs)
	}

	return st
}

// LoadState returns a node in the state st (from SaveState).
func LoadState(st NodeState) (*Node, error) {
	models := make([]ModelSpec, 0, len(st.GPUs))

	for i, g := range st.GPUs {
		m, err := LookupModel(g.Model)
		if err != nil {
			return nil, fmt.Errorf("GPU %d: %w", i, err)
		}

		models = append(models, m)
	}

	n := NewNode(models...)
	if st.DriverVersion != "" {
		n.DriverVersion = st.DriverVersion
	}

	if st.CudaVersion != 0 {
		n.CudaVersion = st.CudaVersion
	}

	n.SetBoard(st.Board)
	n.nextMinor = st.NextMinor

	if f := st.Fabric; f != nil {
		registered := f.Registered
		n.SetFabric(Fabric{Manager: func() bool { return registered }, Status: f.Status})
	}

	for i, gs := range st.GPUs {
		g := n.gpus[i]
		g.uuid, g.busID, g.minor = gs.UUID, gs.BusID, gs.Minor
		g.mode, g.pending, g.generation = gs.MigMode, gs.PendingMig, gs.Generation

		for _, rec := range gs.Instances {
			p, ok := profileByID(&g.model, rec.ProfileID)
			if !ok {
				return nil, fmt.Errorf("GPU %d: GPU instance %d: no profile id %d on %s", i, rec.ID, rec.ProfileID, g.model.Key)
			}

			s := &giState{id: rec.ID, profile: p, placement: nvml.GpuInstancePlacement{Start: rec.Start, Size: rec.Size}, cis: map[int]*ciState{}}

			for _, c := range rec.Compute {
				s.cis[c.ID] = &ciState{id: c.ID, size: c.Size, placement: nvml.ComputeInstancePlacement{Start: c.Start, Size: c.Size}}
			}

			g.gis[rec.ID] = s
		}
	}

	return n, nil
}

// MarshalState is SaveState as JSON.
func (n *Node) MarshalState() ([]byte, error) {
	return json.MarshalIndent(n.SaveState(), "", "  ")
}

// UnmarshalState is LoadState from JSON.
func UnmarshalState(data []byte) (*Node, error) {
	var st NodeState
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("simulated node state: %w", err)
	}

	return LoadState(st)
}

// Generation returns how often GPU index was reset: handles taken before its last reset are
// stale.
func (n *Node) Generation(index int) int {
	n.mu.Lock()
	defer n.mu.Unlock()

	if index < 0 || index >= len(n.gpus) {
		return -1
	}

	return n.gpus[index].generation
}
