// Package podspec turns one container of a rendered DaemonSet into the OCI runtime spec that
// a Kubernetes node would run it with, as the kubelet and containerd's CRI plugin build it:
// privileged containers, the pod's hostPath volumes with their mountPropagation, emptyDir
// and configMap volumes, the env with its fieldRefs. hack/gpu-host/e2e-gpu.sh runs NVIDIA's device
// plugin and GPU feature discovery with it under runc.
package podspec

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// Options say which container to build and what the node adds.
type Options struct {
	DaemonSet, Container string
	// Rootfs stands for the container's image.
	Rootfs string
	// Volumes is where emptyDir and configMap volumes are made.
	Volumes string
	// Node is spec.nodeName.
	Node string
	// HostRoot prefixes every hostPath ("" is the host's /): tests use a scratch directory.
	HostRoot string
	// Env is K=V set after the pod's own; Unset leaves variables of the pod's out.
	Env, Unset []string
	// Binds are extra SRC:DST[:ro] bind mounts without propagation.
	Binds []string
	// Files are VOLUME/NAME=CONFIGMAP/KEY: a ConfigMap entry put into an emptyDir, as an init
	// container (the chart's config-manager) would.
	Files []string
}

// Manifests are the DaemonSets and ConfigMaps of a rendered manifest file.
type Manifests struct {
	daemonSets map[string]*appsv1.DaemonSet
	configMaps map[string]*corev1.ConfigMap
}

// ReadManifests reads a multi-document YAML file.
func ReadManifests(path string) (Manifests, error) {
	m := Manifests{daemonSets: map[string]*appsv1.DaemonSet{}, configMaps: map[string]*corev1.ConfigMap{}}

	data, err := os.ReadFile(path)
	if err != nil {
		return m, err
	}

	for i, doc := range bytes.Split(data, []byte("\n---")) {
		var head struct{ Kind string }
		if err := yaml.Unmarshal(doc, &head); err != nil {
			return m, fmt.Errorf("%s: document %d: %w", path, i, err)
		}

		switch head.Kind {
		case "DaemonSet":
			var ds appsv1.DaemonSet
			if err := yaml.UnmarshalStrict(doc, &ds); err != nil {
				return m, fmt.Errorf("%s: document %d: %w", path, i, err)
			}

			m.daemonSets[ds.Name] = &ds
		case "ConfigMap":
			var cm corev1.ConfigMap
			if err := yaml.UnmarshalStrict(doc, &cm); err != nil {
				return m, fmt.Errorf("%s: document %d: %w", path, i, err)
			}

			m.configMaps[cm.Name] = &cm
		}
	}

	return m, nil
}

// ContainerSpec is the OCI spec of one container of the DaemonSet's pod, built the way
// the kubelet (pkg/kubelet/kubelet_pods.go makeMounts, pkg/volume/hostpath/host_path.go
// checkType) and containerd's CRI plugin (internal/cri/opts/spec_linux_opts.go WithMounts,
// WithPrivilegedDevices; internal/cri/server/container_create_linux.go) build it.
func ContainerSpec(m Manifests, o Options) (*oci.Spec, error) {
	ds, ok := m.daemonSets[o.DaemonSet]
	if !ok {
		return nil, fmt.Errorf("no DaemonSet %q", o.DaemonSet)
	}

	pod := ds.Spec.Template
	podName := ds.Name + "-e2e"

	i := slices.IndexFunc(pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == o.Container })
	if i < 0 {
		return nil, fmt.Errorf("DaemonSet %s has no container %q", ds.Name, o.Container)
	}

	ctr := pod.Spec.Containers[i]

	env, err := containerEnv(ctr, ds.Namespace, podName, o)
	if err != nil {
		return nil, err
	}

	spec := baseSpec(o.Rootfs, podName)
	spec.Process.Args = append(slices.Clone(ctr.Command), ctr.Args...)
	spec.Process.Env = env

	if ctr.WorkingDir != "" {
		spec.Process.Cwd = ctr.WorkingDir
	}

	privileged := ctr.SecurityContext != nil && ctr.SecurityContext.Privileged != nil && *ctr.SecurityContext.Privileged
	if privileged {
		if err := makePrivileged(spec); err != nil {
			return nil, err
		}
	}

	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		volumes[v.Name] = v
	}

	for _, f := range o.Files {
		if err := seedFile(m, volumes, o.Volumes, f); err != nil {
			return nil, err
		}
	}

	for _, vm := range ctr.VolumeMounts {
		v, ok := volumes[vm.Name]
		if !ok {
			return nil, fmt.Errorf("container %s mounts volume %q, which the pod does not declare", ctr.Name, vm.Name)
		}

		src, readOnly, err := volumeSource(m, v, o.Volumes, o.HostRoot)
		if err != nil {
			return nil, fmt.Errorf("volume %s: %w", v.Name, err)
		}

		if err := addBind(spec, src, vm.MountPath, readOnly || vm.ReadOnly, vm.MountPropagation); err != nil {
			return nil, fmt.Errorf("volume %s at %s: %w", v.Name, vm.MountPath, err)
		}
	}

	for _, b := range o.Binds {
		parts := strings.Split(b, ":")
		if len(parts) < 2 {
			return nil, fmt.Errorf("--bind %q: want SRC:DST[:ro]", b)
		}

		if err := addBind(spec, parts[0], parts[1], len(parts) > 2 && parts[2] == "ro", nil); err != nil {
			return nil, err
		}
	}

	return spec, nil
}

