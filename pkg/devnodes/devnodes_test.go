package devnodes_test

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/talos-nvidia/nvidia-driver/internal/sim"
	"github.com/talos-nvidia/nvidia-driver/internal/testutil"
	"github.com/talos-nvidia/nvidia-driver/pkg/devnodes"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// fakeProc writes the /proc and /sys files a loaded driver offers: two GPUs with minors 0
// and 3, uvm and modeset loaded, and the MIG instances given as (gpu minor, gi, ci).
func fakeProc(t *testing.T, root string, instances ...[3]int) {
	t.Helper()

	files := map[string]string{
		"proc/devices": "Character devices:\n  1 mem\n195 nvidia-frontend\n 10 misc\n506 nvidia-uvm\n507 nvidia-caps\n\nBlock devices:\n  8 sd\n",
		"proc/driver/nvidia/gpus/0000:0f:00.0/information": "Model: \t\t NVIDIA H200\nDevice Minor: \t 0\n",
		"proc/driver/nvidia/gpus/0000:8a:00.0/information": "Model: \t\t NVIDIA H200\nDevice Minor: \t 3\n",
		"proc/driver/nvidia-caps/mig-minors":               "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\ngpu0/gi2/access 21\ngpu0/gi2/ci0/access 22\ngpu3/gi1/access 417\ngpu3/gi1/ci0/access 418\n",
		"proc/driver/nvidia/capabilities/mig/config":       "DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n",
		"proc/driver/nvidia/capabilities/mig/monitor":      "DeviceFileMinor: 2\nDeviceFileMode: 292\nDeviceFileModify: 1\n",
	}

	minors := map[[3]int][2]int{{0, 1, 0}: {12, 13}, {0, 2, 0}: {21, 22}, {3, 1, 0}: {417, 418}}

	for _, in := range instances {
		m := minors[in]
		files[fmt.Sprintf("proc/driver/nvidia/capabilities/gpu%d/mig/gi%d/access", in[0], in[1])] = fmt.Sprintf("DeviceFileMinor: %d\nDeviceFileMode: 292\n", m[0])
		files[fmt.Sprintf("proc/driver/nvidia/capabilities/gpu%d/mig/gi%d/ci%d/access", in[0], in[1], in[2])] = fmt.Sprintf("DeviceFileMinor: %d\nDeviceFileMode: 292\n", m[1])
	}

	require.NoError(t, os.RemoveAll(filepath.Join(root, "proc/driver/nvidia/capabilities")))

	for rel, content := range files {
		p := filepath.Join(root, rel)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(content), 0o444))
	}

	for _, mod := range []string{"nvidia_modeset", "nvidia_uvm"} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, "sys/module", mod), 0o755))
	}
}

func newRoot(t *testing.T) string {
	t.Helper()
	testutil.RequireRoot(t)

	return t.TempDir()
}

func assertNode(t *testing.T, path string, major, minor uint32, mode os.FileMode) {
	t.Helper()

	var st unix.Stat_t
	require.NoError(t, unix.Lstat(path, &st), path)
	assert.Equal(t, uint32(unix.S_IFCHR), st.Mode&unix.S_IFMT, "%s is a character device", path)
	assert.Equal(t, major, unix.Major(st.Rdev), "%s major", path)
	assert.Equal(t, minor, unix.Minor(st.Rdev), "%s minor", path)
	assert.Equal(t, mode, os.FileMode(st.Mode&0o777), "%s mode", path)
}

