// Command gen-dashboards writes the Grafana dashboards of deploy/monitoring/dashboards.
// The dashboards are data; writing them from this short description keeps their
// layout consistent and their queries reviewable. deploy's tests check that the
// committed files are what this writes and that every recorded series they use is
// recorded by deploy/monitoring/gpu.rules.yaml.
//
//	go run ./hack/dev/gen-dashboards -out deploy/monitoring/dashboards
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
)

type target struct {
	RefID        string `json:"refId"`
	Expr         string `json:"expr"`
	LegendFormat string `json:"legendFormat,omitempty"`
	Format       string `json:"format,omitempty"`
	Instant      bool   `json:"instant,omitempty"`
	Range        *bool  `json:"range,omitempty"`
}

type gridPos struct {
	H int `json:"h"`
	W int `json:"w"`
	X int `json:"x"`
	Y int `json:"y"`
}

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type fieldDefaults struct {
	Unit string   `json:"unit,omitempty"`
	Min  *float64 `json:"min,omitempty"`
	Max  *float64 `json:"max,omitempty"`
}

type fieldConfig struct {
	Defaults  fieldDefaults `json:"defaults"`
	Overrides []any         `json:"overrides"`
}

type transformation struct {
	ID      string         `json:"id"`
	Options map[string]any `json:"options"`
}

type panel struct {
	ID              int              `json:"id"`
	Type            string           `json:"type"`
	Title           string           `json:"title"`
	Description     string           `json:"description,omitempty"`
	GridPos         gridPos          `json:"gridPos"`
	Datasource      *datasourceRef   `json:"datasource,omitempty"`
	Targets         []target         `json:"targets,omitempty"`
	FieldConfig     *fieldConfig     `json:"fieldConfig,omitempty"`
	Transformations []transformation `json:"transformations,omitempty"`
	Collapsed       *bool            `json:"collapsed,omitempty"`
	Panels          []panel          `json:"panels,omitempty"`
}

type variable struct {
	Name       string         `json:"name"`
	Label      string         `json:"label,omitempty"`
	Type       string         `json:"type"`
	Query      string         `json:"query"`
	Datasource *datasourceRef `json:"datasource,omitempty"`
	Refresh    int            `json:"refresh,omitempty"`
	IncludeAll bool           `json:"includeAll"`
	Multi      bool           `json:"multi"`
	AllValue   string         `json:"allValue,omitempty"`
	Sort       int            `json:"sort,omitempty"`
	Current    map[string]any `json:"current"`
	Hide       int            `json:"hide"`
}

type dashboard struct {
	UID           string   `json:"uid"`
	Title         string   `json:"title"`
	Description   string   `json:"description"`
	Tags          []string `json:"tags"`
	Timezone      string   `json:"timezone"`
	SchemaVersion int      `json:"schemaVersion"`
	Version       int      `json:"version"`
	Editable      bool     `json:"editable"`
	Refresh       string   `json:"refresh"`
	Time          struct {
		From string `json:"from"`
		To   string `json:"to"`
	} `json:"time"`
	Templating struct {
		List []variable `json:"list"`
	} `json:"templating"`
	Annotations struct {
		List []any `json:"list"`
	} `json:"annotations"`
	Panels []panel `json:"panels"`
}

var ds = &datasourceRef{Type: "prometheus", UID: "${datasource}"}

func f(v float64) *float64 { return &v }

// q is one query: an expression and its legend.
type q struct{ expr, legend string }

// spec describes one panel; the builder lays panels out left to right, 24 columns wide.
type spec struct {
	kind, title, desc, unit string
	w, h                    int
	min, max                *float64
	queries                 []q
}

func ts(title, unit string, w int, queries ...q) spec {
	return spec{kind: "timeseries", title: title, unit: unit, w: w, h: 8, queries: queries}
}

func stat(title, unit string, w int, queries ...q) spec {
	return spec{kind: "stat", title: title, unit: unit, w: w, h: 4, queries: queries}
}

func table(title string, queries ...q) spec {
	return spec{kind: "table", title: title, w: 24, h: 10, queries: queries}
}

func row(title string) spec { return spec{kind: "row", title: title, w: 24, h: 1} }

func (s spec) ratio() spec { s.unit, s.min, s.max = "percentunit", f(0), f(1); return s }

func (s spec) describe(d string) spec { s.desc = d; return s }

