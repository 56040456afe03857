package driverroot_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
	"github.com/talos-nvidia/nvidia-driver/pkg/driverroot"
)

// The mount tests run the test binary again in new mount namespaces, in two roles:
//   - "host": a private namespace standing for the node, whose /run is a shared tmpfs;
//   - "container": a child namespace set up as runc sets up the service's container, with the
//     host's /run bind-mounted rshared into it. It calls driverroot.Mount and exits.
//
// The host role then looks at the result from the parent side, as the node would.
const (
	envRole     = "DRIVERROOT_TEST_ROLE"
	envWork     = "DRIVERROOT_TEST_WORK"
	envSubroot  = "DRIVERROOT_TEST_SUBROOT"
	envRootProp = "DRIVERROOT_TEST_ROOT_PROPAGATION"
	envPremount = "DRIVERROOT_TEST_PREMOUNT"
	// envSharedSubroot makes the subroot a shared mount, as /usr/local/glibc is on Talos (it
	// lies on the root filesystem, which Talos mounts shared: internal/app/init/main.go,
	// mount.WithShared), bound into the container as the service YAML binds it.
	envSharedSubroot = "DRIVERROOT_TEST_SHARED_SUBROOT"
)

func TestMain(m *testing.M) {
	switch os.Getenv(envRole) {
	case "host":
		os.Exit(hostRole())
	case "container":
		os.Exit(containerRole())
	case "links":
		os.Exit(linksRole())
	}

	os.Exit(m.Run())
}

// hostView is what the host role saw.
type hostView struct {
	Results      []string `json:"results"`      // Mount's result in each container run
	Mounts       int      `json:"mounts"`       // mounts at the target after the runs
	ReadOnly     bool     `json:"readOnly"`     // the top one is ro
	SameTree     bool     `json:"sameTree"`     // and shows the subroot
	WriteErr     string   `json:"writeErr"`     // creating a file through it
	Propagation  string   `json:"propagation"`  // of the host's copy
	ContainerErr string   `json:"containerErr"` // a container run that failed

	// With a shared subroot:
	PeerGroup        string `json:"peerGroup"`        // the driver root's shared:N
	SubrootPeerGroup string `json:"subrootPeerGroup"` // the host's subroot's shared:N
	SocketOnHost     bool   `json:"socketOnHost"`     // the container's socket bind under the driver root reached the host
	SocketInSubroot  bool   `json:"socketInSubroot"`  // ... and leaked into the host's subroot
	SubrootToRoot    bool   `json:"subrootToRoot"`    // a host mount under the subroot appeared in the driver root
}

func TestMountSeenReadOnlyByHost(t *testing.T) {
	view := runHost(t, "shared", false)

	require.Empty(t, view.ContainerErr)
	assert.Equal(t, []string{"mounted", "reused"}, view.Results, "the second run must reuse, not stack")
	assert.Equal(t, 1, view.Mounts, "exactly one mount at the target")
	assert.True(t, view.ReadOnly, "read-only as the host sees it")
	assert.True(t, view.SameTree, "the host's mount shows the subroot")
	assert.Contains(t, view.WriteErr, "read-only file system")
	assert.Contains(t, view.Propagation, "shared", "later mounts below it (the persistenced socket) must reach the host")
}

func TestMountReplacesWrongMount(t *testing.T) {
	view := runHost(t, "shared", true)

	require.Empty(t, view.ContainerErr)
	assert.Equal(t, []string{"replaced", "reused"}, view.Results)
	assert.Equal(t, 1, view.Mounts)
	assert.True(t, view.ReadOnly)
	assert.True(t, view.SameTree)
}

// TestMountNeedsSharedRootPropagation is the control: with runc's default root propagation
// (rslave), a mount made in the service's namespace never reaches the host. This is why the
// service YAML sets security.rootfsPropagation: shared.
func TestMountNeedsSharedRootPropagation(t *testing.T) {
	view := runHost(t, "rslave", false)

	require.Empty(t, view.ContainerErr)
	assert.Equal(t, 0, view.Mounts, "with an rslave root the host must not see the mount")
}

// TestDriverRootHasItsOwnPeerGroup: the subroot is shared, as on Talos. The driver root must
// not be a peer of it: the persistenced socket bound under the driver root reaches the
// host's /run but not the host's /usr/local/glibc, and a mount under /usr/local/glibc does
// not show in the driver root.
func TestDriverRootHasItsOwnPeerGroup(t *testing.T) {
	t.Setenv(envSharedSubroot, "true")

	view := runHost(t, "shared", false)

	require.Empty(t, view.ContainerErr)
	assert.Equal(t, []string{"mounted", "reused"}, view.Results)
	require.NotEmpty(t, view.PeerGroup, "the driver root is shared")
	require.NotEmpty(t, view.SubrootPeerGroup, "the subroot is shared, as on Talos")
	assert.NotEqual(t, view.SubrootPeerGroup, view.PeerGroup, "a peer group of its own")
	assert.True(t, view.SocketOnHost, "a mount under the driver root still reaches the host's /run")
	assert.False(t, view.SocketInSubroot, "and not the host's subroot")
	assert.False(t, view.SubrootToRoot, "a mount under the host's subroot does not reach the driver root")
}

