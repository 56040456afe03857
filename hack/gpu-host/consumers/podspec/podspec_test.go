package podspec_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/hack/gpu-host/consumers/podspec"
)

// The chart's own rendering with deploy/'s values (before the kustomize patches), as
// committed: NVIDIA's pod spec, not one written for this test.
const rendered = "../../../../deploy/device-plugin/nvidia-device-plugin.rendered.yaml"

func TestDevicePluginContainer(t *testing.T) {
	m, err := podspec.ReadManifests(rendered)
	require.NoError(t, err)

	host := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(host, "var/lib/kubelet/device-plugins"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(host, "run/nvidia/driver"), 0o755))

	o := podspec.Options{
		DaemonSet: "nvidia-device-plugin", Container: "nvidia-device-plugin-ctr", Rootfs: "/rootfs",
		Volumes: t.TempDir(), Node: "gpu-1", HostRoot: host,
		Env: []string{"EXTRA=1"}, Unset: []string{"MPS_ROOT"}, Files: []string{"config/config.yaml=nvidia-device-plugin-configs/none"},
	}

	spec, err := podspec.ContainerSpec(m, o)
	require.NoError(t, err)

	assert.Equal(t, []string{"nvidia-device-plugin"}, spec.Process.Args)
	assert.Equal(t, "/rootfs", spec.Root.Path)

	for _, want := range []string{"NVIDIA_DRIVER_ROOT=/run/nvidia/driver", "DEVICE_LIST_STRATEGY=cdi-cri", "NVIDIA_CDI_HOOK_PATH=/usr/bin/nvidia-cdi-hook", "CONFIG_FILE=/config/config.yaml", "EXTRA=1"} {
		assert.Contains(t, spec.Process.Env, want)
	}

	assert.False(t, slices.ContainsFunc(spec.Process.Env, func(e string) bool { return strings.HasPrefix(e, "MPS_ROOT=") }), "unset")

	cases := []struct {
		dst, src string
		opts     []string
	}{
		// readOnly, no mountPropagation: what the stock chart gives the driver root.
		{"/driver-root", filepath.Join(host, "run/nvidia/driver"), []string{"rbind", "rprivate", "ro"}},
		{"/var/run/cdi", filepath.Join(host, "var/run/cdi"), []string{"rbind", "rprivate"}},
		{"/var/lib/kubelet/device-plugins", filepath.Join(host, "var/lib/kubelet/device-plugins"), []string{"rbind", "rprivate"}},
		// A configMap volume is read-only; an emptyDir is not.
		{"/available-configs", filepath.Join(o.Volumes, "available-configs"), []string{"rbind", "rprivate", "ro"}},
		{"/config", filepath.Join(o.Volumes, "config"), []string{"rbind", "rprivate"}},
	}
	for _, c := range cases {
		t.Run(c.dst, func(t *testing.T) {
			i := slices.IndexFunc(spec.Mounts, func(m oci.Mount) bool { return m.Destination == c.dst })
			require.GreaterOrEqual(t, i, 0, "no mount at %s", c.dst)
			assert.Equal(t, c.src, spec.Mounts[i].Source)
			assert.Equal(t, c.opts, spec.Mounts[i].Options)
		})
	}

	// DirectoryOrCreate made the CDI directory, as the kubelet does.
	assert.DirExists(t, filepath.Join(host, "var/run/cdi"))

	// The configMap's entries are files; --file put the "none" config where config-manager would.
	none, err := os.ReadFile(filepath.Join(o.Volumes, "config/config.yaml"))
	require.NoError(t, err)
	assert.Contains(t, string(none), "migStrategy: none")
	assert.FileExists(t, filepath.Join(o.Volumes, "available-configs/mixed"))

	// Privileged: the bounding set's capabilities, every device allowed, nothing masked.
	assert.Contains(t, spec.Process.Capabilities.Bounding, "CAP_SYS_ADMIN")
	assert.Equal(t, []oci.LinuxDeviceCgroup{{Allow: true, Access: "rwm"}}, spec.Linux.Resources.Devices)
	assert.Empty(t, spec.Linux.MaskedPaths)
}

func TestRefusals(t *testing.T) {
	m, err := podspec.ReadManifests(rendered)
	require.NoError(t, err)

	base := podspec.Options{DaemonSet: "nvidia-device-plugin", Container: "nvidia-device-plugin-ctr", Rootfs: "/rootfs"}

	cases := []struct {
		name  string
		setUp func(o *podspec.Options, host string)
		err   string
	}{
		{
			// type: Directory, and the kubelet's directory is not there: the kubelet's message.
			name:  "hostPath Directory missing",
			setUp: func(*podspec.Options, string) {},
			err:   "hostPath type check failed: ",
		},
		{
			name:  "unknown container",
			setUp: func(o *podspec.Options, _ string) { o.Container = "nope" },
			err:   `has no container "nope"`,
		},
		{
			name: "file into a configMap volume",
			setUp: func(o *podspec.Options, host string) {
				require.NoError(t, os.MkdirAll(filepath.Join(host, "var/lib/kubelet/device-plugins"), 0o755))
				o.Files = []string{"available-configs/x=nvidia-device-plugin-configs/none"}
			},
			err: "is not an emptyDir volume",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := base
			o.HostRoot, o.Volumes = t.TempDir(), t.TempDir()
			c.setUp(&o, o.HostRoot)

			_, err := podspec.ContainerSpec(m, o)
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.err)
		})
	}
}
