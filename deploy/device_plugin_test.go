package deploy_test

import (
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
)

var update = flag.Bool("update", false, "rewrite generated files (rendered chart, PrometheusRule) instead of comparing")

const renderedChart = "device-plugin/nvidia-device-plugin.rendered.yaml"

// The checked-in rendering is what `kubectl apply -k deploy/` uses: it must be exactly
// what helm renders from the pinned chart and our values.
func TestDevicePluginRenderedChartIsCurrent(t *testing.T) {
	got := helmTemplate(t)
	if *update {
		require.NoError(t, os.WriteFile(renderedChart, got, 0o644))
	}
	want, err := os.ReadFile(renderedChart)
	require.NoError(t, err)
	require.Equal(t, string(want), string(got), "%s is stale: run `make deploy-render` (or go test ./deploy -run Rendered -update)", renderedChart)
}

func TestDevicePluginPod(t *testing.T) {
	objs := decodeStrict(t, kustomize(t, "deploy/device-plugin"))
	ds := objs.daemonSets["nvidia-device-plugin"]
	require.NotNil(t, ds, "no nvidia-device-plugin DaemonSet")
	pod := &ds.Spec.Template.Spec

	// Plain runc: no runtime class, no NVIDIA runtime.
	assert.Nil(t, pod.RuntimeClassName)
	gpuNodeAffinity(t, pod, "nvidia.com/gpu.deploy.device-plugin")
	assert.Contains(t, pod.Tolerations, corev1.Toleration{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule})

	plugin := container(t, pod, "nvidia-device-plugin-ctr")
	privileged(t, plugin)
	e := env(plugin)
	assert.Equal(t, "/run/nvidia/driver", e["NVIDIA_DRIVER_ROOT"])
	assert.NotContains(t, e, "NVIDIA_DEV_ROOT", "device nodes are at the driver root's dev/ (docs/driver-root.md)")
	assert.Equal(t, "/usr/bin/nvidia-cdi-hook", e["NVIDIA_CDI_HOOK_PATH"])
	assert.Equal(t, "cdi-cri", e["DEVICE_LIST_STRATEGY"])
	assert.Equal(t, "uuid", e["DEVICE_ID_STRATEGY"])
	assert.Equal(t, "/config/config.yaml", e["CONFIG_FILE"])
	assert.NotContains(t, e, "MIG_STRATEGY", "the MIG strategy comes from the named config")

	// The driver root: a hostPath that may be mounted after the pod started.
	hostPath(t, pod, "driver-root", "/run/nvidia/driver")
	assert.Equal(t, corev1.HostPathDirectoryOrCreate, *volume(t, pod, "driver-root").HostPath.Type)
	hostToContainer(t, plugin, "driver-root", "/driver-root")
	assert.True(t, mount(t, plugin, "driver-root").ReadOnly)
	// The plugin's CDI spec goes where Talos's containerd reads specs.
	hostPath(t, pod, "cdi-root", "/run/cdi")
	assert.Equal(t, "/var/run/cdi", mount(t, plugin, "cdi-root").MountPath)

	// Readiness: the first init container waits for the service's file.
	require.NotEmpty(t, pod.InitContainers)
	wait := &pod.InitContainers[0]
	assert.Equal(t, "wait-for-driver", wait.Name)
	assert.Equal(t, plugin.Image, wait.Image, "the wait uses the plugin's image (it has busybox)")
	assert.Contains(t, script(t, wait), "/run/nvidia/validations/nvidia-driver.ready")
	hostPath(t, pod, "nvidia-validations", "/run/nvidia/validations")
	hostToContainer(t, wait, "nvidia-validations", "/run/nvidia/validations")

	// MIG layout changes reach the plugin: the watcher signals it in the shared PID
	// namespace when the readiness file changes.
	require.NotNil(t, pod.ShareProcessNamespace)
	assert.True(t, *pod.ShareProcessNamespace)
	watch := container(t, pod, "driver-watch")
	assert.Equal(t, plugin.Image, watch.Image)
	assert.Contains(t, script(t, watch), "kill -HUP")
	assert.Contains(t, script(t, watch), "pidof nvidia-device-plugin")
	hostToContainer(t, watch, "nvidia-validations", "/run/nvidia/validations")
	assert.Equal(t, mount(t, wait, "driver-ready-seen").MountPath, mount(t, watch, "driver-ready-seen").MountPath)

	// Named configs per MIG strategy, chosen by the nvidia.com/device-plugin.config label.
	for _, name := range []string{"nvidia-device-plugin-init", "nvidia-device-plugin-sidecar"} {
		ce := env(container(t, pod, name))
		assert.Equal(t, "nvidia.com/device-plugin.config", ce["NODE_LABEL"], name)
		assert.Equal(t, "none", ce["DEFAULT_CONFIG"], name)
	}
	cm := objs.configMaps["nvidia-device-plugin-configs"]
	require.NotNil(t, cm)
	require.Len(t, cm.Data, 3)
	for _, strategy := range []string{"none", "single", "mixed"} {
		var cfg struct {
			Version string `json:"version"`
			Flags   struct {
				MigStrategy string `json:"migStrategy"`
			} `json:"flags"`
		}
		require.NoError(t, yaml.UnmarshalStrict([]byte(cm.Data[strategy]), &cfg), "config %q", strategy)
		assert.Equal(t, "v1", cfg.Version)
		assert.Equal(t, strategy, cfg.Flags.MigStrategy)
	}
	assert.Equal(t, "nvidia-device-plugin-configs", volume(t, pod, "available-configs").ConfigMap.Name)
}

