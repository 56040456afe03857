// Package driverroot checks a glibc subroot against what its consumers need, and mounts it
// read-only at /run/nvidia/driver, the path where the GPU Operator, its validator and the
// device plugin look for a driver by default.
package driverroot

import "path/filepath"

// Paths inside a subroot. The layout is the same whether the subroot comes from NVIDIA's
// installer (pkg.yaml), from Debian's packages or from an installed driver tree
// (hack/dev/build-subroot.sh), and on every architecture but for the glibc loader, which sits
// at the architecture's standard interpreter path (LoaderPath, layout_<arch>.go).
const (
	// LibDir holds glibc and the NVIDIA libraries. Every consumer searches it; /usr/lib is
	// in none of their lists.
	LibDir = "usr/lib64"
	// BinDir holds nvidia-smi, nvidia-persistenced and NVIDIA's other tools.
	BinDir = "usr/bin"
	// LdconfigPath is a static ldconfig.
	LdconfigPath = "sbin/ldconfig"
	// LdCachePath is the cache that nvcdi reads to find the driver's libraries.
	LdCachePath = "etc/ld.so.cache"
	// PersistencedSocketDir is an empty directory on which the daemon's socket directory is
	// bind-mounted, because nvcdi looks for the socket under the driver root.
	PersistencedSocketDir = "run/nvidia-persistenced"
	// DevDir is an empty directory on which the service binds the host's /dev, so that the
	// mounted driver root looks like a driver container's root to NVIDIA's consumers (see
	// BindDev and docs/driver-root.md).
	DevDir = "dev"
)

// Command returns the argv that runs a subroot program with the subroot's own loader and
// libraries, whatever loader and libc the caller's root filesystem has.
func Command(root, program string, args ...string) []string {
	argv := []string{
		filepath.Join(root, LoaderPath),
		"--library-path", filepath.Join(root, LibDir),
		filepath.Join(root, BinDir, program),
	}

	return append(argv, args...)
}
