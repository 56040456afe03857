package deploy_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

// kubePrometheusStackRelease is the release label the ServiceMonitor and PrometheusRule carry:
// kube-prometheus-stack's Prometheus selects by its Helm release's name, and this is the name
// its install instructions use.
const kubePrometheusStackRelease = "kube-prometheus-stack"

const (
	rulesFile          = "monitoring/gpu.rules.yaml"
	prometheusRuleFile = "monitoring/prometheusrule.yaml"
	dashboardsDir      = "monitoring/dashboards"
)

// The rule file format (what promtool reads), decoded strictly.
type ruleFile struct {
	Groups []ruleGroup `json:"groups"`
}

type ruleGroup struct {
	Name     string `json:"name"`
	Interval string `json:"interval,omitempty"`
	Rules    []rule `json:"rules"`
}

type rule struct {
	Record      string            `json:"record,omitempty"`
	Alert       string            `json:"alert,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type prometheusRule struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string            `json:"name"`
		Namespace string            `json:"namespace"`
		Labels    map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec ruleFile `json:"spec"`
}

func loadRules(t *testing.T) ruleFile {
	t.Helper()
	data, err := os.ReadFile(rulesFile)
	require.NoError(t, err)
	var rf ruleFile
	require.NoError(t, yaml.UnmarshalStrict(data, &rf))
	return rf
}

func TestRulesPromtool(t *testing.T) {
	promtool := tool(t, "promtool")
	out := run(t, nil, promtool, "check", "rules", rulesFile)
	t.Logf("%s", out)
	// promtool test rules resolves rule_files relative to the test file.
	out = run(t, nil, promtool, "test", "rules", "monitoring/tests/gpu.rules.test.yaml")
	assert.Contains(t, string(out), "SUCCESS")
}

// The PrometheusRule is the rules file with an object header: generated, and checked
// to carry the very same groups.
func TestPrometheusRuleMatchesRulesFile(t *testing.T) {
	src, err := os.ReadFile(rulesFile)
	require.NoError(t, err)
	if *update {
		var b bytes.Buffer
		b.WriteString("# Generated from gpu.rules.yaml by `go test ./deploy -run PrometheusRule -update`: edit that file.\n")
		b.WriteString("apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata:\n  name: gpu\n  namespace: nvidia-gpu\n  labels:\n    app.kubernetes.io/name: gpu-monitoring\n    release: " + kubePrometheusStackRelease + "\nspec:\n")
		for _, line := range strings.SplitAfter(string(src), "\n") {
			if strings.HasPrefix(line, "#") || line == "" {
				continue
			}
			if strings.TrimSpace(line) == "" {
				b.WriteString(line)
				continue
			}
			b.WriteString("  " + line)
		}
		require.NoError(t, os.WriteFile(prometheusRuleFile, b.Bytes(), 0o644))
	}
	data, err := os.ReadFile(prometheusRuleFile)
	require.NoError(t, err)
	var pr prometheusRule
	require.NoError(t, yaml.UnmarshalStrict(data, &pr), "%s (regenerate with go test ./deploy -run PrometheusRule -update)", prometheusRuleFile)
	assert.Equal(t, "monitoring.coreos.com/v1", pr.APIVersion)
	assert.Equal(t, "PrometheusRule", pr.Kind)
	assert.Equal(t, kubePrometheusStackRelease, pr.Metadata.Labels["release"], "kube-prometheus-stack selects rules by it (docs/kubernetes.md)")
	assert.Equal(t, loadRules(t), pr.Spec, "%s differs from %s: go test ./deploy -run PrometheusRule -update", prometheusRuleFile, rulesFile)
}

func TestRulesContent(t *testing.T) {
	rf := loadRules(t)
	records := map[string]string{}
	alerts := map[string]rule{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				require.NotContains(t, records, r.Record, "recorded twice")
				records[r.Record] = r.Expr
			} else {
				alerts[r.Alert] = r
			}
		}
	}
	for name, metric := range map[string]string{
		"gpu:power_throttle_fraction:rate5m":   "DCGM_FI_DEV_POWER_VIOLATION",
		"gpu:thermal_throttle_fraction:rate5m": "DCGM_FI_DEV_THERMAL_VIOLATION",
	} {
		want := "clamp_max(max by (Hostname, gpu, UUID) (rate(" + metric + "[5m])) / 1e9, 1)"
		assert.Equal(t, want, records[name], name)
	}
	for _, name := range []string{
		"gpu:utilization:ratio", "node:gpu_utilization:avg", "cluster:gpu_utilization:avg",
		"gpu:memory_used:ratio", "cluster:gpu_memory_used:ratio",
		"gpu:power_usage_watts", "gpu:power_limit_watts", "cluster:gpu_power_usage_watts:sum",
		"gpu:tensor_active:ratio", "cluster:gpu_tensor_active:avg",
		"cluster:gpu_allocatable:sum", "cluster:gpu_requested:sum", "cluster:gpu_free:sum",
		"namespace:gpu_requested:sum", "node:gpu_mig_instances:count",
	} {
		assert.Contains(t, records, name)
	}
	scale := alerts["GPUThrottleCounterScale"]
	assert.Contains(t, scale.Expr, "rate(DCGM_FI_DEV_POWER_VIOLATION[5m])) / 1e9 > 1")
	assert.Contains(t, scale.Expr, "rate(DCGM_FI_DEV_THERMAL_VIOLATION[5m])) / 1e9 > 1")
	assert.NotContains(t, scale.Expr, "clamp", "the scale alert must see the unclamped fraction")
}

// grafanaDashboard is the part of a dashboard the tests look at.
type grafanaDashboard struct {
	Title      string         `json:"title"`
	UID        string         `json:"uid"`
	Panels     []grafanaPanel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type grafanaPanel struct {
	Title   string `json:"title"`
	Type    string `json:"type"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

var recordedName = regexp.MustCompile(`\b[a-z_]+:[a-z0-9_:]*[a-z0-9_]\b`)

func TestDashboards(t *testing.T) {
	// The committed dashboards are what hack/dev/gen-dashboards writes.
	tmp := t.TempDir()
	gen := exec.Command("go", "run", "./hack/dev/gen-dashboards", "-out", tmp)
	gen.Dir = root
	out, err := gen.CombinedOutput()
	require.NoError(t, err, "%s", out)
	generated, err := filepath.Glob(filepath.Join(tmp, "*.json"))
	require.NoError(t, err)
	committed, err := filepath.Glob(filepath.Join(dashboardsDir, "*.json"))
	require.NoError(t, err)
	require.Len(t, committed, 5, "deep dive, workload efficiency, fleet inventory, quota vs usage, tenant")
	require.Len(t, generated, len(committed))
	for _, g := range generated {
		want, err := os.ReadFile(g)
		require.NoError(t, err)
		got, err := os.ReadFile(filepath.Join(dashboardsDir, filepath.Base(g)))
		require.NoError(t, err, "run: go run ./hack/dev/gen-dashboards -out deploy/monitoring/dashboards")
		assert.Equal(t, string(want), string(got), "%s is stale: go run ./hack/dev/gen-dashboards -out deploy/monitoring/dashboards", filepath.Base(g))
	}

	records := map[string]bool{}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			records[r.Record] = true
		}
	}
	uids := map[string]bool{}
	for _, path := range committed {
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		var d grafanaDashboard
		dec := json.NewDecoder(bytes.NewReader(data))
		require.NoError(t, dec.Decode(&d), path)
		require.NotEmpty(t, d.Title, path)
		require.False(t, uids[d.UID], "%s: duplicate uid %s", path, d.UID)
		uids[d.UID] = true
		require.NotEmpty(t, d.Panels, path)
		var used []string
		for _, p := range d.Panels {
			if p.Type == "row" || p.Type == "text" {
				continue
			}
			require.NotEmpty(t, p.Targets, "%s: panel %q has no query", path, p.Title)
			for _, tg := range p.Targets {
				require.NotEmpty(t, tg.Expr, "%s: panel %q", path, p.Title)
				used = append(used, recordedName.FindAllString(tg.Expr, -1)...)
			}
		}
		for _, v := range d.Templating.List {
			if q, ok := v.Query.(string); ok {
				used = append(used, recordedName.FindAllString(q, -1)...)
			}
		}
		sort.Strings(used)
		for _, name := range used {
			assert.True(t, records[name], "%s uses %s, which no rule records", filepath.Base(path), name)
		}
	}
}