func TestSyncCreatesNodesFromProc(t *testing.T) {
	root := newRoot(t)
	fakeProc(t, root, [3]int{0, 1, 0})

	res, err := devnodes.Sync(quiet, root)
	require.NoError(t, err)

	assertNode(t, filepath.Join(root, "dev/nvidiactl"), 195, 255, 0o666)
	assertNode(t, filepath.Join(root, "dev/nvidia-modeset"), 195, 254, 0o666)
	assertNode(t, filepath.Join(root, "dev/nvidia-uvm"), 506, 0, 0o666)
	assertNode(t, filepath.Join(root, "dev/nvidia-uvm-tools"), 506, 1, 0o666)
	assertNode(t, filepath.Join(root, "dev/nvidia0"), 195, 0, 0o666)
	assertNode(t, filepath.Join(root, "dev/nvidia3"), 195, 3, 0o666)
	assertNode(t, filepath.Join(root, "dev/nvidia-caps/nvidia-cap1"), 507, 1, 0o400)
	assertNode(t, filepath.Join(root, "dev/nvidia-caps/nvidia-cap2"), 507, 2, 0o444)
	assertNode(t, filepath.Join(root, "dev/nvidia-caps/nvidia-cap12"), 507, 12, 0o444)
	assertNode(t, filepath.Join(root, "dev/nvidia-caps/nvidia-cap13"), 507, 13, 0o444)

	// Only instances that exist get a node, though mig-minors lists more.
	assert.NoFileExists(t, filepath.Join(root, "dev/nvidia-caps/nvidia-cap21"))
	assert.NoFileExists(t, filepath.Join(root, "dev/nvidia-caps/nvidia-cap417"))

	link, err := os.Readlink(filepath.Join(root, "dev/char/195:3"))
	require.NoError(t, err)
	assert.Equal(t, "../nvidia3", link)

	link, err = os.Readlink(filepath.Join(root, "dev/char/507:13"))
	require.NoError(t, err)
	assert.Equal(t, "../nvidia-caps/nvidia-cap13", link)

	assert.Len(t, res.Nodes, 10)
	assert.Len(t, res.Created, 10)
}

func TestSyncIsIdempotent(t *testing.T) {
	root := newRoot(t)
	fakeProc(t, root, [3]int{0, 1, 0})

	_, err := devnodes.Sync(quiet, root)
	require.NoError(t, err)

	var before unix.Stat_t
	require.NoError(t, unix.Stat(filepath.Join(root, "dev/nvidia0"), &before))

	res, err := devnodes.Sync(quiet, root)
	require.NoError(t, err)
	assert.Empty(t, res.Created)
	assert.Empty(t, res.Removed)

	var after unix.Stat_t
	require.NoError(t, unix.Stat(filepath.Join(root, "dev/nvidia0"), &after))
	assert.Equal(t, before.Ino, after.Ino, "an unchanged node is left alone")
}

func TestSyncFixesWrongNode(t *testing.T) {
	root := newRoot(t)
	fakeProc(t, root)

	require.NoError(t, os.MkdirAll(filepath.Join(root, "dev"), 0o755))
	require.NoError(t, unix.Mknod(filepath.Join(root, "dev/nvidia0"), unix.S_IFCHR|0o600, int(unix.Mkdev(195, 7))))

	res, err := devnodes.Sync(quiet, root)
	require.NoError(t, err)
	assert.Contains(t, res.Created, "dev/nvidia0")
	assertNode(t, filepath.Join(root, "dev/nvidia0"), 195, 0, 0o666)
}

// TestSyncKeepsCapabilitiesOtherThanMIG: a capability node whose minor is no MIG one (here
// the nvidia-nvlink fabric-mgmt capability, minor 0, made by an earlier sync or the host's
// nvidia-modprobe) stays when a sync cannot account for it: FabricNodes failed on a /proc
// that does not add up, which Sync only warns about.
func TestSyncKeepsCapabilitiesOtherThanMIG(t *testing.T) {
	root := newRoot(t)
	fakeProc(t, root)

	require.NoError(t, os.MkdirAll(filepath.Join(root, "dev/nvidia-caps"), 0o755))
	require.NoError(t, unix.Mknod(filepath.Join(root, "dev/nvidia-caps/nvidia-cap0"), unix.S_IFCHR|0o400, int(unix.Mkdev(507, 0))))
	// The nvidia-nvswitch driver lists a switch, /proc/devices has no nvidia-nvswitch major.
	write(t, root, "proc/driver/nvidia-nvswitch/devices/0000:c1:00.0/information", "BIOS Version: N/A\n")
	write(t, root, "proc/driver/nvidia-nvswitch/permissions", "DeviceFileMode: 438\n")

	res, err := devnodes.Sync(quiet, root)
	require.NoError(t, err)
	assert.Empty(t, res.Removed)
	assertNode(t, filepath.Join(root, "dev/nvidia-caps/nvidia-cap0"), 507, 0, 0o400)
}

