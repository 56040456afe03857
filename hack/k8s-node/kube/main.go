// Command kube is one binary for the Kubernetes programs of a one-node test cluster: it runs
// kubelet, kube-apiserver, kube-scheduler, kube-controller-manager, kubectl or etcd, chosen by
// the name it is started as (a link named after the program) or by its first argument.
//
// Each entry does what that program's own main does (k8s.io/kubernetes v1.37.0 cmd/<name>/*.go,
// go.etcd.io/etcd v3.7 main.go); only the dispatch is ours.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	_ "time/tzdata" // kube-apiserver and kube-controller-manager: CronJob time zones

	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

// programs maps a program name to its main; each returns the process exit code.
func programs() map[string]func(args []string) int {
	return map[string]func(args []string) int{
		"kubelet": func([]string) int {
			return cli.Run(kubelet.NewKubeletCommand(context.Background()))
		},
		"kube-apiserver": func([]string) int {
			return cli.Run(apiserver.NewAPIServerCommand())
		},
		"kube-scheduler": func([]string) int {
			return cli.Run(scheduler.NewSchedulerCommand())
		},
		"kube-controller-manager": func([]string) int {
			return cli.Run(controllermanager.NewControllerManagerCommand())
		},
		"kubectl": func(args []string) int {
			logs.GlogSetter(cmd.GetLogVerbosity(args)) //nolint:errcheck // as kubectl's main
			if err := cli.RunNoErrOutput(cmd.NewDefaultKubectlCommand()); err != nil {
				util.CheckErr(err)
			}
			return 0
		},
		"etcd": func(args []string) int {
			etcdmain.Main(args)
			return 0
		},
	}
}

func main() {
	progs := programs()
	name := filepath.Base(os.Args[0])
	if _, ok := progs[name]; !ok && len(os.Args) > 1 {
		// "kube kubelet --flags": drop our own name so the program sees its usual argv.
		name = os.Args[1]
		os.Args = os.Args[1:]
	}
	run, ok := progs[name]
	if !ok {
		names := make([]string, 0, len(progs))
		for n := range progs {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(os.Stderr, "usage: %s PROGRAM [ARGS...], or run it as a link named PROGRAM; PROGRAM is one of %s\n",
			filepath.Base(os.Args[0]), strings.Join(names, ", "))
		os.Exit(2)
	}
	os.Exit(run(os.Args))
}
