#!/usr/bin/env bash
# GPU end-to-end test: on any Linux host with an NVIDIA GPU and root, make the host look like a
# Talos node in a private mount namespace, run the nvidia-driver service there from its own
# container root filesystem, and start workloads with plain runc through the CDI specs: ours
# (/run/cdi/nvidia.yaml) and the one NVIDIA's device plugin v0.19.0 writes. The plugin runs in a
# runc container made from deploy/'s and the stock chart's rendered pods, and a test client of
# ours plays the kubelet's side of the device-plugin API (hack/gpu-host/e2e-consumers.sh): the real
# kubelet and containerd run in hack/k8s-node. GPU feature discovery too.
# Skipped (exit 0) where there is no NVIDIA driver. Nothing on the host changes: every mount
# is in the private namespace, and the service runs nvidia-persistenced with
# --no-persistence-mode on a private /run.
#
#   hack/gpu-host/e2e-gpu.sh [DRIVER_TREE]     (default /usr/local/nvidia)
#
# Needs, from `make build` and `make e2e-tools` on a build machine: _out/bin/{nvidia-cdi-hook,
# ldconfig,nvidia-ctk,cdi-e2e,nvidia-device-plugin,gpu-feature-discovery,kubelet-e2e,devchar-e2e},
# _out/e2e/*.yaml (hack/gpu-host/render-consumers.sh), _out/containers/nvidia-driver/, and runc (in
# PATH, or Debian's .deb files in _out/debs/, unpacked here).
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
tree=${1:-/usr/local/nvidia}
out=$top/_out
W=${E2E_WORK:-/tmp/nvidia-driver-e2e}
. "$top/hack/gpu-host/e2e-lib.sh"
# Every check prints PASS or FAIL and a FAIL fails the run; lines marked "measurement only"
# are figures that nothing checks.
fail=0
result() { printf '%-62s %s\n' "$1" "$2"; [ "$2" = PASS ] || fail=1; }