// Installing with helm and the post-renderer gives the same DaemonSet as kubectl -k.
func TestDevicePluginHelmPostRenderer(t *testing.T) {
	postRender, err := filepath.Abs("device-plugin/post-render.sh")
	require.NoError(t, err)
	tool(t, "kustomize")
	out := run(t, []string{"KUSTOMIZE=" + tool(t, "kustomize")}, tool(t, "helm"), "template", "nvidia-device-plugin", chartDir(t),
		"--namespace", "nvidia-gpu", "--values", "device-plugin/values.yaml", "--post-renderer", postRender)
	viaHelm := decodeStrict(t, out)
	viaKustomize := decodeStrict(t, kustomize(t, "deploy/device-plugin"))
	require.NotNil(t, viaHelm.daemonSets["nvidia-device-plugin"])
	assert.Equal(t, viaKustomize.daemonSets["nvidia-device-plugin"].Spec, viaHelm.daemonSets["nvidia-device-plugin"].Spec)
}

func TestNamespaceAndWholeDeploy(t *testing.T) {
	objs := decodeStrict(t, kustomize(t, "deploy"))
	ns := objs.namespaces["nvidia-gpu"]
	require.NotNil(t, ns, "deploy/ must create the nvidia-gpu namespace")
	// Talos enforces Pod Security "baseline" by default; these pods are privileged.
	assert.Equal(t, "privileged", ns.Labels["pod-security.kubernetes.io/enforce"])
	for key, n := range objs.namespaceOf {
		assert.Equal(t, "nvidia-gpu", n, key)
	}
	for name, b := range objs.bindings {
		for _, s := range b.Subjects {
			assert.Equal(t, "nvidia-gpu", s.Namespace, "ClusterRoleBinding %s", name)
		}
	}
	assert.Contains(t, objs.daemonSets, "nvidia-device-plugin")
	assert.Contains(t, objs.daemonSets, "dcgm-exporter")
	for name, ds := range objs.daemonSets {
		assert.Nil(t, ds.Spec.Template.Spec.RuntimeClassName, name)
	}
}

// shellScript returns a container's script with its absolute paths moved under dir,
// so that the real script runs here against a fake node.
func shellScript(t *testing.T, c *corev1.Container, dir string, extra ...string) string {
	t.Helper()
	s := script(t, c)
	pairs := []string{
		"/run/nvidia/validations", filepath.Join(dir, "validations"),
		"/run/nvidia/driver", filepath.Join(dir, "driver"),
		"/run/nvidia/nvml", filepath.Join(dir, "nvml"),
		"/seen", filepath.Join(dir, "seen"),
	}
	return strings.NewReplacer(append(pairs, extra...)...).Replace(s)
}

func writeAtomic(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	require.NoError(t, os.WriteFile(tmp, []byte(content), 0o644))
	require.NoError(t, os.Rename(tmp, path))
}

// shellRun is a script running in its own process group.
type shellRun struct {
	done chan struct{} // closed when the script has ended
	err  error         // its exit, valid once done is closed
	out  *strings.Builder
}

