// Command nfd-features writes the service's Node Feature Discovery feature file for the
// one-node test cluster (hack/k8s-node/test-cpu.sh), with the same two calls that pkg/node
// makes when NVIDIA_DRIVER_NFD_FEATURES_DIR is set (nfd.NewWriter with nfd.DefaultName, then
// Write of nfd.MIGLabels), so the file is byte for byte the service's.
//
// Usage: nfd-features DIR MIG-LAYOUT MIG-STATE GPU-PRODUCT
package main

import (
	"fmt"
	"os"

	"github.com/talos-nvidia/nvidia-driver/pkg/nfd"
)

func main() {
	if len(os.Args) != 5 {
		fmt.Fprintln(os.Stderr, "usage: nfd-features DIR MIG-LAYOUT MIG-STATE GPU-PRODUCT")
		os.Exit(2)
	}
	w, err := nfd.NewWriter(os.Args[1], nfd.DefaultName)
	if err == nil {
		err = w.Write(nfd.MIGLabels(os.Args[2], os.Args[3], os.Args[4]))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "nfd-features:", err)
		os.Exit(1)
	}
}
