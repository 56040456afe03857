// Package ociimage writes a directory as a reproducible one-layer container image archive:
// the extension image (pkg/extension) and the test node's images (hack/k8s-node).
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

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

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

	var layerTar bytes.Buffer
	if err := writeTar(&layerTar, dir); err != nil {
		return v1.Hash{}, err
	}

	data := layerTar.Bytes()

	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	})
	if err != nil {
		return v1.Hash{}, fmt.Errorf("building the layer: %w", err)
	}

	// Docker media types: an image archive keeps no manifest, and whoever reads it back
	// (crane push, imager) rebuilds one with these types, so the digest stays the same.
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("building the image: %w", err)
	}

	cfg, err := img.ConfigFile()
	if err != nil {
		return v1.Hash{}, err
	}

	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", arch
	cfg.Created = v1.Time{Time: epoch}
	cfg.Config = run

	if img, err = mutate.ConfigFile(img, cfg); err != nil {
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
