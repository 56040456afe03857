package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/talos-nvidia/nvidia-driver/pkg/config"
	"github.com/talos-nvidia/nvidia-driver/pkg/daemons"
	"github.com/talos-nvidia/nvidia-driver/pkg/node"
	"github.com/talos-nvidia/nvidia-driver/pkg/nvmljobs"
)

// nvmlJobStopWait is how long an NVML job has to stop when the service stops: within Talos's
// 10 s between SIGTERM and SIGKILL, with time left for the daemons. nvmlJobTimeout bounds a
// job but a MIG change: listing 8 GPUs or writing their CDI spec takes well under a second
// once the driver is up.
const (
	nvmlJobStopWait = 5 * time.Second
	nvmlJobTimeout  = 2 * time.Minute
)

// serve wires the node jobs together and runs them until ctx ends. The NVML work runs in
// child processes (`nvidia-driver nvml-job`), which log to stderr as the service does.
func serve(ctx context.Context, log *slog.Logger, cfg config.Config, stderr io.Writer) error {
	jobs, err := childJobs(cfg, stderr)
	if err != nil {
		return err
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

	return node.New(log, cfg, jobs).Run(ctx)
}

// childJobs runs NVML jobs in child processes of this binary (`nvidia-driver nvml-job`).
func childJobs(cfg config.Config, stderr io.Writer) (*nvmljobs.Child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding the service's own binary for its NVML jobs: %w", err)
	}

	return &nvmljobs.Child{
		Command:  []string{exe, nvmlJobCommand},
		Subroot:  cfg.Subroot,
		LogLevel: cfg.LogLevel,
		Stderr:   stderr,
		StopWait: nvmlJobStopWait,
		Timeout:  nvmlJobTimeout,
	}, nil
}
