package deploy_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"sigs.k8s.io/yaml"
)

// draValues is the part of the DRA driver chart's values that deploy/dra/values.yaml sets, as
// read in deployments/helm/dra-driver-nvidia-gpu/values.yaml and templates/kubeletplugin.yaml
// at kubernetes-sigs/dra-driver-nvidia-gpu v0.4.1. Decoded strictly: a key the chart does not
// have fails here (the chart itself is not served by the module proxy, so CI cannot render it;
// hack/dra/build.sh renders it from a checkout of the tag).
type draValues struct {
	NvidiaDriverRoot  string `json:"nvidiaDriverRoot"`
	NvidiaCDIHookPath string `json:"nvidiaCDIHookPath"`
	Resources         struct {
		GPUs           struct{ Enabled bool } `json:"gpus"`
		ComputeDomains struct{ Enabled bool } `json:"computeDomains"`
	} `json:"resources"`
	GPUResourcesEnabledOverride bool            `json:"gpuResourcesEnabledOverride"`
	FeatureGates                map[string]bool `json:"featureGates"`
	KubeletPlugin               struct {
		Tolerations []corev1.Toleration `json:"tolerations"`
		Affinity    *corev1.Affinity    `json:"affinity"`
	} `json:"kubeletPlugin"`
}

func TestDRAValues(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("dra", "values.yaml"))
	require.NoError(t, err)
	var v draValues
	require.NoError(t, yaml.UnmarshalStrict(data, &v))
	assert.Equal(t, "/run/nvidia/driver", v.NvidiaDriverRoot)
	assert.Equal(t, "/usr/bin/nvidia-cdi-hook", v.NvidiaCDIHookPath, "the extension's hook, on the host")
	assert.True(t, v.Resources.GPUs.Enabled)
	assert.False(t, v.Resources.ComputeDomains.Enabled, "no IMEX daemon on these nodes")
	assert.True(t, v.GPUResourcesEnabledOverride, "templates/validation.yaml refuses GPUs on without it")
	assert.False(t, v.FeatureGates["DynamicMIG"], "the service owns the MIG layout")
	assert.Contains(t, v.KubeletPlugin.Tolerations, corev1.Toleration{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule})

	// Never beside the device plugin: for every node labelling, at most one of the two is
	// scheduled, judged by the scheduler's own matcher on both pods' affinities.
	dra := nodeaffinity.GetRequiredNodeAffinity(&corev1.Pod{Spec: corev1.PodSpec{Affinity: v.KubeletPlugin.Affinity}})
	ds := decodeStrict(t, kustomize(t, "deploy/device-plugin")).daemonSets["nvidia-device-plugin"]
	require.NotNil(t, ds)
	plugin := nodeaffinity.GetRequiredNodeAffinity(&corev1.Pod{Spec: ds.Spec.Template.Spec})
	for _, tc := range []struct {
		labels          map[string]string
		wantDRA, wantDP bool
	}{
		{map[string]string{}, false, false},
		{map[string]string{"nvidia.com/gpu.present": "true"}, false, true},
		{map[string]string{"nvidia.com/gpu.present": "true", "nvidia.com/gpu.deploy.device-plugin": "false"}, true, false},
		{map[string]string{"feature.node.kubernetes.io/pci-10de.present": "true", "nvidia.com/gpu.deploy.device-plugin": "false"}, true, false},
		{map[string]string{"nvidia.com/gpu.present": "true", "nvidia.com/gpu.deploy.device-plugin": "false", "nvidia.com/gpu.deploy.dra-driver": "paused-for-mig-change"}, false, false},
		{map[string]string{"nvidia.com/gpu.present": "true", "nvidia.com/gpu.deploy.device-plugin": "paused-for-mig-change"}, false, false},
		{map[string]string{"nvidia.com/gpu.present": "false", "nvidia.com/gpu.deploy.device-plugin": "false"}, false, false},
	} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: tc.labels}}
		gotDRA, err := dra.Match(node)
		require.NoError(t, err)
		gotDP, err := plugin.Match(node)
		require.NoError(t, err)
		assert.Equal(t, tc.wantDRA, gotDRA, "DRA driver on %v", tc.labels)
		assert.Equal(t, tc.wantDP, gotDP, "device plugin on %v", tc.labels)
		assert.False(t, gotDRA && gotDP, "both on %v", tc.labels)
	}
}

// deploy/dra renders (its namespace, privileged for Pod Security) and its examples decode
// strictly as resource.k8s.io/v1 objects that name the chart's DeviceClasses.
func TestDRAManifests(t *testing.T) {
	objs := decodeStrict(t, kustomize(t, "deploy/dra"))
	ns := objs.namespaces["nvidia-dra-driver-gpu"]
	require.NotNil(t, ns)
	assert.Equal(t, "privileged", ns.Labels["pod-security.kubernetes.io/enforce"])

	classes := map[string]string{}
	for _, f := range []string{"gpu.yaml", "mig.yaml"} {
		data, err := os.ReadFile(filepath.Join("dra", "examples", f))
		require.NoError(t, err)
		for i, doc := range splitDocs(data) {
			var head struct{ Kind string }
			require.NoError(t, yaml.Unmarshal(doc, &head))
			switch head.Kind {
			case "ResourceClaim":
				var c resourcev1.ResourceClaim
				require.NoError(t, yaml.UnmarshalStrict(doc, &c), "%s document %d", f, i)
				classes[f] = c.Spec.Devices.Requests[0].Exactly.DeviceClassName
			case "ResourceClaimTemplate":
				var c resourcev1.ResourceClaimTemplate
				require.NoError(t, yaml.UnmarshalStrict(doc, &c), "%s document %d", f, i)
				classes[f] = c.Spec.Spec.Devices.Requests[0].Exactly.DeviceClassName
			case "Pod":
				var p corev1.Pod
				require.NoError(t, yaml.UnmarshalStrict(doc, &p), "%s document %d", f, i)
				require.Len(t, p.Spec.ResourceClaims, 1)
				assert.Equal(t, p.Spec.ResourceClaims[0].Name, p.Spec.Containers[0].Resources.Claims[0].Name, f)
			default:
				t.Fatalf("%s document %d: unexpected kind %s", f, i, head.Kind)
			}
		}
	}
	// The DeviceClasses of the chart's templates/deviceclass-gpu.yaml and deviceclass-mig.yaml.
	assert.Equal(t, map[string]string{"gpu.yaml": "gpu.nvidia.com", "mig.yaml": "mig.nvidia.com"}, classes)
}