// containerEnv: the pod's env (values and the fieldRefs the charts use), then --env.
func containerEnv(ctr corev1.Container, namespace, podName string, o Options) ([]string, error) {
	vars := map[string]string{}
	order := []string{}

	set := func(k, v string) {
		if _, ok := vars[k]; !ok {
			order = append(order, k)
		}

		vars[k] = v
	}

	// The image's PATH (NVIDIA's images keep theirs standard) and the kubelet's HOSTNAME.
	set("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	set("HOSTNAME", podName)

	for _, e := range ctr.Env {
		switch {
		case e.ValueFrom == nil:
			set(e.Name, e.Value)
		case e.ValueFrom.FieldRef != nil:
			switch e.ValueFrom.FieldRef.FieldPath {
			case "spec.nodeName":
				set(e.Name, o.Node)
			case "metadata.namespace":
				set(e.Name, namespace)
			case "metadata.name":
				set(e.Name, podName)
			default:
				return nil, fmt.Errorf("env %s: fieldRef %s is not supported here", e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
		default:
			return nil, fmt.Errorf("env %s: only values and fieldRefs are supported here", e.Name)
		}
	}

	for _, kv := range o.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("--env %q: want K=V", kv)
		}

		set(k, v)
	}

	var env []string

	for _, k := range order {
		if !slices.Contains(o.Unset, k) {
			env = append(env, k+"="+vars[k])
		}
	}

	return env, nil
}

// volumeSource returns the host directory a volume mounts, making it as the kubelet does.
func volumeSource(m Manifests, v corev1.Volume, volumes, hostRoot string) (string, bool, error) {
	switch {
	case v.HostPath != nil:
		p := filepath.Join("/", hostRoot, v.HostPath.Path)

		var typ corev1.HostPathType
		if v.HostPath.Type != nil {
			typ = *v.HostPath.Type
		}

		switch typ {
		case corev1.HostPathDirectoryOrCreate:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return "", false, err
			}
		case corev1.HostPathDirectory:
			if st, err := os.Stat(p); err != nil || !st.IsDir() {
				// The kubelet's own words (pkg/volume/hostpath/host_path.go).
				return "", false, fmt.Errorf("hostPath type check failed: %s is not a directory", p)
			}
		case corev1.HostPathUnset:
			// No check; containerd makes a missing bind source a directory.
			if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
				if err := os.MkdirAll(p, 0o755); err != nil {
					return "", false, err
				}
			}
		default:
			return "", false, fmt.Errorf("hostPath type %s is not supported here", typ)
		}

		return p, false, nil
	case v.EmptyDir != nil:
		dir := filepath.Join(volumes, v.Name)

		return dir, false, os.MkdirAll(dir, 0o755)
	case v.ConfigMap != nil:
		cm, ok := m.configMaps[v.ConfigMap.Name]
		if !ok {
			return "", false, fmt.Errorf("no ConfigMap %q in the manifests", v.ConfigMap.Name)
		}

		dir := filepath.Join(volumes, v.Name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", false, err
		}

		for k, data := range cm.Data {
			if err := os.WriteFile(filepath.Join(dir, k), []byte(data), 0o644); err != nil {
				return "", false, err
			}
		}

		// ConfigMap volumes are read-only in the container.
		return dir, true, nil
	}

	return "", false, errors.New("only hostPath, emptyDir and configMap volumes are supported here")
}