// The monitoring kustomization builds (PrometheusRule and ServiceMonitor are CRDs:
// decoded loosely here, their rule groups strictly above).
func TestMonitoringKustomization(t *testing.T) {
	out := kustomize(t, "deploy/monitoring")
	kinds := map[string]int{}
	for _, doc := range splitDocs(out) {
		var head struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Namespace string            `json:"namespace"`
				Labels    map[string]string `json:"labels"`
			} `json:"metadata"`
			Data map[string]string `json:"data"`
		}
		require.NoError(t, yaml.Unmarshal(doc, &head))
		kinds[head.Kind]++
		assert.Equal(t, "nvidia-gpu", head.Metadata.Namespace)
		if head.Kind == "ConfigMap" {
			assert.Equal(t, "1", head.Metadata.Labels["grafana_dashboard"])
			assert.Len(t, head.Data, 5)
		} else {
			assert.Equal(t, kubePrometheusStackRelease, head.Metadata.Labels["release"], "%s: kube-prometheus-stack selects by it", head.Kind)
		}
	}
	assert.Equal(t, map[string]int{"PrometheusRule": 1, "ServiceMonitor": 1, "ConfigMap": 1}, kinds)
}

// docBlock returns the YAML code block of docs/<page> that contains marker.
func docBlock(t *testing.T, page, marker string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "docs", page))
	require.NoError(t, err)
	for _, part := range strings.Split(string(data), "```yaml\n")[1:] {
		block, _, ok := strings.Cut(part, "\n```")
		if ok && strings.Contains(block, marker) {
			return block + "\n"
		}
	}
	require.FailNow(t, "no YAML block with "+marker, "docs/%s", page)
	return ""
}

