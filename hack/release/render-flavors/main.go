// Command render-flavors writes, for every platform of the release flavors (linux/amd64,
// linux/arm64), every Talos release of the recipes and every flavor, the extension tree a
// release build would produce around that flavor's manifest: the manifest.yaml exactly as
// bldr renders it from the recipe tree (internal/recipes, with --platform=<platform> and
// --build-arg TALOS_VERSION=<release>), and a rootfs/ that make build's outputs make (the
// Debian subroot as payload, the service, the hook, ldconfig; no kernel modules). That rootfs
// is this machine's (amd64) for every platform: siderolabs' validator reads the manifest and
// the tree's paths, not the programs' architecture. It is the input of
// hack/release/siderolabs-validator.sh, which runs siderolabs' own validator on it.
//
//	go run ./hack/release/render-flavors -out _out -dir DIR    # DIR/<os>-<arch>/<release>/<flavor>/{manifest.yaml,rootfs/}
//
// Each tree is a line on stdout: directory, flavor, release, constraint, platform.
package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/talos-nvidia/nvidia-driver/internal/recipes"
	"github.com/talos-nvidia/nvidia-driver/pkg/extension"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("render-flavors", flag.ContinueOnError)
	fs.SetOutput(stderr)

	root := fs.String("root", ".", "repository root")
	out := fs.String("out", "_out", "make build's output directory")
	dir := fs.String("dir", "", "where to write <release>/<flavor>/")

	if err := fs.Parse(args); err != nil {
		return 2
	}

	if *dir == "" {
		fmt.Fprintln(stderr, "render-flavors: -dir is required")

		return 2
	}

	if err := render(slog.New(slog.NewTextHandler(stderr, nil)), *root, *out, *dir, stdout); err != nil {
		fmt.Fprintln(stderr, "render-flavors:", err)

		return 1
	}

	return 0
}

func render(log *slog.Logger, root, out, dir string, stdout io.Writer) error {
	releases, _, err := recipes.LoadReleases(filepath.Join(root, "hack", "release", "gen-flavors", "releases"))
	if err != nil {
		return err
	}

	for _, a := range recipes.Arches() {
		for _, r := range releases {
			if err := renderRelease(log, root, out, dir, a, r, stdout); err != nil {
				return err
			}
		}
	}

	return nil
}

// renderRelease writes the trees of one release's flavors for one platform.
func renderRelease(log *slog.Logger, root, out, dir string, a recipes.Arch, r recipes.Release, stdout io.Writer) error {
	tr, err := recipes.Load(root, recipes.Options{Platform: a.Platform, BuildArgs: map[string]string{"TALOS_VERSION": r.Talos}})
	if err != nil {
		return fmt.Errorf("loading the recipes for %s %s: %w", a.Platform, r.Talos, err)
	}

	for _, f := range recipes.Flavors() {
		p := tr.Pkg(f.Name)
		if p == nil {
			return fmt.Errorf("%s %s: no package %s", a.Platform, r.Talos, f.Name)
		}

		raw := p.Templates["manifest.yaml"]

		var m extension.Manifest
		if err := yaml.Unmarshal(raw, &m); err != nil {
			return fmt.Errorf("%s %s %s manifest.yaml: %w", a.Platform, r.Talos, f.Name, err)
		}

		res, err := extension.Assemble(log, extension.Options{
			Name: m.Metadata.Name, Version: m.Metadata.Version, TalosVersion: r.Talos,
			TalosConstraint: m.Metadata.Compatibility.Talos.Version, Author: m.Metadata.Author, Description: m.Metadata.Description,
			Payload:           filepath.Join(out, "subroot-debian"),
			ServiceRootfs:     filepath.Join(out, "containers", extension.ServiceName),
			ServiceSpec:       filepath.Join(root, "extension", extension.ServiceName+".yaml"),
			FabricManagerSpec: filepath.Join(root, "extension", extension.FabricManagerServiceName+".yaml"),
			Hook:              filepath.Join(out, "bin", "nvidia-cdi-hook"),
			Ldconfig:          filepath.Join(out, "bin", "ldconfig"),
			Overlay:           filepath.Join(root, "extension", "rootfs"),
			OutDir:            filepath.Join(dir, strings.ReplaceAll(a.Platform, "/", "-"), r.Talos),
		})
		if err != nil {
			return fmt.Errorf("%s %s %s: %w", a.Platform, r.Talos, f.Name, err)
		}

		// The recipe's bytes, not a re-encoding: the validator reads what bldr writes.
		if err := os.WriteFile(filepath.Join(res.Dir, "manifest.yaml"), raw, 0o644); err != nil {
			return err
		}

		fmt.Fprintf(stdout, "%s\t%s\t%s\t%s\t%s\n", res.Dir, f.Name, r.Talos, m.Metadata.Compatibility.Talos.Version, a.Platform)
	}

	return nil
}
