// Package harness runs the extension service the way Talos runs it, with runc (the tests
// give it runc 1.5.1, the version Talos v1.14.1 ships) instead of Talos's containerd,
// inside a private mount namespace whose root is shaped as a Talos node's (root.go) and
// where the extension's files lie over the host paths as Talos lays them. Nothing on the
// machine changes: the build machine's root is detached from the namespace, and every path
// the service touches is a throwaway mount in it.
//
// A real Talos node (machined from the Talos module) is the judge of what Talos does; the
// harness keeps what that node cannot show quickly: faults at exact moments, the daemons'
// stop, and the service's own waits on a machine without a GPU.
package harness

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	"github.com/siderolabs/talos/pkg/machinery/extensions/services"
	"golang.org/x/sys/unix"

	"github.com/talos-nvidia/nvidia-driver/pkg/document"
)

// ConfigFile is one file of an ExtensionServiceConfig: Talos writes its content (0644) on the
// host and bind-mounts it read-only at MountPath inside the service.
type ConfigFile struct {
	Source    string // the host file Talos wrote
	MountPath string
}

// ServiceConfig is what an ExtensionServiceConfig document adds to a service.
type ServiceConfig struct {
	Files       []ConfigFile
	Environment []string
}

// ConfigFileName is where Talos writes an ExtensionServiceConfig file for a service:
// <base>/<service>/<mountPath with "/" replaced by "-">.
func ConfigFileName(base, service, mountPath string) string {
	return filepath.Join(base, service, document.FileName(mountPath))
}

// Spec builds the OCI runtime spec of an extension service as Talos v1.13's extension
// runner does (internal/app/machined/pkg/system/services/extension.go and
// runner/containerd): containerd's default spec for linux, then the process, hosts and
// resolv.conf, no new privileges, the OOM score, the cgroup, then the service's rootfs
// (/usr/local/lib/containers/<name>), root propagation, mounts (the YAML's, then the
// ExtensionServiceConfig files read-only), the host network and IPC namespaces, all
// grantable capabilities, all devices allowed, the environment, no rlimits of its own, a
// read-only rootfs unless writeable, and
// containerd's default seccomp profile last. cgroupPath replaces Talos's
// /system/extensions/<name>, which a test machine does not have.
func Spec(svc services.Spec, cfg ServiceConfig, cgroupPath string) (*specs.Spec, error) {
	ctx := namespaces.WithNamespace(context.Background(), constants.SystemContainerdNamespace)

	mounts := append([]specs.Mount{}, svc.Container.Mounts...)
	for _, f := range cfg.Files {
		mounts = append(mounts, specs.Mount{Source: f.Source, Destination: f.MountPath, Type: "bind", Options: []string{"ro", "bind"}})
	}

	env := append(append([]string{}, svc.Container.Environment...), cfg.Environment...)

	opts := []oci.SpecOpts{
		// runner/containerd newOCISpecOpts
		oci.WithProcessArgs(append([]string{svc.Container.Entrypoint}, svc.Container.Args...)...),
		oci.WithHostHostsFile,
		oci.WithHostResolvconf,
		oci.WithNoNewPrivileges,
		withOOMScoreAdj(-600),
		oci.WithCgroup(cgroupPath),
		// services/extension.go getOCIOptions
		oci.WithRootFSPath(filepath.Join(constants.ExtensionServiceRootfsPath, svc.Name)),
		withRootfsPropagation(svc.Container.Security.RootfsPropagation),
		oci.WithMounts(mounts),
		oci.WithHostNamespace(specs.NetworkNamespace),
		oci.WithHostNamespace(specs.IPCNamespace),
		oci.WithSelinuxLabel(""),
		oci.WithApparmorProfile(""),
		oci.WithCapabilities(allGrantableCapabilities()),
		oci.WithAllDevicesAllowed,
		oci.WithEnv(env),
		// Rlimits are inherited from machined through containerd.
		func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
			s.Process.Rlimits = nil

			return nil
		},
	}

	if !svc.Container.Security.WriteableRootfs {
		opts = append(opts, oci.WithRootFSReadonly())
	}

	if svc.Container.Security.WriteableSysfs {
		opts = append(opts, oci.WithWriteableSysfs)
	}

	if svc.Container.Security.MaskedPaths != nil {
		opts = append(opts, oci.WithMaskedPaths(svc.Container.Security.MaskedPaths))
	}

	if svc.Container.Security.ReadonlyPaths != nil {
		opts = append(opts, oci.WithReadonlyPaths(svc.Container.Security.ReadonlyPaths))
	}

	opts = append(opts, seccomp.WithDefaultProfile())

	s, err := oci.GenerateSpecWithPlatform(ctx, nil, "linux/amd64", &containers.Container{ID: "ext-" + svc.Name}, opts...)
	if err != nil {
		return nil, fmt.Errorf("building the OCI spec of ext-%s: %w", svc.Name, err)
	}

	return s, nil
}

