package driverroot

import "debug/elf"

const (
	// LoaderPath is the glibc loader at x86-64's standard interpreter path, the one
	// NVIDIA's x86_64 programs ask for.
	LoaderPath = "lib64/ld-linux-x86-64.so.2"

	// loaderMachine is the ELF machine of a loader this service can run.
	loaderMachine = elf.EM_X86_64
)
