# Shared by hack/e2e-gpu.sh and hack/e2e-workload.sh (sourced): start containers with plain
# runc, their CDI edits injected as containerd injects them. Needs $W (scratch), $out (_out),
# and runc in PATH; runs as root in a private mount namespace.

# The PyTorch check: CUDA available and a matmul with a known sum (1024^3).
E2E_TORCH='import torch; ok = torch.cuda.is_available(); print("cuda", ok); a = torch.ones(1024, 1024, device="cuda"); print("sum", (a @ a).sum().item())'

# e2e_rootfs makes $W/rootfs: a non-recursive bind of the host's / (it leaves out the
# driver's own mount and this namespace's overlays) under a tmpfs-backed overlay for writes.
# Under the runtime harness, whose / is a Talos-shaped root, the host's / is HARNESS_HOST_ROOT.
e2e_rootfs() {
  mkdir -p "$W/lower" "$W/cup" "$W/cwork" "$W/rootfs"
  mount --bind "${HARNESS_HOST_ROOT:-/}" "$W/lower"
  mount -t overlay e2e-rootfs -o "lowerdir=$W/lower,upperdir=$W/cup,workdir=$W/cwork" "$W/rootfs"
  [ -e "$W/rootfs/usr/local/nvidia/lib64/libcuda.so.1" ] && echo "  WARNING: the driver is visible in the container rootfs"
  return 0
}

# ctr NAME SPEC_DIR DEVICES-or-empty ARGS...: run ARGS in a container of $W/rootfs with DEVICES
# (CDI names, comma-separated) injected from the specs in SPEC_DIR; prints the container's output.
ctr() {
  local name=$1 dir=$2 dev=$3; shift 3
  local b=$W/bundle-$name; rm -rf "$b"; mkdir -p "$b"
  (cd "$b" && runc spec)
  local inj=(--spec-dir "$dir" --config "$b/config.json" --rootfs "$W/rootfs")
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
