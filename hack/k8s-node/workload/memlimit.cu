// memlimit: the sharing tests' memory workload (hack/gpu-host/test-sharing.sh). It holds
// HOLD_GIB of device memory (filled and read back on the GPU, so the memory is really used)
// for HOLD_SECONDS, then, with OVER_GIB, tries one more allocation of that size:
//   memlimit HOLD_GIB HOLD_SECONDS [OVER_GIB]
// It prints what cudaMemGetInfo reports (under MPS with a pinned-memory limit, the limit), and
// "memlimit: cudaMalloc OVER GiB: ok" or "...: failed (<error>)". Exit 0 when everything it
// tried succeeded, 3 when the OVER allocation failed, 1 on any other error.
#include <cstdio>
#include <cstdlib>
#include <unistd.h>
#include <cuda_runtime.h>

__global__ void fill(unsigned *p, size_t n, unsigned v) {
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = v ^ (unsigned)i;
}

__global__ void verify(const unsigned *p, size_t n, unsigned v, unsigned long long *bad) {
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		if (p[i] != (v ^ (unsigned)i)) atomicAdd(bad, 1ULL);
}

int main(int argc, char **argv) {
	if (argc != 3 && argc != 4) {
		fprintf(stderr, "usage: memlimit HOLD_GIB HOLD_SECONDS [OVER_GIB]\n");
		return 1;
	}
	const size_t gib = 1ULL << 30;
	size_t hold = strtoull(argv[1], 0, 10), over = argc == 4 ? strtoull(argv[3], 0, 10) : 0;
	int secs = atoi(argv[2]);
	size_t freeB = 0, totalB = 0;
	cudaError_t e = cudaMemGetInfo(&freeB, &totalB);
	if (e != cudaSuccess) {
		fprintf(stderr, "memlimit: cudaMemGetInfo: %s\n", cudaGetErrorString(e));
		return 1;
	}
	printf("memlimit: cudaMemGetInfo free %zu MiB of %zu MiB\n", freeB >> 20, totalB >> 20);
	unsigned *p = 0;
	unsigned long long *bad = 0;
	if ((e = cudaMalloc(&p, hold * gib)) != cudaSuccess || (e = cudaMalloc(&bad, sizeof *bad)) != cudaSuccess) {
		printf("memlimit: cudaMalloc %zu GiB (held): failed (%s)\n", hold, cudaGetErrorString(e));
		return 1;
	}
	size_t n = hold * gib / sizeof *p;
	cudaMemset(bad, 0, sizeof *bad);
	fill<<<1024, 256>>>(p, n, 0x5eed);
	verify<<<1024, 256>>>(p, n, 0x5eed, bad);
	unsigned long long nbad = 1;
	if ((e = cudaMemcpy(&nbad, bad, sizeof nbad, cudaMemcpyDeviceToHost)) != cudaSuccess || nbad != 0) {
		printf("memlimit: holding %zu GiB: check failed (%s, %llu bad words)\n", hold, cudaGetErrorString(e), nbad);
		return 1;
	}
	printf("memlimit: holding %zu GiB: ok (written and checked on the GPU)\n", hold);
	fflush(stdout);
	sleep(secs);
	if (over) {
		void *q = 0;
		e = cudaMalloc(&q, over * gib);
		if (e != cudaSuccess) {
			printf("memlimit: cudaMalloc %zu GiB: failed (%s)\n", over, cudaGetErrorString(e));
			return 3;
		}
		printf("memlimit: cudaMalloc %zu GiB: ok\n", over);
		cudaFree(q);
	}
	cudaFree(p);
	printf("memlimit: done\n");
	return 0;
}
