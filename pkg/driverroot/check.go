package driverroot

import (
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	securejoin "github.com/cyphar/filepath-securejoin"
)

// Consumers of a subroot, named in the report so that a user knows who will fail.
const (
	ConsumerValidator    = "gpu-operator validator"
	ConsumerDevicePlugin = "device plugin"
	ConsumerNvcdi        = "nvcdi (CDI spec generation)"
	ConsumerService      = "nvidia-driver service and nvidia-cdi-hook"
	ConsumerPersistenced = "nvidia-persistenced"
	ConsumerLdcache      = "CDI update-ldcache hook"
	ConsumerDevRoot      = "device plugin, DRA driver and GPU Operator validator (device nodes at <driver root>/dev)"
)

// Library directories each consumer searches, relative to the driver root.
var (
	validatorLibDirs = []string{"", "usr/lib64", "usr/lib/x86_64-linux-gnu", "lib64", "lib/x86_64-linux-gnu"}
	validatorBinDirs = []string{"", "usr/bin", "usr/sbin", "bin", "sbin"}
	pluginLibDirs    = []string{"usr/lib64", "usr/lib/x86_64-linux-gnu", "lib64", "lib/x86_64-linux-gnu"}
)

// Problem is one missing or misplaced piece of a subroot.
type Problem struct {
	// Path is relative to the subroot (or the list of places looked at).
	Path string `json:"path"`
	// Consumer is who needs it.
	Consumer string `json:"consumer"`
	// Message says what is wrong.
	Message string `json:"message"`
}

func (p Problem) String() string {
	return fmt.Sprintf("%s: %s (needed by %s)", p.Path, p.Message, p.Consumer)
}

// Report is the result of Check.
type Report struct {
	Root string `json:"root"`
	// DriverVersion is read from the name of libnvidia-ml.so's real file, if found.
	DriverVersion string    `json:"driverVersion,omitempty"`
	Problems      []Problem `json:"problems"`
}

// OK reports whether every consumer will find what it needs.
func (r Report) OK() bool { return len(r.Problems) == 0 }

// Err returns nil for a usable subroot and otherwise an error that lists every problem.
func (r Report) Err() error {
	if r.OK() {
		return nil
	}

	lines := make([]string, 0, len(r.Problems))
	for _, p := range r.Problems {
		lines = append(lines, "  "+p.String())
	}

	return fmt.Errorf("subroot %s is unusable, %d problem(s):\n%s", r.Root, len(r.Problems), strings.Join(lines, "\n"))
}

// WriteText prints the report for a person.
func (r Report) WriteText(w io.Writer) error {
	var b strings.Builder

	fmt.Fprintf(&b, "subroot: %s\n", r.Root)

	if r.DriverVersion != "" {
		fmt.Fprintf(&b, "driver version: %s\n", r.DriverVersion)
	}

	if r.OK() {
		b.WriteString("result: OK, every consumer finds what it needs\n")
	} else {
		fmt.Fprintf(&b, "result: UNUSABLE, %d problem(s)\n", len(r.Problems))

		for _, p := range r.Problems {
			fmt.Fprintf(&b, "  - %s\n      needed by: %s\n", p.Path+": "+p.Message, p.Consumer)
		}
	}

	_, err := io.WriteString(w, b.String())

	return err
}

// Check inspects the subroot at root and reports every problem at once. It reads files only:
// nothing in the subroot is executed, so it is safe on a workstation and on any tree.
func Check(root string) Report {
	c := checker{root: root}
	c.run()

	return Report{Root: root, DriverVersion: c.version, Problems: c.problems}
}

type checker struct {
	root     string
	version  string
	problems []Problem
}

func (c *checker) add(path, consumer, format string, args ...any) {
	path = "/" + strings.TrimPrefix(path, "/")
	c.problems = append(c.problems, Problem{Path: path, Consumer: consumer, Message: fmt.Sprintf(format, args...)})
}

func (c *checker) run() {
	st, err := os.Stat(c.root)
	if err != nil {
		c.add("/", "every consumer", "subroot does not exist: %v", unwrapPathError(err))

		return
	}

	if !st.IsDir() {
		c.add("/", "every consumer", "subroot is not a directory")

		return
	}

	c.checkNVML()
	c.checkSMI()
	c.checkDevDir()
	c.checkLoader()
	c.checkPersistenced()
	c.checkLdconfig()
	c.checkLdCache()
	c.checkNeeded()
	c.checkVersions()
}

// find returns the first of dirs/name that is a regular file (after following symlinks
// inside the root), or "".
func (c *checker) find(name string, dirs []string) string {
	for _, d := range dirs {
		rel := filepath.Join(d, name)
		if st, err := c.stat(rel); err == nil && st.Mode().IsRegular() {
			return rel
		}
	}

	return ""
}

// stat follows symlinks as a process chrooted into the subroot would.
func (c *checker) stat(rel string) (fs.FileInfo, error) {
	p, err := securejoin.SecureJoin(c.root, rel)
	if err != nil {
		return nil, err
	}

	return os.Stat(p)
}