// TestMonitoringReleaseOverlay: the kustomization docs/kubernetes.md shows for another
// kube-prometheus-stack release name builds against deploy/monitoring and relabels both the
// ServiceMonitor and the PrometheusRule, leaving their selectors alone.
func TestMonitoringReleaseOverlay(t *testing.T) {
	block := docBlock(t, "kubernetes.md", "kind: Kustomization")
	var k struct {
		Resources []string `json:"resources"`
		Labels    []struct {
			Pairs map[string]string `json:"pairs"`
		} `json:"labels"`
	}
	require.NoError(t, yaml.Unmarshal([]byte(block), &k))
	require.Equal(t, []string{"../nvidia-driver/deploy/monitoring"}, k.Resources, "the docs' overlay names deploy/monitoring of a checkout beside it")
	require.Len(t, k.Labels, 1)
	release := k.Labels[0].Pairs["release"]
	require.NotEmpty(t, release)
	require.NotEqual(t, kubePrometheusStackRelease, release, "the example shows another name")

	// The overlay beside a checkout named nvidia-driver, as the docs lay it out.
	top := t.TempDir()
	abs, err := filepath.Abs(filepath.Join(root, "deploy"))
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(filepath.Join(top, "nvidia-driver"), 0o755))
	require.NoError(t, os.Symlink(abs, filepath.Join(top, "nvidia-driver", "deploy")))
	overlay := filepath.Join(top, "overlay")
	require.NoError(t, os.MkdirAll(overlay, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(block), 0o644))

	out := run(t, nil, tool(t, "kustomize"), "build", overlay)
	relabelled := 0
	for _, doc := range splitDocs(out) {
		var obj struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Labels map[string]string `json:"labels"`
			} `json:"metadata"`
			Spec struct {
				Selector struct {
					MatchLabels map[string]string `json:"matchLabels"`
				} `json:"selector"`
			} `json:"spec"`
		}
		require.NoError(t, yaml.Unmarshal(doc, &obj))
		if obj.Kind == "ServiceMonitor" || obj.Kind == "PrometheusRule" {
			relabelled++
			assert.Equal(t, release, obj.Metadata.Labels["release"], obj.Kind)
		}
		if obj.Kind == "ServiceMonitor" {
			assert.Equal(t, map[string]string{"app.kubernetes.io/name": "dcgm-exporter"}, obj.Spec.Selector.MatchLabels, "the selector stays the exporter's")
		}
	}
	assert.Equal(t, 2, relabelled)
}

