// Package devnodes creates the NVIDIA device nodes that nvidia-modprobe creates on other
// distributions: Talos has no nvidia-modprobe run by a driver container. Majors and minors
// come from /proc, never from constants, and every node and link is made idempotently.
package devnodes

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/talos-nvidia/nvidia-driver/pkg/atomicfile"
	"github.com/talos-nvidia/nvidia-driver/pkg/nvswitch"
)

// Minors of the control nodes, fixed by the kernel module's ABI.
const (
	ctlMinor     = 255
	modesetMinor = 254
	// nvidia-nvswitchctl on the nvidia-nvswitch major (open-gpu-kernel-modules
	// kernel-open/nvidia/linux_nvswitch.c NVSWITCH_CTL_MINOR; nvidia-modprobe-utils.h
	// NV_NVSWITCH_CTL_MINOR), and /dev/nvidia-nvlink, the only minor of its major
	// (nvidia-modprobe-utils.c nvidia_nvlink_mknod).
	nvswitchCtlMinor = 255
	nvlinkMinor      = 0
)

// Node is one character device node.
type Node struct {
	Path  string      `json:"path"` // relative to the host root, e.g. dev/nvidia0
	Major uint32      `json:"major"`
	Minor uint32      `json:"minor"`
	Mode  os.FileMode `json:"mode"`
	UID   uint32      `json:"uid"`
	GID   uint32      `json:"gid"`
	// Keep: the driver says not to create or change this node (ModifyDeviceFiles=0); only
	// its /dev/char link is made, where the node exists.
	Keep bool `json:"keep,omitempty"`
}

// attrs are a node's owner, mode and whether it may be changed, as the driver gives them.
type attrs struct {
	mode     os.FileMode
	uid, gid uint32
	modify   bool
}

// defaultAttrs are nvidia-modprobe's NV_DEVICE_FILE_MODE, _UID, _GID and modify = 1
// (nvidia-modprobe utils/nvidia-modprobe-utils.c init_device_file_parameters), the values
// the driver's NVreg_DeviceFile* parameters default to too.
var defaultAttrs = attrs{mode: 0o666, modify: true}

func (a attrs) node(path string, major, minor uint32) Node {
	return Node{Path: path, Major: major, Minor: minor, Mode: a.mode, UID: a.uid, GID: a.gid, Keep: !a.modify}
}

// Result lists what Sync left in /dev and what it changed.
type Result struct {
	Nodes   []Node   `json:"nodes"`
	Created []string `json:"created,omitempty"`
	Removed []string `json:"removed,omitempty"`
}

// Sync makes /dev match what the loaded driver offers, under hostRoot ("/" on a node):
// nvidiactl, nvidia-modeset (when nvidia_modeset is loaded), nvidia-uvm and nvidia-uvm-tools
// (when nvidia_uvm is loaded), one nvidiaN per GPU, the MIG capability nodes that exist now
// (config, monitor, and one per GPU and compute instance) with stale ones removed, on
// NVSwitch boards the nodes the fabric manager needs (nvidia-nvswitchctl, nvidia-nvswitchN,
// nvidia-nvlink, the fabric-mgmt capability), and /dev/char/<major>:<minor> links for all
// of them.
func Sync(log *slog.Logger, hostRoot string) (Result, error) {
	removeLeftovers(log, hostRoot)

	want, err := Desired(hostRoot)
	if err != nil {
		return Result{}, err
	}

	// The GPUs work without the NVSwitch nodes; only the fabric manager needs them, and the
	// node's NVSwitch job says so when it cannot start.
	fabric, err := FabricNodes(hostRoot)
	if err != nil {
		log.Warn("NVSwitch device nodes not made", "error", err)
	}

	want = append(want, fabric...)

	res := Result{Nodes: want}

	for _, n := range want {
		changed, err := ensureNode(filepath.Join(hostRoot, n.Path), n)
		if err != nil {
			return res, err
		}

		if changed {
			res.Created = append(res.Created, n.Path)
		}

		if n.Keep && !isCharDev(filepath.Join(hostRoot, n.Path), n) {
			continue // nvidia-modprobe links only a node that is there (symlink_char_dev)
		}

		link := filepath.Join(hostRoot, "dev/char", fmt.Sprintf("%d:%d", n.Major, n.Minor))
		if err := ensureLink(link, filepath.Join("..", strings.TrimPrefix(n.Path, "dev/"))); err != nil {
			return res, err
		}
	}

	removed, err := removeStaleCaps(hostRoot, want)
	res.Removed = removed

	if err != nil {
		return res, err
	}

	log.Info("device nodes in place", "nodes", len(want), "created", len(res.Created), "removed", len(res.Removed))

	return res, nil
}