func startShell(t *testing.T, s string) *shellRun {
	t.Helper()
	r := &shellRun{done: make(chan struct{}), out: &strings.Builder{}}
	cmd := exec.Command("/bin/sh", "-c", s)
	cmd.Stdout, cmd.Stderr = r.out, r.out
	// Own process group, so that the cleanup also ends the script's sleep.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = time.Second
	require.NoError(t, cmd.Start())
	go func() {
		r.err = cmd.Wait()
		close(r.done)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-r.done
	})
	return r
}

// The readiness wait and the watcher, run for real: the wait holds until the file
// appears; the watcher sends SIGHUP to a process named nvidia-device-plugin when the
// file changes, not before, and not while the file is missing.
func TestDevicePluginReadinessScripts(t *testing.T) {
	for _, prog := range []string{"pidof", "cmp", "sleep"} {
		if _, err := exec.LookPath(prog); err != nil {
			t.Fatalf("%s not found (the plugin image's busybox has it; install it here)", prog)
		}
	}
	objs := decodeStrict(t, kustomize(t, "deploy/device-plugin"))
	pod := &objs.daemonSets["nvidia-device-plugin"].Spec.Template.Spec
	dir := t.TempDir()
	for _, d := range []string{"validations", "seen"} {
		require.NoError(t, os.Mkdir(filepath.Join(dir, d), 0o755))
	}
	ready := filepath.Join(dir, "validations", "nvidia-driver.ready")
	seen := filepath.Join(dir, "seen", "nvidia-driver.ready")

	// wait-for-driver
	wait := startShell(t, shellScript(t, container(t, pod, "wait-for-driver"), dir, "sleep 2", "sleep 0.1"))
	select {
	case <-wait.done:
		t.Fatalf("wait-for-driver returned before the readiness file existed: %v\n%s", wait.err, wait.out)
	case <-time.After(500 * time.Millisecond):
	}
	writeAtomic(t, ready, `{"generation":1,"mig":{"layout":"all-disabled","state":"success"}}`)
	select {
	case <-wait.done:
		require.NoError(t, wait.err, wait.out.String())
	case <-time.After(5 * time.Second):
		t.Fatalf("wait-for-driver did not finish after the file appeared\n%s", wait.out)
	}
	got, err := os.ReadFile(seen)
	require.NoError(t, err)
	assert.Contains(t, string(got), `"generation":1`)

	// A stand-in plugin: a copy of sleep named nvidia-device-plugin (SIGHUP ends it).
	fake := filepath.Join(dir, "nvidia-device-plugin")
	sleepBin, err := exec.LookPath("sleep")
	require.NoError(t, err)
	data, err := os.ReadFile(sleepBin)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(fake, data, 0o755))
	if out, err := exec.Command("pidof", "nvidia-device-plugin").CombinedOutput(); err == nil {
		t.Fatalf("a process named nvidia-device-plugin already runs here: %s", out)
	}
	plugin := exec.Command(fake, "60")
	testutil.DefaultSIGHUP(t)
	require.NoError(t, plugin.Start())
	pluginDone := make(chan error, 1)
	go func() { pluginDone <- plugin.Wait() }()
	t.Cleanup(func() { _ = plugin.Process.Kill() })

	watch := startShell(t, shellScript(t, container(t, pod, "driver-watch"), dir, "sleep 5", "sleep 0.1"))

	// Unchanged, then missing (bring-up in progress): no signal.
	require.NoError(t, os.Remove(ready))
	select {
	case err := <-pluginDone:
		t.Fatalf("plugin signalled while nothing changed: %v\n%s", err, watch.out)
	case <-time.After(800 * time.Millisecond):
	}
	// A new layout: SIGHUP.
	writeAtomic(t, ready, `{"generation":2,"mig":{"layout":"all-balanced","state":"success"}}`)
	select {
	case err := <-pluginDone:
		var exitErr *exec.ExitError
		require.ErrorAs(t, err, &exitErr)
		ws := exitErr.Sys().(syscall.WaitStatus)
		require.True(t, ws.Signaled(), "plugin ended without a signal: %v", err)
		assert.Equal(t, syscall.SIGHUP, ws.Signal())
	case <-time.After(5 * time.Second):
		t.Fatalf("plugin not signalled after the readiness file changed\n%s", watch.out)
	}
	require.Eventually(t, func() bool {
		got, _ := os.ReadFile(seen)
		return strings.Contains(string(got), `"generation":2`)
	}, 3*time.Second, 50*time.Millisecond, "watcher did not record the new state")
}
