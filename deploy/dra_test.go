package deploy_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"sigs.k8s.io/yaml"
)

// NVIDIA's DRA driver for GPUs, whose Go module carries its Helm chart. The module proxy
// serves this version when asked for it exactly; hack/dra/build.sh builds the same.
const (
	draModule    = "github.com/NVIDIA/k8s-dra-driver-gpu"
	draVersion   = "v0.5.0"
	draChartPath = "deployments/helm/dra-driver-nvidia-gpu"
	draNamespace = "nvidia-dra-driver-gpu"
	// the chart's default image for its appVersion, which hack/dra/build.sh packs
	draImage = "registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu:" + draVersion
)

// draChart is the chart's directory in the module cache.
func draChart(t *testing.T) string {
	t.Helper()
	out := run(t, nil, "go", "mod", "download", "-json", draModule+"@"+draVersion)
	var info struct{ Dir string }
	require.NoError(t, json.Unmarshal(out, &info))
	chart := filepath.Join(info.Dir, filepath.FromSlash(draChartPath))
	require.FileExists(t, filepath.Join(chart, "Chart.yaml"))
	return chart
}

// draValues is the part of the DRA driver chart's values that deploy/dra/values.yaml sets.
// Decoded strictly, so a key this project does not expect fails here; TestDRAValuesInChart
// checks each key against the chart's own values.yaml.
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

func readDRAValues(t *testing.T) draValues {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("dra", "values.yaml"))
	require.NoError(t, err)
	var v draValues
	require.NoError(t, yaml.UnmarshalStrict(data, &v))
	return v
}

