package deploy_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// sharingComponents are the kustomize components of deploy/sharing, each with the chart
// values it is made from.
var sharingComponents = []string{"time-slicing", "mps"}

const configsName = "nvidia-device-plugin-configs"

// pluginConfig is the part of NVIDIA's config file v1 that the sharing configurations set
// (k8s-device-plugin v0.19.0 api/config/v1/config.go, flags.go, sharing.go, replicas.go);
// decoded strictly, so a misspelt key fails here rather than being ignored by the plugin.
type pluginConfig struct {
	Version string `json:"version"`
	Flags   struct {
		MigStrategy string `json:"migStrategy"`
	} `json:"flags"`
	Sharing *struct {
		TimeSlicing *replicatedResources `json:"timeSlicing"`
		MPS         *replicatedResources `json:"mps"`
	} `json:"sharing"`
}

type replicatedResources struct {
	RenameByDefault            bool `json:"renameByDefault"`
	FailRequestsGreaterThanOne bool `json:"failRequestsGreaterThanOne"`
	Resources                  []struct {
		Name     string `json:"name"`
		Replicas int    `json:"replicas"`
	} `json:"resources"`
}

// configsPatch is a component's configs.yaml: the ConfigMap of named configurations with
// only the component's own entries, as helm renders them from the component's values.
func configsPatch(t *testing.T, component string) []byte {
	t.Helper()
	base := decodeStrict(t, helmTemplate(t)).configMaps[configsName]
	with := decodeStrict(t, helmTemplate(t, "--values", filepath.Join(root, "deploy", "sharing", component, "values.yaml"))).configMaps[configsName]
	require.NotNil(t, with)
	data := map[string]string{}
	for k, v := range with.Data {
		if _, ok := base.Data[k]; !ok {
			data[k] = v
		}
	}
	require.NotEmpty(t, data, "deploy/sharing/%s/values.yaml adds no configuration", component)
	cm := corev1.ConfigMap{Data: data}
	cm.APIVersion, cm.Kind, cm.Name = "v1", "ConfigMap", configsName
	out, err := yaml.Marshal(cm)
	require.NoError(t, err)
	return append([]byte(fmt.Sprintf("# Generated from values.yaml by `make deploy-render` (go test ./deploy -run %s -update): do not edit.\n", t.Name())), out...)
}

// Each component's ConfigMap patch is what helm renders from its values: kustomize and helm
// users get the same configurations.
func TestSharingComponentsAreCurrent(t *testing.T) {
	for _, c := range sharingComponents {
		want := configsPatch(t, c)
		path := filepath.Join("sharing", c, "configs.yaml")
		if *update {
			require.NoError(t, os.WriteFile(path, want, 0o644))
		}
		got, err := os.ReadFile(path)
		require.NoError(t, err)
		assert.Equal(t, string(want), string(got), "%s is stale: run `make deploy-render`", path)
	}
}

var configName = regexp.MustCompile(`^(time-slicing|mps)-([0-9]+)(-single)?$`)

// deploy/sharing: deploy/ with both components. Every configuration decodes strictly, does
// what its name says, and the base configurations are still there.
func TestSharingConfigs(t *testing.T) {
	objs := decodeStrict(t, kustomize(t, "deploy/sharing"))
	cm := objs.configMaps[configsName]
	require.NotNil(t, cm)
	for _, base := range []string{"none", "single", "mixed"} {
		assert.Contains(t, cm.Data, base)
	}
	assert.Equal(t, len(objs.daemonSets), len(decodeStrict(t, kustomize(t, "deploy")).daemonSets), "the components add configurations only")
	n := 0
	for name, data := range cm.Data {
		m := configName.FindStringSubmatch(name)
		if m == nil {
			continue
		}
		n++
		var cfg pluginConfig
		require.NoError(t, yaml.UnmarshalStrict([]byte(data), &cfg), "config %q", name)
		assert.Equal(t, "v1", cfg.Version, name)
		require.NotNil(t, cfg.Sharing, name)
		replicas, _ := strconv.Atoi(m[2])
		var r *replicatedResources
		switch m[1] {
		case "time-slicing":
			r = cfg.Sharing.TimeSlicing
			assert.Nil(t, cfg.Sharing.MPS, name)
			assert.True(t, r.FailRequestsGreaterThanOne, "%s: a container must not take two replicas of one GPU", name)
		case "mps":
			r = cfg.Sharing.MPS
			assert.Nil(t, cfg.Sharing.TimeSlicing, name)
			assert.Empty(t, m[3], "%s: MPS does not share MIG devices", name)
		}
		require.NotNil(t, r, name)
		want := "none"
		if m[3] != "" {
			want = "single"
		}
		assert.Equal(t, want, cfg.Flags.MigStrategy, name)
		assert.False(t, r.RenameByDefault, "%s: pods keep asking for nvidia.com/gpu", name)
		require.Len(t, r.Resources, 1, name)
		assert.Equal(t, "nvidia.com/gpu", r.Resources[0].Name, name)
		assert.Equal(t, replicas, r.Resources[0].Replicas, name)
	}
	assert.Equal(t, 9, n, "time-slicing-{2,4,8}, time-slicing-{2,4,8}-single, mps-{2,4,8}")
}

