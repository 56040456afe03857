package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/talos-nvidia/nvidia-driver/pkg/config"
	"github.com/talos-nvidia/nvidia-driver/pkg/fabricmanager"
)

// fabricManagerCommand runs the ext-nvidia-fabricmanager service (extension/nvidia-fabricmanager.yaml).
const fabricManagerCommand = "fabric-manager"

// fabricManagerPoll caps the waits of the fabric manager service: a stat of a few files.
const fabricManagerPoll = 5 * time.Second

// runFabricManager is the ext-nvidia-fabricmanager service. Its settings come from its own
// YAML's environment only (no ExtensionServiceConfig document reaches it); a bad one is
// reported and waited on like the main service's.
func runFabricManager(stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	cfg, err := config.Load(os.Environ())
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	log.Info("starting the fabric manager service", "version", version, "subroot", cfg.Subroot, "hostRoot", cfg.HostRoot)

	if err != nil {
		log.Error("not starting: the configuration is invalid; fix the service's environment", "error", err)
		<-ctx.Done()

		return 0
	}

	jobs, err := childJobs(cfg, stderr)
	if err != nil {
		log.Error("not starting", "error", err)
		<-ctx.Done()

		return 0
	}

	svc := fabricmanager.New(log, fabricmanager.Config{
		HostRoot: cfg.HostRoot, Subroot: cfg.Subroot, StartTimeout: cfg.FabricWait, PollMax: fabricManagerPoll,
	}, jobs)

	if err := svc.Run(ctx); err != nil {
		fmt.Fprintln(stderr, "fabric-manager:", err)
	}

	log.Info("stopped")

	return 0
}
