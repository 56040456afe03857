package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/blang/semver/v4"
	"github.com/siderolabs/talos/pkg/machinery/extensions"
	"github.com/siderolabs/talos/pkg/machinery/gendata"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"
)

// TestGeneratedFilesAreCurrent re-renders every flavor and compares with the files in the
// repository: edit the templates or the release table, then run go run ./hack/gen-flavors.
func TestGeneratedFilesAreCurrent(t *testing.T) {
	files, err := Render(CurrentRelease(), Flavors())
	require.NoError(t, err)
	require.Len(t, files, 3*len(Flavors())+3)

	for rel, want := range files {
		got, err := os.ReadFile(filepath.Join("..", "..", rel))
		require.NoError(t, err, "%s missing: run go run ./hack/gen-flavors", rel)
		assert.Equal(t, string(want), string(got), "%s is stale: run go run ./hack/gen-flavors", rel)
	}
}

// TestManifestsPinTheRelease: each manifest is what Talos loads, names one exact release
// (the machinery module's), and its flavor's driver version.
func TestManifestsPinTheRelease(t *testing.T) {
	files, err := Render(CurrentRelease(), Flavors())
	require.NoError(t, err)

	assert.Equal(t, "v1.13.5", gendata.VersionTag, "go.mod pins machinery v1.13.5")

	names := map[string]bool{}

	for _, f := range Flavors() {
		var m extensions.Manifest
		require.NoError(t, yaml.Unmarshal(files[filepath.Join("flavors", f.Name, "manifest.yaml")], &m))

		assert.Equal(t, "v1alpha1", m.Version)
		assert.Equal(t, f.Name, m.Metadata.Name)
		assert.Equal(t, f.DriverVersion+"-"+gendata.VersionTag, m.Metadata.Version)
		assert.Equal(t, "= "+gendata.VersionTag, m.Metadata.Compatibility.Talos.Version)
		names[f.Name] = true

		ext := extensions.New(t.TempDir(), f.Name, m)

		for v, ok := range map[string]bool{"1.13.5": true, "1.13.4": false, "1.13.6": false, "1.14.0": false} {
			sv := semver.MustParse(v)
			err := ext.Validate(extensions.WithValidateConstraints(), extensions.WithTalosVersion(&sv))
			assert.Equal(t, ok, err == nil, "%s on Talos %s: %v", f.Name, v, err)
		}

		var vars map[string]string
		require.NoError(t, yaml.Unmarshal(files[filepath.Join("flavors", f.Name, "vars.yaml")], &vars))
		assert.Equal(t, f.DriverVersion, vars["NVIDIA_DRIVER_VERSION"])
		assert.Equal(t, gendata.VersionPkgs, vars["PKGS_VERSION"])

		var pkg map[string]any
		require.NoError(t, yaml.Unmarshal(files[filepath.Join("flavors", f.Name, "pkg.yaml")], &pkg), "pkg.yaml is YAML")
		assert.Equal(t, f.Name, pkg["name"])
	}

	assert.Len(t, names, 4)
	assert.Equal(t, files["manifest.yaml"], files[filepath.Join("flavors", Flavors()[0].Name, "manifest.yaml")], "top-level files are the default flavor's")
}
