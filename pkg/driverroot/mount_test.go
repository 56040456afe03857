package driverroot_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
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
)

func TestMain(m *testing.M) {
	switch os.Getenv(envRole) {
	case "host":
		os.Exit(hostRole())
	case "container":
		os.Exit(containerRole())
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

	for range 2 {
		cmd := exec.Command("unshare", "--mount", "--propagation", "unchanged", os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), envRole+"=container")
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

	return view, nil
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

	res, err := driverroot.Mount(log, subroot, filepath.Join(crun, "nvidia/driver"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "container role:", err)

		return 1
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
