// Command image packs a directory as the root filesystem of a one-layer linux/amd64 container
// image archive that `ctr images import` reads: how the test node gets its pause and device
// plugin images without a registry. With -layout it writes an OCI image layout with a zstd
// layer instead, which `crane push` sends to the Talos test node's registry as it is.
//
//	image -rootfs DIR -ref NAME:TAG -out FILE.tar [-entrypoint /pause] [-env K=V ...]
//	image -layout -rootfs DIR -ref NAME:TAG -out DIR [-entrypoint /pause] [-env K=V ...]
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/talos-nvidia/nvidia-driver/internal/ociimage"
)

// listFlag collects a repeated flag.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	*l = append(*l, v)

	return nil
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	fs.SetOutput(stderr)

	rootfs := fs.String("rootfs", "", "directory whose files are the image's / (required)")
	ref := fs.String("ref", "", "image reference the archive is tagged with (required)")
	out := fs.String("out", "", "image archive (or with -layout, directory) to write (required)")
	asLayout := fs.Bool("layout", false, "write an OCI image layout with a zstd layer, not an image archive")
	entrypoint := fs.String("entrypoint", "", "entrypoint, words separated by spaces")
	var env listFlag
	fs.Var(&env, "env", "KEY=VALUE in the image's environment (repeatable)")

	if err := fs.Parse(args); err != nil {
		return 2
	}

	if *rootfs == "" || *ref == "" || *out == "" {
		fmt.Fprintln(stderr, "image: -rootfs, -ref and -out are required")

		return 2
	}

	for _, e := range env {
		if !strings.Contains(e, "=") {
			fmt.Fprintf(stderr, "image: -env %q: want KEY=VALUE\n", e)

			return 2
		}
	}

	cfg := v1.Config{Env: env, Entrypoint: strings.Fields(*entrypoint)}

	write := ociimage.WriteDirImage
	if *asLayout {
		write = ociimage.WriteDirLayout
	}

	digest, err := write(*rootfs, *out, *ref, runtime.GOARCH, cfg)
	if err != nil {
		fmt.Fprintln(stderr, "image:", err)

		return 1
	}

	fmt.Fprintf(stdout, "%s %s %s\n", *out, *ref, digest)

	return 0
}