func (c *checker) resolve(rel string) (string, error) {
	return securejoin.SecureJoin(c.root, rel)
}

func places(name string, dirs []string) string {
	ps := make([]string, 0, len(dirs))
	for _, d := range dirs {
		ps = append(ps, "/"+filepath.Join(d, name))
	}

	return strings.Join(ps, ", ")
}

// misplaced looks for name anywhere in the common library and binary directories, to turn
// "missing" into "found at X, which nobody searches".
func (c *checker) misplaced(name string) string {
	for _, d := range []string{"usr/lib", "lib", "usr/local/lib", "usr/lib/x86_64-linux-gnu/nvidia/current", "usr/lib/nvidia/current", "usr/local/bin"} {
		if st, err := c.stat(filepath.Join(d, name)); err == nil && !st.IsDir() {
			return "/" + filepath.Join(d, name)
		}
	}

	return ""
}

func (c *checker) missing(name string, dirs []string, consumer string) {
	msg := "not found in any of " + places(name, dirs)
	if at := c.misplaced(name); at != "" {
		msg = fmt.Sprintf("misplaced at %s, which %s does not search; move it to /%s", at, consumer, LibDirFor(name))
	}

	c.add(filepath.Join(LibDirFor(name), name), consumer, "%s", msg)
}

// LibDirFor says where a file belongs in the layout.
func LibDirFor(name string) string {
	if strings.Contains(name, ".so") {
		return LibDir
	}

	return BinDir
}

func (c *checker) checkNVML() {
	if c.find("libnvidia-ml.so.1", validatorLibDirs) == "" {
		c.missing("libnvidia-ml.so.1", validatorLibDirs, ConsumerValidator)
	}

	if c.find("libnvidia-ml.so.1", pluginLibDirs) == "" {
		c.missing("libnvidia-ml.so.1", pluginLibDirs, ConsumerDevicePlugin)
	}

	if c.find("libcuda.so.1", pluginLibDirs) == "" {
		c.missing("libcuda.so.1", pluginLibDirs, ConsumerNvcdi)
	}
}

func (c *checker) checkSMI() {
	at := c.find("nvidia-smi", validatorBinDirs)
	if at == "" {
		c.missing("nvidia-smi", validatorBinDirs, ConsumerValidator)

		return
	}

	c.executable(at, ConsumerValidator)
}

func (c *checker) executable(rel, consumer string) {
	st, err := c.stat(rel)
	if err != nil {
		c.add(rel, consumer, "missing")

		return
	}

	if st.Mode().Perm()&0o111 == 0 {
		c.add(rel, consumer, "not executable (mode %v)", st.Mode().Perm())
	}
}

// checkDevDir: the service binds the host's /dev on the subroot's dev/ directory. The
// device plugin, the DRA driver and the GPU Operator validator name device nodes under
// <driver root>/dev; without the mount point they would name paths that do not exist.
func (c *checker) checkDevDir() {
	st, err := os.Lstat(filepath.Join(c.root, DevDir))

	switch {
	case err != nil:
		c.add(DevDir, ConsumerDevRoot, "missing: the empty directory on which the service binds the host's /dev")
	case !st.IsDir():
		c.add(DevDir, ConsumerDevRoot, "must be a directory (the mount point for the host's /dev), found %v", st.Mode().Type())
	}
}

func (c *checker) checkLoader() {
	p, err := c.resolve(LoaderPath)
	if err != nil {
		c.add(LoaderPath, ConsumerService, "cannot resolve: %v", err)

		return
	}

	f, err := elf.Open(p)
	if err != nil {
		c.add(LoaderPath, ConsumerService, "glibc loader missing or not an ELF file: %v", unwrapPathError(err))
	} else {
		// A subroot of another architecture (an amd64 extension on an arm64 node) has
		// no loader at this path, or one that cannot run here.
		if f.Machine != loaderMachine {
			c.add(LoaderPath, ConsumerService, "glibc loader for %v, but this node runs %v programs: the extension was built for another architecture", f.Machine, loaderMachine)
		}

		f.Close() //nolint:errcheck // read-only
	}

	if c.find("libc.so.6", []string{LibDir}) == "" {
		c.missing("libc.so.6", []string{LibDir}, ConsumerService)
	}
}

func (c *checker) checkPersistenced() {
	rel := filepath.Join(BinDir, "nvidia-persistenced")
	if _, err := c.stat(rel); err != nil {
		c.add(rel, ConsumerPersistenced, "missing")
	} else {
		c.executable(rel, ConsumerPersistenced)
	}

	// nvidia-persistenced dlopens libnvidia-cfg to set persistence mode.
	if c.find("libnvidia-cfg.so.1", []string{LibDir}) == "" {
		c.missing("libnvidia-cfg.so.1", []string{LibDir}, ConsumerPersistenced)
	}

	if st, err := c.stat(PersistencedSocketDir); err != nil || !st.IsDir() {
		c.add(PersistencedSocketDir, ConsumerNvcdi, "missing directory: the daemon's socket is bind-mounted there so that CDI specs mount it into containers")
	}
}

