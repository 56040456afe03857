package main

import (
	"context"
	"log/slog"

	"github.com/talos-nvidia/nvidia-driver/pkg/config"
	"github.com/talos-nvidia/nvidia-driver/pkg/daemons"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu"
	"github.com/talos-nvidia/nvidia-driver/pkg/node"
)

// serve wires the node jobs together and runs them until ctx ends.
func serve(ctx context.Context, log *slog.Logger, cfg config.Config) error {
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
