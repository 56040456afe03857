package ociimage_test

import (
	"archive/tar"
	"io"
	"os"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/pkg/ociimage"
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
