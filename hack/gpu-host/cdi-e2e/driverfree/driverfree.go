// Package driverfree checks that a container's root filesystem does not already hold the
// host's NVIDIA driver where a workload would find it. The GPU end-to-end test runs its
// workloads in a copy of the host's root (hack/gpu-host/e2e-lib.sh); if the dynamic loader or PATH
// there reached the host's driver, a library missing from the CDI spec under test would not
// be noticed.
//
// Where it looks, in the root filesystem, with every symlink resolved inside it (as the
// container sees it): the loader's default directories, the directories of /etc/ld.so.conf
// and its includes (the CDI update-ldcache hook runs ldconfig in the container, which reads
// them), every library path in /etc/ld.so.cache, PATH's directories, and any directory named
// by the caller. What counts as the driver: an ELF file named libcuda.so.1, libnvidia-ml.so.1
// or nvidia-smi, whatever else it holds, and any file whose contents are those of a file of the
// host's driver tree (a manifest made by Manifest beforehand, where the tree is readable).
// Same contents, not the same name: the host may have its own libOpenCL.so.1 or libGL.so.1,
// which are not NVIDIA's.
package driverfree

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	securejoin "github.com/cyphar/filepath-securejoin"
)

// Core are the driver's files that a workload needs by name: CUDA's driver library, NVML and
// nvidia-smi. Any ELF file of these names in the root filesystem is the driver.
var Core = []string{"libcuda.so.1", "libnvidia-ml.so.1", "nvidia-smi"}

// libDirs are where glibc's loader looks without a cache (its system directories on x86_64
// and aarch64, multiarch and not).
var libDirs = []string{
	"/lib", "/usr/lib", "/lib64", "/usr/lib64",
	"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
}

// binDirs is the PATH that cdi-e2e inject gives a workload.
var binDirs = []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}

// Manifest maps a file's SHA-256 to its name, for the files of a driver tree.
type Manifest map[string]string

// MakeManifest hashes the regular files directly in dirs (a driver tree's lib64 and bin).
func MakeManifest(dirs ...string) (Manifest, error) {
	m := Manifest{}

	for _, d := range dirs {
		entries, err := os.ReadDir(d)
		if err != nil {
			return nil, fmt.Errorf("driver tree: %w", err)
		}

		for _, e := range entries {
			if !e.Type().IsRegular() {
				continue
			}

			sum, err := hashFile(filepath.Join(d, e.Name()))
			if err != nil {
				return nil, err
			}

			m[sum] = e.Name()
		}
	}

	return m, nil
}

// Write writes the manifest as "SHA256 NAME" lines.
func (m Manifest) Write(w io.Writer) error {
	sums := make([]string, 0, len(m))
	for s := range m {
		sums = append(sums, s)
	}

	sort.Strings(sums)

	for _, s := range sums {
		if _, err := fmt.Fprintf(w, "%s %s\n", s, m[s]); err != nil {
			return err
		}
	}

	return nil
}

// ReadManifest reads what Write wrote.
func ReadManifest(r io.Reader) (Manifest, error) {
	m := Manifest{}
	sc := bufio.NewScanner(r)

	for n := 1; sc.Scan(); n++ {
		sum, name, ok := strings.Cut(sc.Text(), " ")
		if !ok || len(sum) != 64 || name == "" {
			return nil, fmt.Errorf("manifest line %d: want \"SHA256 NAME\", got %q", n, sc.Text())
		}

		m[sum] = name
	}

	return m, sc.Err()
}

// Finding is one place where the root filesystem holds the driver.
type Finding struct {
	// Path is where a workload would find it, in the container; Why says what it is.
	Path, Why string
}

// Check returns where root (a container's root filesystem) holds the driver. extraDirs are
// directories to look in besides the standard ones (the host tree's own path).
func Check(root string, m Manifest, extraDirs ...string) ([]Finding, error) {
	c := checker{root: root, manifest: m, seen: map[string]bool{}}

	dirs := append(append(append([]string{}, libDirs...), binDirs...), extraDirs...)

	conf, err := c.confDirs("/etc/ld.so.conf", 0)
	if err != nil {
		return nil, err
	}

	dirs = append(dirs, conf...)

	cached, err := c.cachePaths()
	if err != nil {
		return nil, err
	}

	for _, p := range cached {
		dirs = append(dirs, path.Dir(p))
	}

	for _, d := range dirs {
		if err := c.dir(d); err != nil {
			return nil, err
		}
	}

	sort.Slice(c.found, func(i, j int) bool { return c.found[i].Path < c.found[j].Path })

	return c.found, nil
}