// The chart's MPS control daemon as deploy/ patches it: the driver root mounted as in the
// plugin's pod, the start script from the scripts ConfigMap, scheduled by the label the
// service writes; the plugin finds nvidia-cuda-mps-control on its PATH.
func TestMPSControlDaemonPod(t *testing.T) {
	objs := decodeStrict(t, kustomize(t, "deploy/device-plugin"))
	ds := objs.daemonSets["nvidia-device-plugin-mps-control-daemon"]
	require.NotNil(t, ds)
	pod := &ds.Spec.Template.Spec
	assert.Equal(t, map[string]string{"nvidia.com/mps.capable": "true"}, pod.NodeSelector)
	assert.Nil(t, pod.RuntimeClassName)
	assert.True(t, pod.HostPID, "the MPS server finds its clients' processes (chart: mps.enableHostPID)")
	d := container(t, pod, "mps-control-daemon-ctr")
	privileged(t, d)
	assert.Equal(t, []string{"/bin/sh", "/scripts/mps-control-daemon.sh"}, d.Command)
	hostPath(t, pod, "driver-root", "/run/nvidia/driver")
	hostToContainer(t, d, "driver-root", "/driver-root")
	hostToContainer(t, d, "nvidia-validations", "/run/nvidia/validations")
	hostPath(t, pod, "mps-root", "/run/nvidia/mps")
	assert.Equal(t, "/mps", mount(t, d, "mps-root").MountPath)
	assert.Equal(t, "/dev/shm", mount(t, d, "mps-shm").MountPath)
	scripts := objs.configMaps[volume(t, pod, "scripts").ConfigMap.Name]
	require.NotNil(t, scripts, "the scripts ConfigMap %s", volume(t, pod, "scripts").ConfigMap.Name)
	for _, f := range []string{"mps-control-daemon.sh", "check-sharing.sh"} {
		want, err := os.ReadFile(filepath.Join("device-plugin", "scripts", f))
		require.NoError(t, err)
		assert.Equal(t, string(want), scripts.Data[f], f)
	}
	// The plugin's own pod: the same scripts, nvidia-cuda-mps-control on its PATH, the check
	// after the config-manager has chosen the configuration.
	plugin := &objs.daemonSets["nvidia-device-plugin"].Spec.Template.Spec
	assert.Equal(t, scripts.Name, volume(t, plugin, "scripts").ConfigMap.Name)
	p := env(container(t, plugin, "nvidia-device-plugin-ctr"))
	assert.True(t, strings.HasSuffix(p["PATH"], ":/driver-root/usr/bin"), p["PATH"])
	var inits []string
	for _, c := range plugin.InitContainers {
		inits = append(inits, c.Name)
	}
	assert.Equal(t, []string{"wait-for-driver", "nvidia-device-plugin-init", "check-sharing"}, inits)
	assert.Contains(t, script(t, container(t, plugin, "driver-watch")), "sh /scripts/check-sharing.sh")
}

// The sharing/MIG check run for real (busybox-compatible sh) against the configurations
// deploy/sharing ships and readiness files as the service writes them (the devices only, no
// layout name).
func TestCheckSharing(t *testing.T) {
	cm := decodeStrict(t, kustomize(t, "deploy/sharing")).configMaps[configsName]
	require.NotNil(t, cm)
	ready := func(modes ...string) string {
		var gpus []string
		for i, m := range modes {
			g := fmt.Sprintf(`    {"index": %d, "uuid": "GPU-%d", "name": "NVIDIA H200"`, i, i)
			if m != "" {
				g += fmt.Sprintf(`, "mig": %q`, m)
			}
			gpus = append(gpus, g+"}")
		}
		return "{\n  \"driverVersion\": \"580.159.04\",\n  \"gpus\": [\n" + strings.Join(gpus, ",\n") + "\n  ]\n}\n"
	}
	for _, tc := range []struct {
		config, ready string
		conflict      string // "" when the check passes
	}{
		{"none", ready("disabled"), ""},
		{"mixed", ready("enabled", "enabled"), ""},
		{"time-slicing-4", ready("disabled", "disabled"), ""},
		{"time-slicing-4", ready(""), ""}, // a GPU without MIG
		{"time-slicing-4", ready("enabled"), "time-slices with migStrategy\nnone"},
		{"time-slicing-4-single", ready("enabled"), ""},
		{"time-slicing-4-single", ready("disabled"), ""},
		{"mps-2", ready("disabled"), ""},
		{"mps-2", ready("disabled (pending enable)"), ""},
		{"mps-2", ready("disabled", "enabled"), `shares GPUs through MPS, but
1 GPU(s) are in MIG mode (the node's nvidia.com/mig.config label names the MIG layout)`},
		{"mps-2", ready("enabled (pending disable)"), "cannot share MIG devices through MPS"},
	} {
		t.Run(tc.config+"/"+strings.NewReplacer("\n", "", " ", "").Replace(tc.ready)[40:], func(t *testing.T) {
			require.Contains(t, cm.Data, tc.config)
			dir := t.TempDir()
			cfg, rd := filepath.Join(dir, "config.yaml"), filepath.Join(dir, "nvidia-driver.ready")
			require.NoError(t, os.WriteFile(cfg, []byte(cm.Data[tc.config]), 0o644))
			require.NoError(t, os.WriteFile(rd, []byte(tc.ready), 0o644))
			out, err := exec.Command("/bin/sh", filepath.Join("device-plugin", "scripts", "check-sharing.sh"), cfg, rd).CombinedOutput()
			if tc.conflict == "" {
				require.NoError(t, err, "%s", out)
				return
			}
			require.Error(t, err, "%s", out)
			assert.Contains(t, string(out), "CONFLICT")
			assert.Contains(t, string(out), tc.conflict)
		})
	}
	// Missing inputs are errors that say which.
	out, err := exec.Command("/bin/sh", filepath.Join("device-plugin", "scripts", "check-sharing.sh"), "/nonexistent/config.yaml", "/nonexistent/ready").CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "no device plugin configuration at /nonexistent/config.yaml")
}
