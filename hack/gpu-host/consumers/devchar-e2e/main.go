// Command devchar-e2e runs the GPU Operator validator's /dev/char step the way the validator
// runs it, with NVIDIA's own code: cmd/nvidia-validator/main.go createDevCharSymlinks in
// github.com/NVIDIA/gpu-operator v26.3.1 calls nvidia-container-toolkit v1.19.0's devchar
// package (the version its go.mod requires, and the one this module builds) with these
// options. The validator itself needs an API server; this step does not.
//
//	devchar-e2e --driver-root /run/nvidia/driver --dev-root /run/nvidia/driver --dev-char-path DIR [--before-v26.3]
//
// --before-v26.3: load the kernel modules whenever the dev root is the driver root, as the
// validator did before it learned to check /sys/module/nvidia/refcnt (read at
// v0.0.0-20250917190837-d73a0086a6ba, validator/main.go).
package main

import (
	"flag"
	"fmt"
	"os"

	devchar "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk/system/create-dev-char-symlinks"
)

func main() {
	driverRoot := flag.String("driver-root", "/run/nvidia/driver", "the driver install dir, as the validator's container sees it")
	devRoot := flag.String("dev-root", "/run/nvidia/driver", "the dev root the validator derived (the driver root when it has a dev/)")
	devCharPath := flag.String("dev-char-path", "/host-dev-char", "where the /dev/char links go")
	before := flag.Bool("before-v26.3", false, "skip the module-loaded check, as older validators do")
	flag.Parse()

	// v26.3.1: modules are loaded only when nvidia is not loaded yet and the validator can
	// chroot into the driver root (it is the dev root too).
	_, err := os.Stat("/sys/module/nvidia/refcnt")
	loaded := err == nil && !*before
	load := !loaded && *devRoot == *driverRoot
	fmt.Printf("module loaded: %t (check skipped: %t), load kernel modules: %t\n", err == nil, *before, load)

	creator, err := devchar.NewSymlinkCreator(
		devchar.WithDriverRoot(*driverRoot),
		devchar.WithDevRoot(*devRoot),
		devchar.WithDevCharPath(*devCharPath),
		devchar.WithCreateAll(true),
		devchar.WithCreateDeviceNodes(true),
		devchar.WithLoadKernelModules(load),
	)
	if err == nil {
		err = creator.CreateLinks()
	}

	if err != nil {
		fmt.Fprintln(os.Stderr, "devchar-e2e:", err)
		os.Exit(1)
	}

	entries, _ := os.ReadDir(*devCharPath)
	fmt.Printf("created %d links in %s\n", len(entries), *devCharPath)
}
