package extension

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// goArch names the ELF machines an extension can be built for as Go and OCI name them.
var goArch = map[elf.Machine]string{elf.EM_X86_64: "amd64", elf.EM_AARCH64: "arm64"}

// Architecture is the architecture of an extension's root filesystem, amd64 or arm64: its
// service binary's (the image's platform follows what is in it).
func Architecture(rootfs string) (string, error) {
	bin := filepath.Join(rootfs, ContainersPath, ServiceName, "usr/bin", ServiceName)

	f, err := elf.Open(bin)
	if err != nil {
		return "", fmt.Errorf("the service binary %s: %w", nodePath(rootfs, bin), err)
	}
	defer f.Close() //nolint:errcheck // read-only

	arch, ok := goArch[f.Machine]
	if !ok {
		return "", fmt.Errorf("the service binary %s is an %v program: want x86-64 or aarch64", nodePath(rootfs, bin), f.Machine)
	}

	return arch, nil
}

// checkOneArchitecture reports every ELF file of another machine than the service binary's:
// an extension assembled from an amd64 subroot and an arm64 service (or hook, or kernel
// modules) would load on a node and fail there. NVIDIA's GSP firmware is left alone: its
// files are ELF images for the GPU's own processor.
func checkOneArchitecture(rootfs string) []error {
	arch, err := Architecture(rootfs)
	if err != nil {
		return []error{err}
	}

	var errs []error

	firmware := filepath.Join(rootfs, FirmwarePath)

	err = filepath.WalkDir(rootfs, func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && path == firmware:
			return filepath.SkipDir
		case !d.Type().IsRegular():
			return nil
		}

		m, isELF, err := elfMachine(path)
		if err != nil {
			return err
		}

		if isELF && goArch[m] != arch {
			errs = append(errs, fmt.Errorf("%s: an %v file in an %s extension (its service binary's architecture)", nodePath(rootfs, path), m, arch))
		}

		return nil
	})
	if err != nil {
		errs = append(errs, err)
	}

	return errs
}

// elfMachine reads a file's ELF machine, if it is an ELF file.
func elfMachine(path string) (elf.Machine, bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false, err
	}
	defer f.Close() //nolint:errcheck // read-only

	magic := make([]byte, len(elf.ELFMAG))
	if _, err := io.ReadFull(f, magic); err != nil || !bytes.Equal(magic, []byte(elf.ELFMAG)) {
		return 0, false, nil //nolint:nilerr // shorter than a magic number: not ELF
	}

	ef, err := elf.NewFile(f)
	if err != nil {
		return 0, false, fmt.Errorf("%s: an ELF file that cannot be read: %w", path, errors.Unwrap(err))
	}

	return ef.Machine, true, nil
}
