// Command cdi-e2e holds the steps of the GPU end-to-end test that need Go: injecting a CDI
// device into an OCI runtime config the way containerd does, comparing two CDI specs, and
// timing two commands against each other. hack/gpu-host/e2e-gpu.sh drives it.
//
//	cdi-e2e inject --spec-dir DIR --config BUNDLE/config.json [--device nvidia.com/gpu=all ...] [--nodes-only] [--rootfs DIR] -- ARGS...
//	cdi-e2e compare --subroot DIR OURS THEIRS
//	cdi-e2e hostpaths SPEC...
//	cdi-e2e driverfiles --out MANIFEST DIR...
//	cdi-e2e driverfree --rootfs DIR [--manifest MANIFEST] [--dir DIR ...]
//	cdi-e2e bench -n 10 --a "CMD..." --b "CMD..." [--min-speedup X] [--max-rss-ratio Y]
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/specs-go"

	"github.com/talos-nvidia/nvidia-driver/hack/gpu-host/cdi-e2e/driverfree"
	"github.com/talos-nvidia/nvidia-driver/hack/gpu-host/cdi-e2e/specdiff"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: cdi-e2e inject|compare|bench|hostpaths|driverfiles|driverfree ...")
		os.Exit(2)
	}

	var err error

	switch os.Args[1] {
	case "inject":
		err = inject(os.Args[2:])
	case "compare":
		err = compare(os.Args[2:])
	case "bench":
		err = bench(os.Args[2:])
	case "hostpaths":
		err = hostPaths(os.Args[2:])
	case "driverfiles":
		err = driverFiles(os.Args[2:])
	case "driverfree":
		err = driverFree(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}

	if err != nil {
		fmt.Fprintln(os.Stderr, "cdi-e2e:", err)
		os.Exit(1)
	}
}

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

// inject rewrites a `runc spec` config: rootfs, process, and the CDI edits of the devices,
// applied with the CDI library as containerd applies them.
func inject(args []string) error {
	fs := flag.NewFlagSet("inject", flag.ContinueOnError)
	specDir := fs.String("spec-dir", "", "CDI spec directory")
	config := fs.String("config", "", "OCI config.json to rewrite")
	rootfs := fs.String("rootfs", "", "container root filesystem")
	var devices, env list
	fs.Var(&devices, "device", "CDI device to inject (repeatable)")
	fs.Var(&env, "env", "extra environment (repeatable)")
	nodesOnly := fs.Bool("nodes-only", false, "inject only the devices' device nodes (and their cgroup rules), none of the spec's mounts, hooks or environment: the e2e's control")

	if err := fs.Parse(args); err != nil {
		return err
	}

	data, err := os.ReadFile(*config)
	if err != nil {
		return err
	}

	var spec oci.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return fmt.Errorf("%s: %w", *config, err)
	}

	spec.Root = &oci.Root{Path: *rootfs}
	spec.Process.Terminal = false
	spec.Process.Args = fs.Args()
	spec.Process.Env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}, env...)
	// The workload is a test of devices, not of confinement: keep the default namespaces
	// but let it see the GPU the way a Kubernetes pod with a device does.
	spec.Hostname = "cdi-e2e"

	if len(devices) > 0 {
		cache, err := cdi.NewCache(cdi.WithSpecDirs(*specDir), cdi.WithAutoRefresh(false))
		if err != nil {
			return fmt.Errorf("loading CDI specs from %s: %w", *specDir, err)
		}

		for path, errs := range cache.GetErrors() {
			return fmt.Errorf("CDI spec %s: %v", path, errs)
		}

		if *nodesOnly {
			if err := injectNodes(cache, &spec, devices); err != nil {
				return err
			}
		} else if unresolved, err := cache.InjectDevices(&spec, devices...); err != nil {
			return fmt.Errorf("injecting %v (unresolved %v): %w", devices, unresolved, err)
		}
	}

	out, err := json.MarshalIndent(&spec, "", "  ")
	if err != nil {
		return err
	}

	return os.WriteFile(*config, out, 0o644)
}

// injectNodes applies only the device nodes that the devices' CDI edits name (the spec's
// common ones and each device's own), with the CDI library's own edit code: the control
// container has the GPU's device nodes and nothing of the driver.
func injectNodes(cache *cdi.Cache, spec *oci.Spec, devices []string) error {
	var nodes []*specs.DeviceNode

	seen := map[string]bool{}
	add := func(ns []*specs.DeviceNode) {
		for _, n := range ns {
			if !seen[n.Path] {
				seen[n.Path] = true
				nodes = append(nodes, n)
			}
		}
	}

	specsSeen := map[*cdi.Spec]bool{}

	for _, name := range devices {
		d := cache.GetDevice(name)
		if d == nil {
			return fmt.Errorf("no CDI device %s", name)
		}

		if s := d.GetSpec(); !specsSeen[s] {
			specsSeen[s] = true
			add(s.ContainerEdits.DeviceNodes)
		}

		add(d.ContainerEdits.DeviceNodes)
	}

	if len(nodes) == 0 {
		return fmt.Errorf("devices %v name no device nodes", devices)
	}

	edits := cdi.ContainerEdits{ContainerEdits: &specs.ContainerEdits{DeviceNodes: nodes}}
	if err := edits.Apply(spec); err != nil {
		return fmt.Errorf("injecting the device nodes of %v: %w", devices, err)
	}

	return nil
}

