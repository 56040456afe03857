// Package sim simulates a node's NVIDIA GPUs for the demo and the tests.
package sim

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// FromSpec returns simulated NVML for a spec MODEL:COUNT, e.g. h200:4.
func FromSpec(spec string) (nvml.Interface, error) {
	model, countText, ok := strings.Cut(spec, ":")

	count, err := strconv.Atoi(countText)
	if !ok || err != nil || count < 1 {
		return nil, fmt.Errorf("%q is not MODEL:COUNT", spec)
	}

	configs := map[string]gpus.Config{
		"h200":      gpus.H200_SXM5_141GB,
		"h100-80gb": gpus.H100_SXM5_80GB,
		"a100-40gb": gpus.A100_SXM4_40GB,
	}

	cfg, ok := configs[model]
	if !ok {
		return nil, fmt.Errorf("unknown simulated GPU model %q", model)
	}

	s, err := server.New(
		server.WithGPUs(gpus.Multiple(count, cfg)...),
		server.WithDriverVersion("580.159.04"),
		server.WithNVMLVersion("13.580.159.04"),
		server.WithCUDADriverVersion(13000),
	)
	if err != nil {
		return nil, fmt.Errorf("building simulated GPUs: %w", err)
	}

	return s, nil
}
