// Command node sets up the state of a simulated NVML node (hack/sim-node/simnvml): the GPUs that the
// simulated libnvidia-ml reports, in a state directory, and the /proc and /sys files that a
// loaded driver would offer for them under a host root.
//
//	go run ./hack/sim-node/simnvml/node -dir /dev/.simnvml -host-root /run/nvidia/sim -gpus h100-80gb:8 \
//	    -nvswitches 4 -subroot _out/subroot-sim
//
// -nvswitches puts the GPUs on an HGX board's NVSwitch fabric (sim.WriteNVSwitchFS), already
// registered, as after a fabric manager ran. -subroot takes the driver version from the
// subroot's libnvidia-ml file name, as nvcdi finds the driver's other libraries by it.
// -show prints the state of an existing directory instead.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/talos-nvidia/nvidia-driver/hack/sim-node/simnvml/state"
	"github.com/talos-nvidia/nvidia-driver/internal/sim"
	"github.com/talos-nvidia/nvidia-driver/pkg/driverroot"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "simnvml node:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("node", flag.ContinueOnError)
	dir := fs.String("dir", "/dev/"+state.DirName, "the state directory")
	hostRoot := fs.String("host-root", "", "write the simulated /proc and /sys under this directory")
	gpus := fs.String("gpus", "h100-80gb:8", "MODEL:COUNT (models: pkg/gpu/models)")
	switches := fs.Int("nvswitches", 0, "NVSwitches on the board (4 on an HGX H100)")
	subroot := fs.String("subroot", "", "take the driver version from this subroot's libnvidia-ml")
	show := fs.Bool("show", false, "print the directory's state and exit")

	if err := fs.Parse(args); err != nil {
		return err
	}

	if *show {
		data, err := os.ReadFile(state.File(*dir))
		if err != nil {
			return err
		}

		_, err = stdout.Write(data)

		return err
	}

	n, err := sim.FromSpec(*gpus)
	if err != nil {
		return err
	}

	if *subroot != "" {
		v := driverroot.Check(*subroot).DriverVersion
		if v == "" {
			return fmt.Errorf("no driver version in %s's libnvidia-ml", *subroot)
		}

		n.DriverVersion = v
	}

	s := state.State{HostRoot: *hostRoot}

	if *switches > 0 {
		s.NVSwitches = &sim.NVSwitches{Count: *switches}
		n.SetFabric(sim.Fabric{Manager: func() bool { return true }})
	}

	s.Node = n.SaveState()

	if err := state.Create(*dir, s); err != nil {
		return err
	}

	if *hostRoot != "" {
		if ret := n.Init(); ret != nvml.SUCCESS {
			return fmt.Errorf("simulated NVML: %w", ret)
		}

		if err := state.WriteProcFS(s, n); err != nil {
			return err
		}
	}

	fmt.Fprintf(stdout, "simnvml: %s (driver %s%s) in %s\n", *gpus, n.DriverVersion, switchText(*switches), *dir)

	return nil
}

func switchText(n int) string {
	if n == 0 {
		return ""
	}

	return fmt.Sprintf(", %d NVSwitches, fabric registered", n)
}