func TestDRAValues(t *testing.T) {
	v := readDRAValues(t)
	assert.Equal(t, "/run/nvidia/driver", v.NvidiaDriverRoot)
	assert.Equal(t, "/usr/bin/nvidia-cdi-hook", v.NvidiaCDIHookPath, "the extension's hook, on the host")
	assert.True(t, v.Resources.GPUs.Enabled)
	assert.False(t, v.Resources.ComputeDomains.Enabled, "no IMEX daemon on these nodes")
	assert.True(t, v.GPUResourcesEnabledOverride, "the chart's templates/validation.yaml refuses GPUs on without it")
	assert.False(t, v.FeatureGates["DynamicMIG"], "the service owns the MIG layout")
	assert.False(t, v.FeatureGates["FabricManagerPartitioning"], "hack/dra/build.sh builds the plugin without NVIDIA's Fabric Manager client")
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

// Each key deploy/dra/values.yaml sets is one of the chart's (helm would ignore a misspelt one
// without a word), down to where the chart's default is not a map or an empty one
// (featureGates).
func TestDRAValuesInChart(t *testing.T) {
	read := func(path string) map[string]any {
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		var m map[string]any
		require.NoError(t, yaml.Unmarshal(data, &m), path)
		return m
	}
	chart := read(filepath.Join(draChart(t), "values.yaml"))
	ours := read(filepath.Join("dra", "values.yaml"))
	assert.Empty(t, keysNotIn(chart, ours, ""), "keys of deploy/dra/values.yaml that chart %s@%s does not have", draModule, draVersion)
}

// keysNotIn lists the keys of ours, as dotted paths, that chart does not have.
func keysNotIn(chart, ours map[string]any, prefix string) []string {
	var bad []string
	for k, v := range ours {
		c, ok := chart[k]
		if !ok {
			bad = append(bad, prefix+k)
			continue
		}
		cm, cIsMap := c.(map[string]any)
		om, oIsMap := v.(map[string]any)
		if cIsMap && oIsMap && len(cm) > 0 {
			bad = append(bad, keysNotIn(cm, om, prefix+k+".")...)
		}
	}
	sort.Strings(bad)
	return bad
}

// The chart rendered as hack/dra/build.sh renders it for the test node (helm install's
// rendering: namespace, CRDs, the node's Kubernetes version): the kubelet plugin's DaemonSet
// with the GPU container only, the driver root and the host's hook, the affinity of the values,
// the image build.sh packs, the names test-dra.sh relies on, and the DeviceClasses the
// examples name.
func TestDRAChartRendered(t *testing.T) {
	gomod, err := os.ReadFile(filepath.Join(root, "hack", "k8s-node", "kube", "go.mod"))
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^\s*k8s\.io/kubernetes\s+(v\S+)`).FindSubmatch(gomod)
	require.NotNil(t, m, "hack/k8s-node/kube/go.mod requires no k8s.io/kubernetes")
	out := run(t, nil, tool(t, "helm"), "template", "dra-driver-nvidia-gpu", draChart(t), "--include-crds",
		"--namespace", draNamespace, "--kube-version", string(m[1]), "-f", filepath.Join("dra", "values.yaml"))

	v := readDRAValues(t)
	var ds *appsv1.DaemonSet
	kinds := map[string]int{}
	classes := map[string]*resourcev1.DeviceClass{}
	for i, doc := range splitDocs(out) {
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct{ Name, Namespace string }
		}
		require.NoError(t, yaml.Unmarshal(doc, &head), "document %d", i)
		kinds[head.Kind]++
		switch head.APIVersion + " " + head.Kind {
		case "apps/v1 DaemonSet":
			ds = &appsv1.DaemonSet{}
			require.NoError(t, yaml.UnmarshalStrict(doc, ds), "document %d", i)
		case "resource.k8s.io/v1 DeviceClass":
			c := &resourcev1.DeviceClass{}
			require.NoError(t, yaml.UnmarshalStrict(doc, c), "document %d", i)
			classes[c.Name] = c
		}
	}
	assert.Equal(t, 1, kinds["DaemonSet"], "kinds rendered: %v", kinds)
	assert.Zero(t, kinds["Deployment"], "no controller (ComputeDomains off) and no webhook (off by default)")
	assert.Equal(t, 2, kinds["CustomResourceDefinition"], "the chart's crds/, as helm install applies them")
	require.NotNil(t, ds)
	assert.Equal(t, "dra-driver-nvidia-gpu-kubelet-plugin", ds.Name, "test-dra.sh patches it by name on the simulated node")
	assert.Equal(t, draNamespace, ds.Namespace)
	pod := &ds.Spec.Template
	assert.Equal(t, "kubelet-plugin", pod.Labels["dra-driver-nvidia-gpu-component"], "test-dra.sh finds the pod by it")

	require.Len(t, pod.Spec.InitContainers, 1)
	initC := container(t, &pod.Spec, "init-container")
	assert.Equal(t, []string{"bash", "/usr/bin/kubelet-plugin-prestart.sh"}, initC.Command)
	assert.Equal(t, "/run/nvidia/driver", env(initC)["NVIDIA_DRIVER_ROOT"])
	hostToContainer(t, initC, "driver-root-parent", "/driver-root-parent")
	hostPath(t, &pod.Spec, "driver-root-parent", "/run/nvidia")

	require.Len(t, pod.Spec.Containers, 1, "the GPU container only")
	gpus := container(t, &pod.Spec, "gpus")
	privileged(t, gpus)
	for _, c := range []*corev1.Container{initC, gpus} {
		assert.Equal(t, draImage, c.Image, "container %s", c.Name)
	}
	e := env(gpus)
	assert.Equal(t, "/run/nvidia/driver", e["NVIDIA_DRIVER_ROOT"])
	assert.Equal(t, "/usr/bin/nvidia-cdi-hook", e["NVIDIA_CDI_HOOK_PATH"], "the host's hook: the plugin copies none of its own")
	assert.NotContains(t, e, "FEATURE_GATES", "every driver feature gate at its default")
	assert.NotContains(t, e, "CONSUMABLE_SHARES")
	hostToContainer(t, gpus, "driver-root", "/driver-root")
	hostPath(t, &pod.Spec, "driver-root", "/run/nvidia/driver")
	assert.Equal(t, v.KubeletPlugin.Affinity, pod.Spec.Affinity)
	assert.Equal(t, v.KubeletPlugin.Tolerations, pod.Spec.Tolerations)
	assert.Empty(t, pod.Spec.NodeSelector, "a nodeSelector would AND with the affinity")

	for _, name := range []string{"gpu.nvidia.com", "mig.nvidia.com"} {
		require.Contains(t, classes, name, "DeviceClasses rendered")
	}
	// On Kubernetes 1.37 (DRAExtendedResource GA) pods that ask for nvidia.com/gpu are given a
	// GPU of this class on a node without the device plugin (docs/sharing.md).
	ext := classes["gpu.nvidia.com"].Spec.ExtendedResourceName
	require.NotNil(t, ext, "DeviceClass gpu.nvidia.com has no extendedResourceName")
	assert.Equal(t, "nvidia.com/gpu", *ext)
}

// hack/dra/build.sh builds the module and version these tests read the chart of.
func TestDRABuildScript(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(root, "hack", "dra", "build.sh"))
	require.NoError(t, err)
	s := string(data)
	assert.Regexp(t, `(?m)^mod=`+regexp.QuoteMeta(draModule)+`$`, s)
	assert.Regexp(t, `(?m)^ver=`+regexp.QuoteMeta(draVersion)+`$`, s)
	assert.Regexp(t, `(?m)^chart=`+regexp.QuoteMeta(draChartPath)+`$`, s)
	assert.Contains(t, s, "ref=registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu:$ver")
}