if [ "${E2E_INNER:-}" != 1 ]; then
  if [ ! -e /proc/driver/nvidia/version ]; then
    echo "e2e-gpu: SKIP: no NVIDIA kernel driver on this host"
    exit 0
  fi
  [ "$(id -u)" = 0 ] || { echo "e2e-gpu: needs root" >&2; exit 2; }
  rm -rf "$W"; mkdir -p "$W"
  echo "== host: $(nvidia-smi -L 2>/dev/null | tr '\n' ' ')"
  # Persistence and MIG modes must be the same after the run: nothing here may change them.
  modes_before=$(e2e_gpu_state) || { echo "e2e-gpu: FAIL: nvidia-smi cannot read the GPUs' modes"; exit 1; }
  echo "== persistence and MIG modes before: $(echo "$modes_before" | paste -sd ';')"

  # runc: Debian's, unpacked here if the host has none.
  if ! command -v runc >/dev/null; then
    mkdir -p "$W/debs"
    for d in "$out"/debs/*.deb; do dpkg -x "$d" "$W/debs"; done
    export PATH=$W/debs/usr/sbin:$W/debs/usr/bin:$PATH
    export LD_LIBRARY_PATH=$W/debs/usr/lib/x86_64-linux-gnu:$W/debs/lib/x86_64-linux-gnu
  fi
  echo "== runc: $(runc --version | head -1)"

  echo "== subroot from $tree"
  LDCONFIG=$out/bin/ldconfig "$top/hack/dev/build-subroot.sh" host "$W/subroot" "$tree" || exit 1
  C=$out/containers/nvidia-driver
  "$C/lib64/ld-linux-x86-64.so.2" --library-path "$C/lib/x86_64-linux-gnu" "$C/usr/bin/nvidia-driver" check-root "$W/subroot" && r=PASS || r=FAIL
  result "check-root accepts the subroot built from $tree" $r
  # The host tree's files, for the check that the workloads' rootfs holds none of them (the
  # tree is hidden in the namespace below).
  "$out/bin/cdi-e2e" driverfiles --out "$W/driver-files" "$tree/lib64" "$tree/bin" | sed 's/^/  /'
  [ "${PIPESTATUS[0]}" = 0 ] && r=PASS || r=FAIL
  result "manifest of the driver tree's files" $r
  export E2E_DRIVER_MANIFEST=$W/driver-files E2E_DRIVER_TREE=$tree

  echo "== reference: nvidia-ctk cdi generate on the host's standard layout"
  "$out/bin/nvidia-ctk" cdi generate --output "$W/ctk.yaml" 2>"$W/ctk.log" || { cat "$W/ctk.log"; exit 1; }

  # Cold, end to end (process start, NVML init, spec, write), each tool on its own layout:
  # nvidia-ctk on the host's installed driver, ours on the subroot built from it. Checked:
  # ours no slower and no larger than nvidia-ctk's (BENCH_MIN_SPEEDUP, BENCH_MAX_RSS_RATIO);
  # the ratios themselves are measurements.
  if [ -z "${E2E_SKIP_BENCH:-}" ]; then
    echo "== benchmark: nvidia-driver cdi generate vs nvidia-ctk cdi generate"
    "$out/bin/cdi-e2e" bench -n "${BENCH_RUNS:-11}" --min-speedup "${BENCH_MIN_SPEEDUP:-1}" --max-rss-ratio "${BENCH_MAX_RSS_RATIO:-1}" \
      --name-a nvidia-ctk --a "$out/bin/nvidia-ctk cdi generate --output $W/bench-ctk.yaml" \
      --name-b nvidia-driver --b "$C/lib64/ld-linux-x86-64.so.2 --library-path $C/lib/x86_64-linux-gnu $C/usr/bin/nvidia-driver cdi generate --driver-root $W/subroot --output $W/bench-ours.yaml" \
      2>&1 | sed 's/^/  /'
    [ "${PIPESTATUS[0]}" = 0 ] && r=PASS || r=FAIL
    result "cdi generate: ours no slower, no larger peak RSS than nvidia-ctk" $r
  fi

  if [ -z "${E2E_SKIP_PERSISTENCED:-}" ]; then
    echo "== nvidia-persistenced under the supervisor (hack/gpu-host/e2e-persistenced.sh)"
    "$top/hack/gpu-host/e2e-persistenced.sh" "$W/subroot" "$out/bin/persistenced-e2e" -- --kills 10 2>&1 | sed 's/^/  /'
    [ "${PIPESTATUS[0]}" = 0 ] && r=PASS || r=FAIL
    result "real nvidia-persistenced under the supervisor: 10 kills, stop, modes unchanged" $r
  fi

  # Every GPU by index and UUID, as the host's nvidia-smi numbers them: the checks below loop
  # over all of them, whatever their count.
  export E2E_UUIDS=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | tr '\n' ' ')
  export E2E_GPUS=$(echo $E2E_UUIDS | wc -w)
  echo "== GPUs: $E2E_GPUS"
  # NVSwitch board, read-only: what the service's detection reads, what NVML says of each
  # GPU's fabric registration, and whether a fabric manager runs here already.
  echo "== NVSwitch board: $(ls /proc/driver/nvidia-nvswitch/devices 2>/dev/null | wc -l) switch(es) in /proc/driver/nvidia-nvswitch/devices," \
    "$(grep -l 0x068000 /sys/bus/pci/devices/*/class 2>/dev/null | xargs -r dirname | xargs -r -I{} grep -l 0x10de {}/vendor | wc -l) NVIDIA bridge (class 0x068000) PCI function(s)"
  nvidia-smi -q 2>/dev/null | grep -A2 '^ *Fabric$' | grep -E 'State|Status' | sort | uniq -c | sed 's/^/  fabric: /'
  echo "  fabric manager processes on the host: $(pgrep -c nv-fabricmanager || true)"
  E2E_INNER=1 unshare --mount --propagation private "$0" "$@"
  rc=$?
  [ $rc = 0 ] || fail=1
  e2e_modes_unchanged "$modes_before" && r=PASS || r=FAIL
  result "persistence and MIG modes unchanged" $r
  [ $fail = 0 ] && echo "e2e-gpu: PASS" || echo "e2e-gpu: FAIL"
  exit $fail
