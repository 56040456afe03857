// Command gen-flavors renders the generated part of the release recipes (internal/recipes):
// the root vars.yaml with the data of every Talos release in hack/release/gen-flavors/releases/,
// flavors/<name>/{pkg.yaml,vars.yaml,manifest.yaml.tmpl} for the four flavors, and
// stages/nvidia-userspace-<branch>/pkg.yaml. Each release's pkgs, tools and kernel versions
// are read from its machinery module (fetched through the go command), its driver versions
// and checksums from the siderolabs files vendored in its directory.
//
//	go run ./hack/release/gen-flavors [-check]
//
// -check only compares and fails if a file is stale.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/talos-nvidia/nvidia-driver/internal/recipes"
)

func main() {
	os.Exit(run())
}

func run() int {
	check := flag.Bool("check", false, "fail if a generated file is stale")
	root := flag.String("root", ".", "repository root")
	flag.Parse()

	releases, missing, err := recipes.LoadReleases(filepath.Join(*root, "hack", "release", "gen-flavors", "releases"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "gen-flavors:", err)

		return 1
	}

	files, err := recipes.Generate(releases, missing)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gen-flavors:", err)

		return 1
	}

	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}

	sort.Strings(paths)

	stale := 0

	for _, rel := range paths {
		p := filepath.Join(*root, rel)

		if *check {
			if old, err := os.ReadFile(p); err != nil || !bytes.Equal(old, files[rel]) {
				fmt.Fprintf(os.Stderr, "gen-flavors: %s is stale: run go run ./hack/release/gen-flavors\n", rel)
				stale++
			}

			continue
		}

		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "gen-flavors:", err)

			return 1
		}

		if err := os.WriteFile(p, files[rel], 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "gen-flavors:", err)

			return 1
		}
	}

	if stale > 0 {
		return 1
	}

	return 0
}
