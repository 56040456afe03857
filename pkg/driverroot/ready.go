package driverroot

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"github.com/talos-nvidia/nvidia-driver/pkg/atomicfile"
)

const (
	// OperatorReadyFile is what GPU Operators before v24.6 wait for from a driver container.
	OperatorReadyFile = ".driver-ctr-ready"
	// ReadyFile is ours: written, with a JSON summary, when the node is fully brought up.
	// In-cluster DaemonSets wait for it.
	ReadyFile = "nvidia-driver.ready"
)

// MarkReady writes both readiness files in dir (e.g. /run/nvidia/validations) atomically.
func MarkReady(dir string, summary []byte) error {
	if _, err := atomicfile.Write(filepath.Join(dir, OperatorReadyFile), nil, 0o644); err != nil {
		return fmt.Errorf("writing the GPU Operator readiness file: %w", err)
	}

	if _, err := atomicfile.Write(filepath.Join(dir, ReadyFile), summary, 0o644); err != nil {
		return fmt.Errorf("writing the readiness file: %w", err)
	}

	return nil
}

// MarkNotReady removes both readiness files, before the node's GPUs change under the
// consumers (a MIG change) or when bring-up fails.
func MarkNotReady(dir string) error {
	for _, name := range []string{ReadyFile, OperatorReadyFile} {
		if err := atomicfile.Remove(filepath.Join(dir, name)); err != nil {
			return err
		}
	}

	return nil
}

// CheckReadyDir says whether the readiness files in dir can be withdrawn (MarkNotReady): not
// through a link on the way to dir, which is refused with an error naming it. A dir not made
// yet holds no file to withdraw.
func CheckReadyDir(dir string) error {
	d, err := atomicfile.OpenDirNoSymlinks(dir, false, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}

	if err != nil {
		return fmt.Errorf("the readiness files cannot be withdrawn: %w", err)
	}

	return d.Close()
}