// Desired reads /proc under hostRoot and returns the nodes the driver offers now.
func Desired(hostRoot string) ([]Node, error) {
	majors, err := readMajors(filepath.Join(hostRoot, "proc/devices"))
	if err != nil {
		return nil, err
	}

	nv, ok := majors["nvidia-frontend"]
	if !ok {
		nv, ok = majors["nvidia"]
	}

	if !ok {
		return nil, fmt.Errorf("%s lists no nvidia character device: the nvidia kernel module is not loaded", filepath.Join(hostRoot, "proc/devices"))
	}

	// The nvidia nodes get the owner and mode of the module's NVreg_DeviceFileUID, _GID and
	// _Mode, unless NVreg_ModifyDeviceFiles=0 leaves them alone: the driver lists its
	// parameters in /proc/driver/nvidia/params (open-gpu-kernel-modules
	// kernel-open/nvidia/nv-procfs.c, "Name: value" lines, the mode in decimal), and
	// nvidia-modprobe reads them there for nvidiactl, nvidia-modeset and nvidiaN
	// (nvidia-modprobe-utils.c nvidia_mknod, nvidia_modeset_mknod: NV_PROC_REGISTRY_PATH).
	nvAttrs, err := readAttrs(filepath.Join(hostRoot, "proc/driver/nvidia/params"), true)
	if err != nil {
		return nil, err
	}

	nodes := []Node{nvAttrs.node("dev/nvidiactl", nv, ctlMinor)}

	if _, err := os.Stat(filepath.Join(hostRoot, "sys/module/nvidia_modeset")); err == nil {
		nodes = append(nodes, nvAttrs.node("dev/nvidia-modeset", nv, modesetMinor))
	}

	if uvm, ok := majors["nvidia-uvm"]; ok {
		// nvidia-modprobe makes the UVM nodes with its defaults, reading no parameters
		// (nvidia_uvm_mknod passes no proc path).
		nodes = append(nodes,
			defaultAttrs.node("dev/nvidia-uvm", uvm, 0),
			defaultAttrs.node("dev/nvidia-uvm-tools", uvm, 1),
		)
	}

	minors, err := gpuMinors(filepath.Join(hostRoot, "proc/driver/nvidia/gpus"))
	if err != nil {
		return nil, err
	}

	for _, m := range minors {
		nodes = append(nodes, nvAttrs.node(fmt.Sprintf("dev/nvidia%d", m), nv, m))
	}

	if caps, ok := majors["nvidia-caps"]; ok {
		capNodes, err := capabilityNodes(hostRoot, caps)
		if err != nil {
			return nil, err
		}

		nodes = append(nodes, capNodes...)
	}

	return nodes, nil
}