func seedFile(m Manifests, volumes map[string]corev1.Volume, dir, spec string) error {
	dst, src, ok := strings.Cut(spec, "=")
	vol, name, ok1 := strings.Cut(dst, "/")
	cmName, key, ok2 := strings.Cut(src, "/")

	if !ok || !ok1 || !ok2 {
		return fmt.Errorf("--file %q: want VOLUME/NAME=CONFIGMAP/KEY", spec)
	}

	if v, found := volumes[vol]; !found || v.EmptyDir == nil {
		return fmt.Errorf("--file %q: %s is not an emptyDir volume of the pod", spec, vol)
	}

	cm, found := m.configMaps[cmName]
	if !found {
		return fmt.Errorf("--file %q: no ConfigMap %s", spec, cmName)
	}

	data, found := cm.Data[key]
	if !found {
		return fmt.Errorf("--file %q: ConfigMap %s has no key %s", spec, cmName, key)
	}

	if err := os.MkdirAll(filepath.Join(dir, vol), 0o755); err != nil {
		return err
	}

	return os.WriteFile(filepath.Join(dir, vol, name), []byte(data), 0o644)
}

// addBind adds a bind mount the way containerd's CRI plugin does: rbind, the propagation
// the kubelet asked for (None: rprivate, HostToContainer: rslave, Bidirectional: rshared,
// with the root's propagation raised to match), ro if read-only.
func addBind(spec *oci.Spec, src, dst string, readOnly bool, prop *corev1.MountPropagationMode) error {
	opts := []string{"rbind"}

	mode := corev1.MountPropagationNone
	if prop != nil {
		mode = *prop
	}

	switch mode {
	case corev1.MountPropagationNone:
		opts = append(opts, "rprivate")
	case corev1.MountPropagationHostToContainer:
		if err := ensureSharedOrSlave(src); err != nil {
			return err
		}

		opts = append(opts, "rslave")

		if spec.Linux.RootfsPropagation != "rshared" {
			spec.Linux.RootfsPropagation = "rslave"
		}
	case corev1.MountPropagationBidirectional:
		opts = append(opts, "rshared")
		spec.Linux.RootfsPropagation = "rshared"
	default:
		return fmt.Errorf("mountPropagation %s is not supported here", mode)
	}

	if readOnly {
		opts = append(opts, "ro")
	}

	spec.Mounts = append(spec.Mounts, oci.Mount{Destination: dst, Type: "bind", Source: src, Options: opts})

	return nil
}

// ensureSharedOrSlave: containerd refuses HostToContainer on a source whose mount is private
// ("is mounted on ... but it is not a shared or slave mount").
func ensureSharedOrSlave(path string) error {
	mi, err := mountOf(path)
	if err != nil {
		return err
	}

	if !strings.Contains(mi.optional, "shared:") && !strings.Contains(mi.optional, "master:") {
		return fmt.Errorf("path %q is mounted on %q but it is not a shared or slave mount", path, mi.mountpoint)
	}

	return nil
}

type mountEntry struct{ mountpoint, optional string }

// mountOf finds the mount a path is on (the longest mount point that contains it).
func mountOf(path string) (mountEntry, error) {
	resolved, err := filepath.EvalSymlinks(path)
	if err != nil {
		return mountEntry{}, err
	}

	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return mountEntry{}, err
	}

	var best mountEntry

	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 7 {
			continue
		}

		mp := fields[4]
		if resolved != mp && !strings.HasPrefix(resolved, strings.TrimSuffix(mp, "/")+"/") {
			continue
		}

		if len(mp) >= len(best.mountpoint) {
			sep := slices.Index(fields, "-")
			best = mountEntry{mountpoint: mp, optional: strings.Join(fields[6:max(sep, 6)], " ")}
		}
	}

	return best, nil
}

