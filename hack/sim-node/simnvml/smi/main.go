// Command smi stands in for nvidia-smi in the simulated node's subroot (hack/sim-node/simnvml/build.sh
// installs it as usr/bin/nvidia-smi): NVIDIA's nvidia-smi refuses the simulated
// libnvidia-ml (it needs NVML's internal export tables, which no public header describes),
// so the GPU Operator's validator, which runs the driver root's nvidia-smi, could never pass
// its driver check there. It does what that check needs: initializes NVML from the driver
// root's library and lists the GPUs as `nvidia-smi -L` does, exiting non-zero when NVML fails
// or finds no GPU. It is not NVIDIA's program and answers no other option.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "nvidia-smi (simnvml stand-in):", err)
		os.Exit(1)
	}
}

// library is the driver root's NVML beside this program (ROOT/usr/bin/nvidia-smi,
// ROOT/usr/lib64/libnvidia-ml.so.1), as NVIDIA's nvidia-smi finds its own; the soname where
// there is none (the library already preloaded, as the validator does).
func library() string {
	exe, err := os.Executable()
	if err == nil {
		lib := filepath.Join(filepath.Dir(exe), "..", "lib64", "libnvidia-ml.so.1")
		if _, err := os.Stat(lib); err == nil {
			return lib
		}
	}

	return "libnvidia-ml.so.1"
}

func run(args []string, stdout io.Writer) error {
	lib := nvml.New(nvml.WithLibraryPath(library()))
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return fmt.Errorf("initializing NVML: %w", ret)
	}
	defer lib.Shutdown() //nolint:errcheck // a listing

	driver, ret := lib.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("driver version: %w", ret)
	}

	if len(args) > 0 && args[0] == "--version" {
		fmt.Fprintf(stdout, "nvidia-smi stand-in (hack/sim-node/simnvml/smi)\nDRIVER version : %s\n", driver)

		return nil
	}

	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("device count: %w", ret)
	}

	if n == 0 {
		return errors.New("no GPU found")
	}

	fmt.Fprintf(stdout, "simulated NVML, driver %s (nvidia-smi stand-in, hack/sim-node/simnvml/smi)\n", driver)

	for i := range n {
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("GPU %d: %w", i, ret)
		}

		name, _ := dev.GetName()
		uuid, _ := dev.GetUUID()
		fmt.Fprintf(stdout, "GPU %d: %s (UUID: %s)\n", i, name, uuid)
	}

	return nil
}
