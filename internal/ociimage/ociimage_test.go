package ociimage_test

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/internal/ociimage"
)

func TestWriteDirImage(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "usr/bin"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "usr/bin/tool"), []byte("#!/bin/sh\n"), 0o755))
	require.NoError(t, os.Symlink("usr/bin/tool", filepath.Join(dir, "tool")))

	run := v1.Config{Entrypoint: []string{"/usr/bin/tool"}, Env: []string{"PATH=/usr/bin"}}
	tests := []struct {
		name, ref string
		wantErr   bool
	}{
		{name: "tagged", ref: "example.com/test/tool:v1"},
		{name: "bad reference", ref: "Not A Ref", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "image.tar")
			digest, err := ociimage.WriteDirImage(dir, out, tt.ref, "arm64", run)
			if tt.wantErr {
				require.Error(t, err)
				assert.NoFileExists(t, out)

				return
			}
			require.NoError(t, err)

			img, err := tarball.ImageFromPath(out, nil)
			require.NoError(t, err)
			got, err := img.Digest()
			require.NoError(t, err)
			assert.Equal(t, digest, got, "the digest returned is the archive's")

			cfg, err := img.ConfigFile()
			require.NoError(t, err)
			assert.Equal(t, run.Entrypoint, cfg.Config.Entrypoint)
			assert.Equal(t, run.Env, cfg.Config.Env)
			assert.Equal(t, "linux", cfg.OS)
			assert.Equal(t, "arm64", cfg.Architecture)

			layers, err := img.Layers()
			require.NoError(t, err)
			require.Len(t, layers, 1)
			rc, err := layers[0].Uncompressed()
			require.NoError(t, err)
			defer rc.Close()
			files := map[string]*tar.Header{}
			tr := tar.NewReader(rc)
			for {
				h, err := tr.Next()
				if err == io.EOF {
					break
				}
				require.NoError(t, err)
				files[h.Name] = h
			}
			require.Contains(t, files, "usr/bin/tool")
			assert.Equal(t, int64(0o755), files["usr/bin/tool"].Mode&0o777)
			assert.Equal(t, 0, files["usr/bin/tool"].Uid)
			require.Contains(t, files, "tool")
			assert.Equal(t, "usr/bin/tool", files["tool"].Linkname)

			// The same files give the same image.
			again, err := ociimage.WriteDirImage(dir, filepath.Join(t.TempDir(), "again.tar"), tt.ref, "arm64", run)
			require.NoError(t, err)
			assert.Equal(t, digest, again)
		})
	}
}

// The layout is what a registry gets from crane push: the same files, OCI media types, a zstd
// layer whose diff ID is its uncompressed tar's (containerd checks it after unpacking), and
// the manifest named by the reference.
func TestWriteDirLayout(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "usr/bin"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "usr/bin/tool"), []byte("#!/bin/sh\n"), 0o755))
	run := v1.Config{Entrypoint: []string{"/usr/bin/tool"}}
	ref := "example.com/test/tool:v1"

	out := filepath.Join(t.TempDir(), "tool.oci")
	require.NoError(t, os.MkdirAll(filepath.Join(out, "stale"), 0o755))
	digest, err := ociimage.WriteDirLayout(dir, out, ref, "amd64", run)
	require.NoError(t, err)
	assert.NoDirExists(t, filepath.Join(out, "stale"), "the layout is replaced whole")

	idx, err := layout.ImageIndexFromPath(out)
	require.NoError(t, err)
	m, err := idx.IndexManifest()
	require.NoError(t, err)
	require.Len(t, m.Manifests, 1)
	assert.Equal(t, digest, m.Manifests[0].Digest)
	assert.Equal(t, ref, m.Manifests[0].Annotations["org.opencontainers.image.ref.name"])
	assert.Equal(t, types.OCIManifestSchema1, m.Manifests[0].MediaType)

	img, err := idx.Image(digest)
	require.NoError(t, err)
	layers, err := img.Layers()
	require.NoError(t, err)
	require.Len(t, layers, 1)
	mt, err := layers[0].MediaType()
	require.NoError(t, err)
	assert.Equal(t, types.OCILayerZStd, mt)

	rc, err := layers[0].Compressed()
	require.NoError(t, err)
	head := make([]byte, 4)
	_, err = io.ReadFull(rc, head)
	require.NoError(t, err)
	require.NoError(t, rc.Close())
	assert.Equal(t, []byte{0x28, 0xb5, 0x2f, 0xfd}, head, "the blob is zstd (RFC 8878 magic number)")

	urc, err := layers[0].Uncompressed()
	require.NoError(t, err)
	tarBytes, err := io.ReadAll(urc)
	require.NoError(t, err)
	require.NoError(t, urc.Close())
	diffID, err := layers[0].DiffID()
	require.NoError(t, err)
	want, _, err := v1.SHA256(bytes.NewReader(tarBytes))
	require.NoError(t, err)
	assert.Equal(t, want, diffID)
	cfg, err := img.ConfigFile()
	require.NoError(t, err)
	assert.Equal(t, []v1.Hash{want}, cfg.RootFS.DiffIDs)
	assert.Equal(t, run.Entrypoint, cfg.Config.Entrypoint)

	// The same files, the same image, in either form.
	again, err := ociimage.WriteDirLayout(dir, out, ref, "amd64", run)
	require.NoError(t, err)
	assert.Equal(t, digest, again)

	_, err = ociimage.WriteDirLayout(dir, filepath.Join(t.TempDir(), "bad"), "Not A Ref", "amd64", run)
	require.Error(t, err)
}
