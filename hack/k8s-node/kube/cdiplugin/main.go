// Command cdiplugin is a test device plugin that serves the devices of one CDI spec file to
// pods by their CDI names, so that a pod gets them through the kubelet and containerd as
// any device plugin's devices (the device plugin API's ContainerAllocateResponse.cdi_devices,
// KEP-4009: kubelet pkg/kubelet/kuberuntime/kuberuntime_container.go makeCDIDevices puts
// them in the CRI request's CDIDevices; containerd internal/cri/opts/spec_linux.go WithCDI
// resolves them from its CDI spec directories).
//
// It exists because no upstream component names the devices of the nvidia-driver service's
// own spec (/run/cdi/nvidia.yaml, nvidia.com/gpu=N) for a pod: NVIDIA's device plugin names
// its own spec's (vendor k8s.device-plugin.nvidia.com, hard-coded in v0.19.0
// cmd/nvidia-device-plugin/plugin-manager.go), the kubelet passes a container no annotation
// of the pod's (pkg/kubelet/kuberuntime/labels.go newContainerAnnotations: the device
// plugins' only), and containerd reads CDI annotations from the container's CRI config
// alone (WithCDI). A DRA driver or another device plugin is what would name them on a
// cluster; this is the smallest such plugin, for the simulated node's check
// (hack/sim-node/test-sim.sh). It is never part of the product.
//
//	cdiplugin -spec /run/cdi/nvidia.yaml -resource test.nvidia-driver/cdi-gpu
//
// It advertises the spec's devices whose names are GPU indices, all healthy, registers with
// the kubelet and serves until it is killed.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"sigs.k8s.io/yaml"
)

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(os.Args[1:], log); err != nil {
		log.Error("cdiplugin", "error", err)
		os.Exit(1)
	}
}

func run(args []string, log *slog.Logger) error {
	fs := flag.NewFlagSet("cdiplugin", flag.ContinueOnError)
	specPath := fs.String("spec", "/run/cdi/nvidia.yaml", "the CDI spec whose devices to serve")
	resource := fs.String("resource", "test.nvidia-driver/cdi-gpu", "the extended resource name")

	if err := fs.Parse(args); err != nil {
		return err
	}

	kind, ids, err := readSpec(*specPath)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	socket := filepath.Join(pluginapi.DevicePluginPath, "cdiplugin.sock")
	if err := os.Remove(socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing an old %s: %w", socket, err)
	}

	lis, err := net.Listen("unix", socket)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", socket, err)
	}

	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, &plugin{kind: kind, ids: ids, ctx: ctx, log: log})

	go srv.Serve(lis) //nolint:errcheck // ends with Stop below

	defer srv.Stop()

	if err := register(ctx, socket, *resource); err != nil {
		return err
	}

	log.Info("serving", "resource", *resource, "spec", *specPath, "kind", kind, "devices", ids)
	<-ctx.Done()

	return nil
}

// gpuIndex matches the device names that are GPU indices (nvcdi's index namer), leaving out
// "all", UUIDs and MIG devices ("0:1").
var gpuIndex = regexp.MustCompile(`^[0-9]+$`)

// readSpec returns a CDI spec's kind and the names of its GPU-index devices.
func readSpec(path string) (string, []string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", nil, fmt.Errorf("reading the CDI spec: %w", err)
	}

	var spec struct {
		Kind    string `json:"kind"`
		Devices []struct {
			Name string `json:"name"`
		} `json:"devices"`
	}
	if err := yaml.Unmarshal(data, &spec); err != nil {
		return "", nil, fmt.Errorf("%s: %w", path, err)
	}

	var ids []string

	for _, d := range spec.Devices {
		if gpuIndex.MatchString(d.Name) {
			ids = append(ids, d.Name)
		}
	}

	if spec.Kind == "" || len(ids) == 0 {
		return "", nil, fmt.Errorf("%s: no kind or no GPU devices", path)
	}

	return spec.Kind, ids, nil
}

// register tells the kubelet about the plugin's socket (pluginapi Registration).
func register(ctx context.Context, socket, resource string) error {
	conn, err := grpc.NewClient("unix://"+pluginapi.KubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("connecting to the kubelet: %w", err)
	}
	defer conn.Close() //nolint:errcheck

	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: filepath.Base(socket), ResourceName: resource,
	})
	if err != nil {
		return fmt.Errorf("registering %s with the kubelet: %w", resource, err)
	}

	return nil
}

type plugin struct {
	pluginapi.UnimplementedDevicePluginServer

	kind string
	ids  []string
	ctx  context.Context //nolint:containedctx // the plugin's lifetime, for ListAndWatch
	log  *slog.Logger
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *plugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	devs := make([]*pluginapi.Device, 0, len(p.ids))
	for _, id := range p.ids {
		devs = append(devs, &pluginapi.Device{ID: id, Health: pluginapi.Healthy})
	}

	if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
		return fmt.Errorf("sending the devices: %w", err)
	}

	select {
	case <-p.ctx.Done():
	case <-stream.Context().Done():
	}

	return nil
}

// Allocate names each requested device by its CDI name, kind=id, and nothing else: the
// container gets what the spec says for it.
func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}

	for _, c := range req.ContainerRequests {
		cr := &pluginapi.ContainerAllocateResponse{}
		for _, id := range c.DevicesIds {
			cr.CdiDevices = append(cr.CdiDevices, &pluginapi.CDIDevice{Name: p.kind + "=" + id})
		}

		p.log.Info("allocate", "cdiDevices", cr.CdiDevices)
		resp.ContainerResponses = append(resp.ContainerResponses, cr)
	}

	return resp, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}
