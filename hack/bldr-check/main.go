//go:build ignore

// This file is built inside a checkout of github.com/siderolabs/bldr by hack/bldr-check.sh
// (its loaders are internal packages: only code in that module can call them). It runs both
// of bldr's loaders on a recipe tree, as bldr validate (FilesystemPackageLoader) and as the
// BuildKit frontend (BuildkitFrontendLoader, served the files that pkgfile/build.go
// fetchPkgs' include patterns let through), then resolves every package as a build target.
//
//	check TREE [BUILD_ARG=VALUE ...]
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/moby/buildkit/client/llb"
	"github.com/moby/buildkit/frontend/gateway/client"
	fstypes "github.com/tonistiigi/fsutil/types"

	"github.com/siderolabs/bldr/internal/pkg/environment"
	"github.com/siderolabs/bldr/internal/pkg/solver"
	"github.com/siderolabs/bldr/internal/pkg/types"
)

// tree serves a directory as the frontend's Reference would: Pkgfile, pkg.yaml, vars.yaml,
// *.tmpl and directories, without _out/.
type tree struct{ root string }

func (t tree) ToState() (llb.State, error)    { return llb.Scratch(), nil }
func (t tree) Evaluate(context.Context) error { return nil }

func (t tree) ReadFile(_ context.Context, req client.ReadRequest) ([]byte, error) {
	return os.ReadFile(filepath.Join(t.root, req.Filename))
}

func (t tree) StatFile(context.Context, client.StatRequest) (*fstypes.Stat, error) {
	return nil, fmt.Errorf("not used by the loader")
}

func (t tree) ReadDir(_ context.Context, req client.ReadDirRequest) ([]*fstypes.Stat, error) {
	entries, err := os.ReadDir(filepath.Join(t.root, req.Path))
	if err != nil {
		return nil, err
	}

	top := filepath.Clean(req.Path) == "/"

	var out []*fstypes.Stat

	for _, e := range entries {
		n := e.Name()

		switch {
		case e.IsDir() && !(top && n == "_out"):
			out = append(out, &fstypes.Stat{Path: n, Mode: uint32(os.ModeDir | 0o755)})
		case !e.IsDir() && ((top && n == "Pkgfile") || n == "pkg.yaml" || n == "vars.yaml" || strings.HasSuffix(n, ".tmpl")):
			out = append(out, &fstypes.Stat{Path: n, Mode: 0o644})
		}
	}

	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })

	return out, nil
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: check TREE [BUILD_ARG=VALUE ...]")
		os.Exit(2)
	}

	vars := func() types.Variables {
		opts := &environment.Options{BuildPlatform: environment.LinuxAmd64, TargetPlatform: environment.LinuxAmd64}
		v := opts.GetVariables()

		for _, a := range os.Args[2:] {
			k, val, _ := strings.Cut(a, "=")
			v["BUILD_ARG_"+k] = val
		}

		return v
	}

	failed := false

	for _, l := range []struct {
		name   string
		loader solver.PackageLoader
	}{
		{"bldr validate (FilesystemPackageLoader)", &solver.FilesystemPackageLoader{Root: os.Args[1], Context: vars()}},
		{"bldr frontend (BuildkitFrontendLoader)", &solver.BuildkitFrontendLoader{Context: vars(), Ref: tree{os.Args[1]}, Ctx: context.Background()}},
	} {
		pkgs, err := solver.NewPackages(l.loader)
		if err != nil {
			fmt.Printf("%s: %v\n", l.name, err)
			failed = true

			continue
		}

		var lines []string

		for _, n := range pkgs.ToSet() {
			g, err := pkgs.Resolve(n.Name)
			if err != nil {
				fmt.Printf("%s: %v\n", l.name, err)
				failed = true

				continue
			}

			var tmpls []string
			for _, f := range g.Root.Pkg.TemplatedFiles {
				tmpls = append(tmpls, f.Path)
			}

			lines = append(lines, fmt.Sprintf("  %s (%s) templates %v", n.Name, g.Root.Pkg.BaseDir, tmpls))
		}

		sort.Strings(lines)
		fmt.Printf("%s: %d packages, all resolved:\n%s\n", l.name, len(lines), strings.Join(lines, "\n"))
	}

	if failed {
		os.Exit(1)
	}
}
