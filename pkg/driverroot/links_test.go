package driverroot_test

import (
	"encoding/json"
	"fmt"
	"io"
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

// linkCase is one link planted on the driver root's path, and what Mount or BindDev did.
type linkCase struct {
	Err string `json:"err"`
	// Stray lists the mounts made anywhere under the test's directory but at the right place,
	// and Made what appeared where the link points.
	Stray []string `json:"stray"`
	Made  []string `json:"made"`
}

// TestNoMountThroughALink: a link at <host>/run/nvidia or at <host>/run/nvidia/driver (issue
// 32: the driver root and the /dev bind were mounted where it pointed, and a link at
// run/nvidia/driver failed with "attaching ... invalid argument") is refused with an error
// that names it; nothing is made or mounted where it points. Without links the mount is made.
func TestNoMountThroughALink(t *testing.T) {
	testutil.RequireRoot(t)

	cmd := exec.Command("unshare", "--mount", "--propagation", "private", os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envRole+"=links", envWork+"="+t.TempDir())
	cmd.Stderr = os.Stderr

	out, err := cmd.Output()
	require.NoError(t, err)

	var cases map[string]linkCase
	require.NoError(t, json.Unmarshal(out, &cases), "%s", out)

	for name, want := range map[string]string{
		"run/nvidia":           "/host/run/nvidia is a symbolic link, not a directory (to \"../elsewhere\"): refused",
		"run/nvidia/driver":    "/host/run/nvidia/driver is a symbolic link, not a directory (to \"/",
		"dev bind, run/nvidia": "/host/run/nvidia is a symbolic link, not a directory (to \"../elsewhere\"): refused",
	} {
		c := cases[name]
		assert.Contains(t, c.Err, want, name)
		assert.Empty(t, c.Stray, "%s: mounted where the link points", name)
		assert.Empty(t, c.Made, "%s: made where the link points", name)
	}

	assert.Empty(t, cases["no link"].Err)
	assert.Len(t, cases["no link"].Stray, 1, "the one right mount")
}

// linksRole runs the cases of TestNoMountThroughALink in this private mount namespace.
func linksRole() int {
	out := map[string]linkCase{}

	for name, plant := range map[string]func(host, elsewhere string) error{
		"run/nvidia": func(host, _ string) error {
			return os.Symlink("../elsewhere", filepath.Join(host, "run/nvidia"))
		},
		"run/nvidia/driver": func(host, elsewhere string) error {
			if err := os.MkdirAll(filepath.Join(host, "run/nvidia"), 0o755); err != nil {
				return err
			}

			return os.Symlink(elsewhere, filepath.Join(host, "run/nvidia/driver"))
		},
		"dev bind, run/nvidia": func(host, elsewhere string) error {
			// An earlier driver root where the link points, with its dev/: BindDev alone.
			if err := os.MkdirAll(filepath.Join(elsewhere, "driver/dev"), 0o755); err != nil {
				return err
			}

			return os.Symlink("../elsewhere", filepath.Join(host, "run/nvidia"))
		},
		"no link": func(string, string) error { return nil },
	} {
		c, err := linkRun(name, plant)
		if err != nil {
			fmt.Fprintln(os.Stderr, "links role:", name, err)

			return 1
		}

		out[name] = c
	}

	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		return 1
	}

	return 0
}

func linkRun(name string, plant func(host, elsewhere string) error) (linkCase, error) {
	var c linkCase

	work, err := os.MkdirTemp(os.Getenv(envWork), "case-")
	if err != nil {
		return c, err
	}

	if err := unix.Mount("tmpfs", work, "tmpfs", 0, ""); err != nil {
		return c, err
	}

	host, elsewhere, subroot := filepath.Join(work, "host"), filepath.Join(work, "host/elsewhere"), filepath.Join(work, "subroot")
	for _, d := range []string{filepath.Join(host, "run"), filepath.Join(host, "dev"), elsewhere, filepath.Join(subroot, "dev")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return c, err
		}
	}

	// A file in the host's /dev, to see where a bind of it lands.
	if err := os.WriteFile(filepath.Join(host, "dev/marker"), nil, 0o644); err != nil {
		return c, err
	}

	if err := plant(host, elsewhere); err != nil {
		return c, err
	}

	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	target := filepath.Join(host, "run/nvidia/driver")

	if name == "dev bind, run/nvidia" {
		_, err = driverroot.BindDev(log, filepath.Join(host, "dev"), target)
	} else {
		_, err = driverroot.Mount(log, subroot, target)
	}

	if err != nil {
		c.Err = err.Error()
	}

	infos, err := mountinfo.GetMounts(mountinfo.PrefixFilter(work))
	if err != nil {
		return c, err
	}

	for _, m := range infos {
		if m.Mountpoint != work {
			c.Stray = append(c.Stray, m.Mountpoint)
		}
	}

	after, err := os.ReadDir(elsewhere)
	if err != nil {
		return c, err
	}

	for _, e := range after {
		c.Made = append(c.Made, e.Name())
	}

	if name == "dev bind, run/nvidia" {
		// The plant made driver/dev there itself; the bind would show the marker in it.
		c.Made = nil

		if _, err := os.Stat(filepath.Join(elsewhere, "driver/dev/marker")); err == nil {
			c.Made = append(c.Made, "driver/dev/marker")
		}
	}

	return c, nil
}
