// Package nfd writes a Node Feature Discovery "local" feature file: node labels that
// come from the host, for clusters that run NFD.
//
// NFD's worker reads every non-hidden file in its features.d directory; each line is
// "name=value" (or "name", meaning "true"). The worker watches the directory, and the
// NFD master removes labels it set earlier that no file reports any more, so replacing
// the whole file is how stale labels go away. Files whose name starts with "." are
// ignored by the worker, which is what makes the temp-file-and-rename write atomic from
// its point of view.
package nfd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/talos-nvidia/nvidia-driver/pkg/atomicfile"
)

// DefaultDir is where NFD's worker (and its Helm chart's hostPath) looks for feature
// files. On Talos /etc is read-only, but /etc/kubernetes is one of the writable overlay
// mounts (its upper layer lives on /var), so this default works there unchanged; the
// extension service needs it bind-mounted read-write.
const DefaultDir = "/etc/kubernetes/node-feature-discovery/features.d"

// DefaultName is the file this project owns inside the features directory.
const DefaultName = "nvidia-driver"

// Label names. They match the names NVIDIA's GPU Operator uses (mig-manager's
// mig.config and mig.config.state, GPU feature discovery's gpu.product), so selectors
// written for it keep working. NFD's master accepts the nvidia.com namespace only when
// it is listed in its extraLabelNs setting.
const (
	LabelMIGConfig      = "nvidia.com/mig.config"
	LabelMIGConfigState = "nvidia.com/mig.config.state"
	LabelGPUProduct     = "nvidia.com/gpu.product"
	// LabelMPSCapable is the label NVIDIA's chart schedules its MPS control daemon by
	// (deployments/helm/nvidia-device-plugin/templates/daemonset-mps-control-daemon.yml,
	// nodeSelector). GPU feature discovery would set it (internal/lm/nvml.go
	// newSharingLabeler); on Talos nothing runs GFD (docs/driver-root.md), so the service does.
	LabelMPSCapable = "nvidia.com/mps.capable"
)

// maxFileSize is NFD's limit for one feature file (larger files are skipped whole).
const maxFileSize = 65536

var (
	labelNameRE  = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
	dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	invalidValue = regexp.MustCompile(`[^-A-Za-z0-9_.]+`)
)

// Writer replaces one feature file atomically.
type Writer struct {
	dir  string
	name string
}

// NewWriter returns a Writer for the file name in dir. The name must be a plain,
// non-hidden file name (NFD ignores hidden files).
func NewWriter(dir, name string) (*Writer, error) {
	switch {
	case dir == "":
		return nil, errors.New("nfd: feature directory is empty")
	case name == "" || strings.ContainsRune(name, '/') || strings.HasPrefix(name, "."):
		return nil, fmt.Errorf("nfd: feature file name %q must be a plain file name not starting with '.'", name)
	}
	return &Writer{dir: dir, name: name}, nil
}

// Path is the feature file's path.
func (w *Writer) Path() string { return filepath.Join(w.dir, w.name) }

// Write replaces the feature file with exactly these labels (labels not given are
// gone from the node at NFD's next pass). Every invalid label is reported at once and
// nothing is written.
func (w *Writer) Write(labels map[string]string) error {
	content, err := Render(labels)
	if err != nil {
		return fmt.Errorf("nfd: %s: %w", w.Path(), err)
	}
	// The temporary file is hidden (a leading dot): NFD ignores hidden files, so it never
	// reads a half-written one.
	if _, err := atomicfile.Write(w.Path(), content, 0o644); err != nil {
		return fmt.Errorf("nfd: %w", err)
	}
	return w.openToWorker()
}

// openToWorker lets every user list and search the directory. NFD's worker runs
// unprivileged (its image's USER 65534:65534, the chart's runAsNonRoot), and Talos makes
// an extension service's missing mount source 0700 (machined's services/extension.go), so
// on a fresh node the worker could not read the file: "unable to access
// .../features.d/: permission denied", and no label reached the node.
func (w *Writer) openToWorker() error {
	st, err := os.Stat(w.dir)
	if err != nil {
		return fmt.Errorf("nfd: %w", err)
	}
	if perm := st.Mode().Perm(); perm&0o055 != 0o055 {
		if err := os.Chmod(w.dir, perm|0o055); err != nil {
			return fmt.Errorf("nfd: making %s readable by NFD's unprivileged worker: %w", w.dir, err)
		}
	}
	return nil
}

// Remove deletes the feature file, so that NFD drops its labels (used when the feature
// is switched off). A missing file is not an error.
func (w *Writer) Remove() error {
	if err := os.Remove(w.Path()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("nfd: remove %s: %w", w.Path(), err)
	}
	return nil
}

