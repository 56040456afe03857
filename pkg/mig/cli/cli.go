// Package cli is the offline `mig plan` command: it plans a layout on GPUs of a given model,
// described by the model's data file (pkg/gpu/models), so a layout can be checked before
// rollout.
package cli

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/talos-nvidia/nvidia-driver/pkg/gpu/models"
	"github.com/talos-nvidia/nvidia-driver/pkg/mig"
)

// PlanJSON is the -o json form of a plan.
type PlanJSON struct {
	GPUs []GPUJSON `json:"gpus"`
}

// GPUJSON is one GPU of a plan.
type GPUJSON struct {
	Index      int            `json:"index"`
	Model      string         `json:"model"`
	MigEnabled bool           `json:"migEnabled"`
	Instances  []InstanceJSON `json:"instances"`
}

// InstanceJSON is one GPU instance: profile, placement, compute instances.
type InstanceJSON struct {
	Profile          string   `json:"profile"`
	Start            uint32   `json:"start"`
	Size             uint32   `json:"size"`
	ComputeInstances []string `json:"computeInstances"`
}

// RunPlanCLI runs `mig plan` with args (after "plan") and returns the exit code:
// 0 when the layout fits, 1 when it does not, 2 on bad usage.
func RunPlanCLI(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("mig plan", flag.ContinueOnError)
	fs.SetOutput(stderr)

	model := fs.String("gpu", "", "GPU model: "+strings.Join(models.Keys(), ", "))
	count := fs.Int("gpus", 1, "number of GPUs")
	config := fs.String("config", "", "layout file (mig-parted v1); without it only the built-in layouts")
	selectName := fs.String("select", "", "layout to plan")
	output := fs.String("o", "text", "output: text or json")

	if err := fs.Parse(args); err != nil {
		return 2
	}

	usage := func(msg string) int {
		fmt.Fprintf(stderr, "mig plan: %s\n", msg)
		fs.Usage()

		return 2
	}

	switch {
	case fs.NArg() > 0:
		return usage(fmt.Sprintf("unexpected argument %q", fs.Arg(0)))
	case *model == "":
		return usage("--gpu is required")
	case *selectName == "":
		return usage("--select is required")
	case *count < 1 || *count > 16:
		return usage("--gpus must be 1 to 16")
	case *output != "text" && *output != "json":
		return usage("-o must be text or json")
	}

	spec, err := models.Lookup(*model)
	if err != nil {
		return usage(err.Error())
	}

	if len(spec.Unverified) > 0 {
		// The plan is only as good as the data: say which file to read before trusting it.
		fmt.Fprintf(stderr, "mig plan: note: %d facts of the %s data are in no source (pkg/gpu/models/data/%s.json, \"unverified\"); on a node the service asks NVML\n",
			len(spec.Unverified), spec.Key, spec.Key)
	}

	cfg := &mig.Config{Layouts: map[string][]mig.Entry{}}

	if *config != "" {
		data, err := os.ReadFile(*config)
		if err != nil {
			fmt.Fprintf(stderr, "mig plan: %v\n", err)

			return 1
		}

		if cfg, err = mig.ParseFile(*config, data); err != nil {
			fmt.Fprintf(stderr, "mig plan: %v\n", err)

			return 1
		}
	}

	plan, err := Plan(spec, *count, cfg.WithBuiltins(), *selectName)
	if err != nil {
		fmt.Fprintf(stderr, "mig plan: %v\n", err)

		return 1
	}

	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")

		if err := enc.Encode(ToJSON(plan, spec.Key)); err != nil {
			fmt.Fprintf(stderr, "mig plan: %v\n", err)

			return 1
		}

		return 0
	}

	if plan.Selected() == 0 {
		fmt.Fprintf(stdout, "layout %q selects no %s GPU (its device filters match none): nothing to do\n", plan.Layout, spec.Key)

		return 0
	}

	fmt.Fprintf(stdout, "layout %q fits on %d × %s (%s):\n", plan.Layout, *count, spec.Key, spec.Name)

	for _, g := range plan.GPUs {
		if !g.Selected {
			fmt.Fprintf(stdout, "  GPU %d: not selected, left as it is\n", g.GPU.Index)

			continue
		}

		fmt.Fprintf(stdout, "  GPU %d: %s\n", g.GPU.Index, g.Target.String())
	}

	return 0
}

// Plan plans a layout on count GPUs of a model.
func Plan(spec models.Model, count int, cfg *mig.Config, layout string) (*mig.Plan, error) {
	gpus := make([]*mig.GPU, count)
	for i := range gpus {
		gpus[i] = mig.FromModel(spec, i)
	}

	return mig.PlanLayout(cfg, layout, gpus)
}

// ToJSON converts a plan to its JSON form, naming the model as given.
func ToJSON(plan *mig.Plan, model string) PlanJSON {
	out := PlanJSON{GPUs: []GPUJSON{}}

	for _, g := range plan.GPUs {
		gj := GPUJSON{Index: g.GPU.Index, Model: model, MigEnabled: g.Target.MigEnabled, Instances: []InstanceJSON{}}

		for _, in := range g.Target.Instances {
			ij := InstanceJSON{Profile: in.Profile, Start: in.Placement.Start, Size: in.Placement.Size, ComputeInstances: []string{}}
			for _, c := range in.ComputeInstances {
				ij.ComputeInstances = append(ij.ComputeInstances, c.Profile)
			}

			gj.Instances = append(gj.Instances, ij)
		}

		out.GPUs = append(out.GPUs, gj)
	}

	return out
}
