//go:build !simulate

package main

import (
	"context"
	"errors"
	"log/slog"

	"github.com/talos-nvidia/nvidia-driver/pkg/config"
)

// takeSimulation leaves the environment as it is: the product has no simulated GPUs, so
// NVIDIA_DRIVER_SIMULATE is an unknown setting like any other (see simulate.go).
func takeSimulation(env []string) ([]string, string) { return env, "" }

func serveSimulated(context.Context, *slog.Logger, config.Config, string) error {
	return errors.New("this build has no simulated GPUs")
}
