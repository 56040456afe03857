// Command gen-flavors renders the generated part of the release recipes (internal/recipes):
// the root vars.yaml with the data of every Talos release in the release facts
// (hack/release/releases.yaml), flavors/<name>/{pkg.yaml,vars.yaml,manifest.yaml.tmpl} for
// the four flavors, and stages/nvidia-userspace-<branch>/pkg.yaml. Each release's kernel
// version is read from its machinery module (fetched through the go command), which must
// also name the pkgs and tools tags of its facts; its driver versions, checksums and images
// come from the facts, each with the source they say it was read at.
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

	releases, err := recipes.LoadReleases(filepath.Join(*root, filepath.FromSlash(recipes.FactsFile)))
	if err != nil {
		fmt.Fprintln(os.Stderr, "gen-flavors:", err)

		return 1
	}

	files, err := recipes.Generate(releases)
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