// FabricNodes returns, on a board whose nvidia-nvswitch driver manages switches, the nodes
// the fabric manager opens there (NVIDIA Fabric Manager User Guide, "Running Fabric Manager
// as a Non-Root User", HGX-2/A100/H100: /dev/nvidia-nvswitchctl, one /dev/nvidia-nvswitchN
// per switch, /dev/nvidia-nvlink and the nvidia-nvlink fabric-mgmt capability), with the
// modes the drivers give in their permissions files, as nvidia-modprobe makes them.
func FabricNodes(hostRoot string) ([]Node, error) {
	switches, err := nvswitch.DriverDevices(hostRoot)
	if err != nil || len(switches) == 0 {
		return nil, err
	}

	majors, err := readMajors(filepath.Join(hostRoot, "proc/devices"))
	if err != nil {
		return nil, err
	}

	major, ok := majors["nvidia-nvswitch"]
	if !ok {
		return nil, fmt.Errorf("the nvidia-nvswitch driver lists %d NVSwitch(es) but %s has no nvidia-nvswitch character device",
			len(switches), filepath.Join(hostRoot, "proc/devices"))
	}

	sw, _, err := readCapability(filepath.Join(hostRoot, "proc/driver/nvidia-nvswitch/permissions"))
	if err != nil {
		return nil, err
	}

	nodes := []Node{sw.node("dev/nvidia-nvswitchctl", major, nvswitchCtlMinor)}

	// The driver gives each switch the lowest free minor as it probes it and lists no minor
	// in /proc (linux_nvswitch.c nvswitch_find_minor, procfs_nvswitch.c): the N switches
	// initialized at load have minors 0..N-1, the numbers the fabric manager passes to
	// nvidia-modprobe -s -c.
	for i := range switches {
		nodes = append(nodes, sw.node(fmt.Sprintf("dev/nvidia-nvswitch%d", i), major, uint32(i)))
	}

	if nvl, ok := majors["nvidia-nvlink"]; ok {
		nl, _, err := readCapability(filepath.Join(hostRoot, "proc/driver/nvidia-nvlink/permissions"))
		if err != nil {
			return nil, err
		}

		nodes = append(nodes, nl.node("dev/nvidia-nvlink", nvl, nvlinkMinor))
	}

	caps, ok := majors["nvidia-caps"]
	if !ok {
		return nodes, nil
	}

	capNode, err := fabricMgmtCapability(hostRoot, caps)
	if err != nil {
		return nil, err
	}

	if capNode == nil {
		return nodes, nil
	}

	return append(nodes, *capNode), nil
}

// fabricMgmtCapability returns the node of the nvidia-nvlink fabric-mgmt capability, which
// the fabric manager must hold (kernel-open/nvidia/nvlink_caps.c), or nil where the driver
// offers none. Its minor is in the capability file and in /proc/driver/nvidia-caps/
// nvlink-minors (kernel-open/nvidia/nv-caps.c); both must agree.
func fabricMgmtCapability(hostRoot string, major uint32) (*Node, error) {
	path := filepath.Join(hostRoot, "proc/driver/nvidia-nvlink/capabilities/fabric-mgmt")
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}

	a, fileMinor, err := readCapability(path)
	if err != nil {
		return nil, err
	}

	minorsPath := filepath.Join(hostRoot, "proc/driver/nvidia-caps/nvlink-minors")

	minors, err := readMigMinors(minorsPath)
	if err != nil {
		return nil, err
	}

	minor, ok := minors["fabric-mgmt"]

	switch {
	case !ok:
		return nil, fmt.Errorf("capability fabric-mgmt is not listed in %s", minorsPath)
	case fileMinor >= 0 && uint32(fileMinor) != minor:
		return nil, fmt.Errorf("capability fabric-mgmt: %s says minor %d, %s says %d", path, fileMinor, minorsPath, minor)
	}

	n := a.node(fmt.Sprintf("dev/nvidia-caps/nvidia-cap%d", minor), major, minor)

	return &n, nil
}

func readMajors(path string) (map[string]uint32, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading device majors: %w", err)
	}
	defer f.Close() //nolint:errcheck

	majors := map[string]uint32{}
	inChar := false
	sc := bufio.NewScanner(f)

	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())

		switch {
		case line == "Character devices:":
			inChar = true
		case line == "Block devices:":
			inChar = false
		case inChar:
			fields := strings.Fields(line)
			if len(fields) != 2 {
				continue
			}

			m, err := strconv.ParseUint(fields[0], 10, 32)
			if err != nil {
				return nil, fmt.Errorf("%s: bad line %q: %w", path, line, err)
			}

			majors[fields[1]] = uint32(m)
		}
	}

	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}

	return majors, nil
}

