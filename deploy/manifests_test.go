package deploy_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"sigs.k8s.io/yaml"
)

// objects holds the typed objects of a multi-document manifest.
type objects struct {
	namespaces   map[string]*corev1.Namespace
	daemonSets   map[string]*appsv1.DaemonSet
	configMaps   map[string]*corev1.ConfigMap
	services     map[string]*corev1.Service
	accounts     map[string]*corev1.ServiceAccount
	clusterRoles map[string]*rbacv1.ClusterRole
	bindings     map[string]*rbacv1.ClusterRoleBinding
	// namespace of every namespaced object, by kind/name
	namespaceOf map[string]string
}

// decodeStrict decodes every document into its Kubernetes API type, rejecting unknown
// or duplicate fields and kinds this project does not ship. k8s.io/api is used only by
// tests, so the service binary does not carry it.
func decodeStrict(t *testing.T, manifest []byte) *objects {
	t.Helper()
	o := &objects{
		namespaces: map[string]*corev1.Namespace{}, daemonSets: map[string]*appsv1.DaemonSet{},
		configMaps: map[string]*corev1.ConfigMap{}, services: map[string]*corev1.Service{},
		accounts: map[string]*corev1.ServiceAccount{}, clusterRoles: map[string]*rbacv1.ClusterRole{},
		bindings: map[string]*rbacv1.ClusterRoleBinding{}, namespaceOf: map[string]string{},
	}
	for i, doc := range splitDocs(manifest) {
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name      string `json:"name"`
				Namespace string `json:"namespace"`
			} `json:"metadata"`
		}
		require.NoError(t, yaml.Unmarshal(doc, &head), "document %d", i)
		key := head.Kind + "/" + head.Metadata.Name
		var obj any
		switch head.APIVersion + " " + head.Kind {
		case "v1 Namespace":
			v := &corev1.Namespace{}
			o.namespaces[head.Metadata.Name], obj = v, v
		case "apps/v1 DaemonSet":
			v := &appsv1.DaemonSet{}
			o.daemonSets[head.Metadata.Name], obj = v, v
		case "v1 ConfigMap":
			v := &corev1.ConfigMap{}
			o.configMaps[head.Metadata.Name], obj = v, v
		case "v1 Service":
			v := &corev1.Service{}
			o.services[head.Metadata.Name], obj = v, v
		case "v1 ServiceAccount":
			v := &corev1.ServiceAccount{}
			o.accounts[head.Metadata.Name], obj = v, v
		case "rbac.authorization.k8s.io/v1 ClusterRole":
			v := &rbacv1.ClusterRole{}
			o.clusterRoles[head.Metadata.Name], obj = v, v
		case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
			v := &rbacv1.ClusterRoleBinding{}
			o.bindings[head.Metadata.Name], obj = v, v
		default:
			t.Fatalf("document %d: unexpected %s %s", i, head.APIVersion, head.Kind)
		}
		require.NoError(t, yaml.UnmarshalStrict(doc, obj), "document %d (%s)", i, key)
		if head.Metadata.Namespace != "" {
			o.namespaceOf[key] = head.Metadata.Namespace
		}
	}
	return o
}

// splitDocs splits a YAML stream, dropping documents that hold only comments.
func splitDocs(manifest []byte) [][]byte {
	var docs [][]byte
	for _, d := range bytes.Split(append([]byte("\n"), manifest...), []byte("\n---")) {
		empty := true
		for _, line := range strings.Split(string(d), "\n") {
			if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
				empty = false
				break
			}
		}
		if !empty {
			docs = append(docs, d)
		}
	}
	return docs
}

func container(t *testing.T, spec *corev1.PodSpec, name string) *corev1.Container {
	t.Helper()
	for _, list := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for i := range list {
			if list[i].Name == name {
				return &list[i]
			}
		}
	}
	t.Fatalf("no container %q in pod", name)
	return nil
}