// kubernetesSD is the part of Prometheus's kubernetes_sd_config the docs use, decoded strictly.
type kubernetesSD struct {
	Role       string `json:"role"`
	Namespaces struct {
		Names []string `json:"names"`
	} `json:"namespaces"`
}

// TestScrapeConfigPromtool: the scrape configuration docs/kubernetes.md gives a Prometheus
// without the operator passes promtool, keeps the exporter's labels and targets the port
// and labels of deploy/dcgm-exporter's Service; a slip in it fails promtool. Debian's
// promtool is built without Kubernetes discovery, so promtool checks the job with a static
// target in its place, and the kubernetes_sd_configs block is decoded strictly here.
func TestScrapeConfigPromtool(t *testing.T) {
	promtool := tool(t, "promtool")
	block := docBlock(t, "kubernetes.md", "scrape_configs:")

	var doc map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(block), &doc))
	jobs, _ := doc["scrape_configs"].([]any)
	require.Len(t, jobs, 1)
	job, _ := jobs[0].(map[string]any)
	sdRaw, err := yaml.Marshal(job["kubernetes_sd_configs"])
	require.NoError(t, err)
	var sds []kubernetesSD
	require.NoError(t, yaml.UnmarshalStrict(sdRaw, &sds), "%s", sdRaw)
	require.Len(t, sds, 1)
	assert.Equal(t, "endpoints", sds[0].Role)
	assert.Equal(t, []string{"nvidia-gpu"}, sds[0].Namespaces.Names, "deploy/'s namespace")

	delete(job, "kubernetes_sd_configs")
	job["static_configs"] = []any{map[string]any{"targets": []any{"dcgm-exporter.nvidia-gpu.svc:9400"}}}
	static, err := yaml.Marshal(doc)
	require.NoError(t, err)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	require.NoError(t, os.WriteFile(cfg, static, 0o644))
	t.Logf("%s", run(t, nil, promtool, "check", "config", cfg))
	block = string(static)

	var sc struct {
		ScrapeConfigs []struct {
			HonorLabels    bool `json:"honor_labels"`
			RelabelConfigs []struct {
				SourceLabels []string `json:"source_labels"`
				Regex        string   `json:"regex"`
				Action       string   `json:"action"`
			} `json:"relabel_configs"`
		} `json:"scrape_configs"`
	}
	require.NoError(t, yaml.Unmarshal([]byte(block), &sc))
	require.Len(t, sc.ScrapeConfigs, 1)
	assert.True(t, sc.ScrapeConfigs[0].HonorLabels, "the rules use the exporter's namespace/pod labels")
	svc, err := os.ReadFile("dcgm-exporter/service.yaml")
	require.NoError(t, err)
	assert.Contains(t, string(svc), "app.kubernetes.io/name: dcgm-exporter")
	assert.Contains(t, string(svc), "- name: metrics")
	require.NotEmpty(t, sc.ScrapeConfigs[0].RelabelConfigs)
	assert.Equal(t, "dcgm-exporter;metrics", sc.ScrapeConfigs[0].RelabelConfigs[0].Regex)

	// The control: an unknown key fails promtool.
	require.NoError(t, os.WriteFile(cfg, []byte(strings.Replace(block, "honor_labels:", "honour_labels:", 1)), 0o644))
	bad := exec.Command(promtool, "check", "config", cfg)
	outBad, err := bad.CombinedOutput()
	require.Error(t, err, "%s", outBad)
	assert.Contains(t, string(outBad), "honour_labels")
}