func withOOMScoreAdj(score int) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		s.Process.OOMScoreAdj = &score

		return nil
	}
}

func withRootfsPropagation(p string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		s.Linux.RootfsPropagation = p

		return nil
	}
}

// allGrantableCapabilities is Talos's capability.AllGrantableCapabilities: every capability
// in the bounding set but CAP_SYS_BOOT and CAP_SYS_MODULE.
func allGrantableCapabilities() []string {
	var caps []string

	for c := 0; c <= unix.CAP_LAST_CAP; c++ {
		if ok, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0); err != nil || ok != 1 {
			continue
		}

		name, ok := capNames[c]
		if !ok || name == "CAP_SYS_BOOT" || name == "CAP_SYS_MODULE" {
			continue
		}

		caps = append(caps, name)
	}

	return caps
}

var capNames = map[int]string{
	unix.CAP_CHOWN: "CAP_CHOWN", unix.CAP_DAC_OVERRIDE: "CAP_DAC_OVERRIDE", unix.CAP_DAC_READ_SEARCH: "CAP_DAC_READ_SEARCH",
	unix.CAP_FOWNER: "CAP_FOWNER", unix.CAP_FSETID: "CAP_FSETID", unix.CAP_KILL: "CAP_KILL", unix.CAP_SETGID: "CAP_SETGID",
	unix.CAP_SETUID: "CAP_SETUID", unix.CAP_SETPCAP: "CAP_SETPCAP", unix.CAP_LINUX_IMMUTABLE: "CAP_LINUX_IMMUTABLE",
	unix.CAP_NET_BIND_SERVICE: "CAP_NET_BIND_SERVICE", unix.CAP_NET_BROADCAST: "CAP_NET_BROADCAST", unix.CAP_NET_ADMIN: "CAP_NET_ADMIN",
	unix.CAP_NET_RAW: "CAP_NET_RAW", unix.CAP_IPC_LOCK: "CAP_IPC_LOCK", unix.CAP_IPC_OWNER: "CAP_IPC_OWNER",
	unix.CAP_SYS_MODULE: "CAP_SYS_MODULE", unix.CAP_SYS_RAWIO: "CAP_SYS_RAWIO", unix.CAP_SYS_CHROOT: "CAP_SYS_CHROOT",
	unix.CAP_SYS_PTRACE: "CAP_SYS_PTRACE", unix.CAP_SYS_PACCT: "CAP_SYS_PACCT", unix.CAP_SYS_ADMIN: "CAP_SYS_ADMIN",
	unix.CAP_SYS_BOOT: "CAP_SYS_BOOT", unix.CAP_SYS_NICE: "CAP_SYS_NICE", unix.CAP_SYS_RESOURCE: "CAP_SYS_RESOURCE",
	unix.CAP_SYS_TIME: "CAP_SYS_TIME", unix.CAP_SYS_TTY_CONFIG: "CAP_SYS_TTY_CONFIG", unix.CAP_MKNOD: "CAP_MKNOD",
	unix.CAP_LEASE: "CAP_LEASE", unix.CAP_AUDIT_WRITE: "CAP_AUDIT_WRITE", unix.CAP_AUDIT_CONTROL: "CAP_AUDIT_CONTROL",
	unix.CAP_SETFCAP: "CAP_SETFCAP", unix.CAP_MAC_OVERRIDE: "CAP_MAC_OVERRIDE", unix.CAP_MAC_ADMIN: "CAP_MAC_ADMIN",
	unix.CAP_SYSLOG: "CAP_SYSLOG", unix.CAP_WAKE_ALARM: "CAP_WAKE_ALARM", unix.CAP_BLOCK_SUSPEND: "CAP_BLOCK_SUSPEND",
	unix.CAP_AUDIT_READ: "CAP_AUDIT_READ", unix.CAP_PERFMON: "CAP_PERFMON", unix.CAP_BPF: "CAP_BPF",
	unix.CAP_CHECKPOINT_RESTORE: "CAP_CHECKPOINT_RESTORE",
}
