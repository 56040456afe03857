package gpu

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// DeviceMajor is the character major of /dev/nvidia<minor> and /dev/nvidiactl.
const DeviceMajor = 195

// Holder is a process that has a GPU's device node open. Monitoring clients (the device
// plugin, DCGM, GFD, nvidia-persistenced) hold GPUs through NVML this way without being
// compute processes, so NVML's process lists never name them; the kernel does, in
// /proc/<pid>/fd.
type Holder struct {
	PID  int    `json:"pid"`
	Name string `json:"name"`
}

func (h Holder) String() string {
	if h.Name == "" {
		return fmt.Sprintf("pid %d", h.PID)
	}

	return fmt.Sprintf("%s (pid %d)", h.Name, h.PID)
}

// Holders lists the processes under procRoot (the host's /proc) that have /dev/nvidia<minor>
// open, sorted by pid. A link counts when it names the device (/dev/nvidia<minor>, as the
// holder's own mount namespace calls it) or when it resolves to a character device
// 195:<minor> (a device node elsewhere, such as a container's). Processes in the caller's own
// PID namespace are left out: the service itself holds the GPU through NVML, and its own
// daemons are stopped by it. Processes that end while being read are skipped.
func Holders(procRoot string, minor int) ([]Holder, error) {
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, fmt.Errorf("listing processes in %s: %w", procRoot, err)
	}

	ownNS, _ := os.Readlink("/proc/self/ns/pid")
	name := fmt.Sprintf("nvidia%d", minor)

	var out []Holder

	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}

		dir := filepath.Join(procRoot, e.Name())
		if ns, err := os.Readlink(filepath.Join(dir, "ns/pid")); err == nil && ns == ownNS {
			continue
		}

		if !holds(filepath.Join(dir, "fd"), name, minor) {
			continue
		}

		comm, _ := os.ReadFile(filepath.Join(dir, "comm"))
		out = append(out, Holder{PID: pid, Name: strings.TrimSpace(string(comm))})
	}

	sort.Slice(out, func(i, j int) bool { return out[i].PID < out[j].PID })

	return out, nil
}

func holds(fdDir, name string, minor int) bool {
	fds, err := os.ReadDir(fdDir)
	if err != nil {
		return false
	}

	for _, fd := range fds {
		p := filepath.Join(fdDir, fd.Name())

		if target, err := os.Readlink(p); err == nil && filepath.Base(target) == name && strings.HasPrefix(target, "/") {
			return true
		}

		var st unix.Stat_t
		if err := unix.Stat(p, &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFCHR &&
			unix.Major(st.Rdev) == DeviceMajor && unix.Minor(st.Rdev) == uint32(minor) {
			return true
		}
	}

	return false
}

// HolderList says who holds a GPU, for messages: "dcgm-exporter (pid 12), nv-hostengine (pid 40)".
func HolderList(hs []Holder) string {
	parts := make([]string, 0, len(hs))
	for _, h := range hs {
		parts = append(parts, h.String())
	}

	return strings.Join(parts, ", ")
}