// hostPaths checks that every host path a spec names exists here: device nodes (hostPath,
// or path when it has none), mount sources and hook programs, in the common edits and in
// every device. runc resolves them in the mount namespace it runs in, which is this one.
func hostPaths(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: hostpaths SPEC...")
	}

	missing := 0

	for _, file := range args {
		spec, err := cdi.ReadSpec(file, 0)
		if err != nil {
			return err
		}

		edits := []struct {
			where string
			edits specs.ContainerEdits
		}{{"containerEdits", spec.ContainerEdits}}
		for _, d := range spec.Devices {
			edits = append(edits, struct {
				where string
				edits specs.ContainerEdits
			}{"device " + d.Name, d.ContainerEdits})
		}

		check := func(where, kind, path string) {
			_, err := os.Stat(path)
			state := "ok"

			if err != nil {
				state = "MISSING"
				missing++
			}

			fmt.Printf("%-8s %-12s %s (%s)\n", state, kind, path, where)
		}

		for _, e := range edits {
			for _, n := range e.edits.DeviceNodes {
				p := n.HostPath
				if p == "" {
					p = n.Path
				}

				check(e.where, "deviceNode", p)
			}

			for _, m := range e.edits.Mounts {
				check(e.where, "mount", m.HostPath)
			}

			for _, h := range e.edits.Hooks {
				check(e.where, "hook", h.Path)
			}
		}
	}

	if missing > 0 {
		return fmt.Errorf("%d host path(s) named in %s do not exist", missing, strings.Join(args, ", "))
	}

	return nil
}

// driverFiles writes the manifest of a driver tree's files (its lib64 and bin), read later
// by driverfree where the tree is hidden.
func driverFiles(args []string) error {
	fs := flag.NewFlagSet("driverfiles", flag.ContinueOnError)
	out := fs.String("out", "", "manifest to write")

	if err := fs.Parse(args); err != nil {
		return err
	}

	if *out == "" || fs.NArg() == 0 {
		return fmt.Errorf("usage: driverfiles --out MANIFEST DIR...")
	}

	m, err := driverfree.MakeManifest(fs.Args()...)
	if err != nil {
		return err
	}

	var b strings.Builder
	if err := m.Write(&b); err != nil {
		return err
	}

	fmt.Printf("driver files: %d in %s\n", len(m), strings.Join(fs.Args(), ", "))

	return os.WriteFile(*out, []byte(b.String()), 0o644)
}

// driverFree fails when a container's root filesystem holds the host's driver where a
// workload would find it (hack/gpu-host/cdi-e2e/driverfree).
func driverFree(args []string) error {
	fs := flag.NewFlagSet("driverfree", flag.ContinueOnError)
	rootfs := fs.String("rootfs", "", "the container's root filesystem")
	manifest := fs.String("manifest", "", "the driver tree's files (driverfiles)")

	var dirs list
	fs.Var(&dirs, "dir", "a directory of the container to look in besides the standard ones (repeatable)")

	if err := fs.Parse(args); err != nil {
		return err
	}

	if *rootfs == "" {
		return fmt.Errorf("usage: driverfree --rootfs DIR [--manifest FILE] [--dir DIR ...]")
	}

	m := driverfree.Manifest{}

	if *manifest != "" {
		f, err := os.Open(*manifest)
		if err != nil {
			return err
		}

		m, err = driverfree.ReadManifest(f)
		f.Close()

		if err != nil {
			return fmt.Errorf("%s: %w", *manifest, err)
		}
	}

	found, err := driverfree.Check(*rootfs, m, dirs...)
	if err != nil {
		return err
	}

	for _, f := range found {
		fmt.Printf("  driver visible in the rootfs: %s (%s)\n", f.Path, f.Why)
	}

	if len(found) > 0 {
		return fmt.Errorf("the host's driver is visible in %s: %d file(s)", *rootfs, len(found))
	}

	fmt.Printf("driverfree: no file of the driver (%s, or any of %d files of the tree) where a workload looks in %s\n",
		strings.Join(driverfree.Core, ", "), len(m), *rootfs)

	return nil
}