func (c *checker) checkLdconfig() {
	p, err := c.resolve(LdconfigPath)
	if err != nil {
		c.add(LdconfigPath, ConsumerLdcache, "cannot resolve: %v", err)

		return
	}

	f, err := elf.Open(p)
	if err != nil {
		c.add(LdconfigPath, ConsumerLdcache, "static ldconfig missing or not an ELF file: %v", unwrapPathError(err))

		return
	}
	defer f.Close() //nolint:errcheck

	if interp := interpreter(f); interp != "" {
		c.add(LdconfigPath, ConsumerLdcache, "must be static, but asks for the interpreter %s", interp)
	}
}

func (c *checker) checkLdCache() {
	p, err := c.resolve(LdCachePath)
	if err != nil {
		c.add(LdCachePath, ConsumerNvcdi, "cannot resolve: %v", err)

		return
	}

	data, err := os.ReadFile(p)
	if err != nil {
		c.add(LdCachePath, ConsumerNvcdi, "missing: run `ldconfig -r <subroot>`")

		return
	}

	entries, err := ParseLdCache(data)
	if err != nil {
		c.add(LdCachePath, ConsumerNvcdi, "unreadable: %v", err)

		return
	}

	for _, lib := range []string{"libnvidia-ml.so.1", "libcuda.so.1"} {
		target, ok := entries[lib]
		if !ok {
			c.add(LdCachePath, ConsumerNvcdi, "does not list %s: rerun `ldconfig -r <subroot>`", lib)

			continue
		}

		if _, err := c.stat(target); err != nil {
			c.add(LdCachePath, ConsumerNvcdi, "lists %s at %s, which does not exist in the subroot", lib, target)
		}
	}
}

// checkNeeded makes sure that the programs and libraries the consumers load find their own
// dependencies in the subroot's library directory.
func (c *checker) checkNeeded() {
	objects := map[string]string{
		filepath.Join(BinDir, "nvidia-smi"):          ConsumerValidator,
		filepath.Join(BinDir, "nvidia-persistenced"): ConsumerPersistenced,
		filepath.Join(LibDir, "libnvidia-ml.so.1"):   ConsumerDevicePlugin,
		filepath.Join(LibDir, "libcuda.so.1"):        ConsumerNvcdi,
	}

	keys := make([]string, 0, len(objects))
	for k := range objects {
		keys = append(keys, k)
	}

	sort.Strings(keys)

	for _, rel := range keys {
		p, err := c.resolve(rel)
		if err != nil {
			continue
		}

		f, err := elf.Open(p)
		if err != nil {
			continue // reported as missing above
		}

		libs, err := f.ImportedLibraries()
		f.Close() //nolint:errcheck

		if err != nil {
			c.add(rel, objects[rel], "unreadable dynamic section: %v", err)

			continue
		}

		for _, lib := range libs {
			if c.find(lib, []string{LibDir}) == "" {
				c.add(filepath.Join(LibDir, lib), objects[rel], "missing: /%s links against it", rel)
			}
		}
	}
}

var soVersion = regexp.MustCompile(`\.so\.(\d+\.\d+(?:\.\d+)?)$`)

// checkVersions: libraries of two driver versions in one subroot break CUDA in confusing ways.
func (c *checker) checkVersions() {
	versions := map[string]string{}

	for _, lib := range []string{"libnvidia-ml.so.1", "libcuda.so.1", "libnvidia-cfg.so.1"} {
		p, err := c.resolve(filepath.Join(LibDir, lib))
		if err != nil {
			continue
		}

		if m := soVersion.FindStringSubmatch(filepath.Base(p)); m != nil {
			versions[lib] = m[1]
		}
	}

	c.version = versions["libnvidia-ml.so.1"]
	if c.version == "" {
		return
	}

	libs := make([]string, 0, len(versions))
	for lib := range versions {
		libs = append(libs, lib)
	}

	slices.Sort(libs)

	for _, lib := range libs {
		if v := versions[lib]; v != c.version {
			c.add(filepath.Join(LibDir, lib), ConsumerNvcdi, "version %s differs from libnvidia-ml's %s: one driver version per subroot", v, c.version)
		}
	}
}

func interpreter(f *elf.File) string {
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}

		b := make([]byte, p.Filesz)
		if _, err := p.ReadAt(b, 0); err != nil {
			return "?"
		}

		return strings.TrimRight(string(b), "\x00")
	}

	return ""
}

// Interpreter returns the ELF interpreter a program asks for, "" for a static program.
func Interpreter(path string) (string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return "", fmt.Errorf("reading ELF file %s: %w", path, err)
	}
	defer f.Close() //nolint:errcheck

	return interpreter(f), nil
}

func unwrapPathError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}

	return err
}
