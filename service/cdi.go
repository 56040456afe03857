package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/talos-nvidia/nvidia-driver/pkg/atomicfile"
	"github.com/talos-nvidia/nvidia-driver/pkg/cdi"
	"github.com/talos-nvidia/nvidia-driver/pkg/config"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu"
)

// cdiGenerate is `nvidia-driver cdi generate`: the spec the service writes, on demand.
// Its flags also produce the spec the device plugin writes (another driver root and vendor),
// which the GPU end-to-end test compares.
func cdiGenerate(args []string, stdout, stderr io.Writer) int {
	cfg, err := config.Load(os.Environ())
	if err != nil {
		fmt.Fprintln(stderr, err)

		return 2
	}

	def := cdi.DefaultOptions(cfg.DriverMount())
	o := def

	fs := flag.NewFlagSet("cdi generate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	output := fs.String("output", "", "write the spec to this file, atomically (default: standard output)")
	fs.StringVar(&o.DriverRoot, "driver-root", def.DriverRoot, "driver root: NVML is loaded from it and the spec's host paths point into it")
	fs.StringVar(&o.DevRoot, "dev-root", cfg.HostRoot, "root of /dev")
	fs.StringVar(&o.Vendor, "vendor", def.Vendor, "CDI vendor")
	fs.StringVar(&o.Class, "class", def.Class, "CDI class")
	fs.StringVar(&o.HookPath, "hook-path", def.HookPath, "host path of nvidia-cdi-hook")
	fs.StringVar(&o.LdconfigPath, "ldconfig-path", def.LdconfigPath, "host path of the static ldconfig the update-ldcache hook runs (empty: the hook's default)")

	if err := fs.Parse(args); err != nil {
		return 2
	}

	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "cdi generate: unexpected argument %q\n", fs.Arg(0))

		return 2
	}

	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))

	s, err := cdi.Generate(log, gpu.FromSubroot(o.DriverRoot), o)
	if err != nil {
		fmt.Fprintln(stderr, "cdi generate:", err)

		return 1
	}

	data, err := cdi.Render(s)
	if err != nil {
		fmt.Fprintln(stderr, "cdi generate:", err)

		return 1
	}

	if *output == "" {
		if _, err := stdout.Write(data); err != nil {
			return 1
		}

		return 0
	}

	if _, err := atomicfile.Write(*output, data, 0o644); err != nil {
		fmt.Fprintln(stderr, "cdi generate:", err)

		return 1
	}

	return 0
}
