package deploy_test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// exporterDefaults are the fields dcgm-exporter exports by default: the uncommented rows of
// its etc/default-counters.csv at NVIDIA/dcgm-exporter 7ad58324b444, read 2026-11-29. A user
// who switches from the exporter's own configuration to ours loses none of them.
var exporterDefaults = []string{
	"DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_GPU_TEMP",
	"DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
	"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL",
	"DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED",
	"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
	"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
	"DCGM_FI_DRIVER_VERSION", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
	"DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES",
}

// extraCounters are the fields our ConfigMap adds to the exporter's defaults, for the
// throttle rules in deploy/monitoring.
var extraCounters = []string{"DCGM_FI_DEV_POWER_VIOLATION", "DCGM_FI_DEV_THERMAL_VIOLATION", "DCGM_FI_DEV_POWER_MGMT_LIMIT"}

// activeCounters returns the fields of a dcgm-exporter counters CSV that are exported
// (rows not commented out), checking each row's form.
func activeCounters(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var fields []string
	seen := map[string]int{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		cols := strings.Split(line, ",")
		require.Len(t, cols, 3, "%s:%d: want FIELD, type, help (no comma in the help)", path, n)
		typ := strings.TrimSpace(cols[1])
		require.Contains(t, []string{"gauge", "counter", "label"}, typ, "%s:%d", path, n)
		field := strings.TrimSpace(cols[0])
		require.NotContains(t, seen, field, "%s:%d: %s again (first on line %d)", path, n, field, seen[field])
		seen[field] = n
		require.NotEmpty(t, strings.TrimSpace(cols[2]), "%s:%d: no help text", path, n)
		fields = append(fields, field)
	}
	require.NoError(t, sc.Err())
	return fields
}

func TestDCGMCounters(t *testing.T) {
	ours := activeCounters(t, "dcgm-exporter/counters.csv")
	want := append(append([]string{}, exporterDefaults...), extraCounters...)
	sort.Strings(want)
	sort.Strings(ours)
	assert.Equal(t, want, ours, "counters.csv = the exporter's defaults + %v", extraCounters)
}

var dcgmField = regexp.MustCompile(`\bDCGM_FI_[A-Z0-9_]*[A-Z0-9]\b`)

// Every DCGM field that rules, dashboards, manifests or docs use is one the exporter
// is configured to export.
func TestDCGMFieldsReferencedAreExported(t *testing.T) {
	exported := map[string]bool{}
	for _, f := range activeCounters(t, "dcgm-exporter/counters.csv") {
		exported[f] = true
	}
	seen := 0
	for _, dir := range []string{".", filepath.Join(root, "docs")} {
		err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err != nil {
				if os.IsNotExist(err) {
					return nil
				}
				return err
			}
			if d.IsDir() || strings.HasSuffix(path, ".csv") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, f := range dcgmField.FindAllString(string(data), -1) {
				seen++
				assert.True(t, exported[f], "%s uses %s, which deploy/dcgm-exporter/counters.csv does not export", path, f)
			}
			return nil
		})
		require.NoError(t, err)
	}
	assert.Greater(t, seen, 20, "expected the rules and dashboards to use DCGM fields")
}

func TestDCGMExporterPod(t *testing.T) {
	objs := decodeStrict(t, kustomize(t, "deploy/dcgm-exporter"))
	ds := objs.daemonSets["dcgm-exporter"]
	require.NotNil(t, ds)
	pod := &ds.Spec.Template.Spec
	assert.Nil(t, pod.RuntimeClassName)
	gpuNodeAffinity(t, pod, "nvidia.com/gpu.deploy.dcgm-exporter")

	exp := container(t, pod, "exporter")
	privileged(t, exp)
	e := env(exp)
	assert.Equal(t, "/run/nvidia/nvml", e["LD_LIBRARY_PATH"])
	assert.Equal(t, "true", e["DCGM_EXPORTER_KUBERNETES"])
	hostPath(t, pod, "driver-root", "/run/nvidia/driver")
	hostToContainer(t, exp, "driver-root", "/run/nvidia/driver")
	hostPath(t, pod, "pod-gpu-resources", "/var/lib/kubelet/pod-resources")
	hostPath(t, pod, "nvidia-validations", "/run/nvidia/validations")

	// The counters file the exporter reads is the generated ConfigMap's counters.csv.
	require.Equal(t, []string{"-f", "/etc/dcgm-exporter/talos/counters.csv"}, exp.Args)
	assert.Equal(t, "/etc/dcgm-exporter/talos", mount(t, exp, "counters").MountPath)
	cmName := volume(t, pod, "counters").ConfigMap.Name
	cm := objs.configMaps[cmName]
	require.NotNil(t, cm, "ConfigMap %s", cmName)
	want, err := os.ReadFile("dcgm-exporter/counters.csv")
	require.NoError(t, err)
	assert.Equal(t, string(want), cm.Data["counters.csv"])

	init := container(t, pod, "wait-for-driver")
	assert.Equal(t, exp.Image, init.Image)
	hostToContainer(t, init, "driver-root", "/run/nvidia/driver")
	hostToContainer(t, init, "nvidia-validations", "/run/nvidia/validations")
	assert.Equal(t, "/run/nvidia/nvml", mount(t, init, "nvml").MountPath)
	assert.Equal(t, "/run/nvidia/nvml", mount(t, exp, "nvml").MountPath)

	svc := objs.services["dcgm-exporter"]
	require.NotNil(t, svc)
	assert.Equal(t, ds.Spec.Selector.MatchLabels, svc.Spec.Selector)
	require.Len(t, svc.Spec.Ports, 1)
	assert.Equal(t, "metrics", svc.Spec.Ports[0].Name)
}