var deviceMinorLine = regexp.MustCompile(`(?m)^Device Minor:\s*(\d+)\s*$`)

// gpuMinors reads the minor of every GPU from /proc/driver/nvidia/gpus/<bus id>/information.
func gpuMinors(dir string) ([]uint32, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}

	if err != nil {
		return nil, fmt.Errorf("listing GPUs: %w", err)
	}

	var minors []uint32

	for _, e := range entries {
		path := filepath.Join(dir, e.Name(), "information")

		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("reading GPU information: %w", err)
		}

		m := deviceMinorLine.FindSubmatch(data)
		if m == nil {
			return nil, fmt.Errorf("%s has no \"Device Minor:\" line", path)
		}

		minor, err := strconv.ParseUint(string(m[1]), 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%s: bad device minor: %w", path, err)
		}

		minors = append(minors, uint32(minor))
	}

	slices.Sort(minors)

	return minors, nil
}

// capabilityNodes returns a node for every capability the driver exposes now. The driver
// creates /proc/driver/nvidia/capabilities entries only for MIG GPU and compute instances
// that exist, while mig-minors lists every possible one: the first says which, the second
// says which minor.
func capabilityNodes(hostRoot string, major uint32) ([]Node, error) {
	minorsPath := filepath.Join(hostRoot, "proc/driver/nvidia-caps/mig-minors")

	minors, err := readMigMinors(minorsPath)
	if err != nil {
		return nil, err
	}

	capsDir := filepath.Join(hostRoot, "proc/driver/nvidia/capabilities")

	var nodes []Node

	err = filepath.WalkDir(capsDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && path == capsDir {
				return fs.SkipDir
			}

			return err
		}

		if d.IsDir() {
			return nil
		}

		rel, _ := filepath.Rel(capsDir, path) //nolint:errcheck // path is under capsDir

		key, ok := migMinorKey(rel)
		if !ok {
			return nil
		}

		minor, ok := minors[key]
		if !ok {
			return fmt.Errorf("capability %s is not listed in %s", key, minorsPath)
		}

		a, fileMinor, err := readCapability(path)
		if err != nil {
			return err
		}

		if fileMinor >= 0 && uint32(fileMinor) != minor {
			return fmt.Errorf("capability %s: %s says minor %d, %s says %d", key, path, fileMinor, minorsPath, minor)
		}

		nodes = append(nodes, a.node(fmt.Sprintf("dev/nvidia-caps/nvidia-cap%d", minor), major, minor))

		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading MIG capabilities: %w", err)
	}

	slices.SortFunc(nodes, func(a, b Node) int { return int(a.Minor) - int(b.Minor) })

	return nodes, nil
}

// migMinorKey maps a capabilities path to its key in mig-minors:
// mig/config -> config, gpu0/mig/gi1/access -> gpu0/gi1/access, gpu0/mig/gi1/ci0/access ->
// gpu0/gi1/ci0/access.
func migMinorKey(rel string) (string, bool) {
	parts := strings.Split(filepath.ToSlash(rel), "/")

	switch {
	case len(parts) == 2 && parts[0] == "mig" && (parts[1] == "config" || parts[1] == "monitor"):
		return parts[1], true
	case len(parts) >= 4 && strings.HasPrefix(parts[0], "gpu") && parts[1] == "mig" && parts[len(parts)-1] == "access":
		return strings.Join(append([]string{parts[0]}, parts[2:]...), "/"), true
	}

	return "", false
}

func readMigMinors(path string) (map[string]uint32, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading MIG capability minors: %w", err)
	}
	defer f.Close() //nolint:errcheck

	minors := map[string]uint32{}
	sc := bufio.NewScanner(f)

	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 2 {
			continue
		}

		m, err := strconv.ParseUint(fields[1], 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%s: bad line %q: %w", path, sc.Text(), err)
		}

		minors[fields[0]] = uint32(m)
	}

	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}

	return minors, nil
}

