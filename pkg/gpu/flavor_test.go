package gpu_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/pkg/gpu"
)

const (
	proprietaryVersion = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue Sep 23 09:11:00 UTC 2025\nGCC version:  gcc\n"
	openVersion        = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build\nGCC version:  gcc\n"
)

type pciDev struct {
	addr, vendor, device, class, driver string
}

func TestCheckDriven(t *testing.T) {
	blackwell := pciDev{"0000:17:00.0", "0x10de", "0x2901", "0x030200", ""}

	for _, tc := range []struct {
		name     string
		version  string
		devs     []pciDev
		procGPUs []string   // entries of /proc/driver/nvidia/gpus
		want     gpu.Flavor // the flavor the GPUs need; "" for no error
		count    int
	}{
		{name: "proprietary module refused a Blackwell GPU", version: proprietaryVersion, devs: []pciDev{blackwell}, want: gpu.FlavorOpen, count: 1},
		{name: "open module refused a Volta GPU", version: openVersion,
			devs: []pciDev{{"0000:3b:00.0", "0x10de", "0x1db4", "0x030200", ""}, {"0000:3c:00.0", "0x10de", "0x1db4", "0x030000", ""}},
			want: gpu.FlavorProprietary, count: 2},
		{name: "the module drives a GPU", version: proprietaryVersion, devs: []pciDev{blackwell}, procGPUs: []string{"0000:18:00.0"}},
		{name: "a GPU bound to vfio-pci is not the module's", version: proprietaryVersion,
			devs: []pciDev{{"0000:17:00.0", "0x10de", "0x2901", "0x030200", "vfio-pci"}}},
		{name: "an NVSwitch and an audio function are not GPUs", version: proprietaryVersion,
			devs: []pciDev{{"0000:05:00.0", "0x10de", "0x22a3", "0x068000", ""}, {"0000:17:00.1", "0x10de", "0x22ba", "0x040300", ""}}},
		{name: "another vendor's GPU", version: proprietaryVersion, devs: []pciDev{{"0000:03:00.0", "0x1002", "0x740f", "0x030200", ""}}},
		{name: "no PCI devices at all", version: proprietaryVersion},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			write := func(rel, content string) {
				p := filepath.Join(root, rel)
				require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
				require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
			}

			write("proc/driver/nvidia/version", tc.version)

			for _, g := range tc.procGPUs {
				write("proc/driver/nvidia/gpus/"+g+"/information", "Device Minor: \t 0\n")
			}

			for _, d := range tc.devs {
				dir := "sys/bus/pci/devices/" + d.addr + "/"
				write(dir+"vendor", d.vendor+"\n")
				write(dir+"device", d.device+"\n")
				write(dir+"class", d.class+"\n")

				if d.driver != "" {
					drv := filepath.Join(root, "sys/bus/pci/drivers", d.driver)
					require.NoError(t, os.MkdirAll(drv, 0o755))
					require.NoError(t, os.Symlink(drv, filepath.Join(root, dir, "driver")))
				}
			}

			err := gpu.CheckDriven(root)
			if tc.want == "" {
				require.NoError(t, err)

				return
			}

			var undriven *gpu.UndrivenError
			require.True(t, errors.As(err, &undriven), "%v", err)
			assert.Equal(t, tc.want, undriven.Need())
			assert.Len(t, undriven.GPUs, tc.count)
			assert.Contains(t, err.Error(), "Install the extension's "+string(tc.want)+" flavor")
		})
	}
}

// TestUnresettable: a GPU whose PCI function has no sysfs reset is named; NVSwitches and
// other vendors' devices are not GPUs here.
func TestUnresettable(t *testing.T) {
	root := t.TempDir()

	for _, d := range []struct {
		addr, vendor, class string
		reset               bool
	}{
		{"0000:07:00.0", "0x10de", "0x030200", true},
		{"0000:0f:00.0", "0x10de", "0x030200", false},
		{"0000:c1:00.0", "0x10de", "0x068000", false},
		{"0000:03:00.0", "0x1002", "0x030200", false},
	} {
		dir := filepath.Join(root, "sys/bus/pci/devices", d.addr)
		require.NoError(t, os.MkdirAll(dir, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "vendor"), []byte(d.vendor+"\n"), 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "class"), []byte(d.class+"\n"), 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "device"), []byte("0x20b2\n"), 0o644))

		if d.reset {
			require.NoError(t, os.WriteFile(filepath.Join(dir, "reset"), nil, 0o200))
		}
	}

	got, err := gpu.Unresettable(root)
	require.NoError(t, err)
	assert.Equal(t, []string{"0000:0f:00.0"}, got)

	got, err = gpu.Unresettable(t.TempDir())
	require.NoError(t, err)
	assert.Empty(t, got, "no PCI devices: nothing to say")
}

func TestLoadedFlavor(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, "proc/driver/nvidia/version")
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))

	for _, tc := range []struct {
		content string
		want    gpu.Flavor
		err     string
	}{
		{proprietaryVersion, gpu.FlavorProprietary, ""},
		{openVersion, gpu.FlavorOpen, ""},
		{"garbage\n", "", `no "NVRM version:" line`},
	} {
		require.NoError(t, os.WriteFile(p, []byte(tc.content), 0o644))

		got, _, err := gpu.LoadedFlavor(root)
		if tc.err != "" {
			assert.ErrorContains(t, err, tc.err)

			continue
		}

		require.NoError(t, err)
		assert.Equal(t, tc.want, got)
	}
}
