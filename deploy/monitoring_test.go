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
		b.WriteString("apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata:\n  name: gpu\n  namespace: nvidia-gpu\n  labels:\n    app.kubernetes.io/name: gpu-monitoring\nspec:\n")
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
		}
	}
	assert.Equal(t, map[string]int{"PrometheusRule": 1, "ServiceMonitor": 1, "ConfigMap": 1}, kinds)
}
