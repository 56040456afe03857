package testutil

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"golang.org/x/sys/unix"

	"github.com/talos-nvidia/nvidia-driver/internal/sim"
	"github.com/talos-nvidia/nvidia-driver/pkg/fabricmanager"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu"
	"github.com/talos-nvidia/nvidia-driver/pkg/nvmljobs"
)

// HGX is a simulated HGX board: eight GPUs, the NVSwitch files of sim.NVSwitches under a
// throwaway host root, a subroot (the Debian-built one with an overlay) whose
// nv-fabricmanager is the fake daemon (internal/fakedaemon), and NVML that
// reports the GPUs registered once a fabric manager's API socket answers.
type HGX struct {
	Host, Subroot string
	// Args records the fake fabric manager's starts; Control holds its FAKEDAEMON_MODE.
	Args, Control string
	GPUs          *sim.Node
}

// HGXOptions say what the board is like.
type HGXOptions struct {
	Switches sim.NVSwitches
	// PreHopper makes an HGX A100 board: NVSwitch gen 2 switches, A100 GPUs, whose NVML
	// reports no fabric registration.
	PreHopper bool
	Mode      string // the fake fabric manager's FAKEDAEMON_MODE
	NoBinary  bool   // the subroot ships no nv-fabricmanager
	// ForeignAPI: a foreign fabric manager answers on the API TCP port of the shipped config.
	ForeignAPI bool
	// Registered: the GPUs are registered with the fabric before anything starts.
	Registered bool
	// RegisterAfter is how long the GPUs take to register once a fabric manager runs (300 ms).
	RegisterAfter time.Duration
}

// NewHGX builds the board and points the fake daemon's settings at it.
func NewHGX(t *testing.T, o HGXOptions) *HGX {
	t.Helper()
	RequireRoot(t)

	dir, err := os.MkdirTemp("", "hgx") // short: UNIX socket paths live under it
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() { os.RemoveAll(dir) }) //nolint:errcheck

	b := &HGX{Host: filepath.Join(dir, "h"), Args: filepath.Join(dir, "args"), Control: filepath.Join(dir, "mode")}
	must(t, os.MkdirAll(b.Host, 0o755))
	b.SetMode(t, o.Mode)

	// The foreign fabric manager's API port, or one nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)

	apiPort := l.Addr().(*net.TCPAddr).Port
	if o.ForeignAPI {
		t.Cleanup(func() { l.Close() }) //nolint:errcheck

		go func() {
			for c, err := l.Accept(); err == nil; c, err = l.Accept() {
				c.Close() //nolint:errcheck
			}
		}()
	} else {
		must(t, l.Close())
	}

	b.Subroot = overlaySubroot(t, dir, o.NoBinary, apiPort)

	model := "h200"
	if o.PreHopper {
		model = "a100-80gb"
		o.Switches.DeviceID = 0x1af1
	}

	b.GPUs = sim.New(Model(t, model), 8)
	if o.RegisterAfter == 0 {
		o.RegisterAfter = 300 * time.Millisecond
	}

	if !o.PreHopper {
		b.GPUs.SetFabric(sim.Fabric{RegisterAfter: o.RegisterAfter, Manager: func() bool {
			return o.ForeignAPI || o.Registered || b.socketAnswers()
		}})
	}

	if r := b.GPUs.Init(); r != nvml.SUCCESS {
		t.Fatalf("simulated NVML: %v", r)
	}

	if o.Registered {
		b.GPUs.SetFabric(sim.Fabric{Manager: func() bool { return true }})
		_, err := gpu.Fabric(b.GPUs)
		must(t, err)
	}

	must(t, sim.WriteProcFS(b.Host, b.GPUs))

	if r := b.GPUs.Shutdown(); r != nvml.SUCCESS {
		t.Fatalf("simulated NVML: %v", r)
	}

	if o.Switches.Count > 0 {
		must(t, sim.WriteNVSwitchFS(b.Host, o.Switches))
	}

	// The supervisor passes a daemon none of its own environment: the fake reads its
	// settings from the file next to it.
	if !o.NoBinary {
		env := fmt.Sprintf("FAKEDAEMON_CONTROL=%s\nFAKEDAEMON_ARGS=%s\nFAKEDAEMON_DEV=%s\n", b.Control, b.Args, filepath.Join(b.Host, "dev"))
		must(t, os.WriteFile(filepath.Join(b.Subroot, "usr/bin/nv-fabricmanager.env"), []byte(env), 0o644))
	}

	return b
}

func must(t *testing.T, err error) {
	t.Helper()

	if err != nil {
		t.Fatal(err)
	}
}

// SetMode sets the fake fabric manager's mode for its next starts.
func (b *HGX) SetMode(t *testing.T, mode string) {
	t.Helper()
	must(t, os.WriteFile(b.Control, []byte(mode), 0o644))
}

func (b *HGX) socketAnswers() bool {
	c, err := net.Dial("unix", filepath.Join(b.Host, fabricmanager.RunDir, "socket"))
	if err == nil {
		c.Close() //nolint:errcheck
	}

	return err == nil
}

