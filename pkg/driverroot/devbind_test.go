package driverroot_test

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/moby/sys/mountinfo"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
	"github.com/talos-nvidia/nvidia-driver/pkg/driverroot"
)

// The dev-bind test runs this test binary again, as TestDevBindRole, in new mount namespaces:
// a "host" (the node: shared /run, a /dev with a character device, a pod that mounted
// /run/nvidia/driver with HostToContainer before the service started) and, inside it, the
// service's "container" as runc sets it up from extension/nvidia-driver.yaml.
const envDevBindRole = "DRIVERROOT_DEVBIND_ROLE"

// devBindView is what the host saw.
type devBindView struct {
	Results     []string `json:"results"`     // BindDev's result per service run
	Mounts      int      `json:"mounts"`      // mounts at /run/nvidia/driver/dev afterwards
	Options     string   `json:"options"`     // of the top one
	SameTree    bool     `json:"sameTree"`    // shows the host's /dev
	OpenErr     string   `json:"openErr"`     // opening dev/null for writing through the bind
	CreateErr   string   `json:"createErr"`   // creating a file through the bind
	LateNode    bool     `json:"lateNode"`    // a node made in /dev after the bind shows through it
	PodOpenErr  string   `json:"podOpenErr"`  // the pod opening /driver-root/dev/null
	RootRO      bool     `json:"rootRO"`      // the driver root itself is still read-only
	SubrootDev  int      `json:"subrootDev"`  // mounts that leaked onto the subroot's own dev/
	HostDevSubs int      `json:"hostDevSubs"` // mounts that leaked below the host's /dev
	Err         string   `json:"err"`
}

func TestBindDevSeenByHostAndPod(t *testing.T) {
	testutil.RequireRoot(t)

	work := t.TempDir()
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", os.Args[0], "-test.run=^TestDevBindRole$")
	cmd.Env = append(os.Environ(), envDevBindRole+"=host", envWork+"="+work)
	cmd.Stderr = os.Stderr

	out, err := cmd.Output()
	require.NoError(t, err, "host role failed")

	var view devBindView
	require.NoError(t, json.Unmarshal(out, &view), "host role said: %s", out)
	require.Empty(t, view.Err)

	assert.Equal(t, []string{"mounted", "reused", "replaced"}, view.Results, "reused across restarts, a stacked mount replaced")
	assert.Equal(t, 1, view.Mounts, "exactly one mount at the driver root's dev/")
	assert.True(t, view.SameTree, "the bind shows the host's /dev")
	assert.Contains(t, view.Options, "ro")
	assert.NotContains(t, view.Options, "nodev")
	assert.Empty(t, view.OpenErr, "device nodes open through the bind")
	assert.Contains(t, view.CreateErr, "read-only file system")
	assert.True(t, view.LateNode, "nodes made later in /dev appear under the driver root")
	assert.Empty(t, view.PodOpenErr, "a HostToContainer pod started before the service sees the device nodes")
	assert.True(t, view.RootRO, "the driver root stays read-only")
	assert.Zero(t, view.SubrootDev, "nothing is mounted on the subroot's own dev/")
	assert.Zero(t, view.HostDevSubs, "nothing is mounted below the host's /dev")

	infos, err := mountinfo.GetMounts(mountinfo.PrefixFilter(work))
	require.NoError(t, err)
	assert.Empty(t, infos, "no mount may leak out of the test's namespace")
}

func TestBindDevNeedsMountPoint(t *testing.T) {
	_, err := driverroot.BindDev(slog.New(slog.DiscardHandler), "/dev", t.TempDir())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "has no dev/ directory to mount on")
}

// TestDevBindRole is not a test: it is the host or container role when the env says so.
func TestDevBindRole(t *testing.T) {
	switch os.Getenv(envDevBindRole) {
	case "host":
		view := devBindHost(os.Getenv(envWork))
		if err := json.NewEncoder(os.Stdout).Encode(view); err != nil {
			os.Exit(1)
		}

		os.Exit(0)
	case "container":
		res, err := devBindContainer(os.Getenv(envWork))
		if err != nil {
			fmt.Fprintln(os.Stderr, "container role:", err)
			os.Exit(1)
		}

		fmt.Print(res)
		os.Exit(0)
	}
}