fi

# ---- inside the private mount namespace: a host that looks like Talos -------------------

# /run: private, shared below like Talos's, so the service's mounts propagate as on a node.
mount -t tmpfs e2e-run /run && mount --make-shared /run
# /usr/local: the driver only in the subroot, at the Talos path.
mount -t tmpfs e2e-usr-local /usr/local
mkdir -p /usr/local/glibc && mount --bind -o ro "$W/subroot" /usr/local/glibc
# /usr/bin and /usr/sbin: the extension's hook and static ldconfig (also as /sbin/ldconfig,
# the update-ldcache hook's default), over the host's through an overlay. /etc and /var/lib:
# overlays too, so that what the pods write there (NFD feature files, the kubelet's
# device-plugin sockets) stays in this namespace.
for d in /usr/bin /usr/sbin /etc /var/lib; do
  n=$(echo "$d" | tr / _)
  mkdir -p "$W/ov$n/upper" "$W/ov$n/work"
  mount -t overlay "e2e$n" -o "lowerdir=$d,upperdir=$W/ov$n/upper,workdir=$W/ov$n/work" "$d"
done
install -m 0755 "$out/bin/nvidia-cdi-hook" /usr/bin/nvidia-cdi-hook
install -m 0755 "$out/bin/ldconfig" /usr/bin/ldconfig
install -m 0755 "$out/bin/ldconfig" /usr/sbin/ldconfig
# /dev: fresh, so the service's device-node job makes the NVIDIA nodes from /proc.
mount -t tmpfs -o mode=755 e2e-dev /dev
for n in null:1:3 zero:1:5 full:1:7 random:1:8 urandom:1:9 tty:5:0; do
  IFS=: read -r name ma mi <<<"$n"; mknod -m 666 "/dev/$name" c "$ma" "$mi"
done
mkdir -p /dev/pts /dev/shm && mount -t devpts -o newinstance,ptmxmode=666 devpts /dev/pts && ln -s pts/ptmx /dev/ptmx
mount -t tmpfs shm /dev/shm

# The hook runs on the host, and Talos has no /lib64 loader: it must take its interpreter from
# the subroot. Prove it in a root that has nothing else.
mkdir -p "$W/bare/usr/bin" "$W/bare/usr/local/glibc"
cp "$out/bin/nvidia-cdi-hook" "$W/bare/usr/bin/" && mount --bind /usr/local/glibc "$W/bare/usr/local/glibc"
if chroot "$W/bare" /usr/bin/nvidia-cdi-hook --version >/dev/null 2>&1; then r=PASS; else r=FAIL; fi
result "hook runs in a root with no loader but the subroot's" $r

# ---- the service, from its own container root filesystem --------------------------------
C=$out/containers/nvidia-driver
svc() { "$C/lib64/ld-linux-x86-64.so.2" --library-path "$C/lib/x86_64-linux-gnu" "$C/usr/bin/nvidia-driver" "$@"; }
export NVIDIA_DRIVER_SUBROOT=/usr/local/glibc NVIDIA_DRIVER_PERSISTENCE_MODE=false
# ext-nvidia-driver starts no fabric manager (ext-nvidia-fabricmanager does, and this script
# does not run that service: a shared host's fabric is never touched). Its NVSwitch job still
# reports what it found.
export NVIDIA_DRIVER_NFD_FEATURES_DIR=/etc/kubernetes/node-feature-discovery/features.d
# service_start LOG: run the service in the background (spid) and wait until it is ready (or
# degraded: an NVSwitch board whose fabric is not up) or gone. exec: $! must be the service
# itself, so that a SIGTERM reaches it.
#
# The service runs its NVML jobs in children of its own binary (/proc/self/exe), so it is
# started as a container starts it, not through the loader by hand (then /proc/self/exe
# would be the loader): a copy of the binary, changed only in its ELF interpreter (patched in
# place: /run/e2e-ld.so, the container's loader), with the container's libraries.
cp "$C/lib64/ld-linux-x86-64.so.2" /run/e2e-ld.so
python3 - "$C/usr/bin/nvidia-driver" "$W/nvidia-driver" /run/e2e-ld.so <<'PY'
import struct, sys
src, dst, interp = sys.argv[1:]
elf = bytearray(open(src, "rb").read())
phoff, = struct.unpack_from("<Q", elf, 0x20)
phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
for i in range(phnum):
    ph = phoff + i * phentsize
    if struct.unpack_from("<I", elf, ph)[0] == 3:  # PT_INTERP
        off, = struct.unpack_from("<Q", elf, ph + 8)
        size, = struct.unpack_from("<Q", elf, ph + 32)
        new = interp.encode() + b"\0"
        assert len(new) <= size, "interpreter path too long"
        elf[off:off + size] = new.ljust(size, b"\0")
