// Package ociimage writes a directory as a reproducible one-layer container image, as an
// image archive (the extension image, internal/extension; the test nodes' images, hack/k8s-node)
// or as an OCI image layout (what the Talos test node's registry serves, hack/talos-node).
package ociimage

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/google/go-containerregistry/pkg/compression"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// refNameAnnotation names an image in an OCI image layout's index (image-spec
// annotations.md), as crane and skopeo read it.
const refNameAnnotation = "org.opencontainers.image.ref.name"

// epoch is every file's time in the image, so that the same files give the same digest.
var epoch = time.Unix(0, 0).UTC()

// WriteDirImage writes dir's files as a one-layer linux/<arch> container image (arch: a Go
// GOARCH, amd64 or arm64, as OCI's platform names it) with the files at /, its runtime config
// (entrypoint, environment) set to run, into the image archive tarPath
// (the format `crane push`, `ctr images import` and go-containerregistry's tarball package
// read), tagged ref. Files are sorted, owned by root, with fixed times, so the same files give
// the same digest, which it returns.
func WriteDirImage(dir, tarPath, ref, arch string, run v1.Config) (v1.Hash, error) {
	tag, err := name.NewTag(ref)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("image reference %q: %w", ref, err)
	}

	// Docker media types and a gzip layer: an image archive keeps no manifest, and whoever
	// reads it back (crane push, imager) rebuilds one with these types, so the digest stays
	// the same.
	img, err := dirImage(dir, arch, run)
	if err != nil {
		return v1.Hash{}, err
	}

	if err := os.MkdirAll(filepath.Dir(tarPath), 0o755); err != nil {
		return v1.Hash{}, err
	}

	tmp := tarPath + ".tmp"
	if err := tarball.WriteToFile(tmp, tag, img); err != nil {
		os.Remove(tmp) //nolint:errcheck

		return v1.Hash{}, fmt.Errorf("writing %s: %w", tarPath, err)
	}

	if err := os.Rename(tmp, tarPath); err != nil {
		return v1.Hash{}, err
	}

	return img.Digest()
}

// WriteDirLayout writes the image WriteDirImage would, with OCI media types and its layer
// compressed with zstd, as an OCI image layout at layoutPath (a directory, replaced whole),
// its one manifest named ref: what `crane push` sends to a registry as it is. For a node that
// pulls from a registry: containerd decompresses zstd faster than gzip (the Talos test node's
// emulated CPUs, hack/talos-node/registry.sh). It returns the image's digest.
func WriteDirLayout(dir, layoutPath, ref, arch string, run v1.Config) (v1.Hash, error) {
	if _, err := name.NewTag(ref); err != nil {
		return v1.Hash{}, fmt.Errorf("image reference %q: %w", ref, err)
	}

	img, err := dirImage(dir, arch, run,
		tarball.WithCompression(compression.ZStd), tarball.WithMediaType(types.OCILayerZStd))
	if err != nil {
		return v1.Hash{}, err
	}

	img = mutate.ConfigMediaType(mutate.MediaType(img, types.OCIManifestSchema1), types.OCIConfigJSON)

	tmp := layoutPath + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return v1.Hash{}, err
	}

	if err := writeLayout(tmp, ref, img); err != nil {
		os.RemoveAll(tmp) //nolint:errcheck

		return v1.Hash{}, fmt.Errorf("writing %s: %w", layoutPath, err)
	}

	if err := os.RemoveAll(layoutPath); err != nil {
		return v1.Hash{}, err
	}

	if err := os.Rename(tmp, layoutPath); err != nil {
		return v1.Hash{}, err
	}

	return img.Digest()
}

func writeLayout(path, ref string, img v1.Image) error {
	p, err := layout.Write(path, empty.Index)
	if err != nil {
		return err
	}

	return p.AppendImage(img, layout.WithAnnotations(map[string]string{refNameAnnotation: ref}))
}

// dirImage is dir's files as a one-layer linux/<arch> image that runs run, its layer made
// with layerOpts (gzip and Docker's media type without any).
func dirImage(dir, arch string, run v1.Config, layerOpts ...tarball.LayerOption) (v1.Image, error) {
	var layerTar bytes.Buffer
	if err := writeTar(&layerTar, dir); err != nil {
		return nil, err
	}

	data := layerTar.Bytes()

	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, append(layerOpts, tarball.WithCompressedCaching)...)
	if err != nil {
		return nil, fmt.Errorf("building the layer: %w", err)
	}

	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, fmt.Errorf("building the image: %w", err)
	}

	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}

	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", arch
	cfg.Created = v1.Time{Time: epoch}
	cfg.Config = run

	return mutate.ConfigFile(img, cfg)
}

// writeTar writes dir's files, sorted, owned by root, with fixed times.
func writeTar(w io.Writer, dir string) error {
	var paths []string

	err := filepath.WalkDir(dir, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}

		if path != dir {
			paths = append(paths, path)
		}

		return nil
	})
	if err != nil {
		return err
	}

	sort.Strings(paths)

	tw := tar.NewWriter(w)

	for _, p := range paths {
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}

		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}

		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}

		rel, _ := filepath.Rel(dir, p) //nolint:errcheck // under dir
		hdr.Name = filepath.ToSlash(rel)

		if info.IsDir() {
			hdr.Name += "/"
		}

		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		hdr.ModTime, hdr.AccessTime, hdr.ChangeTime = epoch, time.Time{}, time.Time{}
		hdr.Format = tar.FormatPAX

		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}

		if info.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}

			_, err = io.Copy(tw, f)
			f.Close() //nolint:errcheck

			if err != nil {
				return err
			}
		}
	}

	return tw.Close()
}