func volume(t *testing.T, spec *corev1.PodSpec, name string) *corev1.Volume {
	t.Helper()
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == name {
			return &spec.Volumes[i]
		}
	}
	t.Fatalf("no volume %q in pod", name)
	return nil
}

func mount(t *testing.T, c *corev1.Container, name string) *corev1.VolumeMount {
	t.Helper()
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].Name == name {
			return &c.VolumeMounts[i]
		}
	}
	t.Fatalf("container %q does not mount %q", c.Name, name)
	return nil
}

func env(c *corev1.Container) map[string]string {
	m := map[string]string{}
	for _, e := range c.Env {
		m[e.Name] = e.Value
	}
	return m
}

// script is a container's shell script (command /bin/sh -c SCRIPT).
func script(t *testing.T, c *corev1.Container) string {
	t.Helper()
	require.Len(t, c.Command, 3, "container %s: want /bin/sh -c SCRIPT", c.Name)
	require.Equal(t, []string{"/bin/sh", "-c"}, c.Command[:2])
	return c.Command[2]
}

func hostToContainer(t *testing.T, c *corev1.Container, name, path string) {
	t.Helper()
	m := mount(t, c, name)
	require.Equal(t, path, m.MountPath, "container %s mount %s", c.Name, name)
	require.NotNil(t, m.MountPropagation, "container %s mount %s has no propagation", c.Name, name)
	require.Equal(t, corev1.MountPropagationHostToContainer, *m.MountPropagation, "container %s mount %s", c.Name, name)
}

func hostPath(t *testing.T, spec *corev1.PodSpec, name, path string) {
	t.Helper()
	v := volume(t, spec, name)
	require.NotNil(t, v.HostPath, "volume %s is not a hostPath", name)
	require.Equal(t, path, v.HostPath.Path, "volume %s", name)
}

func privileged(t *testing.T, c *corev1.Container) {
	t.Helper()
	require.NotNil(t, c.SecurityContext, "container %s has no securityContext", c.Name)
	require.NotNil(t, c.SecurityContext.Privileged, "container %s", c.Name)
	require.True(t, *c.SecurityContext.Privileged, "container %s must be privileged", c.Name)
}

// gpuNodeAffinity checks that the pod can land on a Talos node without Node Feature
// Discovery: one of the OR-ed terms is the nvidia.com/gpu.present=true label that the
// docs' machine config patch sets (siderolabs/talos#12103).
// gpuNodeAffinity checks, with the scheduler's own node-affinity matcher, that the pod goes
// to GPU nodes (labelled from machine config, or by NFD) unless the node carries the GPU
// Operator's pause label for this operand (nvidia.com/gpu.deploy.<operand>), which a MIG mode
// change needs (docs/mig.md, section 5).
func gpuNodeAffinity(t *testing.T, spec *corev1.PodSpec, pauseLabel string) {
	t.Helper()
	require.Empty(t, spec.NodeSelector, "a nodeSelector would AND with the affinity")

	required := nodeaffinity.GetRequiredNodeAffinity(&corev1.Pod{Spec: *spec})

	for _, tc := range []struct {
		labels map[string]string
		want   bool
	}{
		{map[string]string{"nvidia.com/gpu.present": "true"}, true},
		{map[string]string{"feature.node.kubernetes.io/pci-10de.present": "true"}, true},
		{map[string]string{}, false},
		{map[string]string{"nvidia.com/gpu.present": "false"}, false},
		{map[string]string{"nvidia.com/gpu.present": "true", pauseLabel: "true"}, true},
		{map[string]string{"nvidia.com/gpu.present": "true", pauseLabel: "paused-for-mig-change"}, false},
		{map[string]string{"nvidia.com/gpu.present": "true", pauseLabel: "false"}, false},
		{map[string]string{"feature.node.kubernetes.io/pci-10de.present": "true", pauseLabel: "paused-for-mig-change"}, false},
	} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node-1", Labels: tc.labels}}
		match, err := required.Match(node)
		require.NoError(t, err)
		assert.Equal(t, tc.want, match, "node labels %v", tc.labels)
	}
}