func runHost(t *testing.T, rootPropagation string, premount bool) hostView {
	t.Helper()
	testutil.RequireRoot(t)

	if _, err := exec.LookPath("unshare"); err != nil {
		t.Fatalf("unshare (util-linux) is needed: %v", err)
	}

	work := t.TempDir()

	cmd := exec.Command("unshare", "--mount", "--propagation", "private", os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		envRole+"=host", envWork+"="+work, envSubroot+"="+testutil.Subroot(t), envRootProp+"="+rootPropagation,
		fmt.Sprintf("%s=%t", envPremount, premount))
	cmd.Stderr = os.Stderr

	out, err := cmd.Output()
	require.NoError(t, err, "host role failed")

	var view hostView
	require.NoError(t, json.Unmarshal(out, &view), "host role said: %s", out)

	// The namespaces are gone with their processes; nothing is left on this machine.
	infos, err := mountinfo.GetMounts(mountinfo.PrefixFilter(work))
	require.NoError(t, err)
	assert.Empty(t, infos, "no mount may leak out of the test's namespace")

	return view
}

func hostRole() int {
	view, err := hostSteps()
	if err != nil {
		fmt.Fprintln(os.Stderr, "host role:", err)

		return 1
	}

	if err := json.NewEncoder(os.Stdout).Encode(view); err != nil {
		return 1
	}

	return 0
}

func hostSteps() (hostView, error) {
	var view hostView

	work, subroot := os.Getenv(envWork), os.Getenv(envSubroot)
	run := filepath.Join(work, "run")
	target := filepath.Join(run, "nvidia/driver")

	// The node's /run: a tmpfs with shared propagation, as on Talos.
	if err := os.MkdirAll(run, 0o755); err != nil {
		return view, err
	}

	if err := unix.Mount("tmpfs", run, "tmpfs", 0, ""); err != nil {
		return view, fmt.Errorf("mounting the host's /run: %w", err)
	}

	if err := unix.Mount("", run, "", unix.MS_SHARED, ""); err != nil {
		return view, fmt.Errorf("making the host's /run shared: %w", err)
	}

	if os.Getenv(envPremount) == "true" {
		// A writable mount of another tree, as a broken earlier run might leave.
		other := filepath.Join(work, "other")
		if err := os.MkdirAll(other, 0o755); err != nil {
			return view, err
		}

		if err := os.MkdirAll(target, 0o755); err != nil {
			return view, err
		}

		if err := unix.Mount(other, target, "", unix.MS_BIND, ""); err != nil {
			return view, fmt.Errorf("premounting: %w", err)
		}
	}

	hostSubroot := ""
	if os.Getenv(envSharedSubroot) == "true" {
		hostSubroot = filepath.Join(work, "host-glibc")
		if err := sharedBind(subroot, hostSubroot); err != nil {
			return view, err
		}
	}

	for range 2 {
		cmd := exec.Command("unshare", "--mount", "--propagation", "unchanged", os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), envRole+"=container", envSubroot+"="+subrootOrBind(subroot, hostSubroot))
		cmd.Stderr = os.Stderr

		out, err := cmd.Output()
		if err != nil {
			view.ContainerErr = fmt.Sprintf("%v: %s", err, out)

			return view, nil
		}

		view.Results = append(view.Results, string(out))
	}

	infos, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(target))
	if err != nil {
		return view, err
	}

	view.Mounts = len(infos)
	if len(infos) == 0 {
		return view, nil
	}

	top := infos[len(infos)-1]
	view.Propagation = top.Optional

	for _, o := range splitComma(top.Options) {
		if o == "ro" {
			view.ReadOnly = true
		}
	}

	var a, b unix.Stat_t
	if err := unix.Stat(subroot, &a); err != nil {
		return view, err
	}

	if err := unix.Stat(target, &b); err != nil {
		return view, err
	}

	view.SameTree = a.Dev == b.Dev && a.Ino == b.Ino

	if f, err := os.Create(filepath.Join(target, "written-by-host")); err != nil {
		view.WriteErr = err.Error()
	} else {
		f.Close() //nolint:errcheck
	}

	if hostSubroot != "" {
		return view, peerGroups(&view, hostSubroot, target)
	}

	return view, nil
}