func TestSyncRemovesStaleCapabilities(t *testing.T) {
	root := newRoot(t)
	fakeProc(t, root, [3]int{0, 1, 0}, [3]int{0, 2, 0}, [3]int{3, 1, 0})

	_, err := devnodes.Sync(quiet, root)
	require.NoError(t, err)
	assertNode(t, filepath.Join(root, "dev/nvidia-caps/nvidia-cap418"), 507, 418, 0o444)

	// The layout changes: gpu0/gi2 and gpu3/gi1 are destroyed.
	fakeProc(t, root, [3]int{0, 1, 0})

	res, err := devnodes.Sync(quiet, root)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{
		"dev/nvidia-caps/nvidia-cap21", "dev/nvidia-caps/nvidia-cap22",
		"dev/nvidia-caps/nvidia-cap417", "dev/nvidia-caps/nvidia-cap418",
	}, res.Removed)
	assert.NoFileExists(t, filepath.Join(root, "dev/nvidia-caps/nvidia-cap418"))
	assert.NoFileExists(t, filepath.Join(root, "dev/char/507:418"))
	assertNode(t, filepath.Join(root, "dev/nvidia-caps/nvidia-cap13"), 507, 13, 0o444)
}

func TestSyncErrors(t *testing.T) {
	cases := []struct {
		name  string
		setup func(t *testing.T, root string)
		want  string
	}{
		{
			name:  "no /proc/devices",
			setup: func(*testing.T, string) {},
			want:  "reading device majors",
		},
		{
			name: "driver not loaded",
			setup: func(t *testing.T, root string) {
				write(t, root, "proc/devices", "Character devices:\n  1 mem\n\nBlock devices:\n")
			},
			want: "lists no nvidia character device: the nvidia kernel module is not loaded",
		},
		{
			name: "GPU information without a minor",
			setup: func(t *testing.T, root string) {
				fakeProc(t, root)
				write(t, root, "proc/driver/nvidia/gpus/0000:0f:00.0/information", "Model: H200\n")
			},
			want: `has no "Device Minor:" line`,
		},
		{
			name: "capability unknown to mig-minors",
			setup: func(t *testing.T, root string) {
				fakeProc(t, root)
				write(t, root, "proc/driver/nvidia/capabilities/gpu9/mig/gi1/access", "DeviceFileMinor: 5\n")
			},
			want: "capability gpu9/gi1/access is not listed in",
		},
		{
			name: "capability and mig-minors disagree",
			setup: func(t *testing.T, root string) {
				fakeProc(t, root)
				write(t, root, "proc/driver/nvidia/capabilities/gpu0/mig/gi1/access", "DeviceFileMinor: 99\n")
			},
			want: "says minor 99",
		},
	}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root := newRoot(t)
			tc.setup(t, root)

			_, err := devnodes.Sync(quiet, root)
			require.ErrorContains(t, err, tc.want)

			// Nothing was created on a bad /proc.
			assert.NoDirExists(t, filepath.Join(root, "dev"))
		})
	}
}

func write(t *testing.T, root, rel, content string) {
	t.Helper()

	p := filepath.Join(root, rel)
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(t, os.WriteFile(p, []byte(content), 0o444))
}

// TestSyncNVSwitchBoard: on a simulated HGX board (four NVSwitches) the nodes that the fabric
// manager opens are made from /proc, with /dev/char links; where the nvidia-nvswitch driver
// manages no switch (a VM without the board's topology) none are made.
func TestSyncNVSwitchBoard(t *testing.T) {
	for _, tc := range []struct {
		name  string
		board sim.NVSwitches
		want  []string
	}{
		{"four managed switches", sim.NVSwitches{Count: 4}, []string{
			"dev/nvidia-nvswitchctl", "dev/nvidia-nvswitch0", "dev/nvidia-nvswitch1", "dev/nvidia-nvswitch2",
			"dev/nvidia-nvswitch3", "dev/nvidia-nvlink", "dev/nvidia-caps/nvidia-cap0",
		}},
		{"switches the driver does not manage", sim.NVSwitches{Count: 4, Unmanaged: true}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := newRoot(t)
			fakeProc(t, root)
			require.NoError(t, sim.WriteNVSwitchFS(root, tc.board))

			res, err := devnodes.Sync(quiet, root)
			require.NoError(t, err)

			var fabric []string

			for _, n := range res.Nodes {
				if n.Major == sim.MajorNVSwitch || n.Major == sim.MajorNVLink || (n.Major == 507 && n.Minor == 0) {
					fabric = append(fabric, n.Path)
				}
			}

			assert.Equal(t, tc.want, fabric)

			if tc.want == nil {
				assert.NoFileExists(t, filepath.Join(root, "dev/nvidia-nvswitchctl"))

				return
			}

			assertNode(t, filepath.Join(root, "dev/nvidia-nvswitchctl"), sim.MajorNVSwitch, 255, 0o666)
			assertNode(t, filepath.Join(root, "dev/nvidia-nvswitch3"), sim.MajorNVSwitch, 3, 0o666)
			assertNode(t, filepath.Join(root, "dev/nvidia-nvlink"), sim.MajorNVLink, 0, 0o666)
			assertNode(t, filepath.Join(root, "dev/nvidia-caps/nvidia-cap0"), 507, 0, 0o400)

			link, err := os.Readlink(filepath.Join(root, fmt.Sprintf("dev/char/%d:255", sim.MajorNVSwitch)))
			require.NoError(t, err)
			assert.Equal(t, "../nvidia-nvswitchctl", link)

			// A second sync keeps the fabric-mgmt capability: it is not a stale MIG node.
			res, err = devnodes.Sync(quiet, root)
			require.NoError(t, err)
			assert.Empty(t, res.Removed)
			assert.Empty(t, res.Created)
		})
	}
}

func TestSyncNVSwitchErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, root string)
		want  string
	}{
		{"switches without a major", func(t *testing.T, root string) {
			write(t, root, "proc/driver/nvidia-nvswitch/devices/0000:c1:00.0/information", "BIOS Version: N/A\n")
			write(t, root, "proc/driver/nvidia-nvswitch/permissions", "DeviceFileMode: 438\n")
		}, "lists 1 NVSwitch(es) but"},
		{"fabric-mgmt minors disagree", func(t *testing.T, root string) {
			require.NoError(t, sim.WriteNVSwitchFS(root, sim.NVSwitches{Count: 2}))
			require.NoError(t, os.WriteFile(filepath.Join(root, "proc/driver/nvidia-caps/nvlink-minors"), []byte("fabric-mgmt 7\n"), 0o444))
		}, "fabric-mgmt: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := newRoot(t)
			fakeProc(t, root)
			tc.setup(t, root)

			// The GPUs' nodes are made; the NVSwitch problem is a warning, not a failure.
			var logs strings.Builder
			_, err := devnodes.Sync(slog.New(slog.NewTextHandler(&logs, nil)), root)
			require.NoError(t, err)
			assert.FileExists(t, filepath.Join(root, "dev/nvidia3"))
			assert.NoFileExists(t, filepath.Join(root, "dev/nvidia-nvswitchctl"))
			assert.Contains(t, logs.String(), "NVSwitch device nodes not made")
			assert.Contains(t, logs.String(), tc.want)

			_, err = devnodes.FabricNodes(root)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func assertOwner(t *testing.T, path string, uid, gid uint32) {
	t.Helper()

	var st unix.Stat_t
	require.NoError(t, unix.Lstat(path, &st), path)
	assert.Equal(t, [2]uint32{uid, gid}, [2]uint32{st.Uid, st.Gid}, "%s owner", path)
}

// TestSyncFollowsDriverDeviceFileParams: the nvidia nodes get the owner and mode of the
// module's NVreg_DeviceFileUID/GID/Mode, as /proc/driver/nvidia/params lists them (the mode
// in decimal: 432 is 0660), the UVM nodes nvidia-modprobe's defaults; with
// NVreg_ModifyDeviceFiles=0 nothing is created or changed, existing nodes only get their
// /dev/char links.
func TestSyncFollowsDriverDeviceFileParams(t *testing.T) {
	params := func(modify int) string {
		return fmt.Sprintf("ResmanDebugLevel: 4294967295\nRmLogonRC: 1\nModifyDeviceFiles: %d\nDeviceFileUID: 1000\nDeviceFileGID: 44\n"+
			"DeviceFileMode: 432\nInitializeSystemMemoryAllocations: 1\nRegistryDwords: \"\"\n", modify)
	}

	t.Run("owner and mode", func(t *testing.T) {
		root := newRoot(t)
		fakeProc(t, root)
		write(t, root, "proc/driver/nvidia/params", params(1))

		_, err := devnodes.Sync(quiet, root)
		require.NoError(t, err)

		for _, n := range []struct {
			path  string
			minor uint32
		}{{"dev/nvidiactl", 255}, {"dev/nvidia-modeset", 254}, {"dev/nvidia0", 0}, {"dev/nvidia3", 3}} {
			assertNode(t, filepath.Join(root, n.path), 195, n.minor, 0o660)
			assertOwner(t, filepath.Join(root, n.path), 1000, 44)
		}

		assertNode(t, filepath.Join(root, "dev/nvidia-uvm"), 506, 0, 0o666)
		assertOwner(t, filepath.Join(root, "dev/nvidia-uvm"), 0, 0)

		// A node made before with other attributes is corrected.
		require.NoError(t, unix.Chown(filepath.Join(root, "dev/nvidia0"), 0, 0))
		res, err := devnodes.Sync(quiet, root)
		require.NoError(t, err)
		assert.Equal(t, []string{"dev/nvidia0"}, res.Created)
		assertOwner(t, filepath.Join(root, "dev/nvidia0"), 1000, 44)
	})

	t.Run("ModifyDeviceFiles=0", func(t *testing.T) {
		root := newRoot(t)
		fakeProc(t, root)
		write(t, root, "proc/driver/nvidia/params", params(0))
		require.NoError(t, os.MkdirAll(filepath.Join(root, "dev"), 0o755))
		require.NoError(t, unix.Mknod(filepath.Join(root, "dev/nvidia0"), unix.S_IFCHR|0o600, int(unix.Mkdev(195, 0))))

		res, err := devnodes.Sync(quiet, root)
		require.NoError(t, err)

		assert.NotContains(t, res.Created, "dev/nvidia0")
		assertNode(t, filepath.Join(root, "dev/nvidia0"), 195, 0, 0o600)
		assert.NoFileExists(t, filepath.Join(root, "dev/nvidiactl"), "not created: the driver says to leave its nodes alone")
		assert.NoFileExists(t, filepath.Join(root, "dev/nvidia3"))

		link, err := os.Readlink(filepath.Join(root, "dev/char/195:0"))
		require.NoError(t, err)
		assert.Equal(t, "../nvidia0", link)
		assert.NoFileExists(t, filepath.Join(root, "dev/char/195:3"))

		assertNode(t, filepath.Join(root, "dev/nvidia-uvm"), 506, 0, 0o666)
	})
}

// TestSyncRemovesLeftoverTemporaries: a sync killed between mknod (or symlink) and rename
// leaves "<name>.tmp"; the next sync removes every one, also those of nodes it no longer
// makes, and leaves other files alone.
func TestSyncRemovesLeftoverTemporaries(t *testing.T) {
	root := newRoot(t)
	fakeProc(t, root)

	for _, d := range []string{"dev/nvidia-caps", "dev/char"} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, d), 0o755))
	}

	for _, n := range []struct {
		path         string
		major, minor uint32
	}{{"dev/nvidia0.tmp", 195, 0}, {"dev/nvidia7.tmp", 195, 7}, {"dev/nvidia-caps/nvidia-cap99.tmp", 507, 99}} {
		require.NoError(t, unix.Mknod(filepath.Join(root, n.path), unix.S_IFCHR|0o666, int(unix.Mkdev(n.major, n.minor))))
	}

	require.NoError(t, os.Symlink("../nvidia7", filepath.Join(root, "dev/char/195:7.tmp")))
	write(t, root, "dev/nvidia-notes.tmp", "not ours: a regular file")

	_, err := devnodes.Sync(quiet, root)
	require.NoError(t, err)

	for _, p := range []string{"dev/nvidia0.tmp", "dev/nvidia7.tmp", "dev/nvidia-caps/nvidia-cap99.tmp", "dev/char/195:7.tmp"} {
		_, err := os.Lstat(filepath.Join(root, p))
		assert.ErrorIs(t, err, os.ErrNotExist, p)
	}

	assert.FileExists(t, filepath.Join(root, "dev/nvidia-notes.tmp"))
	assertNode(t, filepath.Join(root, "dev/nvidia0"), 195, 0, 0o666)
}

// TestSyncRefusesSymlinkedDirectories: a link planted in place of dev/char or
// dev/nvidia-caps is not followed: the sync fails naming it, and nothing is made where it
// points.
func TestSyncRefusesSymlinkedDirectories(t *testing.T) {
	for _, dir := range []string{"dev/char", "dev/nvidia-caps"} {
		t.Run(dir, func(t *testing.T) {
			root := newRoot(t)
			fakeProc(t, root, [3]int{0, 1, 0})

			elsewhere := filepath.Join(root, "elsewhere")
			require.NoError(t, os.MkdirAll(elsewhere, 0o755))
			require.NoError(t, os.MkdirAll(filepath.Join(root, "dev"), 0o755))
			require.NoError(t, os.Symlink(elsewhere, filepath.Join(root, dir)))

			_, err := devnodes.Sync(quiet, root)
			require.Error(t, err)
			assert.Contains(t, err.Error(), filepath.Join(root, dir)+": it is a symbolic link")

			entries, err := os.ReadDir(elsewhere)
			require.NoError(t, err)
			assert.Empty(t, entries, "nothing made through the link")
		})
	}
}
