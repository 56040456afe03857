// Command harness runs the assembled extension's service the way Talos runs it (see
// internal/harness), with the runc it is given (-runc: Talos v1.13 ships runc 1.4), in a
// private mount namespace, and prints what the host side saw. It changes nothing on the
// machine. It exits 3 when the result is not what it waited for (a phase not in -until, an
// -after-ready command that failed or never ran), 1 when it could not run.
//
//	go run ./hack/harness [-extension DIR] [-env K=V ...] [-config MOUNTPATH=FILE ...]
//	                      [-document-after 2s] [-then restart|change|remove] [-then-env K=V ...]
//	                      [-override NODEPATH=FILE ...]
//	                      [-until waiting,ready,failed] [-wait 60s] [-hold 3s] [-json]
//
// -env and -config make the service's ExtensionServiceConfig; without either the node has
// none, and the service runs with its defaults.
//
// On a GPU host, build the payload from the host's driver first:
//
//	hack/dev/build-subroot.sh host _out/subroot-host && \
//	go run ./hack/release/extension -name nvidia-driver-dev-host -payload _out/subroot-host && \
//	go run ./hack/harness -extension _out/extensions/nvidia-driver-dev-host \
//	    -env NVIDIA_DRIVER_PERSISTENCE_MODE=false -until ready,failed
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/talos-nvidia/nvidia-driver/internal/harness"
)

const envInside = "NVIDIA_DRIVER_HARNESS_INSIDE"

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("harness", flag.ContinueOnError)
	fs.SetOutput(stderr)

	var env, configs, overrides, thenEnv list

	ext := fs.String("extension", "_out/extensions/nvidia-driver-dev-debian", "assembled extension directory (make extension)")
	fs.Var(&env, "env", "ExtensionServiceConfig environment entry K=V (repeatable)")
	fs.Var(&configs, "config", "ExtensionServiceConfig file MOUNTPATH=LOCALFILE (repeatable)")
	until := fs.String("until", "waiting,ready,failed", "service phases to wait for before SIGTERM")
	wait := fs.Duration("wait", 60*time.Second, "longest wait for -until")
	hold := fs.Duration("hold", 3*time.Second, "watch the service this long after -until before stopping it")
	afterPhases := fs.String("after-ready-phases", "ready", "the service phases in which -after-ready runs")
	beforeBoot := fs.String("before-boot", "", "shell command to run on the node once the extension is laid, before the service starts (e.g. hack/sim-node/sim-node.sh)")
	afterReady := fs.String("after-ready", "", "shell command to run while the service is ready (e.g. hack/gpu-host/e2e-workload.sh)")
	docAfter := fs.Duration("document-after", 0, "boot without the ExtensionServiceConfig and add it this long after the service started")
	then := fs.String("then", "", "once -until and -hold are over: restart (stop and start the service), change (apply -then-env as a change of the document) or remove (delete the document); then wait for -until again and stop")
	fs.Var(&thenEnv, "then-env", "environment of the changed document for -then change (repeatable)")
	fs.Var(&overrides, "override", "bind LOCALFILE over NODEPATH once the extension is laid: NODEPATH=LOCALFILE (repeatable)")
	changes := fs.Int("changes", 0, "with -after-ready: run it in the background and change the document this many times meanwhile (a restart by Talos each)")
	changeEvery := fs.Duration("change-every", 0, "with -changes: wait this long before each change")
	runc := fs.String("runc", "runc", "runc binary")
	ociHook := fs.String("oci-hook", "", "an OCI createContainer hook for the service's container, program and arguments separated by spaces (a simulated node's /proc/driver: hack/sim-node/simnvml/prochook)")
	asJSON := fs.Bool("json", false, "print the result as JSON")

	if err := fs.Parse(args); err != nil {
		return 2
	}

	if os.Getenv(envInside) == "" {
		return reexec(args, stderr)
	}

	configFiles, err := pairs("-config", "MOUNTPATH=LOCALFILE", configs)
	if err != nil {
		fmt.Fprintln(stderr, "harness:", err)

		return 2
	}

	files := map[string]string{}

	for mountPath, local := range configFiles {
		data, err := os.ReadFile(local)
		if err != nil {
			fmt.Fprintln(stderr, "harness:", err)

			return 2
		}

		files[mountPath] = string(data)
	}

	var doc *harness.Document
	if len(env) > 0 || len(files) > 0 {
		doc = &harness.Document{Files: files, Environment: env}
	}

	over, err := pairs("-override", "NODEPATH=LOCALFILE", overrides)
	if err != nil {
		fmt.Fprintln(stderr, "harness:", err)

		return 2
	}

	runcPath, err := exec.LookPath(*runc)
	if err != nil {
		fmt.Fprintln(stderr, "harness: runc not found (hack/dev/install-test-deps.sh installs it):", err)

		return 2
	}

	res, err := harness.Run(harness.Options{
		Extension: *ext, Document: doc, DocumentAfter: *docAfter, Until: strings.Split(*until, ","),
		Wait: *wait, Hold: *hold, Then: *then, ThenDocument: &harness.Document{Environment: thenEnv}, Overrides: over, AfterReady: *afterReady, BeforeBoot: *beforeBoot, AfterPhases: strings.Split(*afterPhases, ","), Changes: *changes, ChangeEvery: *changeEvery,
		Work: os.Getenv(envInside), Runc: runcPath, Log: stderr, CreateContainerHook: strings.Fields(*ociHook),
	})
	if err != nil {
		fmt.Fprintln(stderr, "harness:", err)

		return 1
	}

	if *asJSON {
		if err := json.NewEncoder(stdout).Encode(res); err != nil {
			return 1
		}
	} else {
		printSummary(stdout, res)
	}

	if problems := checkResult(res, strings.Split(*until, ","), *afterReady != ""); len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintln(stderr, "harness: FAIL:", p)
		}

		return exitCheckFailed
	}

	return 0
}

