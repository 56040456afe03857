// Command extension assembles the nvidia-driver system extension into
// _out/extensions/<name>/ (manifest.yaml + rootfs/), validates it with Talos's own code and
// the project's stricter checks, and writes the OCI image archive _out/extensions/<name>.tar.
//
// With no flags it builds the development image from the Debian-built subroot: named
// nvidia-driver-dev-debian, versioned <driver>-dev, no kernel modules. For a release
// payload give -payload (a subroot with NVIDIA's userspace), -modules (the <kernel>/ trees
// with NVIDIA's kernel modules), -module-kind and -firmware.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/talos-nvidia/nvidia-driver/internal/extension"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("extension", flag.ContinueOnError)
	fs.SetOutput(stderr)

	out := fs.String("out", "_out", "make build's output directory (inputs are read from it)")
	o := extension.Options{}
	fs.StringVar(&o.Name, "name", "nvidia-driver-dev-debian", "extension name")
	fs.StringVar(&o.Version, "version", "", "extension version (default: the payload's driver version + -version-suffix)")
	fs.StringVar(&o.VersionSuffix, "version-suffix", "-dev", "suffix of the default version")
	fs.StringVar(&o.TalosVersion, "talos-version", "v1.13.5", "Talos release to validate against")
	fs.StringVar(&o.TalosConstraint, "talos-constraint", "", "manifest compatibility.talos.version (default: exactly -talos-version)")
	fs.StringVar(&o.Author, "author", "talos-nvidia", "manifest author")
	fs.StringVar(&o.Description, "description", "", "manifest description (default: says what the payload is)")
	fs.StringVar(&o.Payload, "payload", "", "glibc subroot with NVIDIA's userspace (default: <out>/subroot-debian)")
	fs.StringVar(&o.Modules, "modules", "", "directory of <kernel release>/ trees with NVIDIA's kernel modules")
	kind := fs.String("module-kind", "", "open or proprietary (required with -modules)")
	fs.StringVar(&o.Firmware, "firmware", "", "directory of NVIDIA's firmware files")
	fs.StringVar(&o.ServiceSpec, "service-spec", "extension/nvidia-driver.yaml", "the service's YAML")
	fs.StringVar(&o.FabricManagerSpec, "fabricmanager-spec", "extension/nvidia-fabricmanager.yaml", "the fabric manager service's YAML")
	fs.StringVar(&o.Overlay, "overlay", "extension/rootfs", "files laid over rootfs/")
	ref := fs.String("image-ref", "", "tag written into the image archive (default: talos-nvidia/<name>:<version>)")
	noImage := fs.Bool("no-image", false, "assemble and validate only")
	validate := fs.String("validate", "", "only validate this extension directory (manifest.yaml + rootfs/); with -module-kind also its subroot and kernel modules")
	driverVersion := fs.String("driver-version", "", "with -validate and -module-kind: the driver version every nvidia*.ko must declare")
	kernelVersion := fs.String("kernel-version", "", "with -validate: the release's kernel; the image must be that one release's (version suffix, modules of that kernel only)")

	if err := fs.Parse(args); err != nil {
		return 2
	}

	log := slog.New(slog.NewTextHandler(stderr, nil))

	if *validate != "" {
		if err := extension.ValidateRelease(*validate, o.TalosVersion, extension.ModuleKind(*kind), *driverVersion); err != nil {
			fmt.Fprintln(stderr, "extension:", err)

			return 1
		}

		if *kernelVersion != "" {
			if err := extension.CheckRelease(*validate, o.TalosVersion, *kernelVersion); err != nil {
				fmt.Fprintln(stderr, "extension:", err)

				return 1
			}
		}

		fmt.Fprintf(stdout, "%s: valid for Talos %s\n", *validate, o.TalosVersion)

		return 0
	}

	o.ModuleKind = extension.ModuleKind(*kind)
	o.OutDir = filepath.Join(*out, "extensions")
	o.ServiceRootfs = filepath.Join(*out, "containers", extension.ServiceName)
	o.Hook = filepath.Join(*out, "bin", "nvidia-cdi-hook")
	o.Ldconfig = filepath.Join(*out, "bin", "ldconfig")

	if o.Payload == "" {
		o.Payload = filepath.Join(*out, "subroot-debian")
	}

	if o.TalosConstraint == "" {
		o.TalosConstraint = "= " + o.TalosVersion
	}

	if o.Description == "" {
		o.Description = "NVIDIA driver root, device nodes, nvidia-persistenced, MIG and CDI for Talos (ext-nvidia-driver), and nv-fabricmanager on NVSwitch boards (ext-nvidia-fabricmanager)"
		if o.Modules == "" {
			o.Description = "DEVELOPMENT BUILD, not a release: no kernel modules, userspace from " + o.Payload + ". " + o.Description
		}
	}

	res, err := extension.Assemble(log, o)
	if err != nil {
		fmt.Fprintln(stderr, "extension:", err)

		return 1
	}

	sizes, err := extension.Measure(res.Dir)
	if err != nil {
		fmt.Fprintln(stderr, "extension:", err)

		return 1
	}

	summary := map[string]any{
		"dir": res.Dir, "name": res.Manifest.Metadata.Name, "version": res.Manifest.Metadata.Version,
		"talos": res.Manifest.Metadata.Compatibility.Talos.Version, "driverVersion": res.DriverVersion,
		"modules": res.Modules, "bytes": sizes, "bytesWithoutPayload": sizes.Own(),
	}

	if !*noImage {
		if *ref == "" {
			*ref = "talos-nvidia/" + o.Name + ":" + res.Manifest.Metadata.Version
		}

		tarPath := res.Dir + ".tar"

		digest, err := extension.WriteImage(res.Dir, tarPath, *ref)
		if err != nil {
			fmt.Fprintln(stderr, "extension:", err)

			return 1
		}

		st, err := os.Stat(tarPath)
		if err != nil {
			fmt.Fprintln(stderr, "extension:", err)

			return 1
		}

		summary["image"], summary["imageRef"], summary["imageDigest"], summary["imageArchiveBytes"] = tarPath, *ref, digest.String(), st.Size()
	}

	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")

	if err := enc.Encode(summary); err != nil {
		return 1
	}

	fmt.Fprintf(stderr, "extension %s %s: %.1f MiB of files, %.1f MiB without NVIDIA's payload; service binary %.1f MiB\n",
		res.Manifest.Metadata.Name, res.Manifest.Metadata.Version, mib(sizes.Total), mib(sizes.Own()), mib(sizes.Service))

	return 0
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }
