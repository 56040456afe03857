package deploy_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

// gpuOperatorModule ships the GPU Operator's Helm chart (deployments/gpu-operator). The test
// renders it at the version hack/k8s-node/validator/go.mod requires, the one
// hack/gpu-operator/build.sh builds in CI.
const gpuOperatorModule = "github.com/NVIDIA/gpu-operator"

// skipOutsideCI skips a test whose inputs cannot be had here, and fails it in CI, where a
// skip would hide a broken setup.
func skipOutsideCI(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

// gpuOperatorChart returns the chart's directory in the module cache and the module@version.
func gpuOperatorChart(t *testing.T) (string, string) {
	t.Helper()
	modDir := filepath.Join(root, "hack", "k8s-node", "validator")
	gomod, err := os.ReadFile(filepath.Join(modDir, "go.mod"))
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(gpuOperatorModule) + `\s+(v\S+)`).FindSubmatch(gomod)
	require.NotNil(t, m, "hack/k8s-node/validator/go.mod requires no %s", gpuOperatorModule)
	version := string(m[1])

	cmd := exec.Command("go", "mod", "download", "-json", gpuOperatorModule+"@"+version)
	cmd.Dir = modDir // its go.sum has the module's hash
	out, err := cmd.Output()
	if err != nil {
		skipOutsideCI(t, "cannot download %s@%s (its chart): %v\n%s", gpuOperatorModule, version, err, out)
	}
	var info struct{ Dir string }
	require.NoError(t, json.Unmarshal(out, &info))
	chart := filepath.Join(info.Dir, "deployments", "gpu-operator")
	require.FileExists(t, filepath.Join(chart, "Chart.yaml"))
	return chart, gpuOperatorModule + "@" + version
}

// renderGPUOperator renders NVIDIA's chart as `helm install -n gpu-operator` would, with the
// given values files, CRDs included.
func renderGPUOperator(t *testing.T, chart string, values ...string) []byte {
	t.Helper()
	if err := installTools(); err != nil {
		skipOutsideCI(t, "no helm: %v", err)
	}
	args := []string{"template", "gpu-operator", chart, "--namespace", "gpu-operator", "--include-crds"}
	for _, v := range values {
		args = append(args, "--values", v)
	}
	return run(t, nil, tool(t, "helm"), args...)
}

// rendered is a chart rendering, each document decoded as plain data, by kind and name.
type rendered map[string]map[string]any

func decodeRendering(t *testing.T, out []byte) rendered {
	t.Helper()
	r := rendered{}
	for i, doc := range splitDocs(out) {
		var obj map[string]any
		require.NoError(t, yaml.Unmarshal(doc, &obj), "document %d", i)
		if obj == nil {
			continue
		}
		kind, _ := obj["kind"].(string)
		name, _ := get(obj, "metadata", "name").(string)
		r[kind+"/"+name] = obj
	}
	return r
}