// exitCheckFailed is the exit code of a run whose result is not what it waited for; the
// result is printed all the same.
const exitCheckFailed = 3

// checkResult lists what makes a run fail: a phase it did not wait for, an -after-ready
// command that failed or never ran, a change of the document after which the service did not
// come back to a phase waited for.
func checkResult(res harness.Result, until []string, afterReady bool) []string {
	var out []string

	if !slices.Contains(until, res.Phase) {
		out = append(out, fmt.Sprintf("the service's phase is %q, not one of %v (%s)", res.Phase, until, res.Message))
	}

	switch {
	case afterReady && res.AfterReadyExit == nil:
		out = append(out, "the -after-ready command did not run: the service never reached a phase it runs in")
	case afterReady && *res.AfterReadyExit != 0:
		out = append(out, fmt.Sprintf("the -after-ready command exited %d", *res.AfterReadyExit))
	}

	for i, p := range res.ChangePhases {
		if !slices.Contains(until, p) {
			out = append(out, fmt.Sprintf("after change %d of the document the phase is %q", i+1, p))
		}
	}

	if res.Second != nil && !slices.Contains(until, res.Second.Phase) && res.Second.Phase != "" {
		out = append(out, fmt.Sprintf("after -then the phase is %q", res.Second.Phase))
	}

	return out
}

// pairs splits each K=V value of a repeatable flag.
func pairs(flag, form string, values []string) (map[string]string, error) {
	out := map[string]string{}

	for _, v := range values {
		k, val, ok := strings.Cut(v, "=")
		if !ok {
			return nil, fmt.Errorf("%s %q: want %s", flag, v, form)
		}

		out[k] = val
	}

	return out, nil
}

// reexec runs this program again in a private mount namespace, with a scratch directory.
func reexec(args []string, stderr io.Writer) int {
	work, err := os.MkdirTemp("", "nvidia-driver-harness-")
	if err != nil {
		fmt.Fprintln(stderr, "harness:", err)

		return 1
	}
	defer os.RemoveAll(work) //nolint:errcheck // empty once the namespace is gone

	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(stderr, "harness:", err)

		return 1
	}

	cmd := exec.Command("unshare", append([]string{"--mount", "--propagation", "private", self}, args...)...)
	cmd.Env = append(os.Environ(), envInside+"="+work)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, stderr

	if err := cmd.Run(); err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}

		fmt.Fprintln(stderr, "harness:", err)

		return 1
	}

	return 0
}

func printSummary(w io.Writer, r harness.Result) {
	yes := func(b bool) string {
		if b {
			return "yes"
		}

		return "no"
	}

	fmt.Fprintf(w, "service            %s (rootfs propagation %q, %d capabilities, seccomp: containerd's default profile)\n", r.Service, r.RootfsPropagates, r.CapabilityCount)
	fmt.Fprintf(w, "up                 %v (what the boot waits for)\n", r.Up)
	if r.Failed != "" {
		fmt.Fprintf(w, "failed             %s\n", r.Failed)
	}
	fmt.Fprintf(w, "phase              %s: %s\n", r.Phase, r.Message)
	fmt.Fprintf(w, "status after       %d ms\n", r.StartMillis)
	fmt.Fprintf(w, "driver root        mounted %s, read-only %s; after stop: mounted %s, read-only %s\n",
		yes(r.DriverRoot.Mounted), yes(r.DriverRoot.ReadOnly), yes(r.DriverRootAfter.Mounted), yes(r.DriverRootAfter.ReadOnly))
	fmt.Fprintf(w, "/dev               %s\n", strings.Join(r.DevEntries, " "))
	fmt.Fprintf(w, "CDI spec           %s; readiness file %s\n", yes(r.CDISpec), yes(r.ReadyFile))
	if r.AfterReadyExit != nil {
		fmt.Fprintf(w, "after ready        command exit code %d\n", *r.AfterReadyExit)
	}
	fmt.Fprintf(w, "peer groups        %s\n", peerGroups(r.PeerGroups))
	fmt.Fprintf(w, "socket dir mounts  %d while running, %d after stop\n", r.SocketDir, r.SocketDirAfterStop)
	fmt.Fprintf(w, "containers started %d; exited by themselves with codes %v (each restarted after 5 s: restart always)\n", r.Starts, r.Exits)
	fmt.Fprintf(w, "stop               SIGTERM to every process -> exit %d in %d ms\n", r.ExitCode, r.StopMillis)
	if r.Second != nil {
		fmt.Fprintf(w, "then               %s: %s; socket dir mounts %d; stop: exit %d in %d ms\n",
			r.Second.Phase, r.Second.Message, r.Second.SocketDir, r.Second.ExitCode, r.Second.StopMillis)
	}
	fmt.Fprintf(w, "talos events:\n  %s\n", strings.Join(r.Events, "\n  "))
	fmt.Fprintf(w, "log (%d waiting line(s)):\n%s", r.WaitingLogLines, r.Log)
	if r.Second != nil {
		fmt.Fprintf(w, "log after -then:\n%s", r.Second.Log)
	}
}

func peerGroups(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}

	sort.Strings(keys)

	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		v := m[k]
		if v == "" {
			v = "not shared"
		}

		parts = append(parts, k+" "+v)
	}

	return strings.Join(parts, ", ")
}
