package nvmljobs

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/talos-nvidia/nvidia-driver/pkg/cdi"
	"github.com/talos-nvidia/nvidia-driver/pkg/gpu"
	"github.com/talos-nvidia/nvidia-driver/pkg/mig"
)

// Job names, as the request carries them.
const (
	jobListGPUs     = "list-gpus"
	jobFabricStates = "fabric-states"
	jobApplyMIG     = "apply-mig"
	jobWriteCDI     = "write-cdi"
)

// request is what the service sends a child on its standard input.
type request struct {
	Job string `json:"job"`
	// Subroot is where the child loads NVML from and finds nvidia-smi.
	Subroot  string      `json:"subroot"`
	LogLevel slog.Level  `json:"logLevel"`
	MIG      *MIGRequest `json:"mig,omitempty"`
	CDI      *CDIRequest `json:"cdi,omitempty"`
}

// message is one line of a child's standard output: progress, then the answer.
type message struct {
	// Changing: the MIG job is about to change the first GPU.
	Changing bool      `json:"changing,omitempty"`
	Done     *response `json:"done,omitempty"`
}

// response is a job's outcome.
type response struct {
	GPUs   []gpu.GPU         `json:"gpus,omitempty"`
	Fabric []gpu.FabricState `json:"fabric,omitempty"`
	MIG    *MIGResult        `json:"mig,omitempty"`
	Error  string            `json:"error,omitempty"`
	// Kind says which of the errors the caller acts on it is: "layout" (a *mig.LayoutError),
	// "no-gpu" (ErrNoGPU), or "" for any other.
	Kind string `json:"kind,omitempty"`
}

// Child runs each job in a new process of the service's binary, which answers with Serve.
type Child struct {
	// Command is the binary and the arguments that make it run Serve.
	Command []string
	// Subroot is the glibc subroot NVML is loaded from.
	Subroot  string
	LogLevel slog.Level
	// Stderr gets the child's log lines: the service's own log.
	Stderr io.Writer
	// StopWait is how long a child has to stop once the context ends (SIGTERM, then
	// SIGKILL): a MIG change under way rolls back in that time.
	StopWait time.Duration
	// Timeout bounds every job but a MIG change (whose GPU resets take their time): an NVML
	// call that hangs (a GPU fallen off the bus) is stopped, and the service tries again.
	// Zero: no bound.
	Timeout time.Duration
}

var _ Jobs = (*Child)(nil)

// ListGPUs lists the GPUs in a child.
func (c *Child) ListGPUs(ctx context.Context) ([]gpu.GPU, error) {
	resp, err := c.run(ctx, request{Job: jobListGPUs}, nil)
	if err != nil {
		return nil, err
	}

	return resp.GPUs, nil
}

// FabricStates reads the fabric registration in a child.
func (c *Child) FabricStates(ctx context.Context) ([]gpu.FabricState, error) {
	resp, err := c.run(ctx, request{Job: jobFabricStates}, nil)
	if err != nil {
		return nil, err
	}

	return resp.Fabric, nil
}

// ApplyMIG applies the layout in a child.
func (c *Child) ApplyMIG(ctx context.Context, req MIGRequest, changing func()) (MIGResult, error) {
	resp, err := c.run(ctx, request{Job: jobApplyMIG, MIG: &req}, changing)
	if resp.MIG != nil {
		return *resp.MIG, err
	}

	return MIGResult{}, err
}

// WriteCDI writes the CDI spec in a child.
func (c *Child) WriteCDI(ctx context.Context, req CDIRequest) error {
	_, err := c.run(ctx, request{Job: jobWriteCDI, CDI: &req}, nil)

	return err
}

func (c *Child) run(ctx context.Context, req request, changing func()) (response, error) {
	req.Subroot, req.LogLevel = c.Subroot, c.LogLevel

	in, err := json.Marshal(req)
	if err != nil {
		return response{}, fmt.Errorf("NVML job %s: encoding the request: %w", req.Job, err)
	}

	jobCtx := ctx

	if c.Timeout > 0 && req.Job != jobApplyMIG {
		var cancel context.CancelFunc

		jobCtx, cancel = context.WithTimeout(ctx, c.Timeout)
		defer cancel()
	}

	cmd := exec.CommandContext(jobCtx, c.Command[0], c.Command[1:]...) //nolint:gosec // our own binary
	cmd.Stdin = bytes.NewReader(in)
	cmd.Stderr = c.Stderr
	// On stop the child gets SIGTERM from us (Talos signals the container's init alone: runc
	// 1.2 and later ignore kill --all; the kernel kills the rest when the init exits) and
	// StopWait to finish, then SIGKILL.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = c.StopWait

	out, err := cmd.StdoutPipe()
	if err != nil {
		return response{}, fmt.Errorf("NVML job %s: %w", req.Job, err)
	}

	if err := cmd.Start(); err != nil {
		return response{}, fmt.Errorf("NVML job %s: starting %s: %w", req.Job, c.Command[0], err)
	}

	var done *response

	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 0, 64*1024), 16<<20)

	for sc.Scan() {
		var m message
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			continue // not a message (ServeProcess sends stray output to the log): skipped
		}

		if m.Changing && changing != nil {
			changing()
		}

		if m.Done != nil {
			done = m.Done
		}
	}

	waitErr := cmd.Wait()

	switch {
	case done != nil:
		return *done, done.err()
	case ctx.Err() != nil:
		return response{}, ctx.Err()
	case jobCtx.Err() != nil:
		return response{}, fmt.Errorf("NVML job %s: no answer within %s; the child process was stopped", req.Job, c.Timeout)
	case waitErr != nil:
		return response{}, fmt.Errorf("NVML job %s: the child process gave no answer: %w", req.Job, waitErr)
	default:
		return response{}, fmt.Errorf("NVML job %s: the child process gave no answer", req.Job)
	}
}

