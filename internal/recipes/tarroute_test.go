package recipes_test

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/blang/semver/v4"
	"github.com/siderolabs/talos/pkg/machinery/extensions"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/talos-nvidia/nvidia-driver/internal/extension"
	"github.com/talos-nvidia/nvidia-driver/internal/recipes"
)

// finalOutput lays out what a package's finalize copies (bldr convert/node.go finalize:
// each From copied to To of an empty tree, a directory's contents into To): the files that
// `docker buildx build --output type=tar` writes for the final stage.
func finalOutput(t *testing.T, root string, p *recipes.Pkg) string {
	t.Helper()

	out := filepath.Join(t.TempDir(), "output")
	require.NoError(t, os.MkdirAll(out, 0o755))

	for _, f := range p.Finalize {
		src, dst := filepath.Join(root, f.From), filepath.Join(out, f.To)
		require.NoError(t, os.MkdirAll(dst, 0o755))

		if st, err := os.Stat(src); err == nil && st.IsDir() {
			run(t, "", "cp", "-a", src+"/.", dst)
		} else {
			run(t, "", "cp", "-a", src, dst)
		}
	}

	return out
}

// imagerUntar extracts a tar as Talos's imager extracts a systemExtensions tarballPath
// (talos v1.13.9 pkg/imager/profile/input.go ContainerAsset.Extract, pkg/archiver/untar.go
// Untar): directories made one by one (no parents), symbolic links as they are, files
// created exclusively with their mode.
func imagerUntar(t *testing.T, archive, dst string) {
	t.Helper()

	f, err := os.Open(archive)
	require.NoError(t, err)

	defer f.Close() //nolint:errcheck

	tr := tar.NewReader(f)

	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}

		require.NoError(t, err)

		path := filepath.Join(dst, filepath.Clean("/"+hdr.Name))

		switch hdr.Typeflag {
		case tar.TypeDir:
			mode := hdr.FileInfo().Mode()&os.ModePerm | 0o700
			if err := os.Mkdir(path, mode); err != nil && !os.IsExist(err) {
				require.NoError(t, err)
			}

			require.NoError(t, os.Chmod(path, mode))
		case tar.TypeSymlink:
			require.NoError(t, os.Symlink(hdr.Linkname, path))
		default:
			fp, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_EXCL, hdr.FileInfo().Mode())
			require.NoError(t, err)

			_, err = io.Copy(fp, tr) //nolint:gosec // the test's own archive
			require.NoError(t, err)
			require.NoError(t, fp.Close())
		}
	}
}

// tarRoute checks docs/extension.md's no-registry route on a flavor's final stage: its
// type=tar output, extracted as the imager does, is an extension that Talos's
// extensions.Load takes and Validate (constraints and contents, as the imager's Builder
// validates, pkg/imager/extensions/extensions.go) accepts for the release; an image
// archive (type=docker) of the same files is refused with Load's "unexpected file".
func tarRoute(t *testing.T, root string, p *recipes.Pkg, talos string) {
	t.Helper()

	out := finalOutput(t, root, p)

	entries, err := os.ReadDir(out)
	require.NoError(t, err)

	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}

	assert.Equal(t, []string{"manifest.yaml", "rootfs"}, names, "the final stage's output")

	archive := filepath.Join(t.TempDir(), p.Name+".tar")
	run(t, "", "tar", "-C", out, "-cf", archive, "manifest.yaml", "rootfs")

	v, err := semver.ParseTolerant(talos)
	require.NoError(t, err)

	ext := filepath.Join(t.TempDir(), "extensions", "0")
	require.NoError(t, os.MkdirAll(ext, 0o755))
	imagerUntar(t, archive, ext)

	loaded, err := extensions.Load(ext)
	require.NoError(t, err, "Talos's extensions.Load of the type=tar output")
	assert.Equal(t, p.Name, loaded.Manifest.Metadata.Name)
	require.NoError(t, loaded.Validate(extensions.WithValidateConstraints(), extensions.WithValidateContents(), extensions.WithTalosVersion(&v)))

	image := filepath.Join(t.TempDir(), "image.tar")
	_, err = extension.WriteImage(out, image, "talos-nvidia/"+p.Name+":test")
	require.NoError(t, err)

	bad := filepath.Join(t.TempDir(), "extensions", "0")
	require.NoError(t, os.MkdirAll(bad, 0o755))
	imagerUntar(t, image, bad)

	_, err = extensions.Load(bad)
	require.Error(t, err)
	assert.True(t, strings.Contains(err.Error(), "unexpected file"), "%v", err)
}
