// Package memory gives back what the service's bring-up used once it only waits: the Go
// heap it no longer needs, the C heap NVML and its libraries freed, and the pages of the
// service's binary and libraries (code and tables of the bring-up) that it will not touch
// while idle.
package memory

/*
#include <malloc.h>
*/
import "C"

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Released says what Release did, in kB of resident memory (VmRSS).
type Released struct {
	BeforeKiB, AfterKiB int
}

// Release returns memory to the kernel:
//   - the Go heap's free pages (debug.FreeOSMemory runs a GC first);
//   - glibc's free heap (malloc_trim): NVML and libnvidia-ml's helpers free what they
//     allocated on nvmlShutdown, but glibc keeps freed memory for reuse;
//   - the resident pages of its executable and libraries (MADV_PAGEOUT): clean file pages,
//     read back from their files if they are touched again.
//
// Nothing it releases is lost: a later bring-up (a MIG change restarts the service) pages
// back in what it needs.
func Release() (Released, error) {
	var r Released

	before, err := rssKiB()
	if err != nil {
		return r, err
	}

	r.BeforeKiB = before

	debug.FreeOSMemory()
	C.malloc_trim(0)

	if err := pageOutFiles(); err != nil {
		return r, err
	}

	r.AfterKiB, err = rssKiB()

	return r, err
}

// pageOutFiles asks the kernel to reclaim the resident pages of this process's read-only file
// mappings: its executable and the libraries it loaded (Linux 5.4+; an older kernel refuses
// the advice and nothing happens). The kernel leaves alone pages that other processes map.
func pageOutFiles() error {
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return fmt.Errorf("reading the memory map: %w", err)
	}

	sc := bufio.NewScanner(bytes.NewReader(maps))
	for sc.Scan() {
		// start-end perms offset dev inode path
		f := strings.Fields(sc.Text())
		if len(f) < 6 || !strings.HasPrefix(f[5], "/") || strings.Contains(f[1], "w") {
			continue // anonymous, or holding data the process changed
		}

		start, end, ok := strings.Cut(f[0], "-")
		if !ok {
			continue
		}

		lo, err1 := strconv.ParseUint(start, 16, 64)
		hi, err2 := strconv.ParseUint(end, 16, 64)

		if err1 != nil || err2 != nil {
			continue
		}

		if err := madvise(uintptr(lo), uintptr(hi-lo), unix.MADV_PAGEOUT); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("paging out %s (%s): %w", f[0], f[5], err)
		}
	}

	return sc.Err()
}

func madvise(addr, length uintptr, advice int) error {
	if _, _, errno := unix.Syscall(unix.SYS_MADVISE, addr, length, uintptr(advice)); errno != 0 {
		return errno
	}

	return nil
}

// rssKiB is this process's VmRSS.
func rssKiB() (int, error) {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, fmt.Errorf("reading /proc/self/status: %w", err)
	}

	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			fields := strings.Fields(v)
			if len(fields) > 0 {
				return strconv.Atoi(fields[0])
			}
		}
	}

	return 0, fmt.Errorf("no VmRSS in /proc/self/status")
}