// overlaySubroot mounts the Debian-built subroot with nv-fabricmanager (the fake) and
// NVIDIA's fabricmanager.cfg (shortened, its API on apiPort) added, the way the fabric
// manager archive adds them.
func overlaySubroot(t *testing.T, dir string, noBinary bool, apiPort int) string {
	t.Helper()

	upper, work, merged := filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "subroot")
	for _, d := range []string{upper + "/usr/bin", upper + "/usr/share/nvidia/nvswitch", work, merged} {
		must(t, os.MkdirAll(d, 0o755))
	}

	if !noBinary {
		data, err := os.ReadFile(FakeDaemon(t))
		must(t, err)
		must(t, os.WriteFile(filepath.Join(upper, "usr/bin/nv-fabricmanager"), data, 0o755))
	}

	cfg := fmt.Sprintf("LOG_LEVEL=4\nLOG_FILE_NAME=/var/log/fabricmanager.log\nDAEMONIZE=1\nBIND_INTERFACE_IP=127.0.0.1\n"+
		"STARTING_TCP_PORT=16000\nUNIX_SOCKET_PATH=\nFABRIC_MODE=0\nSTATE_FILE_NAME=/var/tmp/fabricmanager.state\n"+
		"FM_CMD_BIND_INTERFACE=127.0.0.1\nFM_CMD_PORT_NUMBER=%d\nFM_CMD_UNIX_SOCKET_PATH=\nABORT_CUDA_JOBS_ON_FM_EXIT=1\n", apiPort)
	must(t, os.WriteFile(filepath.Join(upper, "usr/share/nvidia/nvswitch/fabricmanager.cfg"), []byte(cfg), 0o644))

	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", Subroot(t), upper, work)
	must(t, unix.Mount("overlay", merged, "overlay", 0, opts))
	t.Cleanup(func() { unix.Unmount(merged, unix.MNT_DETACH) }) //nolint:errcheck

	return merged
}

// Starts counts the fake fabric manager's starts.
func (b *HGX) Starts(t *testing.T) int {
	t.Helper()

	data, err := os.ReadFile(b.Args)
	if os.IsNotExist(err) {
		return 0
	}

	must(t, err)

	return strings.Count(string(data), "\n")
}

// FabricManagerPID finds the fake fabric manager among the processes, 0 if none runs.
func (b *HGX) FabricManagerPID(t *testing.T) int {
	t.Helper()

	cfg := filepath.Join(b.Host, fabricmanager.RunDir, "fabricmanager.cfg")
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	must(t, err)

	for _, p := range procs {
		data, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(data), cfg) {
			var pid int
			if _, err := fmt.Sscanf(p, "/proc/%d/cmdline", &pid); err == nil {
				return pid
			}
		}
	}

	return 0
}

// FabricManagerService is an ext-nvidia-fabricmanager service running on an HGX board.
type FabricManagerService struct {
	Svc  *fabricmanager.Service
	Logs *SyncBuffer
	Stop func()
}

// RunFabricManager starts the fabric manager service on the board, with short polls; Stop
// (also run at cleanup) stops it and waits for it.
func (b *HGX) RunFabricManager(t *testing.T) *FabricManagerService {
	t.Helper()

	fm := &FabricManagerService{Logs: &SyncBuffer{}}
	log := slog.New(slog.NewTextHandler(fm.Logs, nil))
	fm.Svc = fabricmanager.New(log, fabricmanager.Config{
		HostRoot: b.Host, Subroot: b.Subroot, StartTimeout: 5 * time.Second,
		PollInitial: 10 * time.Millisecond, PollMax: 50 * time.Millisecond,
	}, &nvmljobs.Local{Log: log, NVML: b.GPUs})

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- fm.Svc.Run(ctx) }()

	stopped := false
	fm.Stop = func() {
		if stopped {
			return
		}

		stopped = true

		cancel()

		if err := <-done; err != nil {
			t.Errorf("fabric manager service: %v", err)
		}
	}
	t.Cleanup(fm.Stop)

	return fm
}

// WaitState waits until the service reports one of states, and returns its status.
func (fm *FabricManagerService) WaitState(t *testing.T, states ...string) fabricmanager.Status {
	t.Helper()

	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		st := fm.Svc.Status()
		for _, s := range states {
			if st.State == s {
				return st
			}
		}

		time.Sleep(5 * time.Millisecond)
	}

	t.Fatalf("the fabric manager service never reached %v: %s: %s\n%s", states, fm.Svc.Status().State, fm.Svc.Status().Message, fm.Logs)

	return fabricmanager.Status{}
}

// FakeDaemon builds the fake daemon (internal/fakedaemon), which acts as
// nvidia-persistenced or, given -c, as nv-fabricmanager, and returns its path.
func FakeDaemon(t *testing.T) string {
	t.Helper()

	bin := filepath.Join(t.TempDir(), "fakedaemon")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/talos-nvidia/nvidia-driver/internal/fakedaemon")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")

	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the fake daemon: %v: %s", err, out)
	}

	return bin
}
