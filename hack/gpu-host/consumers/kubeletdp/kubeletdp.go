// Package kubeletdp plays the kubelet's side of the device-plugin API for hack/gpu-host/e2e-gpu.sh:
// the Registration service on kubelet.sock, then what the kubelet's device manager does
// with a plugin that registers (pkg/kubelet/cm/devicemanager/plugin/v1beta1 server.go and
// client.go, devicemanager/manager.go): GetDevicePluginOptions, ListAndWatch,
// GetPreferredAllocation when offered, Allocate for one container, PreStartContainer when
// required.
package kubeletdp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Report is what the kubelet's side saw.
type Report struct {
	ResourceName string             `json:"resourceName"`
	Endpoint     string             `json:"endpoint"`
	Version      string             `json:"version"`
	Options      *pluginOptions     `json:"options"`
	Devices      []pluginDevice     `json:"devices"`
	Allocated    []string           `json:"allocated"`
	Response     *allocatedResponse `json:"response"`
	// Milliseconds from the start of this command.
	RegisteredMs  int64 `json:"registeredMs"`
	ListedMs      int64 `json:"listedMs"`
	AllocateMs    int64 `json:"allocateMs"` // the Allocate call alone
	TotalMs       int64 `json:"totalMs"`
	HealthyCount  int   `json:"healthy"`
	RequestedSize int   `json:"requested"`
}

type pluginOptions struct {
	PreStartRequired                bool `json:"preStartRequired"`
	GetPreferredAllocationAvailable bool `json:"getPreferredAllocationAvailable"`
}

type pluginDevice struct {
	ID     string `json:"id"`
	Health string `json:"health"`
}

type allocatedResponse struct {
	CDIDevices  []string          `json:"cdiDevices"`
	Envs        map[string]string `json:"envs,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Mounts      []string          `json:"mounts,omitempty"`
	DeviceNodes []string          `json:"deviceNodes,omitempty"`
}

// registration is the kubelet's Registration service (pkg/kubelet/cm/devicemanager/plugin/
// v1beta1/server.go): it accepts the first plugin that registers with the right version.
type registration struct {
	pluginapi.UnimplementedRegistrationServer

	got chan *pluginapi.RegisterRequest
}

func (r *registration) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	if req.Version != pluginapi.Version {
		return nil, fmt.Errorf("unsupported device plugin API version %q (want %s)", req.Version, pluginapi.Version)
	}

	select {
	case r.got <- req:
	default:
	}

	return &pluginapi.Empty{}, nil
}

// Serve listens on dir/kubelet.sock until a plugin registers, then lists its devices and
// allocates n healthy ones, as for a container that asks for n. The report is returned with
// what was seen so far also when a step fails.
func Serve(ctx context.Context, dir string, n int) (*Report, error) {
	start := time.Now()
	ms := func() int64 { return time.Since(start).Milliseconds() }

	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}

	sock := filepath.Join(dir, "kubelet.sock")
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}

	l, err := net.Listen("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", sock, err)
	}

	srv := grpc.NewServer()
	reg := &registration{got: make(chan *pluginapi.RegisterRequest, 1)}
	pluginapi.RegisterRegistrationServer(srv, reg)

	go srv.Serve(l) //nolint:errcheck // ends with srv.GracefulStop
	// Graceful: Register hands the request over before it answers, and the plugin's side may
	// be done before that answer is written; Stop would cut it off (the plugin sees EOF).
	defer srv.GracefulStop()

	var req *pluginapi.RegisterRequest

	select {
	case req = <-reg.got:
	case <-ctx.Done():
		return nil, fmt.Errorf("no device plugin registered at %s: %w", sock, ctx.Err())
	}

	report := &Report{ResourceName: req.ResourceName, Endpoint: req.Endpoint, Version: req.Version, RegisteredMs: ms(), RequestedSize: n}

	// The kubelet dials the plugin's socket in the same directory (client.go).
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, req.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return report, fmt.Errorf("dialing the plugin at %s: %w", req.Endpoint, err)
	}
	defer conn.Close() //nolint:errcheck

	client := pluginapi.NewDevicePluginClient(conn)

	opts, err := client.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	if err != nil {
		return report, fmt.Errorf("GetDevicePluginOptions: %w", err)
	}

	report.Options = &pluginOptions{PreStartRequired: opts.PreStartRequired, GetPreferredAllocationAvailable: opts.GetPreferredAllocationAvailable}

	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		return report, fmt.Errorf("ListAndWatch: %w", err)
	}

	list, err := stream.Recv()
	if err != nil {
		return report, fmt.Errorf("ListAndWatch: first response: %w", err)
	}

	report.ListedMs = ms()

	var healthy []string

	for _, d := range list.Devices {
		report.Devices = append(report.Devices, pluginDevice{ID: d.ID, Health: d.Health})

		if d.Health == pluginapi.Healthy {
			healthy = append(healthy, d.ID)
		}
	}

	report.HealthyCount = len(healthy)

	if len(healthy) < n {
		return report, fmt.Errorf("%d healthy devices of %s, %d asked for", len(healthy), req.ResourceName, n)
	}

	ids := healthy[:n]

	if opts.GetPreferredAllocationAvailable {
		pref, err := client.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
			{AvailableDeviceIDs: healthy, AllocationSize: int32(n)},
		}})
		if err != nil {
			return report, fmt.Errorf("GetPreferredAllocation: %w", err)
		}

		if got := pref.ContainerResponses[0].DeviceIDs; len(got) == n {
			ids = got
		}
	}

	report.Allocated = ids

	t0 := time.Now()

	resp, err := client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
	if err != nil {
		return report, fmt.Errorf("Allocate %v: %w", ids, err)
	}

	report.AllocateMs = time.Since(t0).Milliseconds()

	if len(resp.ContainerResponses) != 1 {
		return report, fmt.Errorf("Allocate: %d container responses for one container", len(resp.ContainerResponses))
	}

	cr := resp.ContainerResponses[0]
	ar := &allocatedResponse{Envs: cr.Envs, Annotations: cr.Annotations}

	for _, d := range cr.CdiDevices {
		ar.CDIDevices = append(ar.CDIDevices, d.Name)
	}

	for _, m := range cr.Mounts {
		ar.Mounts = append(ar.Mounts, m.HostPath+":"+m.ContainerPath)
	}

	for _, d := range cr.Devices {
		ar.DeviceNodes = append(ar.DeviceNodes, d.HostPath+":"+d.ContainerPath)
	}

	report.Response = ar

	if opts.PreStartRequired {
		if _, err := client.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: ids}); err != nil {
			return report, fmt.Errorf("PreStartContainer: %w", err)
		}
	}

	report.TotalMs = ms()

	return report, nil
}

// PrintSummary tells a person what happened, one line per step.
func PrintSummary(w io.Writer, r *Report) {
	fmt.Fprintf(w, "registered %s (endpoint %s, API %s) after %d ms\n", r.ResourceName, r.Endpoint, r.Version, r.RegisteredMs)

	for _, d := range r.Devices {
		fmt.Fprintf(w, "listed %s %s (first ListAndWatch answer after %d ms)\n", d.ID, d.Health, r.ListedMs)
	}

	if r.Response != nil {
		fmt.Fprintf(w, "allocated %v in %d ms: cdiDevices %v envs %v annotations %v\n",
			r.Allocated, r.AllocateMs, r.Response.CDIDevices, r.Response.Envs, r.Response.Annotations)
	}
}
