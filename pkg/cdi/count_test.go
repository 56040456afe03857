package cdi_test

import (
	"fmt"
	"regexp"
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
	"github.com/talos-nvidia/nvidia-driver/pkg/cdi"
)

var gpuNode = regexp.MustCompile(`^/dev/nvidia[0-9]+$`)

// TestSpecForAnyGPUCount: for 1, 3 and 8 simulated GPUs (an HGX board has eight) the spec
// has a device per index and per UUID that holds exactly that GPU's node, and "all" holds
// every GPU's node: nothing assumes one or two GPUs.
func TestSpecForAnyGPUCount(t *testing.T) {
	for _, count := range []int{1, 3, 8} {
		t.Run(fmt.Sprintf("%d GPUs", count), func(t *testing.T) {
			lib, host := simulatedNode(t, fmt.Sprintf("h200:%d", count))

			s, err := cdi.Generate(quiet, lib, options(t, host))
			require.NoError(t, err)

			nodes := map[string][]string{}
			for _, d := range s.Raw().Devices {
				for _, n := range d.ContainerEdits.DeviceNodes {
					if gpuNode.MatchString(n.Path) {
						nodes[d.Name] = append(nodes[d.Name], n.Path)
					}
				}
			}

			uuids := simulatedUUIDs(t, lib)
			require.Len(t, uuids, count)
			assert.Len(t, nodes, 2*count+1, "a device per index, per UUID, and all")

			var all []string

			for i, u := range uuids {
				want := []string{fmt.Sprintf("/dev/nvidia%d", i)}
				assert.Equal(t, want, nodes[fmt.Sprint(i)], "device %d", i)
				assert.Equal(t, want, nodes[u], "device %s", u)

				all = append(all, want[0])
			}

			got := nodes["all"]
			sort.Strings(got)
			sort.Strings(all)
			assert.Equal(t, all, got)
		})
	}
}

// BenchmarkGenerateByGPUCount: spec generation on one and eight simulated GPUs, for the
// scaling on an HGX board (issue 14); compare the two in one run.
func BenchmarkGenerateByGPUCount(b *testing.B) {
	for _, count := range []int{1, 8} {
		b.Run(fmt.Sprintf("gpus=%d", count), func(b *testing.B) {
			lib, host := simulatedNode(b, fmt.Sprintf("h200:%d", count))
			o := cdi.DefaultOptions(testutil.Subroot(b))
			o.DevRoot = host

			b.ReportAllocs()

			for b.Loop() {
				if _, err := cdi.Generate(quiet, lib, o); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
