// Command registry is distribution's registry with its filesystem storage driver alone, the
// Talos test node's image registry (hack/talos-node/registry.sh). distribution's own
// cmd/registry links its Azure, GCS and S3 drivers too, whose SDKs were 430 of the 1052
// packages this module built before (2026-12-05); the registry runs the same code
// (registry.RootCmd, "serve" with a configuration file).
package main

import (
	"os"

	"github.com/distribution/distribution/v3/registry"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
)

func main() {
	if err := registry.RootCmd.Execute(); err != nil {
		os.Exit(1)
	}
}
