package nvswitch_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/internal/sim"
	"github.com/talos-nvidia/nvidia-driver/pkg/nvswitch"
)

func write(t *testing.T, root, rel, content string) {
	t.Helper()

	p := filepath.Join(root, rel)
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(t, os.WriteFile(p, []byte(content), 0o444))
}

// pciDevice writes a sysfs PCI function with the attributes go-nvlib reads.
func pciDevice(t *testing.T, root, bus, vendor, class string) {
	t.Helper()
	write(t, root, "sys/bus/pci/devices/"+bus+"/vendor", vendor+"\n")
	write(t, root, "sys/bus/pci/devices/"+bus+"/class", class+"\n")
}

func TestDetect(t *testing.T) {
	hgx := []string{"0000:c1:00.0", "0000:c2:00.0", "0000:c3:00.0", "0000:c4:00.0"}

	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, root string)
		want  nvswitch.Board
	}{
		{"no sysfs, no driver", func(*testing.T, string) {}, nvswitch.Board{}},
		{"GPUs, a NIC and a non-NVIDIA bridge only", func(t *testing.T, root string) {
			pciDevice(t, root, "0000:0f:00.0", "0x10de", "0x030200") // a 3D controller: a GPU
			pciDevice(t, root, "0000:20:00.0", "0x15b3", "0x020000") // a Mellanox NIC
			pciDevice(t, root, "0000:30:00.0", "0x8086", "0x068000") // someone else's bridge
		}, nvswitch.Board{}},
		{"HGX board with four managed switches", func(t *testing.T, root string) {
			write(t, root, "proc/devices", "Character devices:\n\nBlock devices:\n")
			require.NoError(t, sim.WriteNVSwitchFS(root, sim.NVSwitches{Count: 4}))
		}, nvswitch.Board{PCI: hgx, Driver: hgx, Arch: nvswitch.ArchHopper}},
		{"HGX A100 board: NVSwitch gen 2", func(t *testing.T, root string) {
			write(t, root, "proc/devices", "Character devices:\n\nBlock devices:\n")
			require.NoError(t, sim.WriteNVSwitchFS(root, sim.NVSwitches{Count: 4, DeviceID: 0x1af1}))
		}, nvswitch.Board{PCI: hgx, Driver: hgx, Arch: nvswitch.ArchAmpere}},
		{"a switch device id this build does not know", func(t *testing.T, root string) {
			write(t, root, "proc/devices", "Character devices:\n\nBlock devices:\n")
			require.NoError(t, sim.WriteNVSwitchFS(root, sim.NVSwitches{Count: 4, DeviceID: 0x2901}))
		}, nvswitch.Board{PCI: hgx, Driver: hgx, Arch: nvswitch.ArchUnknown}},
		{"switches the driver does not manage", func(t *testing.T, root string) {
			write(t, root, "proc/devices", "Character devices:\n\nBlock devices:\n")
			require.NoError(t, sim.WriteNVSwitchFS(root, sim.NVSwitches{Count: 4, Unmanaged: true}))
		}, nvswitch.Board{PCI: hgx, Arch: nvswitch.ArchHopper}},
		{"NVLink 5 board: a CX7 bridge with SW_MNG in its VPD", func(t *testing.T, root string) {
			write(t, root, "sys/class/infiniband/mlx5_0/device/vpd", "\x82\x10ConnectX-7\x90SMDL SW_MNG\x78")
			write(t, root, "sys/class/infiniband/mlx5_1/device/vpd", "\x82\x10ConnectX-7 NIC\x78")
		}, nvswitch.Board{NVLink5: []string{"mlx5_0"}, Arch: nvswitch.ArchBlackwell}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			tc.setup(t, root)

			got, err := nvswitch.Detect(root)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.want.HasNVSwitch(), got.HasNVSwitch())
			assert.Equal(t, tc.want.Arch == nvswitch.ArchAmpere, got.PreHopper())
		})
	}
}

func TestDetectBadClass(t *testing.T) {
	root := t.TempDir()
	pciDevice(t, root, "0000:c1:00.0", "0x10de", "bridge")

	_, err := nvswitch.Detect(root)
	require.ErrorContains(t, err, "PCI device 0000:c1:00.0")
}