open(dst, "wb").write(elf)
PY
chmod 755 "$W/nvidia-driver"
# wait_phase PID PHASES TENTHS: until the status file shows one of PHASES (a \| list), PID is
# gone, or TENTHS tenths of a second have passed.
wait_phase() {
  for _ in $(seq "$3"); do
    grep -q "\"phase\": \"\($2\)\"" /run/nvidia-driver/status.json 2>/dev/null && return
    kill -0 "$1" 2>/dev/null || return
    sleep 0.1
  done
}
service_start() {
  ( export LD_LIBRARY_PATH="$C/lib/x86_64-linux-gnu"; exec "$W/nvidia-driver" run 2>"$1" ) &
  spid=$!
  wait_phase $spid 'ready\|degraded' 3000
}
# On a node the service's files lie on a read-only squashfs; here they were just copied or
# built, and the kernel does not page out dirty page-cache pages: write them back first, or
# the idle RSS below would count pages a node never keeps.
sync
start=$(date +%s%N)
service_start "$W/service.log"
echo "== service log"; sed 's/^/  /' "$W/service.log"
ready_ms=?
if grep -q '"phase": "ready"' /run/nvidia-driver/status.json 2>/dev/null; then
  ready_ms=$(( ($(date +%s%N) - start) / 1000000 ))
  result "service ready ($ready_ms ms): mount, device nodes, persistenced, CDI" PASS
else
  result "service ready" FAIL; cat /run/nvidia-driver/status.json
fi
findmnt -n -o TARGET,OPTIONS /run/nvidia/driver | grep -q '^/run/nvidia/driver *ro,' && r=PASS || r=FAIL
result "/run/nvidia/driver mounted read-only" $r
ls -l /dev/nvidia* | sed 's/^/  /'
missing=
for f in /proc/driver/nvidia/gpus/*/information; do
  m=$(sed -n 's/^Device Minor:[[:space:]]*//p' "$f")
  [ -c "/dev/nvidia$m" ] || missing="$missing /dev/nvidia$m"
done
[ -z "$missing" ] && r=PASS || r=FAIL
result "a device node for each of the $E2E_GPUS GPU(s)${missing:+, missing:$missing}" $r
# The NVSwitch job: on a board with switches, a fabric manager already at work is left alone
# and the status says so; elsewhere the status has no fabric.
fabric=$(grep -A3 '^  "fabric": {' /run/nvidia-driver/status.json | sed -n 's/^ *"\(state\|message\)": "\(.*\)",\{0,1\}$/\2/p' | paste -sd ' ')
echo "  status fabric: ${fabric:-none}"
if [ -n "$(ls /proc/driver/nvidia-nvswitch/devices 2>/dev/null)" ]; then
  [ ! -e /run/nvidia-fabricmanager/fabricmanager.cfg ] && r=PASS || r=FAIL
  result "NVSwitch board: the service started no fabric manager of its own" $r
  if [ "$(pgrep -c nv-fabricmanager || true)" -gt 0 ]; then
    echo "$fabric" | grep -q 'ext-nvidia-fabricmanager service is not running' && r=PASS || r=FAIL
    result "NVSwitch board: the status names the fabric manager service it found not running" $r
  fi