// get walks maps by key; nil where a key is missing.
func get(v any, keys ...string) any {
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

// envOf turns a rendered env list into a map.
func envOf(t *testing.T, v any) map[string]string {
	t.Helper()
	list, ok := v.([]any)
	require.True(t, ok, "env is not a list: %#v", v)
	env := map[string]string{}
	for _, e := range list {
		name, _ := get(e, "name").(string)
		value, _ := get(e, "value").(string)
		env[name] = value
	}
	return env
}

// unknownFields lists the paths in v that a structural schema does not declare, which the API
// server would prune from the object without a word.
func unknownFields(schema map[string]any, v any, path string) []string {
	if preserve, _ := schema["x-kubernetes-preserve-unknown-fields"].(bool); preserve {
		return nil
	}
	switch v := v.(type) {
	case map[string]any:
		props, _ := schema["properties"].(map[string]any)
		extra, _ := schema["additionalProperties"].(map[string]any)
		var bad []string
		for k, sub := range v {
			s, ok := props[k].(map[string]any)
			if !ok && extra != nil {
				s, ok = extra, true
			}
			if !ok {
				bad = append(bad, path+"."+k)
				continue
			}
			bad = append(bad, unknownFields(s, sub, path+"."+k)...)
		}
		return bad
	case []any:
		items, _ := schema["items"].(map[string]any)
		var bad []string
		for i, sub := range v {
			bad = append(bad, unknownFields(items, sub, fmt.Sprintf("%s[%d]", path, i))...)
		}
		return bad
	}
	return nil
}

// The Cozystack overlay on setup 2, as NVIDIA's chart renders it: the ClusterPolicy the operator
// would act on, checked against the ClusterPolicy CRD the same chart installs.
func TestGPUOperatorCozystackValues(t *testing.T) {
	chart, version := gpuOperatorChart(t)
	t.Logf("chart of %s", version)
	nri := filepath.Join("gpu-operator", "values-nri.yaml")
	cozy := filepath.Join("gpu-operator", "values-cozystack.yaml")
	out := renderGPUOperator(t, chart, nri, cozy)
	r := decodeRendering(t, out)

	policy := r["ClusterPolicy/cluster-policy"]
	require.NotNil(t, policy, "the chart rendered no ClusterPolicy cluster-policy")
	spec := get(policy, "spec")

	// The extension's driver root, no operator driver, nothing of Cozystack's compat tree.
	assert.Equal(t, "/run/nvidia/driver", get(spec, "hostPaths", "driverInstallDir"))
	assert.NotContains(t, string(out), "/var/nvidia-driver")
	assert.Equal(t, false, get(spec, "driver", "enabled"))

	// values-nri.yaml's toolkit survives the overlay.
	assert.Equal(t, true, get(spec, "toolkit", "enabled"))
	assert.Equal(t, "/var/lib/nvidia-container-toolkit", get(spec, "toolkit", "installDir"))
	assert.Equal(t, "none", envOf(t, get(spec, "toolkit", "env"))["CREATE_DEVICE_NODES"])
	assert.Equal(t, true, get(spec, "cdi", "enabled"))
	assert.Equal(t, "true", envOf(t, get(spec, "validator", "driver", "env"))["DISABLE_DEV_CHAR_SYMLINK_CREATION"])
	assert.Equal(t, false, get(spec, "migManager", "enabled"))
	assert.Equal(t, false, get(spec, "dcgm", "enabled"), "the exporter embeds its host engine")

	// Cozystack's settings.
	assert.Equal(t, false, get(spec, "sandboxWorkloads", "enabled"))
	assert.Equal(t, false, get(spec, "vfioManager", "enabled"))
	assert.Equal(t, true, get(spec, "devicePlugin", "enabled"))
	exporter := get(spec, "dcgmExporter")
	assert.Equal(t, true, get(exporter, "enabled"))
	assert.Equal(t, "dcgm-custom-metrics", get(exporter, "config", "name"))
	monitor := get(exporter, "serviceMonitor")
	assert.Equal(t, true, get(monitor, "enabled"))
	assert.Equal(t, "15s", get(monitor, "interval"))
	assert.Equal(t, true, get(monitor, "honorLabels"))
	assert.Equal(t, []any{map[string]any{
		"sourceLabels": []any{"__meta_kubernetes_pod_node_name"}, "targetLabel": "node", "action": "replace",
	}}, get(monitor, "relabelings"))
	// The chart does not make the counters' ConfigMap: the user makes it from counters.csv.
	assert.NotContains(t, r, "ConfigMap/dcgm-custom-metrics")
	assert.NotNil(t, r["DaemonSet/gpu-operator-node-feature-discovery-worker"], "the chart's NFD (nfd.enabled)")

	// Every field of the rendered policy is one the CRD declares: the API server prunes the
	// rest, so a misspelt setting (a snake_case relabeling key) would vanish without an error.
	crd := r["CustomResourceDefinition/clusterpolicies.nvidia.com"]
	require.NotNil(t, crd, "the chart's CRDs (--include-crds)")
	versions, _ := get(crd, "spec", "versions").([]any)
	var schema map[string]any
	for _, v := range versions {
		if get(v, "name") == "v1" {
			schema, _ = get(v, "schema", "openAPIV3Schema").(map[string]any)
		}
	}
	require.NotNil(t, schema, "the CRD's v1 schema")
	specSchema, _ := get(schema, "properties", "spec").(map[string]any)
	require.NotNil(t, specSchema, "the CRD's spec schema")
	assert.Empty(t, unknownFields(specSchema, policy["spec"], "spec"), "fields the ClusterPolicy CRD of %s does not declare", version)

	// The counters' key: the one the CRD names for config.name (and the operator mounts,
	// controllers/object_controls.go MetricsConfigFileName), as the overlay's command makes it.
	desc, _ := get(schema, "properties", "spec", "properties", "dcgmExporter", "properties", "config",
		"properties", "name", "description").(string)
	assert.Contains(t, desc, "dcgm-metrics.csv")
	overlay, err := os.ReadFile(cozy)
	require.NoError(t, err)
	assert.Contains(t, string(overlay), "--from-file=dcgm-metrics.csv=deploy/dcgm-exporter/counters.csv")
	require.FileExists(t, filepath.Join("dcgm-exporter", "counters.csv"))

	// cdi.nriPluginEnabled arrived with v26.7.0, which the module proxy does not serve. Where
	// the module version's CRD lacks the field, the chart renders none (the values key is
	// ignored), and only what it does render is checked; a chart whose CRD has it must render it.
	if get(schema, "properties", "spec", "properties", "cdi", "properties", "nriPluginEnabled") != nil {
		assert.Equal(t, true, get(spec, "cdi", "nriPluginEnabled"))
	} else {
		assert.Nil(t, get(spec, "cdi", "nriPluginEnabled"))
		t.Logf("%s's chart has no cdi.nriPluginEnabled (v26.7.0 and later): not checked", version)
	}
}

// deploy/gpu-operator/cozystack-package.yaml carries the values of values-nri.yaml with
// values-cozystack.yaml on top: NVIDIA's chart renders the same from either, and
// docs/gpu-operator.md shows the file verbatim.
func TestGPUOperatorCozystackPackage(t *testing.T) {
	pkgFile := filepath.Join("gpu-operator", "cozystack-package.yaml")
	data, err := os.ReadFile(pkgFile)
	require.NoError(t, err)
	var pkg map[string]any
	require.NoError(t, yaml.UnmarshalStrict(data, &pkg))
	assert.Equal(t, "cozystack.io/v1alpha1", pkg["apiVersion"])
	assert.Equal(t, "Package", pkg["kind"])
	assert.Equal(t, "cozystack.gpu-operator", get(pkg, "metadata", "name"))
	values, ok := get(pkg, "spec", "components", "gpu-operator", "values", "gpu-operator").(map[string]any)
	require.True(t, ok, "spec.components.gpu-operator.values.gpu-operator")
	asValues, err := yaml.Marshal(values)
	require.NoError(t, err)
	assert.NotContains(t, string(asValues), "/var/nvidia-driver")

	doc, err := os.ReadFile(filepath.Join(root, "docs", "gpu-operator.md"))
	require.NoError(t, err)
	assert.True(t, strings.Contains(string(doc), "```yaml\n"+string(data)+"```\n"),
		"docs/gpu-operator.md does not show %s verbatim", pkgFile)

	chart, _ := gpuOperatorChart(t)
	tmp := filepath.Join(t.TempDir(), "package-values.yaml")
	require.NoError(t, os.WriteFile(tmp, asValues, 0o644))
	want := renderGPUOperator(t, chart, filepath.Join("gpu-operator", "values-nri.yaml"), filepath.Join("gpu-operator", "values-cozystack.yaml"))
	got := renderGPUOperator(t, chart, tmp)
	assert.Equal(t, string(want), string(got), "the Package's values render differently from values-nri.yaml + values-cozystack.yaml")

	// Its values are the two files merged as helm merges them; the render above cannot see a
	// key this chart ignores (cdi.nriPluginEnabled before v26.7.0).
	var merged map[string]any
	for _, f := range []string{"values-nri.yaml", "values-cozystack.yaml"} {
		raw, err := os.ReadFile(filepath.Join("gpu-operator", f))
		require.NoError(t, err)
		var v map[string]any
		require.NoError(t, yaml.Unmarshal(raw, &v))
		merged = mergeValues(merged, v)
	}
	assert.Equal(t, merged, values)
}

// mergeValues merges values files as helm does: maps key by key, anything else (lists
// included) replaced by the later file's.
func mergeValues(base, over map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range base {
		out[k] = v
	}
	for k, v := range over {
		bm, bok := out[k].(map[string]any)
		om, ook := v.(map[string]any)
		if bok && ook {
			out[k] = mergeValues(bm, om)
			continue
		}
		out[k] = v
	}
	return out
}
