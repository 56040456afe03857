// Command kubelet-e2e plays the two parts of a node that hack/gpu-host/e2e-gpu.sh needs in order to run
// NVIDIA's device plugin and GPU feature discovery the way a Kubernetes node runs them,
// without a Kubernetes node:
//
//	kubelet-e2e oci --manifest FILE --daemonset NAME --container NAME --rootfs DIR --bundle DIR
//	    [--volumes DIR] [--node NAME] [--env K=V ...] [--unset K ...] [--bind SRC:DST[:ro] ...]
//	    [--file VOLUME/NAME=CONFIGMAP/KEY ...]
//	  turns one container of a rendered DaemonSet into a runc bundle config, as the kubelet
//	  and containerd's CRI plugin turn a pod's container into an OCI spec (privileged, the
//	  pod's hostPath volumes with their mountPropagation, emptyDir and configMap volumes).
//
//	kubelet-e2e plugin --dir /var/lib/kubelet/device-plugins --out FILE [--allocate N] [--timeout D]
//	  serves the kubelet's device-plugin registration socket, and when a plugin registers,
//	  does what the kubelet's device manager does with it: GetDevicePluginOptions,
//	  ListAndWatch, and one Allocate of N healthy devices (the kubelet's Allocate for a
//	  container that asks for N). It writes what it saw as JSON and exits.
//
// The other steps of the test (CDI injection into workload containers, spec checks) are in
// hack/gpu-host/cdi-e2e.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: kubelet-e2e oci|plugin ...")
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	var err error

	switch os.Args[1] {
	case "oci":
		err = ociCommand(os.Args[2:])
	case "plugin":
		err = pluginCommand(ctx, os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}

	if err != nil {
		fmt.Fprintln(os.Stderr, "kubelet-e2e:", err)
		os.Exit(1)
	}
}
