// Package specdiff checks that one CDI spec (ours, on the glibc subroot) gives a container
// everything another (nvidia-ctk's, on the host's installed driver) gives it, device by device:
// the same device names, and for each device the edits a container requesting it gets (the
// spec's common edits plus the device's own, as the CDI library applies them,
// tags.cncf.io/container-device-interface pkg/cdi/container-edits.go): device nodes, mounts,
// hooks and environment. hack/gpu-host/e2e-gpu.sh runs it through `cdi-e2e compare`.
//
// The two specs describe the same driver in two layouts (the installed tree, e.g.
// /usr/local/nvidia/lib64, against the subroot's usr/lib64), so files are matched by name and
// the arguments that name those layouts' directories are left out of hook comparison. A file
// of theirs that ours lacks is excused only when the subroot has no file of that name either:
// then the difference is the subroot's contents, not the spec generation.
package specdiff

import (
	"fmt"
	"io/fs"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"

	"tags.cncf.io/container-device-interface/specs-go"
)

// Tree is the set of file names in a driver root.
type Tree map[string]bool

// ReadTree walks root (the subroot) and records the name of every entry. It stays on root's
// filesystem and leaves out dev/, proc/ and sys/: what is mounted there at run time (the host's
// /dev under the driver root) is not the subroot's contents.
func ReadTree(root string) (Tree, error) {
	rootDev, err := lstatDev(root)
	if err != nil {
		return nil, fmt.Errorf("subroot %s: %w", root, err)
	}

	t := Tree{}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}

		if p == root {
			return nil
		}

		if d.IsDir() {
			rel, _ := filepath.Rel(root, p)
			if rel == "dev" || rel == "proc" || rel == "sys" {
				return filepath.SkipDir
			}

			if dev, err := lstatDev(p); err == nil && dev != rootDev {
				return filepath.SkipDir
			}
		}

		t[d.Name()] = true

		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading subroot %s: %w", root, err)
	}

	return t, nil
}

func lstatDev(p string) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		return 0, err
	}

	return st.Dev, nil
}

// Result lists what was found. Problems are differences without a reason (the comparison
// fails on any); Excused are files of theirs that ours lacks and the subroot lacks too.
// Each entry names the devices it applies to.
type Result struct {
	OurDevices, TheirDevices []string
	Problems                 []string
	Excused                  []string
	// Extra counts what ours gives that theirs does not (not a problem).
	Extra int
}

// OK says whether ours covers theirs.
func (r Result) OK() bool { return len(r.Problems) == 0 }

// findings collects messages and the devices each applies to, so that a difference in the
// common edits is reported once, not once per device.
type findings struct {
	order   []string
	devices map[string][]string
}

func (f *findings) add(msg, device string) {
	if f.devices == nil {
		f.devices = map[string][]string{}
	}

	if _, ok := f.devices[msg]; !ok {
		f.order = append(f.order, msg)
	}

	f.devices[msg] = append(f.devices[msg], device)
}

func (f *findings) list(all int) []string {
	out := make([]string, 0, len(f.order))
	for _, m := range f.order {
		d := f.devices[m]
		if len(d) == all {
			out = append(out, m+" (every device)")
		} else {
			out = append(out, fmt.Sprintf("%s (device %s)", m, strings.Join(d, ", ")))
		}
	}

	return out
}

// Compare checks ours against theirs. subroot is the file names of our driver root.
func Compare(ours, theirs *specs.Spec, subroot Tree) Result {
	var r Result

	r.OurDevices, r.TheirDevices = names(ours), names(theirs)

	var problems, excused findings

	for _, n := range r.TheirDevices {
		if !slices.Contains(r.OurDevices, n) {
			problems.add("device "+n+" of theirs is not in ours", n)
		}
	}

	for _, n := range r.OurDevices {
		if !slices.Contains(r.TheirDevices, n) {
			problems.add("device "+n+" of ours is not in theirs", n)
		}
	}

	compared := 0

	for _, n := range r.TheirDevices {
		od := device(ours, n)
		if od == nil {
			continue
		}

		compared++

		o, t := effective(ours, od), effective(theirs, device(theirs, n))
		r.Extra += compareEdits(o, t, subroot, n, &problems, &excused)
	}

	r.Problems = problems.list(compared)
	r.Excused = excused.list(compared)

	return r
}

func names(s *specs.Spec) []string {
	n := make([]string, 0, len(s.Devices))
	for _, d := range s.Devices {
		n = append(n, d.Name)
	}

	sort.Strings(n)

	return n
}

func device(s *specs.Spec, name string) *specs.Device {
	for i := range s.Devices {
		if s.Devices[i].Name == name {
			return &s.Devices[i]
		}
	}

	return nil
}

// effective is what a container requesting d gets: the spec's common edits, then d's.
func effective(s *specs.Spec, d *specs.Device) specs.ContainerEdits {
	var e specs.ContainerEdits

	for _, src := range []specs.ContainerEdits{s.ContainerEdits, d.ContainerEdits} {
		e.Env = append(e.Env, src.Env...)
		e.DeviceNodes = append(e.DeviceNodes, src.DeviceNodes...)
		e.Mounts = append(e.Mounts, src.Mounts...)
		e.Hooks = append(e.Hooks, src.Hooks...)
	}

	return e
}

