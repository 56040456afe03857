package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/talos-nvidia/nvidia-driver/pkg/config"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu/sim"
	"github.com/talos-nvidia/nvidia-driver/pkg/node"
)

// serve wires the node jobs together and runs them until ctx ends.
func serve(ctx context.Context, log *slog.Logger, cfg config.Config) error {
	lib, err := openNVML(log, cfg)
	if err != nil {
		return err
	}

	return node.New(log, cfg, lib).Run(ctx)
}

// openNVML returns the subroot's NVML, or, for the demo, simulated GPUs whose /proc files
// are written under the throwaway host root.
func openNVML(log *slog.Logger, cfg config.Config) (nvml.Interface, error) {
	if cfg.Simulate == "" {
		return gpu.FromSubroot(cfg.Subroot), nil
	}

	lib, err := sim.FromSpec(cfg.Simulate)
	if err != nil {
		return nil, fmt.Errorf("simulate: %w", err)
	}

	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("simulate: %w", ret)
	}
	defer lib.Shutdown() //nolint:errcheck

	if err := sim.WriteProcFS(cfg.HostRoot, lib); err != nil {
		return nil, err
	}

	log.Warn("using simulated GPUs", "spec", cfg.Simulate)

	return lib, nil
}
