package memory_test

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/pkg/memory"
)

// sink keeps the allocation from being optimized away.
var sink []byte

// TestReleaseGivesBackHeapAndFilePages: after a bring-up's worth of garbage, Release returns
// the Go heap's free pages and the executable's resident pages to the kernel.
func TestReleaseGivesBackHeapAndFilePages(t *testing.T) {
	const garbage = 64 << 20

	sink = make([]byte, garbage)
	for i := range sink {
		sink[i] = byte(i)
	}

	sink = nil

	fileBefore := rssFileKiB(t)

	rel, err := memory.Release()
	require.NoError(t, err)

	t.Logf("RSS %d kB before, %d kB after; file-backed %d kB before, %d kB after", rel.BeforeKiB, rel.AfterKiB, fileBefore, rssFileKiB(t))
	assert.Less(t, rel.AfterKiB, rel.BeforeKiB-garbage/1024/2, "the freed heap is given back")
	assert.Less(t, rssFileKiB(t), fileBefore, "file pages are paged out")
}

func rssFileKiB(t *testing.T) int {
	t.Helper()

	data, err := os.ReadFile("/proc/self/status")
	require.NoError(t, err)

	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "RssFile:"); ok {
			n, err := strconv.Atoi(strings.Fields(v)[0])
			require.NoError(t, err)

			return n
		}
	}

	t.Fatal("no RssFile in /proc/self/status")

	return 0
}