// err turns the answer's error back into the error the job returned, as far as callers
// tell errors apart.
func (r response) err() error {
	switch {
	case r.Error == "":
		return nil
	case r.Kind == "layout":
		return &mig.LayoutError{Err: errors.New(r.Error)}
	case r.Kind == "no-gpu":
		return ErrNoGPU
	case r.Kind == "no-devices":
		return cdi.ErrNoDevices
	default:
		return errors.New(r.Error)
	}
}

// ServeProcess is the whole child process: one request from stdin, the answer on stdout, the
// log on stderr. Whatever else writes to stdout (a library's printf) is sent to stderr, so
// that it cannot run into an answer line. SIGTERM (from the service, when it stops) ends the
// job's context, and a MIG change under way rolls back before the child exits.
func ServeProcess(newLocal func(subroot string, log *slog.Logger) *Local) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	// The answers keep the stdout the service reads, on a descriptor of their own that no
	// program the job runs inherits; descriptor 1 becomes the log.
	fd, err := unix.FcntlInt(uintptr(unix.Stdout), unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		return fmt.Errorf("keeping the answers' descriptor: %w", err)
	}

	answers := os.NewFile(uintptr(fd), "nvml-job answers")
	defer answers.Close() //nolint:errcheck // written and synced by Serve's encoder

	if err := unix.Dup2(unix.Stderr, unix.Stdout); err != nil {
		return fmt.Errorf("sending stray output to the log: %w", err)
	}

	return Serve(ctx, os.Stdin, answers, os.Stderr, newLocal)
}

// Serve is the child's side: it reads one request from in, runs it on the Local that
// newLocal makes for the request's subroot, and writes progress and the answer to out, one
// JSON message a line. Its own failures are returned; the job's are in the answer.
func Serve(ctx context.Context, in io.Reader, out, logTo io.Writer, newLocal func(subroot string, log *slog.Logger) *Local) error {
	var req request
	if err := json.NewDecoder(in).Decode(&req); err != nil {
		return fmt.Errorf("reading the NVML job's request: %w", err)
	}

	log := slog.New(slog.NewTextHandler(logTo, &slog.HandlerOptions{Level: req.LogLevel})).With("nvmlJob", req.Job)
	local := newLocal(req.Subroot, log)
	enc := json.NewEncoder(out)

	var resp response

	var err error

	switch req.Job {
	case jobListGPUs:
		resp.GPUs, err = local.ListGPUs(ctx)
	case jobFabricStates:
		resp.Fabric, err = local.FabricStates(ctx)
	case jobApplyMIG:
		if req.MIG == nil {
			return errors.New("NVML job apply-mig: the request has no MIG part")
		}

		var res MIGResult

		res, err = local.ApplyMIG(ctx, *req.MIG, func() {
			if encErr := enc.Encode(message{Changing: true}); encErr != nil {
				log.Warn("cannot tell the service that GPUs change", "error", encErr)
			}
		})
		resp.MIG = &res
	case jobWriteCDI:
		if req.CDI == nil {
			return errors.New("NVML job write-cdi: the request has no CDI part")
		}

		err = local.WriteCDI(ctx, *req.CDI)
	default:
		return fmt.Errorf("unknown NVML job %q", req.Job)
	}

	if err != nil {
		resp.Error = err.Error()

		var layoutErr *mig.LayoutError

		switch {
		case errors.As(err, &layoutErr):
			resp.Kind = "layout"
		case errors.Is(err, ErrNoGPU):
			resp.Kind = "no-gpu"
		case errors.Is(err, cdi.ErrNoDevices):
			resp.Kind = "no-devices"
		}
	}

	if err := enc.Encode(message{Done: &resp}); err != nil {
		return fmt.Errorf("writing the NVML job's answer: %w", err)
	}

	return nil
}
