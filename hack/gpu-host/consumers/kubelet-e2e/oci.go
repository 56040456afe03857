package main

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"

	"github.com/talos-nvidia/nvidia-driver/hack/gpu-host/consumers/podspec"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func ociCommand(args []string) error {
	var (
		o                        podspec.Options
		manifest, bundle         string
		env, unset, binds, files list
	)

	f := flag.NewFlagSet("oci", flag.ContinueOnError)
	f.StringVar(&manifest, "manifest", "", "rendered manifests (multi-document YAML)")
	f.StringVar(&o.DaemonSet, "daemonset", "", "the DaemonSet's name")
	f.StringVar(&o.Container, "container", "", "the container's name in its pod template")
	f.StringVar(&o.Rootfs, "rootfs", "", "the container's root filesystem (stands for its image)")
	f.StringVar(&bundle, "bundle", "", "the runc bundle directory to write config.json into")
	f.StringVar(&o.Volumes, "volumes", "", "where emptyDir and configMap volumes are made (default BUNDLE/volumes)")
	f.StringVar(&o.Node, "node", "e2e-node", "the node name (spec.nodeName)")
	f.Var(&env, "env", "K=V set in the container's environment after the pod's own (repeatable)")
	f.Var(&unset, "unset", "a variable of the pod's environment to leave out (repeatable)")
	f.Var(&binds, "bind", "SRC:DST[:ro] an extra bind mount, no propagation (repeatable)")
	f.Var(&files, "file", "VOLUME/NAME=CONFIGMAP/KEY: put a ConfigMap entry into an emptyDir, as an init container would (repeatable)")

	if err := f.Parse(args); err != nil {
		return err
	}

	o.Env, o.Unset, o.Binds, o.Files = env, unset, binds, files
	if o.Volumes == "" {
		o.Volumes = filepath.Join(bundle, "volumes")
	}

	m, err := podspec.ReadManifests(manifest)
	if err != nil {
		return err
	}

	spec, err := podspec.ContainerSpec(m, o)
	if err != nil {
		return err
	}

	out, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}

	if err := os.MkdirAll(bundle, 0o755); err != nil {
		return err
	}

	return os.WriteFile(filepath.Join(bundle, "config.json"), out, 0o644)
}
