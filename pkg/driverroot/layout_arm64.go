package driverroot

import "debug/elf"

const (
	// LoaderPath is the glibc loader at aarch64's standard interpreter path, the one
	// NVIDIA's aarch64 (linux-sbsa) programs ask for.
	LoaderPath = "lib/ld-linux-aarch64.so.1"

	// loaderMachine is the ELF machine of a loader this service can run.
	loaderMachine = elf.EM_AARCH64
)
