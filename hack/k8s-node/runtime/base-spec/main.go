// Command base-spec prints the OCI base runtime spec that Talos gives containerd's CRI runc
// runtime (base_runtime_spec = "/etc/cri/conf.d/base-spec.json" in Talos v1.13 hack/cri-plugin.part).
//
// As Talos's files.CRIBaseRuntimeSpecController (internal/app/machined/pkg/controllers/files/
// cri_base_runtime_spec.go) makes it with no machine-config overrides: containerd's own default
// spec for the k8s.io namespace and this platform, with the default rlimits removed.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/platforms"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "base-spec:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx := namespaces.WithNamespace(context.Background(), "k8s.io")
	spec, err := oci.GenerateSpecWithPlatform(ctx, nil, platforms.DefaultString(), &containers.Container{})
	if err != nil {
		return fmt.Errorf("generating containerd's default spec: %w", err)
	}
	// Talos: "compatibility with CRI defaults: remove default rlimits" (containerd/cri#515).
	spec.Process.Rlimits = nil
	out, err := json.Marshal(spec)
	if err != nil {
		return fmt.Errorf("encoding the spec: %w", err)
	}
	_, err = os.Stdout.Write(out)
	return err
}