// readCapability parses a capability or permissions file: "DeviceFileMinor: 1",
// "DeviceFileMode: 256" (decimal), "DeviceFileModify: 1", and the owner where the driver
// gives one (kernel-open/nvidia/nv-caps.c; nvidia-modprobe passes the same file to
// mknod_helper). A missing minor is returned as -1, a missing mode as 0444.
func readCapability(path string) (attrs, int64, error) {
	a := defaultAttrs
	a.mode = 0o444

	return parseAttrs(path, a)
}

// readAttrs reads a node's attributes from the driver's params file, the defaults where it
// has none; optional: a missing file means the defaults (nvidia-modprobe does the same).
func readAttrs(path string, optional bool) (attrs, error) {
	if _, err := os.Stat(path); optional && errors.Is(err, fs.ErrNotExist) {
		return defaultAttrs, nil
	}

	a, _, err := parseAttrs(path, defaultAttrs)

	return a, err
}

// parseAttrs reads "Name: unsigned" lines, as nvidia-modprobe does
// (init_device_file_parameters: DeviceFileUID, DeviceFileGID, DeviceFileMode,
// ModifyDeviceFiles or DeviceFileModify), and DeviceFileMinor.
func parseAttrs(path string, a attrs) (attrs, int64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return a, 0, fmt.Errorf("reading device file attributes: %w", err)
	}

	minor := int64(-1)

	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}

		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
		if err != nil {
			continue
		}

		switch strings.TrimSpace(k) {
		case "DeviceFileMode":
			a.mode = os.FileMode(n) & os.ModePerm
		case "DeviceFileUID":
			a.uid = uint32(n)
		case "DeviceFileGID":
			a.gid = uint32(n)
		case "ModifyDeviceFiles", "DeviceFileModify":
			a.modify = n == 1
		case "DeviceFileMinor":
			minor = int64(n)
		}
	}

	return a, minor, nil
}

// ensureNode makes path a character device with the node's numbers, mode and owner. A
// wrong node is replaced through a temporary name and a rename, so the path is never
// missing. A node the driver says to keep is left as it is.
func ensureNode(path string, n Node) (bool, error) {
	if n.Keep {
		return false, nil
	}

	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err == nil {
		if st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == unix.Mkdev(n.Major, n.Minor) && os.FileMode(st.Mode&0o777) == n.Mode &&
			st.Uid == n.UID && st.Gid == n.GID {
			return false, nil
		}
	}

	if err := atomicfile.MkdirNoFollow(filepath.Dir(path)); err != nil {
		return false, err
	}

	tmp := path + ".tmp"
	_ = os.Remove(tmp) //nolint:errcheck // a leftover from a crash

	if err := unix.Mknod(tmp, unix.S_IFCHR|uint32(n.Mode), int(unix.Mkdev(n.Major, n.Minor))); err != nil {
		return false, fmt.Errorf("creating device node %s (%d:%d): %w", path, n.Major, n.Minor, err)
	}

	// mknod applies the umask; set the mode the driver asks for.
	if err := unix.Chmod(tmp, uint32(n.Mode)); err != nil {
		os.Remove(tmp) //nolint:errcheck

		return false, fmt.Errorf("setting mode of %s: %w", path, err)
	}

	if err := unix.Lchown(tmp, int(n.UID), int(n.GID)); err != nil {
		os.Remove(tmp) //nolint:errcheck

		return false, fmt.Errorf("setting owner of %s: %w", path, err)
	}

	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp) //nolint:errcheck

		return false, fmt.Errorf("placing device node %s: %w", path, err)
	}

	return true, nil
}