func build(uid, title, desc string, vars []variable, specs []spec) dashboard {
	d := dashboard{UID: uid, Title: title, Description: desc, Tags: []string{"gpu", "nvidia", "talos"},
		Timezone: "browser", SchemaVersion: 39, Version: 1, Editable: true, Refresh: "30s"}
	d.Time.From, d.Time.To = "now-6h", "now"
	d.Templating.List = append([]variable{{Name: "datasource", Label: "Prometheus", Type: "datasource", Query: "prometheus", Current: map[string]any{}}}, vars...)
	d.Annotations.List = []any{}
	x, y, rowH := 0, 0, 0
	for i, s := range specs {
		if x+s.w > 24 {
			x, y, rowH = 0, y+rowH, 0
		}
		p := panel{ID: i + 1, Type: s.kind, Title: s.title, Description: s.desc, GridPos: gridPos{H: s.h, W: s.w, X: x, Y: y}}
		if s.kind == "row" {
			p.Collapsed = new(bool)
			p.Panels = []panel{}
		} else {
			p.Datasource = ds
			p.FieldConfig = &fieldConfig{Defaults: fieldDefaults{Unit: s.unit, Min: s.min, Max: s.max}, Overrides: []any{}}
			for j, qu := range s.queries {
				t := target{RefID: string(rune('A' + j)), Expr: qu.expr, LegendFormat: qu.legend}
				if s.kind == "table" || s.kind == "stat" {
					t.Instant, t.Range = true, new(bool)
				}
				if s.kind == "table" {
					t.Format = "table"
				}
				p.Targets = append(p.Targets, t)
			}
			if s.kind == "table" {
				p.Transformations = []transformation{{ID: "merge", Options: map[string]any{}}}
			}
		}
		d.Panels = append(d.Panels, p)
		x += s.w
		if s.h > rowH {
			rowH = s.h
		}
	}
	return d
}

func queryVar(name, label, query string) variable {
	return variable{Name: name, Label: label, Type: "query", Query: query, Datasource: ds, Refresh: 2,
		IncludeAll: true, Multi: true, AllValue: ".*", Sort: 1, Current: map[string]any{}}
}

// Selectors used by the per-GPU and per-namespace dashboards.
const (
	gpuSel = `{Hostname=~"$Hostname", gpu=~"$gpu"}`
	nsSel  = `{namespace=~"$namespace"}`
)