// compare checks that our spec gives a container everything nvidia-ctk's gives it, device by
// device (hack/gpu-host/cdi-e2e/specdiff); a file of theirs that ours lacks is excused only when the
// subroot has no file of that name.
func compare(args []string) error {
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	subroot := fs.String("subroot", "", "the glibc subroot our spec was generated from")

	if err := fs.Parse(args); err != nil {
		return err
	}

	if fs.NArg() != 2 || *subroot == "" {
		return fmt.Errorf("usage: compare --subroot DIR OURS THEIRS")
	}

	ours, err := cdi.ReadSpec(fs.Arg(0), 0)
	if err != nil {
		return err
	}

	theirs, err := cdi.ReadSpec(fs.Arg(1), 0)
	if err != nil {
		return err
	}

	tree, err := specdiff.ReadTree(*subroot)
	if err != nil {
		return err
	}

	r := specdiff.Compare(ours.Spec, theirs.Spec, tree)
	fmt.Printf("device names: ours %v, theirs %v\n", r.OurDevices, r.TheirDevices)
	fmt.Printf("per device (common edits and its own): device nodes, mounts, hooks, environment\n")

	for _, e := range r.Excused {
		fmt.Printf("  excused: %s\n", e)
	}

	for _, p := range r.Problems {
		fmt.Printf("  PROBLEM: %s\n", p)
	}

	fmt.Printf("theirs missing in ours: %d excused, %d unexplained; ours has %d item(s) beyond theirs\n", len(r.Excused), len(r.Problems), r.Extra)

	if !r.OK() {
		return fmt.Errorf("%d unexplained difference(s)", len(r.Problems))
	}

	fmt.Println("compare: OK")

	return nil
}

// bench runs two commands alternately and reports the median wall time and peak RSS of each.
func bench(args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	n := fs.Int("n", 10, "runs of each")
	a := fs.String("a", "", "first command (shell)")
	b := fs.String("b", "", "second command (shell)")
	nameA := fs.String("name-a", "a", "")
	nameB := fs.String("name-b", "b", "")
	minSpeedup := fs.Float64("min-speedup", 0, "fail unless b's median wall time is at most a's divided by this (0: not checked)")
	maxRSS := fs.Float64("max-rss-ratio", 0, "fail unless b's median peak RSS is at most a's times this (0: not checked)")

	if err := fs.Parse(args); err != nil {
		return err
	}

	type result struct {
		wall []time.Duration
		rss  []int64
	}

	results := map[string]*result{*nameA: {}, *nameB: {}}
	cmds := map[string]string{*nameA: *a, *nameB: *b}

	for i := range *n {
		order := []string{*nameA, *nameB}
		if i%2 == 1 {
			order = []string{*nameB, *nameA}
		}

		for _, name := range order {
			// exec the command directly (no shell) so that its own RSS is measured.
			argv := strings.Fields(cmds[name])
			cmd := exec.Command(argv[0], argv[1:]...)
			cmd.Stdout, cmd.Stderr = nil, nil

			start := time.Now()
			if err := cmd.Run(); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}

			results[name].wall = append(results[name].wall, time.Since(start))
			results[name].rss = append(results[name].rss, cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss)
		}
	}

	med := func(r *result) (time.Duration, int64) {
		slices.Sort(r.wall)
		slices.Sort(r.rss)

		return r.wall[len(r.wall)/2], r.rss[len(r.rss)/2]
	}

	wa, ra := med(results[*nameA])
	wb, rb := med(results[*nameB])

	fmt.Printf("bench (%d runs each, alternating, median):\n", *n)
	fmt.Printf("  %-20s wall %7.1f ms  peak RSS %6.1f MB\n", *nameA, float64(wa.Microseconds())/1000, float64(ra)/1024)
	fmt.Printf("  %-20s wall %7.1f ms  peak RSS %6.1f MB\n", *nameB, float64(wb.Microseconds())/1000, float64(rb)/1024)
	speedup, rssRatio := float64(wa)/float64(wb), float64(rb)/float64(ra)
	fmt.Printf("  %s against %s: %.2fx the speed (wall), %.2fx less peak RSS (measurements)\n", *nameB, *nameA, speedup, 1/rssRatio)

	return benchBounds(*nameA, *nameB, speedup, rssRatio, *minSpeedup, *maxRSS)
}

// benchBounds checks the ratios against the bounds given (0: that one is not checked) and
// says which were.
func benchBounds(nameA, nameB string, speedup, rssRatio, minSpeedup, maxRSS float64) error {
	var failed []string

	if minSpeedup > 0 {
		ok := speedup >= minSpeedup
		fmt.Printf("  bound: %s at least %.2fx the speed of %s: %.2fx, %s\n", nameB, minSpeedup, nameA, speedup, passFail(ok))

		if !ok {
			failed = append(failed, fmt.Sprintf("speed %.2fx < %.2fx", speedup, minSpeedup))
		}
	}

	if maxRSS > 0 {
		ok := rssRatio <= maxRSS
		fmt.Printf("  bound: %s peak RSS at most %.2fx %s's: %.2fx, %s\n", nameB, maxRSS, nameA, rssRatio, passFail(ok))

		if !ok {
			failed = append(failed, fmt.Sprintf("peak RSS %.2fx > %.2fx", rssRatio, maxRSS))
		}
	}

	if minSpeedup <= 0 && maxRSS <= 0 {
		fmt.Println("  no bound given: the figures are measurements only")
	}

	if len(failed) > 0 {
		return fmt.Errorf("bench: %s against %s: %s", nameB, nameA, strings.Join(failed, ", "))
	}

	return nil
}

func passFail(ok bool) string {
	if ok {
		return "PASS"
	}

	return "FAIL"
}