type checker struct {
	root     string
	manifest Manifest
	seen     map[string]bool
	found    []Finding
	// names are the driver's file names, for a cheap first test before hashing.
	names map[string]bool
}

// resolve returns the host path of p as the container sees it.
func (c *checker) resolve(p string) (string, error) {
	return securejoin.SecureJoin(c.root, p)
}

func (c *checker) dir(d string) error {
	d = path.Clean("/" + d)
	if c.seen[d] {
		return nil
	}

	c.seen[d] = true

	host, err := c.resolve(d)
	if err != nil {
		return fmt.Errorf("rootfs %s: %w", d, err)
	}

	entries, err := os.ReadDir(host)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return nil
	} else if err != nil {
		return fmt.Errorf("rootfs %s: %w", d, err)
	}

	for _, e := range entries {
		if err := c.file(path.Join(d, e.Name())); err != nil {
			return err
		}
	}

	return nil
}

func (c *checker) file(p string) error {
	if c.names == nil {
		c.names = map[string]bool{}
		for _, n := range c.manifest {
			c.names[n] = true
		}
	}

	host, err := c.resolve(p)
	if err != nil {
		return fmt.Errorf("rootfs %s: %w", p, err)
	}

	st, err := os.Stat(host)
	if err != nil || !st.Mode().IsRegular() {
		return nil // absent, a dangling link, or not a file: nothing a workload could load
	}

	base := path.Base(p)
	for _, n := range Core {
		if base == n && isELF(host) {
			c.found = append(c.found, Finding{Path: p, Why: "the driver's " + n})

			return nil
		}
	}

	// Only names of the tree (the file's or its link target's) are worth hashing.
	if !c.names[base] && !c.names[filepath.Base(host)] {
		return nil
	}

	sum, err := hashFile(host)
	if err != nil {
		return err
	}

	if n, ok := c.manifest[sum]; ok {
		c.found = append(c.found, Finding{Path: p, Why: "the same contents as the driver tree's " + n})
	}

	return nil
}

// confDirs reads an ld.so.conf: directories, and include lines whose globs are relative to
// the including file's directory (glibc elf/ldconfig.c parse_conf_include).
func (c *checker) confDirs(file string, depth int) ([]string, error) {
	if depth > 8 {
		return nil, nil
	}

	host, err := c.resolve(file)
	if err != nil {
		return nil, fmt.Errorf("rootfs %s: %w", file, err)
	}

	data, err := os.ReadFile(host)
	if os.IsNotExist(err) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("rootfs %s: %w", file, err)
	}

	var dirs []string

	for _, line := range strings.Split(string(data), "\n") {
		line, _, _ = strings.Cut(line, "#")
		fields := strings.Fields(line)

		switch {
		case len(fields) == 0 || fields[0] == "hwcap":
		case fields[0] == "include":
			for _, pat := range fields[1:] {
				if !path.IsAbs(pat) {
					pat = path.Join(path.Dir(file), pat)
				}

				matches, _ := filepath.Glob(filepath.Join(c.root, pat))
				for _, mt := range matches {
					rel, _ := filepath.Rel(c.root, mt)

					sub, err := c.confDirs("/"+rel, depth+1)
					if err != nil {
						return nil, err
					}

					dirs = append(dirs, sub...)
				}
			}
		default:
			dirs = append(dirs, fields[0])
		}
	}

	return dirs, nil
}

// cachePaths returns the library paths in /etc/ld.so.cache: its string table holds each
// library's full path, NUL-terminated (glibc elf/cache.c), so the absolute strings are
// those paths.
func (c *checker) cachePaths() ([]string, error) {
	host, err := c.resolve("/etc/ld.so.cache")
	if err != nil {
		return nil, fmt.Errorf("rootfs /etc/ld.so.cache: %w", err)
	}

	data, err := os.ReadFile(host)
	if os.IsNotExist(err) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("rootfs /etc/ld.so.cache: %w", err)
	}

	var paths []string

	for _, s := range bytes.Split(data, []byte{0}) {
		if len(s) > 1 && s[0] == '/' && bytes.Contains(s, []byte(".so")) {
			paths = append(paths, string(s))
		}
	}

	return paths, nil
}

// isELF: a program or library the loader could run. A host's wrapper script named
// nvidia-smi that calls the hidden tree is not the driver.
func isELF(p string) bool {
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()

	magic := make([]byte, 4)
	_, err = io.ReadFull(f, magic)

	return err == nil && string(magic) == "\x7fELF"
}

func hashFile(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()

	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("reading %s: %w", p, err)
	}

	return hex.EncodeToString(h.Sum(nil)), nil
}