func dashboards() map[string]dashboard {
	hostVar := queryVar("Hostname", "Node", "label_values(gpu:utilization:ratio, Hostname)")
	gpuVar := queryVar("gpu", "GPU", `label_values(gpu:utilization:ratio{Hostname=~"$Hostname"}, gpu)`)
	nsVar := queryVar("namespace", "Namespace", "label_values(namespace:gpu_requested:sum, namespace)")
	return map[string]dashboard{
		"gpu-deep-dive.json": build("talos-gpu-deep-dive", "GPU / Performance deep dive",
			"One or more GPUs in detail: activity, memory, power against its limit, throttling, clocks, temperatures, interconnects, errors.",
			[]variable{hostVar, gpuVar}, []spec{
				ts("GPU utilization", "", 12, q{"gpu:utilization:ratio" + gpuSel, "{{Hostname}} GPU {{gpu}}"}).ratio(),
				ts("Tensor and graphics engine activity", "", 12,
					q{"gpu:tensor_active:ratio" + gpuSel, "tensor {{Hostname}} GPU {{gpu}}"},
					q{"gpu:gr_engine_active:ratio" + gpuSel, "graphics engine {{Hostname}} GPU {{gpu}}"},
					q{"max by (Hostname, gpu) (DCGM_FI_PROF_DRAM_ACTIVE" + gpuSel + ")", "DRAM {{Hostname}} GPU {{gpu}}"}).ratio().
					describe("Utilization says a kernel was running; tensor activity says how much of the tensor pipes it used."),
				ts("Framebuffer memory", "bytes", 12,
					q{"gpu:memory_used_bytes" + gpuSel, "used {{Hostname}} GPU {{gpu}}"},
					q{"gpu:memory_total_bytes" + gpuSel, "total {{Hostname}} GPU {{gpu}}"}),
				ts("Power draw and limit", "watt", 12,
					q{"gpu:power_usage_watts" + gpuSel, "draw {{Hostname}} GPU {{gpu}}"},
					q{"gpu:power_limit_watts" + gpuSel, "limit {{Hostname}} GPU {{gpu}}"}),
				ts("Throttled fraction of time", "", 12,
					q{"gpu:power_throttle_fraction:rate5m" + gpuSel, "power {{Hostname}} GPU {{gpu}}"},
					q{"gpu:thermal_throttle_fraction:rate5m" + gpuSel, "thermal {{Hostname}} GPU {{gpu}}"}).ratio().
					describe("rate(DCGM_FI_DEV_*_VIOLATION[5m]) / 1e9, clamped to 1 (the counters are nanoseconds)."),
				ts("Temperatures", "celsius", 12,
					q{"gpu:temperature_celsius" + gpuSel, "GPU {{Hostname}} GPU {{gpu}}"},
					q{"max by (Hostname, gpu) (DCGM_FI_DEV_MEMORY_TEMP" + gpuSel + ")", "memory {{Hostname}} GPU {{gpu}}"}),
				ts("Clocks", "hertz", 12,
					q{"max by (Hostname, gpu) (DCGM_FI_DEV_SM_CLOCK" + gpuSel + ") * 1e6", "SM {{Hostname}} GPU {{gpu}}"},
					q{"max by (Hostname, gpu) (DCGM_FI_DEV_MEM_CLOCK" + gpuSel + ") * 1e6", "memory {{Hostname}} GPU {{gpu}}"}),
				ts("PCIe and NVLink throughput", "Bps", 12,
					q{"max by (Hostname, gpu) (DCGM_FI_PROF_PCIE_TX_BYTES" + gpuSel + ")", "PCIe TX {{Hostname}} GPU {{gpu}}"},
					q{"max by (Hostname, gpu) (DCGM_FI_PROF_PCIE_RX_BYTES" + gpuSel + ")", "PCIe RX {{Hostname}} GPU {{gpu}}"},
					q{"max by (Hostname, gpu) (DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL" + gpuSel + ")", "NVLink {{Hostname}} GPU {{gpu}}"}),
				ts("Errors", "short", 24,
					q{"max by (Hostname, gpu) (DCGM_FI_DEV_XID_ERRORS" + gpuSel + ")", "last XID {{Hostname}} GPU {{gpu}}"},
					q{"max by (Hostname, gpu) (increase(DCGM_FI_DEV_PCIE_REPLAY_COUNTER" + gpuSel + "[5m]))", "PCIe replays/5m {{Hostname}} GPU {{gpu}}"},
					q{"max by (Hostname, gpu) (DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS" + gpuSel + ")", "uncorrectable remapped rows {{Hostname}} GPU {{gpu}}"},
					q{"max by (Hostname, gpu) (DCGM_FI_DEV_ROW_REMAP_FAILURE" + gpuSel + ")", "row remap failure {{Hostname}} GPU {{gpu}}"}),
			}),
		"gpu-workload-efficiency.json": build("talos-gpu-workload-efficiency", "GPU / Workload efficiency",
			"Per pod: is the GPU busy, and busy doing tensor work? High utilization with low tensor activity points at input pipelines, small batches or non-tensor kernels; throttling shows GPUs held back by power or heat.",
			[]variable{nsVar}, []spec{
				ts("Utilization by pod", "", 12, q{"pod:gpu_utilization:avg" + nsSel, "{{namespace}}/{{pod}}"}).ratio(),
				ts("Tensor activity by pod", "", 12, q{"pod:gpu_tensor_active:avg" + nsSel, "{{namespace}}/{{pod}}"}).ratio(),
				ts("Tensor activity per unit of utilization", "", 12,
					q{"pod:gpu_tensor_active:avg" + nsSel + " / (pod:gpu_utilization:avg" + nsSel + " > 0)", "{{namespace}}/{{pod}}"}).
					describe("Close to 0: the GPU is busy but its tensor cores idle."),
				ts("Throttled fraction by pod", "", 12,
					q{"pod:gpu_power_throttle_fraction:rate5m" + nsSel, "power {{namespace}}/{{pod}}"},
					q{"pod:gpu_thermal_throttle_fraction:rate5m" + nsSel, "thermal {{namespace}}/{{pod}}"}).ratio(),
				table("Pods on GPUs now",
					q{"pod:gpu_utilization:avg" + nsSel, "utilization"},
					q{"pod:gpu_tensor_active:avg" + nsSel, "tensor"},
					q{"pod:gpu_memory_used_bytes:sum" + nsSel, "memory"},
					q{"pod:gpu_power_throttle_fraction:rate5m" + nsSel, "power throttled"},
					q{"pod:gpu_thermal_throttle_fraction:rate5m" + nsSel, "thermal throttled"}),
			}),
		"gpu-fleet-inventory.json": build("talos-gpu-fleet-inventory", "GPU / Fleet inventory",
			"What GPUs the cluster has, where, their power limits against their draw, and MIG instances.",
			nil, []spec{
				stat("GPUs", "short", 6, q{"sum(node:gpus:count)", ""}),
				stat("Power draw", "watt", 6, q{"cluster:gpu_power_usage_watts:sum", ""}),
				stat("Power limit", "watt", 6, q{"cluster:gpu_power_limit_watts:sum", ""}),
				stat("MIG instances", "short", 6, q{"sum(cluster:gpu_mig_instances:count)", ""}),
				table("GPUs by node and model", q{"node:gpus:count", ""}),
				ts("Power draw against limit by node", "watt", 12,
					q{"node:gpu_power_usage_watts:sum", "draw {{Hostname}}"},
					q{"node:gpu_power_limit_watts:sum", "limit {{Hostname}}"}),
				ts("Draw as a share of the limit", "", 12, q{"gpu:power_usage_to_limit:ratio", "{{Hostname}} GPU {{gpu}}"}).ratio(),
				table("Every GPU: power limit, draw, memory",
					q{"gpu:power_limit_watts", "limit"},
					q{"gpu:power_usage_watts", "draw"},
					q{"gpu:power_usage_to_limit:ratio", "draw/limit"},
					q{"gpu:memory_total_bytes", "memory"},
					q{"max by (Hostname, gpu, UUID, modelName, DCGM_FI_DRIVER_VERSION) (DCGM_FI_DEV_GPU_TEMP)", "temperature"}),
				table("MIG instances by node and profile", q{"node:gpu_mig_instances:count", ""}),
			}),
		"gpu-quota-vs-usage.json": build("talos-gpu-quota-vs-usage", "GPU / Quota against live usage",
			"What is promised (quotas), allocated (requests of scheduled pods) and actually used (DCGM), per resource and namespace.",
			nil, []spec{
				ts("Allocatable, requested and free", "short", 12,
					q{"cluster:gpu_allocatable:sum", "allocatable {{resource}}"},
					q{"cluster:gpu_requested:sum", "requested {{resource}}"},
					q{"cluster:gpu_free:sum", "free {{resource}}"}),
				ts("Allocated share", "", 12, q{"cluster:gpu_allocated:ratio", "{{resource}}"}).ratio(),
				ts("Allocated against in use by namespace", "short", 12,
					q{`namespace:gpu_requested:sum{resource="nvidia_com_gpu"}`, "requested {{namespace}}"},
					q{"namespace:gpus_in_use:count", "in use {{namespace}}"}),
				ts("Live utilization by namespace", "", 12, q{"namespace:gpu_utilization:avg", "{{namespace}}"}).ratio(),
				table("Namespaces: quota, requests, use",
					q{"namespace:gpu_quota_hard:sum", "quota"},
					q{"namespace:gpu_quota_used:sum", "quota used"},
					q{`sum by (namespace) (namespace:gpu_requested:sum{resource="nvidia_com_gpu"})`, "requested"},
					q{"namespace:gpus_in_use:count", "GPUs in use"},
					q{"namespace:gpu_utilization:avg", "utilization"},
					q{"namespace:gpu_tensor_active:avg", "tensor"}),
			}),
		"gpu-tenant.json": build("talos-gpu-tenant", "GPU / Tenant (namespace) view",
			"One namespace's GPUs: what it requested and may request, how well it uses them, and its pods.",
			[]variable{nsVar}, []spec{
				stat("GPUs requested", "short", 6, q{`sum(namespace:gpu_requested:sum{namespace=~"$namespace", resource="nvidia_com_gpu"})`, ""}),
				stat("Quota", "short", 6, q{"sum(namespace:gpu_quota_hard:sum" + nsSel + ")", ""}),
				stat("Utilization", "percentunit", 6, q{"avg(namespace:gpu_utilization:avg" + nsSel + ")", ""}),
				stat("Tensor activity", "percentunit", 6, q{"avg(namespace:gpu_tensor_active:avg" + nsSel + ")", ""}),
				ts("Requests by resource (GPUs and MIG slices)", "short", 12, q{"namespace:gpu_requested:sum" + nsSel, "{{namespace}} {{resource}}"}),
				ts("Utilization and tensor activity", "", 12,
					q{"namespace:gpu_utilization:avg" + nsSel, "utilization {{namespace}}"},
					q{"namespace:gpu_tensor_active:avg" + nsSel, "tensor {{namespace}}"}).ratio(),
				ts("GPU memory used", "bytes", 12, q{"namespace:gpu_memory_used_bytes:sum" + nsSel, "{{namespace}}"}),
				ts("Power draw", "watt", 12, q{"namespace:gpu_power_usage_watts:sum" + nsSel, "{{namespace}}"}),
				table("Pods",
					q{"pod:gpu_utilization:avg" + nsSel, "utilization"},
					q{"pod:gpu_tensor_active:avg" + nsSel, "tensor"},
					q{"pod:gpu_memory_used_bytes:sum" + nsSel, "memory"}),
			}),
	}
}

func main() {
	out := flag.String("out", "deploy/monitoring/dashboards", "directory to write the dashboards to")
	flag.Parse()
	if err := write(*out); err != nil {
		fmt.Fprintln(os.Stderr, "gen-dashboards:", err)
		os.Exit(1)
	}
}

func write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, d := range dashboards() {
		data, err := json.MarshalIndent(d, "", "  ")
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), append(data, '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
}