else
  [ -z "$fabric" ] && r=PASS || r=FAIL
  result "no NVSwitch: no fabric in the status" $r
fi
# The contract (docs/driver-root.md): the driver root's dev/ is the host's /dev, read-only,
# device nodes open through it.
o=$(findmnt -n -o OPTIONS /run/nvidia/driver/dev); echo "  /run/nvidia/driver/dev: $o"
echo "$o" | grep -q '^ro,' && ! echo "$o" | grep -q nodev && [ "$(stat -c %d:%i /dev)" = "$(stat -c %d:%i /run/nvidia/driver/dev)" ] \
  && (exec 3</run/nvidia/driver/dev/nvidiactl) && r=PASS || r=FAIL
result "/run/nvidia/driver/dev is the host's /dev, read-only, nodes open" $r
[ -S /run/nvidia/driver/run/nvidia-persistenced/socket ] && r=PASS || r=FAIL
result "persistenced socket visible under the driver root" $r
# Idle memory: the service's RSS a second after ready, and, from its own log line, its RSS at
# ready before it released the bring-up's memory (NVML shut down, Go and C heaps trimmed,
# file pages paged out): what it kept idle before it did so. Bound: 16 MiB.
sleep 1
idle=$(awk '/VmRSS/{print $2}' /proc/$spid/status)
before=$(grep -o 'rssBeforeKiB=[0-9]*' "$W/service.log" | tail -1 | cut -d= -f2)
echo "  idle RSS: ${idle} kB (at ready, before releasing the bring-up's memory: ${before:-?} kB)"
# Where it is: the largest resident mappings, so a regression names its cause.
awk '/^[0-9a-f]+-[0-9a-f]+ /{name=($6 == "" ? "[anon]" : $6)} /^Rss:/{rss[name]+=$2; n[name]++} END{for (k in rss) if (rss[k] >= 256) printf "    %6d kB  %s (%d mappings)\n", rss[k], k, n[k]}' /proc/$spid/smaps | sort -rn | head -12
[ -n "${E2E_SMAPS:-}" ] && awk '/^[0-9a-f]+-[0-9a-f]+ /{m=$1" "$6} /^Size:/{sz=$2} /^Rss:/{if ($2 >= 128) printf "      %6d kB of %7d kB  %s\n", $2, sz, m}' /proc/$spid/smaps | sort -rn | head -25
[ -n "${E2E_SMAPS:-}" ] && echo "  files mapped: $(awk '$6 ~ /^\// {print $6}' /proc/$spid/maps | sort -u | xargs -r -n1 basename | paste -sd ' ')"
echo "  threads: $(ls /proc/$spid/task | wc -l)"
[ -n "$idle" ] && [ "$idle" -le 16384 ] && r=PASS || r=FAIL
result "idle RSS ${idle} kB <= 16384 kB (16 MiB); before release ${before:-?} kB" $r

# ---- specs -------------------------------------------------------------------------------
echo "== compare our spec with nvidia-ctk's"
"$out/bin/cdi-e2e" compare --subroot "$W/subroot" /run/cdi/nvidia.yaml "$W/ctk.yaml" | sed 's/^/  /'
[ "${PIPESTATUS[0]}" = 0 ] && r=PASS || r=FAIL
result "our spec covers nvidia-ctk's, per device (nodes, mounts, hooks, env)" $r

# ---- workloads with plain runc -------------------------------------------------------------
e2e_rootfs && r=PASS || r=FAIL
result "workload rootfs: no file of the host's driver where one looks" $r
torch=$E2E_TORCH

