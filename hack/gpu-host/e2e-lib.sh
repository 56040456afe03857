# Shared by hack/gpu-host/e2e-gpu.sh and hack/gpu-host/e2e-workload.sh (sourced): start containers with plain
# runc, their CDI edits injected as containerd injects them. Needs $W (scratch), $out (_out),
# and runc in PATH; runs as root in a private mount namespace.

# The PyTorch check: CUDA available and a matmul with a known sum (1024^3).
E2E_TORCH='import torch; ok = torch.cuda.is_available(); print("cuda", ok); a = torch.ones(1024, 1024, device="cuda"); print("sum", (a @ a).sum().item())'

# The control: the GPUs' device nodes without the spec's mounts. It prints the nodes it sees,
# then CUDA must fail for want of the driver's library (PyTorch's c10/cuda/CUDAFunctions.cpp:
# "Found no NVIDIA driver" is cudaErrorInsufficientDriver with no driver version, not "no
# device").
E2E_CONTROL='import glob; print("nodes", " ".join(sorted(glob.glob("/dev/nvidia*")))); import torch; print("cuda", torch.cuda.is_available()); torch.ones(1, device="cuda")'

# e2e_control_verdict OUTPUT NODE...: the control's output shows every NODE, CUDA
# unavailable and failing with "Found no NVIDIA driver", and no result; prints why not.
e2e_control_verdict() {
  local o=$1 n; shift
  local nodes; nodes=$(echo "$o" | sed -n 's/^nodes //p')
  for n in "$@"; do
    echo " $nodes " | grep -q " $n " || { echo "  control: device node $n not in the container (saw: ${nodes:-none})"; return 1; }
  done
  echo "$o" | grep -q '^cuda False$' || { echo "  control: torch.cuda.is_available() was not False"; return 1; }
  echo "$o" | grep -q 'Found no NVIDIA driver' || { echo "  control: CUDA did not fail for want of the driver"; return 1; }
  ! echo "$o" | grep -q '^sum ' || { echo "  control: a result came back"; return 1; }
}

# e2e_gpu_state: each GPU's index, bus id, persistence and MIG modes (read-only query).
e2e_gpu_state() { nvidia-smi --query-gpu=index,pci.bus_id,persistence_mode,mig.mode.current --format=csv,noheader; }

# e2e_modes_unchanged BEFORE: the GPUs' modes now are BEFORE (an e2e_gpu_state of earlier).
e2e_modes_unchanged() {
  local now; now=$(e2e_gpu_state) || { echo "  cannot read the GPUs' modes now"; return 1; }
  echo "== persistence and MIG modes after: $(echo "$now" | paste -sd ';')"
  [ -n "$1" ] && [ "$1" = "$now" ] || { echo "  before: $(echo "$1" | paste -sd ';')"; return 1; }
}

# e2e_rootfs makes $W/rootfs: a non-recursive bind of the host's / (it leaves out the
# driver's own mount and this namespace's overlays) under a tmpfs-backed overlay for writes.
# Under the runtime harness, whose / is a Talos-shaped root, the host's / is HARNESS_HOST_ROOT.
# It fails when the host's driver is visible there where a workload looks (cdi-e2e
# driverfree): E2E_DRIVER_MANIFEST names the tree's files (cdi-e2e driverfiles), and
# E2E_DRIVER_TREE the tree's own path, looked at as well.
e2e_rootfs() {
  mkdir -p "$W/lower" "$W/cup" "$W/cwork" "$W/rootfs"
  mount --bind "${HARNESS_HOST_ROOT:-/}" "$W/lower" || return 1
  mount -t overlay e2e-rootfs -o "lowerdir=$W/lower,upperdir=$W/cup,workdir=$W/cwork" "$W/rootfs" || return 1
  local t=${E2E_DRIVER_TREE:-/usr/local/nvidia}
  "$out/bin/cdi-e2e" driverfree --rootfs "$W/rootfs" ${E2E_DRIVER_MANIFEST:+--manifest "$E2E_DRIVER_MANIFEST"} \
    --dir "$t/lib64" --dir "$t/bin" | sed 's/^/  /'
  return "${PIPESTATUS[0]}"
}

# ctr NAME SPEC_DIR DEVICES-or-empty ARGS...: run ARGS in a container of $W/rootfs with DEVICES
# (CDI names, comma-separated) injected from the specs in SPEC_DIR; prints the container's output.
# E2E_INJECT=--nodes-only injects only their device nodes.
ctr() {
  local name=$1 dir=$2 dev=$3; shift 3
  local b=$W/bundle-$name; rm -rf "$b"; mkdir -p "$b"
  (cd "$b" && runc spec)
  local inj=(--spec-dir "$dir" --config "$b/config.json" --rootfs "$W/rootfs" ${E2E_INJECT:-})
  # dev: one CDI device, or several separated by commas.
  local d; for d in ${dev//,/ }; do inj+=(--device "$d"); done
  "$out/bin/cdi-e2e" inject "${inj[@]}" -- "$@" || return 1
  echo "[$(date +%T.%N | cut -c1-12)] runc run $name" >&2
  timeout -k 5 "${E2E_CTR_TIMEOUT:-120}" runc --log "$b/runc.log" run --bundle "$b" "e2e-$name-$$" </dev/null 2>&1
  local rc=$?
  if [ $rc = 124 ] || [ $rc = 137 ]; then
    echo "TIMEOUT running $name; processes:" >&2
    ps -eo pid,ppid,stat,wchan:20,args --forest | grep -v '\[' | tail -25 >&2
    tail -5 "$b/runc.log" >&2
    runc delete -f "e2e-$name-$$" >/dev/null 2>&1
  fi
  echo "[$(date +%T.%N | cut -c1-12)] runc exit $rc" >&2
}
