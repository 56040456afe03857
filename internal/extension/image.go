package extension

import (
	"io/fs"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/talos-nvidia/nvidia-driver/internal/ociimage"
)

// WriteImage writes the extension directory dir (manifest.yaml and rootfs/) as a one-layer
// container image with the files at /, where Talos's imager looks for them, into the image
// archive tarPath, tagged ref. Its platform is linux/<the rootfs's Architecture>. It returns
// the image's digest.
func WriteImage(dir, tarPath, ref string) (v1.Hash, error) {
	arch, err := Architecture(filepath.Join(dir, "rootfs"))
	if err != nil {
		return v1.Hash{}, err
	}

	return ociimage.WriteDirImage(dir, tarPath, ref, arch, v1.Config{})
}

// Sizes are the byte counts of an extension's regular files.
type Sizes struct {
	Total int64 `json:"total"`
	// Payload is NVIDIA's part: the subroot, kernel modules and firmware.
	Payload int64 `json:"payload"`
	// Service is the service binary alone.
	Service int64 `json:"service"`
}

// Own is what the project adds: everything but NVIDIA's payload.
func (s Sizes) Own() int64 { return s.Total - s.Payload }

// Measure adds up the sizes of an extension directory's files.
func Measure(dir string) (Sizes, error) {
	var s Sizes

	rootfs := filepath.Join(dir, "rootfs")
	payload := []string{SubrootPath, ModulesPath, "usr/lib/firmware"}
	service := filepath.Join(ContainersPath, ServiceName, "usr/bin", ServiceName)

	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}

		info, err := d.Info()
		if err != nil {
			return err
		}

		s.Total += info.Size()

		rel, _ := filepath.Rel(rootfs, path) //nolint:errcheck

		for _, p := range payload {
			if rel == p || strings.HasPrefix(rel, p+"/") {
				s.Payload += info.Size()
			}
		}

		if rel == service {
			s.Service = info.Size()
		}

		return nil
	})

	return s, err
}