// compareEdits adds what theirs has and ours lacks to problems (or excused) and returns how
// many items ours has beyond theirs.
func compareEdits(o, t specs.ContainerEdits, subroot Tree, dev string, problems, excused *findings) int {
	extra := 0

	// Device nodes by their path in the container.
	on, tn := set(o.DeviceNodes, func(n *specs.DeviceNode) string { return n.Path }),
		set(t.DeviceNodes, func(n *specs.DeviceNode) string { return n.Path })
	for _, p := range sorted(tn) {
		if !on[p] {
			problems.add("device node "+p+" missing", dev)
		}
	}

	extra += beyond(on, tn)

	// Mounts by file name (the layouts' directories differ by design), runtime sockets by
	// their container path (the same in both).
	om, tm := set(o.Mounts, mountKey), set(t.Mounts, mountKey)
	for _, k := range sorted(tm) {
		if om[k] {
			continue
		}

		if base := path.Base(k); !subroot[base] {
			excused.add("mount "+k+": the subroot has no "+base, dev)
		} else {
			problems.add("mount "+k+" missing, though the subroot has "+base, dev)
		}
	}

	extra += beyond(om, tm)

	// Hooks: each create-symlinks link on its own, the rest by name and arguments.
	oh, th := hookKeys(o.Hooks), hookKeys(t.Hooks)
	for _, name := range sorted(th) {
		if _, ok := oh[name]; ok {
			continue
		}

		k := th[name]

		if k.file != "" && !subroot[k.file] {
			excused.add("hook "+k.key+": the subroot has no "+k.file, dev)
		} else {
			problems.add("hook "+k.key+" missing", dev)
		}
	}

	// Environment: the same variables; a value that is a path names a layout and may differ.
	oe, te := envMap(o.Env), envMap(t.Env)
	for _, k := range sorted(te) {
		ov, ok := oe[k]

		switch {
		case !ok:
			problems.add("environment "+k+" missing", dev)
		case ov != te[k] && !(strings.HasPrefix(ov, "/") && strings.HasPrefix(te[k], "/")):
			problems.add(fmt.Sprintf("environment %s=%s, theirs %s", k, ov, te[k]), dev)
		}
	}

	return extra
}

func set[T any](items []*T, key func(*T) string) map[string]bool {
	m := make(map[string]bool, len(items))
	for _, it := range items {
		if it != nil {
			m[key(it)] = true
		}
	}

	return m
}

func sorted[V any](m map[string]V) []string {
	k := make([]string, 0, len(m))
	for s := range m {
		k = append(k, s)
	}

	sort.Strings(k)

	return k
}

func beyond(ours, theirs map[string]bool) int {
	n := 0

	for k := range ours {
		if !theirs[k] {
			n++
		}
	}

	return n
}

func mountKey(m *specs.Mount) string {
	p := path.Clean(m.ContainerPath)
	if strings.HasPrefix(p, "/var/run/") {
		p = strings.TrimPrefix(p, "/var")
	}

	if strings.HasPrefix(p, "/run/") {
		return p
	}

	return path.Base(p)
}

// layoutFlags name directories of one layout: the driver root, the library folders, the
// ldconfig the hook runs (ours is the extension's static one, theirs the host's). Their
// values differ by design; the mounts they refer to are compared on their own.
var layoutFlags = []string{"--driver-root", "--folder", "--ldconfig-path"}

type hookKey struct {
	key string
	// file is the library a create-symlinks link points at, for the subroot excuse.
	file string
}

func hookKeys(hooks []*specs.Hook) map[string]hookKey {
	m := map[string]hookKey{}

	for _, h := range hooks {
		if h == nil {
			continue
		}

		args := h.Args
		if len(args) > 0 {
			args = args[1:] // the program's name
		}

		if len(args) > 0 && args[0] == "hook" { // nvidia-ctk hook SUBCOMMAND
			args = args[1:]
		}

		sub := "(none)"
		if len(args) > 0 {
			sub, args = args[0], args[1:]
		}

		prefix := h.HookName + " " + sub
		if sub == "create-symlinks" {
			for _, l := range linkArgs(args) {
				target, link, _ := strings.Cut(l, "::")
				k := hookKey{key: prefix + " --link " + path.Base(target) + "::" + path.Base(link), file: path.Base(target)}
				m[k.key] = k
			}

			continue
		}

		var rest []string

		for i := 0; i < len(args); i++ {
			a := args[i]
			flag, _, hasValue := strings.Cut(a, "=")

			if slices.Contains(layoutFlags, flag) {
				if !hasValue {
					i++
				}

				continue
			}

			rest = append(rest, a)
		}

		k := hookKey{key: strings.TrimSpace(prefix + " " + strings.Join(rest, " "))}
		m[k.key] = k
	}

	return m
}

// linkArgs returns the TARGET::LINK values of --link flags (--link X or --link=X).
func linkArgs(args []string) []string {
	var links []string

	for i := 0; i < len(args); i++ {
		switch {
		case args[i] == "--link" && i+1 < len(args):
			links = append(links, args[i+1])
			i++
		case strings.HasPrefix(args[i], "--link="):
			links = append(links, strings.TrimPrefix(args[i], "--link="))
		}
	}

	return links
}

func envMap(env []string) map[string]string {
	m := make(map[string]string, len(env))
	for _, e := range env {
		k, v, _ := strings.Cut(e, "=")
		m[k] = v
	}

	return m
}
