package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/talos-nvidia/nvidia-driver/pkg/config"
	"github.com/talos-nvidia/nvidia-driver/pkg/daemons"
	"github.com/talos-nvidia/nvidia-driver/pkg/driverroot"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu/sim"
	"github.com/talos-nvidia/nvidia-driver/pkg/node"
)

// serve wires the node jobs together and runs them until ctx ends.
func serve(ctx context.Context, log *slog.Logger, cfg config.Config) error {
	if cfg.Simulate != "" {
		return serveSimulated(ctx, log, cfg)
	}

	// nvidia-persistenced logs only to syslog. Read /dev/log ourselves, so its lines show in
	// `talosctl logs ext-nvidia-driver`, unless a syslog reader already serves it (then its
	// lines go there). The reader outlives the runner so that the daemon's last lines get in.
	if cfg.Persistenced {
		sink, err := daemons.ListenSyslog(log, cfg.Host("/dev/log"))
		if err != nil {
			log.Info("nvidia-persistenced's syslog lines go to the node's syslog reader", "reason", err)
		} else {
			sinkCtx, stopSink := context.WithCancel(context.Background())
			done := make(chan struct{})

			go func() {
				defer close(done)

				if err := sink.Serve(sinkCtx); err != nil {
					log.Warn("syslog reader stopped", "error", err)
				}
			}()

			defer func() { stopSink(); <-done }()
		}
	}

	return node.New(log, cfg, gpu.FromSubroot(cfg.Subroot)).Run(ctx)
}

// serveSimulated runs the node jobs on simulated GPUs (the demo), whose /proc files are
// written under the throwaway host root as a loaded driver would offer them.
func serveSimulated(ctx context.Context, log *slog.Logger, cfg config.Config) error {
	simNode, err := sim.FromSpec(cfg.Simulate)
	if err != nil {
		return fmt.Errorf("simulate: %w", err)
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

	log.Warn("using simulated GPUs", "spec", cfg.Simulate)

	return node.New(log, cfg, simNode, node.WithSimulatedProc(writeProc), node.WithResetter(simNode)).Run(ctx)
}
