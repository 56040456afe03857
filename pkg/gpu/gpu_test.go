package gpu_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/talos-nvidia/nvidia-driver/pkg/gpu"
)

func TestMPSCapable(t *testing.T) {
	for _, tc := range []struct {
		name string
		mig  []string // one GPU per entry: its MIG mode as gpu.Describe writes it
		want bool
	}{
		{"no GPU", nil, false},
		{"a GPU without MIG", []string{""}, true},
		{"MIG off", []string{"disabled", "disabled"}, true},
		{"MIG off until the next reset", []string{"disabled (pending enable)"}, true},
		{"MIG on one GPU of two", []string{"disabled", "enabled"}, false},
		{"MIG on until the next reset", []string{"enabled (pending disable)"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var gpus []gpu.GPU
			for i, m := range tc.mig {
				gpus = append(gpus, gpu.GPU{Index: i, MIG: m})
			}
			assert.Equal(t, tc.want, gpu.MPSCapable(gpus))
		})
	}
}
