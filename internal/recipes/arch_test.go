package recipes_test

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/talos-nvidia/nvidia-driver/internal/recipes"
	"github.com/talos-nvidia/nvidia-driver/pkg/driverroot"
)

// TestArchLoaderIsTheServices: the loader path the recipes put in the subroot of this
// test's architecture is the one its service looks for (pkg/driverroot layout_<arch>.go);
// make test-arm64 runs it as arm64 too.
func TestArchLoaderIsTheServices(t *testing.T) {
	for _, a := range recipes.Arches() {
		if a.Siderolabs == runtime.GOARCH {
			assert.Equal(t, driverroot.LoaderPath, a.Loader, "%s", a.Platform)

			return
		}
	}

	t.Fatalf("no recipe architecture for %s", runtime.GOARCH)
}