out1=$(ctr smi /run/cdi nvidia.com/gpu=all nvidia-smi -L); echo "$out1" | sed 's/^/  /'
[ "$(echo "$out1" | grep -c '^GPU ')" = "$E2E_GPUS" ] && r=PASS || r=FAIL
result "ours, nvidia.com/gpu=all: nvidia-smi -L lists all $E2E_GPUS GPU(s)" $r
out2=$(ctr torch /run/cdi nvidia.com/gpu=all /opt/torch/.venv/bin/python3 -c "$torch"); echo "$out2" | tail -3 | sed 's/^/  /'
echo "$out2" | grep -q '^sum 1073741824' && r=PASS || r=FAIL
result "ours, nvidia.com/gpu=all: CUDA matmul in PyTorch is right" $r
# The control: every GPU's device node and the control nodes, none of the spec's mounts.
nodes=(/dev/nvidiactl /dev/nvidia-uvm)
for f in /proc/driver/nvidia/gpus/*/information; do nodes+=("/dev/nvidia$(sed -n 's/^Device Minor:[[:space:]]*//p' "$f")"); done
out3=$(E2E_INJECT=--nodes-only ctr control /run/cdi nvidia.com/gpu=all /opt/torch/.venv/bin/python3 -c "$E2E_CONTROL")
echo "$out3" | grep -E '^(nodes|cuda) ' | sed 's/^/  /'; echo "$out3" | tail -1 | sed 's/^/  /'
e2e_control_verdict "$out3" "${nodes[@]}" && r=PASS || r=FAIL
result "control, device nodes without the spec's mounts: no driver for CUDA" $r

# ---- NVIDIA's consumers: the device plugin (its own spec) and GPU feature discovery ---------
if [ -z "${E2E_SKIP_CONSUMERS:-}" ]; then
  E2E_TORCH=$torch . "$top/hack/gpu-host/e2e-consumers.sh"
fi