func devBindHost(work string) devBindView {
	var view devBindView

	fail := func(err error) devBindView { view.Err = err.Error(); return view }

	run, hostDev := filepath.Join(work, "run"), filepath.Join(work, "dev")
	subroot, pod := filepath.Join(work, "subroot"), filepath.Join(work, "pod")
	driver := filepath.Join(run, "nvidia/driver")

	for _, d := range []string{run, hostDev, filepath.Join(subroot, "dev"), pod} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fail(err)
		}
	}

	// The node: /run a shared tmpfs (Talos), /dev a shared filesystem with a real
	// character device (/dev/null's numbers).
	for _, m := range []string{run, hostDev} {
		if err := unix.Mount("tmpfs", m, "tmpfs", 0, "mode=755"); err != nil {
			return fail(fmt.Errorf("tmpfs at %s: %w", m, err))
		}

		if err := unix.Mount("", m, "", unix.MS_SHARED, ""); err != nil {
			return fail(err)
		}
	}

	if err := unix.Mknod(filepath.Join(hostDev, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		return fail(err)
	}

	// A pod that mounted the hostPath /run/nvidia/driver with HostToContainer (rslave)
	// before the service made anything there.
	if err := os.MkdirAll(driver, 0o755); err != nil {
		return fail(err)
	}

	if err := unix.Mount(driver, pod, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fail(err)
	}

	if err := unix.Mount("", pod, "", unix.MS_SLAVE|unix.MS_REC, ""); err != nil {
		return fail(err)
	}

	serviceRun := func() error {
		cmd := exec.Command("unshare", "--mount", "--propagation", "unchanged", os.Args[0], "-test.run=^TestDevBindRole$")
		cmd.Env = append(os.Environ(), envDevBindRole+"=container")
		cmd.Stderr = os.Stderr

		out, err := cmd.Output()
		if err != nil {
			return fmt.Errorf("service run: %w", err)
		}

		view.Results = append(view.Results, string(out))

		return nil
	}

	for range 2 {
		if err := serviceRun(); err != nil {
			return fail(err)
		}
	}

	// A stray mount stacked on the bind (by hand, or a broken earlier version): replaced.
	if err := unix.Mount("tmpfs", filepath.Join(driver, "dev"), "tmpfs", 0, ""); err != nil {
		return fail(err)
	}

	if err := serviceRun(); err != nil {
		return fail(err)
	}

	target := filepath.Join(driver, "dev")

	infos, err := mountinfo.GetMounts(allAt(target))
	if err != nil {
		return fail(err)
	}

	view.Mounts = len(infos)
	if len(infos) > 0 {
		view.Options = infos[len(infos)-1].Options
	}

	view.SameTree = sameInode(hostDev, target)

	if f, err := os.OpenFile(filepath.Join(target, "null"), os.O_WRONLY, 0); err != nil {
		view.OpenErr = err.Error()
	} else {
		_, err = f.WriteString("x")
		if err != nil {
			view.OpenErr = err.Error()
		}

		f.Close() //nolint:errcheck
	}

	if f, err := os.Create(filepath.Join(target, "written-through-driver-root")); err != nil {
		view.CreateErr = err.Error()
	} else {
		f.Close() //nolint:errcheck
	}

	if err := unix.Mknod(filepath.Join(hostDev, "late"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		return fail(err)
	}

	_, err = os.Stat(filepath.Join(target, "late"))
	view.LateNode = err == nil

	if f, err := os.OpenFile(filepath.Join(pod, "dev/null"), os.O_WRONLY, 0); err != nil {
		view.PodOpenErr = err.Error()
	} else {
		f.Close() //nolint:errcheck
	}

	if root, err := mountinfo.GetMounts(allAt(driver)); err == nil && len(root) > 0 {
		view.RootRO = slices.Contains(splitComma(root[len(root)-1].Options), "ro")
	}

	if sub, err := mountinfo.GetMounts(allAt(filepath.Join(subroot, "dev"))); err == nil {
		view.SubrootDev = len(sub)
	}

	if below, err := mountinfo.GetMounts(mountinfo.PrefixFilter(hostDev + "/")); err == nil {
		view.HostDevSubs = len(below)
	}

	return view
}

// devBindContainer sets its namespace up as runc sets up the service's container from
// extension/nvidia-driver.yaml (root propagation shared; /run rbind,rshared; /dev
// rbind,rslave) and does what the service does at bring-up: Mount, then BindDev.
func devBindContainer(work string) (driverroot.MountResult, error) {
	if err := unix.Mount("", "/", "", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return "", fmt.Errorf("root propagation: %w", err)
	}

	crun, cdev := filepath.Join(work, "container/run"), filepath.Join(work, "container/dev")
	for _, m := range []struct {
		src, dst string
		prop     uintptr
	}{{filepath.Join(work, "run"), crun, unix.MS_SHARED}, {filepath.Join(work, "dev"), cdev, unix.MS_SLAVE}} {
		if err := os.MkdirAll(m.dst, 0o755); err != nil {
			return "", err
		}

		if err := unix.Mount(m.src, m.dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return "", fmt.Errorf("binding %s: %w", m.src, err)
		}

		if err := unix.Mount("", m.dst, "", m.prop|unix.MS_REC, ""); err != nil {
			return "", err
		}
	}

	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	driver := filepath.Join(crun, "nvidia/driver")

	if _, err := driverroot.Mount(log, filepath.Join(work, "subroot"), driver); err != nil {
		return "", err
	}

	res, err := driverroot.BindDev(log, cdev, driver)
	if err != nil {
		return "", err
	}

	if !sameInode(cdev, filepath.Join(driver, "dev")) {
		return "", fmt.Errorf("%s/dev does not show %s after BindDev", driver, cdev)
	}

	return res, nil
}

func sameInode(a, b string) bool {
	var sa, sb unix.Stat_t

	return unix.Stat(a, &sa) == nil && unix.Stat(b, &sb) == nil && sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

// allAt keeps every mount at mp (mountinfo.SingleEntryFilter stops at the first one).
func allAt(mp string) mountinfo.FilterFunc {
	return func(m *mountinfo.Info) (bool, bool) { return m.Mountpoint != mp, false }
}
