// Command installer-model stands in for NVIDIA's nvidia-installer where the real one cannot
// run (no NVIDIA archive on the CI machine): the recipes' stage scripts run with it on the
// test archive that internal/recipes' stage test makes from Debian's NVIDIA packages. It
// reads ./.manifest as the installer's parse_manifest does and puts every entry where the
// model of set_destinations (internal/recipes: installer.go, manifest.go) says, with the
// command line's prefixes and overrides: files copied with their MANIFEST mode, symbolic
// links made to their target. Then, as the installer does after installing, it runs
// ldconfig (which writes the build root's /etc/ld.so.cache), and writes its log to
// --log-file-name. It builds no kernel module and checks no system.
//
// It is a model: what the real installer does beyond placing files (its own state under
// /var/lib/nvidia, a file type it routes otherwise) stays unverified until a real build.
package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/talos-nvidia/nvidia-driver/internal/recipes"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "nvidia-installer (model):", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	flags, err := recipes.ParseInstallerArgs(args)
	if err != nil {
		return err
	}

	f, err := os.Open(".manifest")
	if err != nil {
		return fmt.Errorf("no package found for installation: %w", err)
	}
	defer f.Close() //nolint:errcheck

	m, err := recipes.ParseManifest(f)
	if err != nil {
		return fmt.Errorf(".manifest: %w", err)
	}

	var log strings.Builder

	fmt.Fprintf(&log, "nvidia-installer model: %s %s\n", m.Description, m.Version)

	for _, e := range m.Entries {
		dst, dropped, err := flags.EntryDestination(e)
		if err != nil {
			return err
		}

		if dropped != "" {
			fmt.Fprintf(&log, "skip %s (%s): %s\n", e.File, e.Type, dropped)

			continue
		}

		if err := install(e, dst); err != nil {
			return fmt.Errorf("installing %s (%s) to %s: %w", e.File, e.Type, dst, err)
		}

		fmt.Fprintf(&log, "install %s (%s) -> %s\n", e.File, e.Type, dst)
	}

	if out, err := exec.Command("ldconfig").CombinedOutput(); err != nil {
		return fmt.Errorf("ldconfig: %w: %s", err, out)
	}

	if p := flags.Options["log-file-name"]; p != "" {
		if err := os.WriteFile(p, []byte(log.String()), 0o644); err != nil {
			return err
		}
	}

	fmt.Fprintf(stdout, "nvidia-installer model: installed %s %s\n", m.Description, m.Version)

	return nil
}

func install(e recipes.ManifestEntry, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}

	if e.Target != "" {
		_ = os.Remove(dst) //nolint:errcheck // absent is fine; Symlink reports the rest

		return os.Symlink(e.Target, dst)
	}

	data, err := os.ReadFile(e.File)
	if err != nil {
		return err
	}

	if err := os.WriteFile(dst, data, os.FileMode(e.Mode)); err != nil {
		return err
	}

	return os.Chmod(dst, os.FileMode(e.Mode))
}
