# NVIDIA's own consumers of the driver root in the GPU end-to-end test (sourced by
# hack/gpu-host/e2e-gpu.sh inside its private mount namespace, once the service is ready and
# e2e_rootfs has made $W/rootfs). Needs $W, $out, result(), ctr() and $E2E_TORCH.
#
# The device plugin and GPU feature discovery v0.19.0 are built from NVIDIA's Go module
# (hack/gpu-host/consumers, `make e2e-tools`) and run in runc containers whose config kubelet-e2e makes
# from the rendered DaemonSets the way the kubelet and containerd make a pod's (privileged;
# the pod's hostPath volumes with their mountPropagation, so the driver root is at
# /driver-root inside). kubelet-e2e plays the kubelet's side of the device-plugin API
# (Register, ListAndWatch, Allocate); the CDI devices Allocate answers with are injected from
# the spec the plugin wrote into the workload containers, as containerd injects them.
#
# Manifests (rendered by hack/gpu-host/render-consumers.sh into $out/e2e):
#   deploy-device-plugin.yaml  `kustomize build deploy/device-plugin`: what deploy/ installs
#   stock-cdi.yaml             NVIDIA's chart with nvidiaDriverRoot=/run/nvidia/driver (what a
#                              GPU Operator user sets) and the settings Talos needs whatever
#                              the driver root: deviceListStrategy=cdi-cri (no NVIDIA runtime),
#                              cdi.nvidiaHookPath, securityContext.privileged; no nvidiaDevRoot,
#                              none of deploy/'s patches (no mount propagation)
#   stock-gfd.yaml             NVIDIA's chart with nvidiaDriverRoot and gfd.enabled=true

K=$out/bin/kubelet-e2e
M=$out/e2e
DP_SPEC=k8s.device-plugin.nvidia.com-gpu
# The images' programs: NVIDIA's image has them in /usr/bin.
install -m 0755 "$out/bin/nvidia-device-plugin" "$out/bin/gpu-feature-discovery" "$W/rootfs/usr/bin/"
echo "  /var/run is $(readlink -f /var/run)"

# pod_start NAME MANIFEST DAEMONSET CONTAINER [kubelet-e2e oci args...]: start the container
# in the background (pod_pid); its output goes to $W/pod-NAME/out.log.
pod_start() {
  local name=$1 manifest=$2 ds=$3 c=$4; shift 4
  local b=$W/pod-$name
  rm -rf "$b"; mkdir -p "$b"
  "$K" oci --manifest "$manifest" --daemonset "$ds" --container "$c" --rootfs "$W/rootfs" --bundle "$b" "$@" || return 1
  echo "[$(date +%T.%N | cut -c1-12)] runc run pod $name" >&2
  timeout -k 5 120 runc --log "$b/runc.log" run --bundle "$b" "e2e-pod-$name-$$" </dev/null >"$b/out.log" 2>&1 &
  pod_pid=$!
}

pod_stop() {
  runc kill "e2e-pod-$1-$$" TERM 2>/dev/null
  wait "$pod_pid" 2>/dev/null
  runc delete -f "e2e-pod-$1-$$" >/dev/null 2>&1
  return 0
}

pod_log() { echo "  --- $1: container output (last ${2:-25} lines)"; tail -n "${2:-25}" "$W/pod-$1/out.log" | sed 's/^/    /'; }

# dp_start NAME MANIFEST [oci args...]: the kubelet side, then the plugin's container; waits
# until the kubelet side has registered, listed and allocated one GPU (or failed).
dp_start() {
  local name=$1 manifest=$2; shift 2
  rm -f /run/cdi/$DP_SPEC.* /var/run/cdi/$DP_SPEC.*
  mkdir -p /var/lib/kubelet/device-plugins
  "$K" plugin --dir /var/lib/kubelet/device-plugins --out "$W/$name.kubelet.json" --timeout 30s 2>"$W/$name.kubelet.log" &
  local kp=$!
  for _ in $(seq 50); do [ -S /var/lib/kubelet/device-plugins/kubelet.sock ] && break; sleep 0.1; done
  pod_start "$name" "$manifest" nvidia-device-plugin nvidia-device-plugin-ctr "$@" || { kill $kp; return 1; }
  wait $kp
  dp_rc=$?
  sed 's/^/  kubelet side: /' "$W/$name.kubelet.log"
  dp_cdi=$(grep -o '"k8s.device-plugin.nvidia.com/gpu=[^"]*"' "$W/$name.kubelet.json" 2>/dev/null | head -1 | tr -d '"')
}

