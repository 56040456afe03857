# Sourced by the GPU tests inside hack/k8s-node/cluster.sh: the CUDA workload image.
#
# workload_image REF: builds hack/k8s-node/workload/vecadd.cu and memlimit.cu with the host's
# nvcc (sm_90, the H200) into an image with the host libraries they need at the same paths,
# the rest of glibc that NVIDIA's programs from a CDI spec (nvidia-smi) need, and busybox, and
# imports it into containerd as REF. Needs K8S_NODE_DIR, K8S_NODE_IMAGES and $logs; says what
# failed on stderr and returns non-zero.
workload_image() {
	local ref=$1 nvcc r l libc a p
	nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
	[[ -n $nvcc ]] || { echo "workload: no nvcc on this host" >&2; return 1; }
	r=$K8S_NODE_DIR/workload-rootfs
	mkdir -p "$r/usr/bin" "$r/busybox" "$r/bin" "$r/etc" "$r/tmp"
	for p in vecadd memlimit; do
		"$nvcc" -O2 -arch=sm_90 -o "$r/usr/bin/$p" "$(dirname "${BASH_SOURCE[0]}")/workload/$p.cu" 2>"$logs/nvcc-$p.log" ||
			{ echo "workload: nvcc $p: $(tail -3 "$logs/nvcc-$p.log")" >&2; return 1; }
	done
	# (ldd of two files heads each list with "FILE:", which is not a library)
	for l in $(ldd "$r/usr/bin/vecadd" "$r/usr/bin/memlimit" | grep -v ':$' | grep -o '/[^ ]*' | sort -u); do
		mkdir -p "$r$(dirname "$l")" && cp -L "$l" "$r$l"
	done
	libc=$(ldd "$r/usr/bin/vecadd" | grep -o '/[^ ]*/libc\.so\.6')
	for l in libpthread.so.0 libdl.so.2 librt.so.1 libm.so.6; do
		[[ -e $(dirname "$libc")/$l ]] && cp -L "$(dirname "$libc")/$l" "$r$(dirname "$libc")/"
	done
	cp "$K8S_NODE_IMAGES/busybox" "$r/busybox/busybox"
	for a in $("$r/busybox/busybox" --list); do [[ $a == busybox ]] || ln -sf busybox "$r/busybox/$a"; done
	ln -sf /busybox/sh "$r/bin/sh"
	"$K8S_NODE_IMAGES/image" -rootfs "$r" -ref "$ref" -out "$K8S_NODE_DIR/cuda.tar" \
		-env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/busybox >/dev/null &&
		ctr -n k8s.io images import "$K8S_NODE_DIR/cuda.tar" >/dev/null
}

# The test pods: REF of workload_image in $img.
pod() { # NAME GPUS COMMAND [CLAIM]: a pod of the workload image, tolerating the GPU node's taint;
	# with CLAIM, its GPU is that ResourceClaim's (DRA) instead of GPUS nvidia.com/gpu
	local res="" claims=""
	[[ $2 -gt 0 ]] && res="resources: {limits: {nvidia.com/gpu: $2}}"
	if [[ -n ${4:-} ]]; then
		res="resources: {claims: [{name: gpu}]}"
		claims="resourceClaims: [{name: gpu, resourceClaimName: $4}]"
	fi
	# (The test pods run as root: Talos warns about, but allows, what "restricted" would refuse.)
	kubectl apply -f - 2>&1 >/dev/null <<EOF | grep -v '^Warning: would violate PodSecurity'
apiVersion: v1
kind: Pod
metadata: {name: $1, labels: {k8s-node-test: $1}}
spec:
  restartPolicy: Never
  tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
  $claims
  containers:
  - name: work
    image: $img
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "$3"]
    $res
EOF
}
watch_phases() { # NAME: time-stamped phase changes into $K8S_NODE_DIR/NAME.phases
	kubectl get pods -l k8s-node-test="$1" -w --no-headers -o custom-columns=P:.status.phase 2>/dev/null |
		while read -r p; do echo "$(date +%s.%N) $p"; done >"$K8S_NODE_DIR/$1.phases" &
}
watch_allocatable() { # NAME: from now, the node's nvidia.com/gpu allocatable as it changes, time-stamped, into $K8S_NODE_DIR/NAME.alloc
	{
		date +%s.%N
		kubectl get node "$K8S_NODE" -w -o 'jsonpath={.status.allocatable.nvidia\.com/gpu}{"\n"}' 2>/dev/null |
			while read -r a; do echo "$(date +%s.%N) ${a:-0}"; done
	} >"$K8S_NODE_DIR/$1.alloc" &
}
allocatable_seconds() { # NAME: watch_allocatable's start -> the first nvidia.com/gpu above 0 (seconds, ms precision)
	awk 'NR==1{t0=$1; next} $2>0&&!r{r=$1} END{if(r) printf "%.3f", r-t0; else print "none"}' "$K8S_NODE_DIR/$1.alloc"
}
start_seconds() { # NAME: created -> first Running, from the watch (seconds, ms precision)
	awk 'NR==1{t0=$1} $2=="Running"&&!r{r=$1} END{if(r) printf "%.3f", r-t0; else print "none"}' "$K8S_NODE_DIR/$1.phases"
}
