package node

// The Node Feature Discovery feature file is kept at the labels last asked for. A write that
// fails (the features directory a link, which is refused, or on a file system read-only for a
// while) is retried in the background with the runner's backoff until it succeeds, with the
// newest labels then, or the service stops. The node serves its GPUs meanwhile: once it is up,
// it is degraded by the labels' condition, which says they are retried and why.

import (
	"context"
	"fmt"
	"maps"
	"sync"

	"github.com/talos-nvidia/nvidia-driver/pkg/gpu"
	"github.com/talos-nvidia/nvidia-driver/pkg/nfd"
)

// labelState is the feature file as the runner keeps it.
type labelState struct {
	mu sync.Mutex
	// want is the labels last asked for; problem why they are not in the file, nil once
	// they are.
	want    map[string]string
	problem error
	// retrying: a retry runs; it ends once the file has want, or with the service.
	retrying bool
	// logged is the last problem logged: each is logged once until it changes.
	logged string
}

// labelNode writes the Node Feature Discovery feature file, when configured: the MIG
// layout, its state, the GPU product and whether MPS can share the GPUs, for clusters that
// run NFD; with pause, the labels that ask the operands to leave for a MIG change. A write
// that fails is retried until ctx ends.
func (r *Runner) labelNode(ctx context.Context, state string, pause bool) {
	if r.cfg.NFDFeaturesDir == "" {
		return
	}

	layout := ""
	if state != "" {
		layout = r.cfg.MIGLayout
	}

	product := ""
	gpus := r.status.Get().GPUs
	if len(gpus) > 0 {
		product = gpus[0].Name
	}

	labels := nfd.MIGLabels(layout, state, product)
	if len(gpus) > 0 {
		labels = nfd.WithMPSCapable(labels, gpu.MPSCapable(gpus))
	}
	if pause {
		maps.Copy(labels, nfd.PauseLabels())
	}

	l := &r.labels
	l.mu.Lock()
	l.want = labels
	err := r.writeLabels()
	start := err != nil && !l.retrying
	if start {
		l.retrying = true
	}
	l.mu.Unlock()

	if start {
		r.tasks.Go(func() { r.retryLabels(ctx) })
	}
}

// writeLabels writes the labels wanted; r.labels.mu is held. A new problem is logged, and
// the end of one.
func (r *Runner) writeLabels() error {
	l := &r.labels
	dir := r.cfg.Host(r.cfg.NFDFeaturesDir)

	w, err := nfd.NewWriter(dir, nfd.DefaultName)
	if err == nil {
		err = w.Write(l.want)
	}

	had := l.problem != nil
	l.problem = err

	switch {
	case err != nil && err.Error() != l.logged:
		l.logged = err.Error()
		r.log.Warn("retrying the Node Feature Discovery labels until they are written", "dir", dir, "error", err)
	case err == nil && had:
		l.logged = ""
		r.log.Info("the Node Feature Discovery labels are written", "dir", dir)
	}

	return err
}

// retryLabels writes the labels wanted, with backoff, until the file has them or ctx ends;
// the status of an up node says each new problem and the end.
func (r *Runner) retryLabels(ctx context.Context) {
	l := &r.labels

	err := r.wait.Until(ctx, func() error {
		l.mu.Lock()
		defer l.mu.Unlock()

		err := l.problem // nil: labelNode wrote them meanwhile
		if err != nil {
			err = r.writeLabels()
		}

		if err == nil {
			l.retrying = false
		}

		return err
	}, func(error) { r.reportUp() })

	if err == nil {
		r.reportUp()
	}
}

// labelsCondition is a problem while the labels last asked for are not in the feature file.
func (r *Runner) labelsCondition() Condition {
	c := Condition{Name: ConditionLabels}

	r.labels.mu.Lock()
	defer r.labels.mu.Unlock()

	if r.labels.problem != nil {
		c.Problem = fmt.Sprintf("the Node Feature Discovery labels are not written, retrying: %s", r.labels.problem)
	}

	return c
}