func baseSpec(rootfs, hostname string) *oci.Spec {
	return &oci.Spec{
		Version:  oci.Version,
		Root:     &oci.Root{Path: rootfs},
		Hostname: hostname,
		Process: &oci.Process{
			Cwd:  "/",
			User: oci.User{UID: 0, GID: 0},
			Capabilities: &oci.LinuxCapabilities{
				Bounding:  defaultCaps,
				Effective: defaultCaps,
				Permitted: defaultCaps,
			},
			NoNewPrivileges: false,
		},
		Mounts: []oci.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		},
		Linux: &oci.Linux{
			Namespaces: []oci.LinuxNamespace{
				{Type: oci.PIDNamespace}, {Type: oci.NetworkNamespace}, {Type: oci.IPCNamespace},
				{Type: oci.UTSNamespace}, {Type: oci.MountNamespace}, {Type: oci.CgroupNamespace},
			},
			Resources:     &oci.LinuxResources{Devices: []oci.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}},
			MaskedPaths:   []string{"/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi"},
			ReadonlyPaths: []string{"/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		},
	}
}

// makePrivileged: every capability, every host device in the container's /dev and allowed in
// its cgroup, /sys and cgroupfs writable, nothing masked (containerd's privileged container).
func makePrivileged(spec *oci.Spec) error {
	caps, err := currentCaps()
	if err != nil {
		return err
	}

	spec.Process.Capabilities = &oci.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps}
	spec.Linux.MaskedPaths, spec.Linux.ReadonlyPaths = nil, nil
	spec.Linux.Resources.Devices = []oci.LinuxDeviceCgroup{{Allow: true, Access: "rwm"}}

	for i, m := range spec.Mounts {
		if m.Destination == "/sys" || m.Destination == "/sys/fs/cgroup" {
			spec.Mounts[i].Options = slices.DeleteFunc(slices.Clone(m.Options), func(o string) bool { return o == "ro" })
		}
	}

	devices, err := hostDevices("/dev")
	if err != nil {
		return err
	}

	spec.Linux.Devices = devices

	return nil
}

// hostDevices lists the device nodes under dir as containerd's oci.HostDevices does,
// skipping the directories it skips.
func hostDevices(dir string) ([]oci.LinuxDevice, error) {
	var out []oci.LinuxDevice

	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}

		if d.IsDir() {
			switch d.Name() {
			case "pts", "shm", "fd", "mqueue", ".lxc", ".lxd-mounts", ".udev":
				return fs.SkipDir
			}

			return nil
		}

		if p == "/dev/console" {
			return nil
		}

		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}

		var typ string

		switch st.Mode & unix.S_IFMT {
		case unix.S_IFCHR:
			typ = "c"
		case unix.S_IFBLK:
			typ = "b"
		default:
			return nil
		}

		mode := fs.FileMode(st.Mode & 0o777)
		uid, gid := st.Uid, st.Gid
		out = append(out, oci.LinuxDevice{
			Path: p, Type: typ, Major: int64(unix.Major(st.Rdev)), Minor: int64(unix.Minor(st.Rdev)),
			FileMode: &mode, UID: &uid, GID: &gid,
		})

		return nil
	})

	return out, err
}

// currentCaps: the capabilities in this process's bounding set, which is what a privileged
// container gets (containerd's WithAllCurrentCapabilities), not every capability there is.
func currentCaps() ([]string, error) {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return nil, err
	}

	for _, line := range strings.Split(string(data), "\n") {
		hex, ok := strings.CutPrefix(line, "CapBnd:")
		if !ok {
			continue
		}

		bits, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
		if err != nil {
			return nil, fmt.Errorf("CapBnd %q: %w", hex, err)
		}

		var caps []string

		for i, name := range allCaps {
			if bits&(1<<i) != 0 {
				caps = append(caps, name)
			}
		}

		return caps, nil
	}

	return nil, errors.New("no CapBnd in /proc/self/status")
}

// containerd's default capabilities (pkg/oci/spec.go defaultUnixCaps), and every capability
// in the order of its bit number.
var (
	defaultCaps = []string{
		"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
		"CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
		"CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
	}
	allCaps = []string{
		"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
		"CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE",
		"CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER",
		"CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE", "CAP_SYS_PACCT",
		"CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE", "CAP_SYS_RESOURCE", "CAP_SYS_TIME",
		"CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE", "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL",
		"CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM",
		"CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE",
	}
)
