// Command cdi-e2e holds the steps of the GPU end-to-end test that need Go: injecting a CDI
// device into an OCI runtime config the way containerd does, comparing two CDI specs, and
// timing two commands against each other. hack/e2e-gpu.sh drives it.
//
//	cdi-e2e inject --spec-dir DIR --config BUNDLE/config.json [--device nvidia.com/gpu=all ...] [--rootfs DIR] -- ARGS...
//	cdi-e2e compare --subroot DIR OURS THEIRS
//	cdi-e2e hostpaths SPEC...
//	cdi-e2e bench -n 10 --a "CMD..." --b "CMD..."
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

	"github.com/talos-nvidia/nvidia-driver/hack/cdi-e2e/specdiff"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: cdi-e2e inject|compare|bench|hostpaths ...")
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

		if unresolved, err := cache.InjectDevices(&spec, devices...); err != nil {
			return fmt.Errorf("injecting %v (unresolved %v): %w", devices, unresolved, err)
		}
	}

	out, err := json.MarshalIndent(&spec, "", "  ")
	if err != nil {
		return err
	}

	return os.WriteFile(*config, out, 0o644)
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

// compare checks that our spec gives a container everything nvidia-ctk's gives it, device by
// device (hack/cdi-e2e/specdiff); a file of theirs that ours lacks is excused only when the
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
	fmt.Printf("  %s against %s: %.2fx the speed (wall), %.2fx less peak RSS\n", *nameB, *nameA, float64(wa)/float64(wb), float64(ra)/float64(rb))

	return nil
}
