package kubeletdp_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/talos-nvidia/nvidia-driver/hack/gpu-host/consumers/kubeletdp"
)

// plugin is a device plugin that answers as NVIDIA's does with a CDI strategy: one healthy
// and one unhealthy GPU, CDI device names in Allocate. It only stands in for the plugin in
// this test of the kubelet side; hack/gpu-host/e2e-gpu.sh runs the real one.
type plugin struct {
	pluginapi.UnimplementedDevicePluginServer

	allocated chan []string
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *plugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	err := s.Send(&pluginapi.ListAndWatchResponse{Devices: []*pluginapi.Device{
		{ID: "GPU-bad", Health: pluginapi.Unhealthy},
		{ID: "GPU-good", Health: pluginapi.Healthy},
	}})
	if err != nil {
		return err
	}

	<-s.Context().Done()

	return nil
}

func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	ids := req.ContainerRequests[0].DevicesIds
	p.allocated <- ids

	resp := &pluginapi.ContainerAllocateResponse{}
	for _, id := range ids {
		resp.CdiDevices = append(resp.CdiDevices, &pluginapi.CDIDevice{Name: "k8s.device-plugin.nvidia.com/gpu=" + id})
	}

	return &pluginapi.AllocateResponse{ContainerResponses: []*pluginapi.ContainerAllocateResponse{resp}}, nil
}

// startPlugin serves the plugin on dir/name.sock and registers it, as a plugin does once
// the kubelet's socket is there.
func startPlugin(t *testing.T, dir, version string) *plugin {
	t.Helper()

	p := &plugin{allocated: make(chan []string, 1)}
	l, err := net.Listen("unix", filepath.Join(dir, "fake.sock"))
	require.NoError(t, err)

	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)

	go srv.Serve(l) //nolint:errcheck
	t.Cleanup(srv.Stop)

	sock := filepath.Join(dir, "kubelet.sock")
	require.Eventually(t, func() bool { _, err := os.Stat(sock); return err == nil }, 5*time.Second, 10*time.Millisecond)

	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() }) //nolint:errcheck

	// The socket file exists from bind(), a moment before listen(): wait for the connection
	// rather than fail on a refusal in between.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: version, Endpoint: "fake.sock", ResourceName: "nvidia.com/gpu",
		Options: &pluginapi.DevicePluginOptions{},
	}, grpc.WaitForReady(true))
	if version == pluginapi.Version {
		require.NoError(t, err)
	} else {
		require.ErrorContains(t, err, "unsupported device plugin API version")
	}

	return p
}

func TestServeRegistersListsAndAllocatesHealthyDevices(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	type result struct {
		r   *kubeletdp.Report
		err error
	}

	done := make(chan result, 1)

	go func() { r, err := kubeletdp.Serve(ctx, dir, 1); done <- result{r, err} }()

	p := startPlugin(t, dir, pluginapi.Version)
	res := <-done
	require.NoError(t, res.err)

	assert.Equal(t, []string{"GPU-good"}, <-p.allocated, "only a healthy device is allocated")
	assert.Equal(t, "nvidia.com/gpu", res.r.ResourceName)
	assert.Equal(t, 1, res.r.HealthyCount)
	assert.Len(t, res.r.Devices, 2)
	assert.Equal(t, []string{"k8s.device-plugin.nvidia.com/gpu=GPU-good"}, res.r.Response.CDIDevices)
}

func TestServeRefusesTooFewHealthyDevicesAndOldVersions(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	done := make(chan error, 1)

	go func() { _, err := kubeletdp.Serve(ctx, dir, 2); done <- err }()

	// A plugin speaking another API version is refused and Serve keeps waiting.
	startPlugin(t, dir, "v1alpha")
	require.NoError(t, os.Remove(filepath.Join(dir, "fake.sock")))
	startPlugin(t, dir, pluginapi.Version)

	assert.ErrorContains(t, <-done, "1 healthy devices of nvidia.com/gpu, 2 asked for")
}