# sees NAME DEVICES UUID...: a container given DEVICES (comma-separated CDI names) sees exactly
# the GPUs with those UUIDs.
sees() {
  local name=$1 devs=$2; shift 2
  local got; got=$(ctr "$name" /run/cdi "$devs" nvidia-smi -L)
  echo "$got" | sed 's/^/  /'
  [ "$(echo "$got" | grep -c '^GPU ')" = $# ] || return 1
  for u in "$@"; do echo "$got" | grep -q "$u" || return 1; done
}
uuids=($E2E_UUIDS)
for i in "${!uuids[@]}"; do
  sees "gpu$i" "nvidia.com/gpu=$i" "${uuids[$i]}" && r=PASS || r=FAIL
  result "nvidia.com/gpu=$i gives exactly GPU $i" $r
  sees "uuid$i" "nvidia.com/gpu=${uuids[$i]}" "${uuids[$i]}" && r=PASS || r=FAIL
  result "nvidia.com/gpu=<UUID of GPU $i> gives exactly GPU $i" $r
done
if [ "$E2E_GPUS" -ge 2 ]; then
  last=$((E2E_GPUS - 1))
  sees pair "nvidia.com/gpu=0,nvidia.com/gpu=$last" "${uuids[0]}" "${uuids[$last]}" && r=PASS || r=FAIL
  result "nvidia.com/gpu=0 and nvidia.com/gpu=$last: exactly those two GPUs" $r
else
  echo "  (one GPU: the two-device check needs two)"
fi

# ---- persistenced: kill -9, and stop -------------------------------------------------------
ppid=$(cat /run/nvidia-persistenced/nvidia-persistenced.pid 2>/dev/null)
if [ -n "$ppid" ]; then
  t0=$(date +%s%N); kill -9 "$ppid"
  for _ in $(seq 300); do
    np=$(cat /run/nvidia-persistenced/nvidia-persistenced.pid 2>/dev/null)
    [ -n "$np" ] && [ "$np" != "$ppid" ] && [ -S /run/nvidia-persistenced/socket ] && break
    sleep 0.01
  done
  [ -n "$np" ] && [ "$np" != "$ppid" ] && r=PASS || r=FAIL
  result "persistenced restarted after kill -9 ($(( ($(date +%s%N) - t0) / 1000000 )) ms to a new pid and socket)" $r
else
  result "persistenced running under the service" FAIL
fi

t0=$(date +%s%N); kill -TERM $spid; wait $spid; rc=$?
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
[ $rc = 0 ] && [ $ms -lt 10000 ] && r=PASS || r=FAIL
result "SIGTERM: service exit code $rc after $ms ms" $r
pgrep -f 'bin/nvidia-persistenced' >/dev/null && r=FAIL || r=PASS
result "nvidia-persistenced stopped with the service" $r
findmnt -n /run/nvidia/driver >/dev/null && findmnt -n /run/nvidia/driver/dev >/dev/null && r=PASS || r=FAIL
result "driver root and its dev/ still mounted after the service stopped" $r

# A restart (every ExtensionServiceConfig change is one) reuses both mounts, stacks nothing.
service_start "$W/service2.log"
grep -E 'reusing|replacing|mounted|bound' "$W/service2.log" | sed 's/^/  /'
n1=$(awk '$5 == "/run/nvidia/driver"' /proc/self/mountinfo | wc -l); n2=$(awk '$5 == "/run/nvidia/driver/dev"' /proc/self/mountinfo | wc -l)
grep -q 'driver root already mounted by an earlier run' "$W/service2.log" && grep -q 'host /dev already bound under the driver root' "$W/service2.log" \
  && [ "$n1" = 1 ] && [ "$n2" = 1 ] && r=PASS || r=FAIL
result "restart: both mounts reused ($n1 at the driver root, $n2 at its dev/)" $r
kill -TERM $spid; wait $spid

# Idle memory against baselines in the same run: E2E_BASELINE_CONTAINERS names container root
# filesystems of other builds of the service (earlier commits', from
# hack/dev/stage-service-rootfs.sh), each run the same way on the same node; its ready time and
# RSS a second after ready are printed beside ours. Settings a build does not know are left
# out of its environment (its configuration is strict). Baselines run through the loader by
# hand: builds before the NVML jobs do not execute themselves again.
for B in ${E2E_BASELINE_CONTAINERS:-${E2E_BASELINE_CONTAINER:-}}; do
  rm -f /run/nvidia-driver/status.json
  # Builds before the driver-root contract refuse a subroot with dev/: give them a copy
  # (hard links) without it.
  bsub=$W/subroot
  if ! "$B/lib64/ld-linux-x86-64.so.2" --library-path "$B/lib/x86_64-linux-gnu" "$B/usr/bin/nvidia-driver" check-root "$bsub" >/dev/null 2>&1; then
    bsub=$W/subroot-nodev
    rm -rf "$bsub" && cp -al "$W/subroot" "$bsub" && rmdir "$bsub/dev" 2>/dev/null
  fi
  bstart=$(date +%s%N)
  ( exec env -u NVIDIA_DRIVER_NFD_FEATURES_DIR -u LD_LIBRARY_PATH NVIDIA_DRIVER_SUBROOT="$bsub" \
      "$B/lib64/ld-linux-x86-64.so.2" --library-path "$B/lib/x86_64-linux-gnu" "$B/usr/bin/nvidia-driver" run 2>"$W/baseline.log" ) &
  bpid=$!
  wait_phase $bpid 'ready\|failed' 600
  bready=$(( ($(date +%s%N) - bstart) / 1000000 ))
  sleep 1
  bidle=$(awk '/VmRSS/{print $2}' /proc/$bpid/status 2>/dev/null)
  grep -q '"phase": "ready"' /run/nvidia-driver/status.json 2>/dev/null || { echo "  baseline not ready:"; tail -3 "$W/baseline.log" | sed 's/^/    /'; }
  echo "  measurement only, same node, same run: this build ready in ${ready_ms} ms, idle RSS ${idle} kB; baseline $(basename "$B") ready in ${bready} ms, idle RSS ${bidle:-?} kB"
  kill -TERM $bpid 2>/dev/null; wait $bpid
done
exit $fail
