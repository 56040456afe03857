// Command migls lists the MIG devices that an NVML library reports, as NVIDIA's programs see
// them through go-nvml and go-nvlib (the device plugin's own libraries): one line per MIG
// device, "UUID PROFILE PARENT-MINOR GI CI". The simulated node's checks
// (hack/sim-node/test-sim-mig.sh) compare what the device plugin advertises, and the
// device nodes each pod gets, with it.
//
//	migls -lib /run/nvidia/driver/usr/lib64/libnvidia-ml.so.1
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "migls:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("migls", flag.ContinueOnError)
	lib := fs.String("lib", "libnvidia-ml.so.1", "the NVML library to load")

	if err := fs.Parse(args); err != nil {
		return err
	}

	nvmllib := nvml.New(nvml.WithLibraryPath(*lib))
	if ret := nvmllib.Init(); ret != nvml.SUCCESS {
		return fmt.Errorf("initializing NVML from %s: %w", *lib, ret)
	}
	defer nvmllib.Shutdown() //nolint:errcheck // a listing

	devicelib := device.New(nvmllib)

	return devicelib.VisitMigDevices(func(_ int, d device.Device, _ int, m device.MigDevice) error {
		minor, ret := d.GetMinorNumber()
		if ret != nvml.SUCCESS {
			return fmt.Errorf("parent minor: %w", ret)
		}

		uuid, ret := m.GetUUID()
		if ret != nvml.SUCCESS {
			return fmt.Errorf("MIG UUID: %w", ret)
		}

		gi, ret := m.GetGpuInstanceId()
		if ret != nvml.SUCCESS {
			return fmt.Errorf("%s: GPU instance id: %w", uuid, ret)
		}

		ci, ret := m.GetComputeInstanceId()
		if ret != nvml.SUCCESS {
			return fmt.Errorf("%s: compute instance id: %w", uuid, ret)
		}

		p, err := m.GetProfile()
		if err != nil {
			return fmt.Errorf("%s: profile: %w", uuid, err)
		}

		if p == nil {
			return errors.New(uuid + ": no profile")
		}

		_, err = fmt.Fprintf(stdout, "%s %s %d %d %d\n", uuid, p.String(), minor, gi, ci)

		return err
	})
}