// The exporter's init script links NVML (and only the NVIDIA libraries: the subroot's
// usr/lib64 also holds glibc) and its liveness probe restarts it once per readiness change.
func TestDCGMExporterScripts(t *testing.T) {
	objs := decodeStrict(t, kustomize(t, "deploy/dcgm-exporter"))
	pod := &objs.daemonSets["dcgm-exporter"].Spec.Template.Spec
	dir := t.TempDir()
	lib := filepath.Join(dir, "driver", "usr", "lib64")
	for _, d := range []string{lib, filepath.Join(dir, "validations"), filepath.Join(dir, "nvml")} {
		require.NoError(t, os.MkdirAll(d, 0o755))
	}
	for _, f := range []string{"libnvidia-ml.so.580.159.04", "libcuda.so.580.159.04", "libc.so.6", "libm.so.6", "libnvidia-cfg.so.1"} {
		require.NoError(t, os.WriteFile(filepath.Join(lib, f), nil, 0o644))
	}
	require.NoError(t, os.Symlink("libnvidia-ml.so.580.159.04", filepath.Join(lib, "libnvidia-ml.so.1")))
	require.NoError(t, os.Symlink("libcuda.so.580.159.04", filepath.Join(lib, "libcuda.so.1")))
	ready := filepath.Join(dir, "validations", "nvidia-driver.ready")
	writeAtomic(t, ready, `{"generation":1}`)

	initScript := shellScript(t, container(t, pod, "wait-for-driver"), dir)
	out, err := exec.Command("/bin/sh", "-c", initScript).CombinedOutput()
	require.NoError(t, err, "%s", out)
	entries, err := os.ReadDir(filepath.Join(dir, "nvml"))
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	assert.ElementsMatch(t, []string{".ready-seen", "libnvidia-ml.so.1", "libnvidia-ml.so.580.159.04", "libcuda.so.1", "libcuda.so.580.159.04"}, names)
	target, err := os.Readlink(filepath.Join(dir, "nvml", "libnvidia-ml.so.1"))
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(lib, "libnvidia-ml.so.1"), target)

	// Without NVML in the driver root the init container fails, loudly.
	require.NoError(t, os.Remove(filepath.Join(lib, "libnvidia-ml.so.1")))
	require.NoError(t, os.Remove(filepath.Join(lib, "libnvidia-ml.so.580.159.04")))
	require.NoError(t, os.RemoveAll(filepath.Join(dir, "nvml")))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "nvml"), 0o755))
	out, err = exec.Command("/bin/sh", "-c", initScript).CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "no libnvidia-ml.so.1")
	writeAtomic(t, filepath.Join(dir, "nvml", ".ready-seen"), `{"generation":1}`)

	exp := container(t, pod, "exporter")
	require.NotNil(t, exp.LivenessProbe)
	require.NotNil(t, exp.LivenessProbe.Exec)
	assert.Equal(t, int32(1), exp.LivenessProbe.FailureThreshold)
	probeCmd := exp.LivenessProbe.Exec.Command
	require.Len(t, probeCmd, 3)
	probe := strings.NewReplacer("/run/nvidia/validations", filepath.Join(dir, "validations"), "/run/nvidia/nvml", filepath.Join(dir, "nvml")).Replace(probeCmd[2])
	live := func() bool { return exec.Command(probeCmd[0], probeCmd[1], probe).Run() == nil }
	assert.True(t, live(), "unchanged")
	writeAtomic(t, ready, `{"generation":2}`)
	assert.False(t, live(), "changed: restart once")
	assert.True(t, live(), "after the restart")
	require.NoError(t, os.Remove(ready))
	assert.True(t, live(), "file missing while the node is brought up again")
}