// Write replaces DefaultName in dir with exactly these labels.
func Write(dir string, labels map[string]string) error {
	w, err := NewWriter(dir, DefaultName)
	if err != nil {
		return err
	}
	return w.Write(labels)
}

// Render returns the feature file content for labels, sorted by name so that equal
// label sets give equal files.
func Render(labels map[string]string) ([]byte, error) {
	names := make([]string, 0, len(labels))
	for k := range labels {
		names = append(names, k)
	}
	sort.Strings(names)

	var errs []error
	var b strings.Builder
	b.WriteString("# Written by the nvidia-driver extension service (ext-nvidia-driver); replaced whole on every change.\n")
	for _, k := range names {
		v := labels[k]
		if err := validateName(k); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := validateValue(k, v); err != nil {
			errs = append(errs, err)
			continue
		}
		fmt.Fprintf(&b, "%s=%s\n", k, v)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if b.Len() > maxFileSize {
		return nil, fmt.Errorf("feature file would be %d bytes, over NFD's limit of %d", b.Len(), maxFileSize)
	}
	return []byte(b.String()), nil
}

// validateName checks a Kubernetes label name: an optional DNS subdomain prefix and
// "/", then a name of at most 63 characters.
func validateName(k string) error {
	prefix, name, hasPrefix := strings.Cut(k, "/")
	if !hasPrefix {
		name, prefix = prefix, ""
	}
	switch {
	case hasPrefix && (prefix == "" || len(prefix) > 253 || !dnsSubdomain.MatchString(prefix)):
		return fmt.Errorf("label %q: prefix %q is not a DNS subdomain", k, prefix)
	case len(name) == 0 || len(name) > 63 || !labelNameRE.MatchString(name):
		return fmt.Errorf("label %q: name %q must be 1-63 characters [A-Za-z0-9-_.], starting and ending alphanumeric", k, name)
	}
	return nil
}

func validateValue(k, v string) error {
	if v == "" {
		return nil
	}
	if len(v) > 63 || !labelNameRE.MatchString(v) {
		return fmt.Errorf("label %q: value %q must be at most 63 characters [A-Za-z0-9-_.], starting and ending alphanumeric", k, v)
	}
	return nil
}

// SanitizeValue turns free text (a GPU product name such as "NVIDIA H200 NVL") into a
// label value the way NVIDIA's GPU feature discovery does: runs of other characters
// become "-" ("NVIDIA-H200-NVL"), cut to 63 characters, trimmed to alphanumeric ends.
func SanitizeValue(s string) string {
	v := invalidValue.ReplaceAllString(strings.TrimSpace(s), "-")
	if len(v) > 63 {
		v = v[:63]
	}
	return strings.TrimFunc(v, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
	})
}

// MIGLabels gives the node's GPU labels: the MIG layout's name and its state
// (success, failed, pending, pending-reboot) and the GPU product. Empty inputs are left out.
func MIGLabels(layout, state, product string) map[string]string {
	labels := map[string]string{}
	if v := SanitizeValue(layout); v != "" {
		labels[LabelMIGConfig] = v
	}
	if v := SanitizeValue(state); v != "" {
		labels[LabelMIGConfigState] = v
	}
	if v := SanitizeValue(product); v != "" {
		labels[LabelGPUProduct] = v
	}
	return labels
}

// WithMPSCapable adds nvidia.com/mps.capable to labels: "true" where every GPU of the node
// can be shared through MPS (gpu.MPSCapable), "false" otherwise, so that a node whose
// layout turns MIG on loses the label and the MPS control daemon with it.
func WithMPSCapable(labels map[string]string, capable bool) map[string]string {
	labels[LabelMPSCapable] = strconv.FormatBool(capable)
	return labels
}

// PausedForMIGChange is the value of the GPU Operator's nvidia.com/gpu.deploy.<operand>
// labels that takes an operand's pod off a node while its MIG layout changes (the
// operator's mig-manager sets it: mig-parted deployments/container/reconfigure-mig.sh);
// the DaemonSets of deploy/ honour it.
const PausedForMIGChange = "paused-for-mig-change"

// PauseLabels are the labels that pause the operands deploy/ runs, the device plugin and the
// DCGM exporter, for a MIG change.
func PauseLabels() map[string]string {
	return map[string]string{
		"nvidia.com/gpu.deploy.device-plugin": PausedForMIGChange,
		"nvidia.com/gpu.deploy.dcgm-exporter": PausedForMIGChange,
	}
}