# dp_cdi_checks NAME LABEL: the spec the plugin wrote, its host paths, and workloads through it.
dp_cdi_checks() {
  local name=$1 label=$2 r spec
  spec=$(ls /run/cdi/$DP_SPEC.* /var/run/cdi/$DP_SPEC.* 2>/dev/null | head -1)
  [ "$dp_rc" = 0 ] && grep -q '"resourceName": "nvidia.com/gpu"' "$W/$name.kubelet.json" && [ -n "$dp_cdi" ] && r=PASS || r=FAIL
  result "device plugin, $label: registered, listed, allocated $dp_cdi" $r
  [ -n "$spec" ] && r=PASS || r=FAIL
  result "device plugin, $label: wrote its CDI spec ${spec:-(none)}" $r
  [ -n "$spec" ] || { pod_log "$name" 40; return; }
  "$out/bin/cdi-e2e" hostpaths "$spec" >"$W/$name.hostpaths" 2>&1 && r=PASS || r=FAIL
  echo "  device nodes in the plugin's spec:"; grep deviceNode "$W/$name.hostpaths" | sed 's/^/    /'
  grep -c '^ok' "$W/$name.hostpaths" | sed 's/^/  host paths in it that exist: /'
  grep -v '^ok' "$W/$name.hostpaths" | sed 's/^/  /'
  result "device plugin, $label: every host path in its spec exists" $r
  local d=$W/spec-$name; mkdir -p "$d"; cp "$spec" "$d/"
  local o
  o=$(ctr "$name-smi" "$(dirname "$spec")" "$dp_cdi" nvidia-smi -L); echo "$o" | sed 's/^/  /'
  echo "$o" | grep -q '^GPU 0: ' && r=PASS || r=FAIL
  result "device plugin, $label: nvidia-smi -L through its spec" $r
  o=$(ctr "$name-torch" "$(dirname "$spec")" "$dp_cdi" /opt/torch/.venv/bin/python3 -c "$E2E_TORCH"); echo "$o" | tail -2 | sed 's/^/  /'
  echo "$o" | grep -q '^sum 1073741824' && r=PASS || r=FAIL
  result "device plugin, $label: CUDA matmul in PyTorch through its spec" $r
}

echo "== NVIDIA device plugin v0.19.0 (built from its module), as deploy/ runs it"
dp_start deploy "$M/deploy-device-plugin.yaml" --file config/config.yaml=nvidia-device-plugin-configs/none
dp_cdi_checks deploy "deploy/"
pod_stop deploy

echo "== the device plugin from NVIDIA's chart: nvidiaDriverRoot=/run/nvidia/driver, no nvidiaDevRoot"
dp_start stock-cdi "$M/stock-cdi.yaml"
dp_cdi_checks stock-cdi "stock chart"
pod_stop stock-cdi

echo "== GPU feature discovery v0.19.0 (built from its module)"
gfd=(--env GFD_ONESHOT=true --env GFD_NO_TIMESTAMP=true --env GFD_USE_NODE_FEATURE_API=false)
labels=/etc/kubernetes/node-feature-discovery/features.d
rm -f "$labels/gfd"
pod_start gfd-chart "$M/stock-gfd.yaml" nvidia-device-plugin-gpu-feature-discovery gpu-feature-discovery-ctr "${gfd[@]}"
wait "$pod_pid"; grc=$?; runc delete -f "e2e-pod-gfd-chart-$$" >/dev/null 2>&1
pod_log gfd-chart 6
[ $grc != 0 ] && grep -q 'unsupported strategy auto' "$W/pod-gfd-chart/out.log" && r=PASS || r=FAIL
result "GFD as the chart runs it finds no NVML (exit $grc): why NFD labels are the way" $r

# NVML on its library path by hand (no chart value does this), as the dcgm-exporter init
# container does it: only libnvidia-ml, so the image's own libc stays the one it runs with.
mkdir -p "$W/gfd-nvml" && ln -sf /driver-root/usr/lib64/libnvidia-ml.so.1 "$W/gfd-nvml/libnvidia-ml.so.1"
pod_start gfd-nvml "$M/stock-gfd.yaml" nvidia-device-plugin-gpu-feature-discovery gpu-feature-discovery-ctr "${gfd[@]}" \
  --bind /run/nvidia/driver:/driver-root:ro --bind "$W/gfd-nvml:/nvml:ro" --env LD_LIBRARY_PATH=/nvml
wait "$pod_pid"; grc=$?; runc delete -f "e2e-pod-gfd-nvml-$$" >/dev/null 2>&1
[ $grc = 0 ] && grep -q '^nvidia.com/gpu.product=' "$labels/gfd" 2>/dev/null && r=PASS || { r=FAIL; pod_log gfd-nvml; }
grep -E '^nvidia.com/(gpu\.(product|count|memory|family)|cuda\.driver-version\.full)=' "$labels/gfd" 2>/dev/null | sed 's/^/  gfd: /'
result "GFD with NVML put on its library path writes nvidia.com/gpu.product" $r

ours=$(sed -n 's#^nvidia.com/gpu.product=##p' "$labels/nvidia-driver" 2>/dev/null)
theirs=$(sed -n 's#^nvidia.com/gpu.product=##p' "$labels/gfd" 2>/dev/null)
sed 's/^/  service: /' "$labels/nvidia-driver" 2>/dev/null
[ -n "$ours" ] && { [ -z "$theirs" ] || [ "$ours" = "$theirs" ]; } && r=PASS || r=FAIL
result "service's NFD label nvidia.com/gpu.product=${ours:-(none)} (GFD: ${theirs:-(none)})" $r

# The GPU Operator validator's /dev/char step (createDevCharSymlinks), made the way validator
# v26.3.1 makes it with nvidia-container-toolkit v1.19.0's devchar package (devchar-e2e):
# the driver root has a dev/, so the dev root is the driver root. v26.3.1 loads modules
# (chroot <driver root> /sbin/modprobe, which the subroot lacks) unless
# /sys/module/nvidia/refcnt exists, which needs a kernel with CONFIG_MODULE_UNLOAD (Talos's
# has it); then it creates the control nodes that are missing, through the read-only dev/.
# Validators before v26.3 always load modules here. What docs/driver-root.md says, per case:
echo "== the GPU Operator validator's /dev/char step, NVIDIA's devchar code in our helper; the validator itself runs in hack/k8s-node"
"$out/bin/devchar-e2e" --dev-char-path "$W/devchar" >"$W/devchar.log" 2>&1
vrc=$?
sed 's/^/  /' "$W/devchar.log"
if [ ! -e /sys/module/nvidia/refcnt ]; then
  want="no /sys/module/nvidia/refcnt (kernel without module unloading): its chroot modprobe fails"
  [ $vrc != 0 ] && grep -q "chroot: failed to run command .*/sbin/modprobe" "$W/devchar.log" && r=PASS || r=FAIL
elif [ -e /dev/nvidia-modeset ]; then
  want="module loaded, every control node there: links created"
  [ $vrc = 0 ] && r=PASS || r=FAIL
else
  want="module loaded, no nvidia-modeset: its mknod on the read-only dev/ fails"
  [ $vrc != 0 ] && grep -q 'nvidia-modeset.*read-only file system' "$W/devchar.log" && r=PASS || r=FAIL
fi
result "devchar code as validator v26.3.1 calls it (not the validator), $want" $r
"$out/bin/devchar-e2e" --dev-char-path "$W/devchar-old" --before-v26.3 >"$W/devchar-old.log" 2>&1
vrc=$?
tail -1 "$W/devchar-old.log" | sed 's/^/  /'
[ $vrc != 0 ] && grep -q "chroot: failed to run command .*/sbin/modprobe" "$W/devchar-old.log" && r=PASS || r=FAIL
result "devchar code as validators before v26.3 call it: chroot modprobe fails" $r
