// Command nfd-features writes the service's Node Feature Discovery feature file for the
// one-node test cluster (hack/k8s-node/test-cpu.sh), with the same calls that pkg/node
// makes when NVIDIA_DRIVER_NFD_FEATURES_DIR is set (nfd.NewWriter with nfd.DefaultName, then
// Write of nfd.MIGLabels, with nfd.WithMPSCapable where the node has GPUs), so the file is
// byte for byte the service's.
//
// Usage: nfd-features DIR MIG-LAYOUT MIG-STATE GPU-PRODUCT [MPS-CAPABLE]
// (MPS-CAPABLE true or false; left out, the file has no mps.capable label, as the service
// writes it before it has seen a GPU).
package main

import (
	"fmt"
	"os"
	"strconv"

	"github.com/talos-nvidia/nvidia-driver/pkg/nfd"
)

const usage = "usage: nfd-features DIR MIG-LAYOUT MIG-STATE GPU-PRODUCT [MPS-CAPABLE]"

func main() {
	if len(os.Args) != 5 && len(os.Args) != 6 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	labels := nfd.MIGLabels(os.Args[2], os.Args[3], os.Args[4])
	if len(os.Args) == 6 {
		capable, err := strconv.ParseBool(os.Args[5])
		if err != nil {
			fmt.Fprintf(os.Stderr, "nfd-features: MPS-CAPABLE %q: %v\n%s\n", os.Args[5], err, usage)
			os.Exit(2)
		}
		labels = nfd.WithMPSCapable(labels, capable)
	}
	w, err := nfd.NewWriter(os.Args[1], nfd.DefaultName)
	if err == nil {
		err = w.Write(labels)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "nfd-features:", err)
		os.Exit(1)
	}
}
