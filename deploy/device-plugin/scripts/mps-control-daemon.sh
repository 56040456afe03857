#!/bin/sh
# The chart's MPS control daemon on the ext-nvidia-driver driver root, without the NVIDIA
# container runtime (docs/sharing.md, "MPS"). NVIDIA's image counts on that runtime to put
# the driver's programs and libraries into the container; here they are taken from the driver
# root, mounted at /driver-root:
#   - mps-control-daemon runs `nvidia-smi -c EXCLUSIVE_PROCESS` and `nvidia-cuda-mps-control -d`
#     looked up on its PATH, and starts nvidia-cuda-mps-control with an environment of two
#     variables only, CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY
#     (k8s-device-plugin v0.19.0 cmd/mps-control-daemon/mps/daemon.go, Start);
#   - the control daemon then starts nvidia-cuda-mps-server by name with that environment, so
#     with no PATH (execvp's default /bin:/usr/bin), and the server loads libcuda.so.1, and
#     the daemon NVML, from the loader's default directories.
# So the programs are linked into /usr/bin and NVIDIA's libraries (not the driver root's glibc:
# the image's own loader runs them) into /usr/lib and /usr/lib64, where the image's loader
# looks without LD_LIBRARY_PATH. Then the daemon is exec'd as /usr/bin/mps-control-daemon:
# the chart's config-manager sidecar finds the process to signal by that argv[0].
set -u
root=/driver-root
ready=/run/nvidia/validations/nvidia-driver.ready
# Like the plugin's wait-for-driver: nothing before the service has brought the node up.
until [ -s "$ready" ]; do echo "mps-control-daemon: waiting for $ready"; sleep 2; done
for b in nvidia-cuda-mps-control nvidia-cuda-mps-server nvidia-smi; do
	if [ ! -x "$root/usr/bin/$b" ]; then
		echo "mps-control-daemon: $root/usr/bin/$b is missing: the driver root (/run/nvidia/driver) has no MPS; the extension's driver payload must include NVIDIA's MPS programs" >&2
		exit 1
	fi
	ln -sf "$root/usr/bin/$b" "/usr/bin/$b"
done
mkdir -p /usr/lib /usr/lib64
n=0
for l in "$root"/usr/lib64/libcuda.so* "$root"/usr/lib64/libnvidia-*.so*; do
	[ -e "$l" ] || continue
	ln -sf "$l" /usr/lib/ && ln -sf "$l" /usr/lib64/ && n=$((n + 1))
done
echo "mps-control-daemon: linked nvidia-cuda-mps-control, nvidia-cuda-mps-server, nvidia-smi and $n NVIDIA libraries from $root"
exec /usr/bin/mps-control-daemon "$@"
