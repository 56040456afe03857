package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/talos-nvidia/nvidia-driver/hack/gpu-host/consumers/kubeletdp"
)

func pluginCommand(ctx context.Context, args []string) error {
	f := flag.NewFlagSet("plugin", flag.ContinueOnError)
	dir := f.String("dir", pluginapi.DevicePluginPath, "the kubelet's device-plugin directory")
	out := f.String("out", "", "write the report there (default stdout)")
	n := f.Int("allocate", 1, "devices to allocate, as for a container that asks for N")
	timeout := f.Duration("timeout", 90*time.Second, "give up after this long")

	if err := f.Parse(args); err != nil {
		return err
	}

	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	report, err := kubeletdp.Serve(ctx, *dir, *n)
	if report != nil {
		kubeletdp.PrintSummary(os.Stderr, report)
	}

	if err != nil {
		return err
	}

	data, err := json.MarshalIndent(report, "", "  ")
	if err != nil {
		return err
	}

	if *out == "" {
		_, err = fmt.Println(string(data))

		return err
	}

	return os.WriteFile(*out, append(data, '\n'), 0o644)
}