// sharedBind binds src at dst and makes it shared: a new peer group, in this namespace only.
func sharedBind(src, dst string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}

	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("binding %s: %w", dst, err)
	}

	if err := unix.Mount("", dst, "", unix.MS_SHARED, ""); err != nil {
		return fmt.Errorf("making %s shared: %w", dst, err)
	}

	return nil
}

// subrootOrBind names the subroot the container mounts: the shared bind when there is one.
func subrootOrBind(subroot, bind string) string {
	if bind != "" {
		return bind
	}

	return subroot
}

// peerGroups looks at what propagated between the host's shared subroot and the driver root.
func peerGroups(view *hostView, hostSubroot, target string) error {
	view.PeerGroup = peerGroup(target)
	view.SubrootPeerGroup = peerGroup(hostSubroot)

	sock := driverroot.PersistencedSocketDir
	view.SocketOnHost = isMountPoint(filepath.Join(target, sock))
	view.SocketInSubroot = isMountPoint(filepath.Join(hostSubroot, sock))

	// A mount the host makes under its subroot (on Talos: anything below /usr/local/glibc).
	other := filepath.Join(hostSubroot, "run/nvidia-fabricmanager")
	if err := unix.Mount("tmpfs", other, "tmpfs", 0, ""); err != nil {
		return fmt.Errorf("mounting under the host's subroot: %w", err)
	}

	view.SubrootToRoot = isMountPoint(filepath.Join(target, "run/nvidia-fabricmanager"))

	return nil
}

func peerGroup(path string) string {
	infos, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(path))
	if err != nil || len(infos) == 0 {
		return ""
	}

	for _, f := range strings.Fields(infos[len(infos)-1].Optional) {
		if strings.HasPrefix(f, "shared:") {
			return f
		}
	}

	return ""
}

func isMountPoint(path string) bool {
	infos, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(path))

	return err == nil && len(infos) > 0
}

// containerRole sets up its namespace as runc does for the service's container and mounts
// the driver root into the host's /run as the service does.
func containerRole() int {
	work, subroot := os.Getenv(envWork), os.Getenv(envSubroot)

	// runc: the root's propagation is security.rootfsPropagation when set, rslave otherwise.
	flags := map[string]uintptr{"shared": unix.MS_SHARED, "rslave": unix.MS_SLAVE}[os.Getenv(envRootProp)]
	if err := unix.Mount("", "/", "", flags|unix.MS_REC, ""); err != nil {
		fmt.Fprintln(os.Stderr, "container role: root propagation:", err)

		return 1
	}

	// The service YAML's mount: the host's /run, rbind with rshared.
	crun := filepath.Join(work, "container", "run")
	if err := os.MkdirAll(crun, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "container role:", err)

		return 1
	}

	if err := unix.Mount(filepath.Join(work, "run"), crun, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		fmt.Fprintln(os.Stderr, "container role: binding /run:", err)

		return 1
	}

	if err := unix.Mount("", crun, "", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		fmt.Fprintln(os.Stderr, "container role: rshared /run:", err)

		return 1
	}

	log := slog.New(slog.NewTextHandler(os.Stderr, nil))

	if os.Getenv(envSharedSubroot) == "true" {
		// The service YAML's rbind of /usr/local/glibc: with a shared root propagation it
		// joins the host's peer group.
		bind := filepath.Join(work, "container", "glibc")
		if err := os.MkdirAll(bind, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "container role:", err)

			return 1
		}

		if err := unix.Mount(subroot, bind, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			fmt.Fprintln(os.Stderr, "container role: binding the subroot:", err)

			return 1
		}

		subroot = bind
	}

	target := filepath.Join(crun, "nvidia/driver")

	res, err := driverroot.Mount(log, subroot, target)
	if err != nil {
		fmt.Fprintln(os.Stderr, "container role:", err)

		return 1
	}

	// What the persistenced supervisor does: bind its run directory under the driver root.
	if sock := filepath.Join(target, driverroot.PersistencedSocketDir); os.Getenv(envSharedSubroot) == "true" && !isMountPoint(sock) {
		if err := unix.Mount(work, sock, "", unix.MS_BIND, ""); err != nil {
			fmt.Fprintln(os.Stderr, "container role: binding the socket directory:", err)

			return 1
		}
	}

	if ok, err := driverroot.IsMounted(subroot, filepath.Join(crun, "nvidia/driver")); err != nil || !ok {
		fmt.Fprintln(os.Stderr, "container role: not mounted after Mount:", errors.Join(err))

		return 1
	}

	fmt.Print(res)

	return 0
}

func splitComma(s string) []string {
	var out []string

	for len(s) > 0 {
		i := 0
		for i < len(s) && s[i] != ',' {
			i++
		}

		out = append(out, s[:i])

		if i < len(s) {
			i++
		}

		s = s[i:]
	}

	return out
}
