//go:build simulate

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/talos-nvidia/nvidia-driver/internal/sim"
	"github.com/talos-nvidia/nvidia-driver/pkg/config"
	"github.com/talos-nvidia/nvidia-driver/pkg/driverroot"
	"github.com/talos-nvidia/nvidia-driver/pkg/node"
	"github.com/talos-nvidia/nvidia-driver/pkg/nvmljobs"
)

// The demo build (go build -tags simulate, `make demo`) runs the service on simulated GPUs
// named by NVIDIA_DRIVER_SIMULATE=MODEL:COUNT. The product is built without this file: there
// the variable is an unknown setting, and neither the simulator nor go-nvml's mocks are in
// the binary.
const simulateEnv = "NVIDIA_DRIVER_SIMULATE"

// takeSimulation removes NVIDIA_DRIVER_SIMULATE from env (the configuration does not know it)
// and returns its value.
func takeSimulation(env []string) ([]string, string) {
	out := make([]string, 0, len(env))
	spec := ""

	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, simulateEnv+"="); ok {
			spec = v

			continue
		}

		out = append(out, kv)
	}

	return out, spec
}

// serveSimulated runs the node jobs on simulated GPUs, whose /proc files are written under the
// throwaway host root as a loaded driver would offer them.
func serveSimulated(ctx context.Context, log *slog.Logger, cfg config.Config, spec string) error {
	if cfg.HostRoot == "/" {
		return errors.New(simulateEnv + ": simulated GPUs need a throwaway host root (NVIDIA_DRIVER_HOST_ROOT), not the node's /")
	}

	simNode, err := sim.FromSpec(spec)
	if err != nil {
		return fmt.Errorf("%s: %w", simulateEnv, err)
	}

	// nvcdi finds the driver's libraries by the version NVML reports: the subroot's.
	if v := driverroot.Check(cfg.Subroot).DriverVersion; v != "" {
		simNode.DriverVersion = v
	}

	writeProc := func() error {
		if ret := simNode.Init(); ret != nvml.SUCCESS {
			return fmt.Errorf("simulate: %w", ret)
		}
		defer simNode.Shutdown() //nolint:errcheck

		return sim.WriteProcFS(cfg.HostRoot, simNode)
	}

	if err := writeProc(); err != nil {
		return err
	}

	log.Warn("using simulated GPUs", "spec", spec)

	// In this process: the simulated GPUs' state (MIG) lives in it, where a child's would be
	// lost with the child.
	jobs := &nvmljobs.Local{Log: log, NVML: simNode, Resetter: simNode, AfterMIGChange: writeProc}

	return node.New(log, cfg, jobs).Run(ctx)
}