func ensureLink(path, target string) error {
	if cur, err := os.Readlink(path); err == nil && cur == target {
		return nil
	}

	if err := atomicfile.MkdirNoFollow(filepath.Dir(path)); err != nil {
		return err
	}

	tmp := path + ".tmp"
	_ = os.Remove(tmp) //nolint:errcheck

	if err := os.Symlink(target, tmp); err != nil {
		return fmt.Errorf("creating link %s: %w", path, err)
	}

	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp) //nolint:errcheck

		return fmt.Errorf("placing link %s: %w", path, err)
	}

	return nil
}

var capNodeName = regexp.MustCompile(`^nvidia-cap(\d+)$`)

// removeStaleCaps removes capability nodes (and their /dev/char links) for MIG instances
// that no longer exist: nodes whose minor is a MIG capability's (mig-minors lists every
// possible one) and that want does not name. Other capability nodes, such as the
// nvidia-nvlink fabric-mgmt one, are not MIG's to remove: they stay even when this sync
// could not account for them (FabricNodes failed, or another tool made them).
func removeStaleCaps(hostRoot string, want []Node) ([]string, error) {
	dir := filepath.Join(hostRoot, "dev/nvidia-caps")

	if st, err := os.Lstat(dir); err == nil && !st.IsDir() {
		return nil, fmt.Errorf("%s is not a directory (%s): not removing anything through it", dir, st.Mode().Type())
	}

	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}

	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", dir, err)
	}

	migMinors := map[uint32]bool{}

	minors, err := readMigMinors(filepath.Join(hostRoot, "proc/driver/nvidia-caps/mig-minors"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil // a driver without MIG capabilities: no node here is a MIG one
	}

	if err != nil {
		return nil, err
	}

	for _, m := range minors {
		migMinors[m] = true
	}

	keep := map[string]bool{}
	for _, n := range want {
		keep[n.Path] = true
	}

	var removed []string

	for _, e := range entries {
		rel := "dev/nvidia-caps/" + e.Name()
		if !capNodeName.MatchString(e.Name()) || keep[rel] {
			continue
		}

		path := filepath.Join(dir, e.Name())

		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || !migMinors[unix.Minor(st.Rdev)] {
			continue
		}

		link := filepath.Join(hostRoot, "dev/char", fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev)))
		if err := os.Remove(link); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return removed, fmt.Errorf("removing stale link %s: %w", link, err)
		}

		if err := os.Remove(path); err != nil {
			return removed, fmt.Errorf("removing stale capability node %s: %w", path, err)
		}

		removed = append(removed, rel)
	}

	return removed, nil
}

func isCharDev(path string, n Node) bool {
	var st unix.Stat_t

	return unix.Lstat(path, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == unix.Mkdev(n.Major, n.Minor)
}

// leftovers are the temporary names ensureNode and ensureLink use: a kill between their
// mknod or symlink and the rename leaves one behind.
var leftovers = []string{"dev/nvidia*.tmp", "dev/nvidia-caps/nvidia-cap*.tmp", "dev/char/*:*.tmp"}

// removeLeftovers removes the temporary nodes and links an earlier, killed sync left; only
// character devices and links, the only kinds it makes. A failure is logged: the sync
// itself replaces each one it needs.
func removeLeftovers(log *slog.Logger, hostRoot string) {
	for _, pattern := range leftovers {
		dir := filepath.Join(hostRoot, filepath.Dir(pattern))
		if st, err := os.Lstat(dir); err != nil || !st.IsDir() {
			continue // missing, or a link that the sync refuses and reports
		}

		paths, _ := filepath.Glob(filepath.Join(hostRoot, pattern)) //nolint:errcheck // only ErrBadPattern

		for _, p := range paths {
			st, err := os.Lstat(p)
			if err != nil || (st.Mode().Type() != fs.ModeCharDevice|fs.ModeDevice && st.Mode().Type() != fs.ModeSymlink) {
				continue
			}

			if err := os.Remove(p); err != nil {
				log.Warn("cannot remove a leftover temporary device node", "path", p, "error", err)

				continue
			}

			log.Info("removed a leftover temporary device node", "path", p)
		}
	}
}
