// vecadd: a CUDA program that checks its own result, the test pods' GPU workload. It adds two
// vectors of 4,194,304 floats on GPU 0 and compares every element with the sum computed on
// the host; it prints the device and "vecadd: N elements ok" and exits 0 only when all match.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

__global__ void add(const float *a, const float *b, float *c, int n) {
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) c[i] = a[i] + b[i];
}

#define CHECK(call)                                                                       \
	do {                                                                              \
		cudaError_t e = (call);                                                   \
		if (e != cudaSuccess) {                                                   \
			fprintf(stderr, "vecadd: %s: %s\n", #call, cudaGetErrorString(e)); \
			return 1;                                                         \
		}                                                                         \
	} while (0)

int main() {
	const int n = 1 << 22;
	const size_t bytes = n * sizeof(float);
	float *a = (float *)malloc(bytes), *b = (float *)malloc(bytes), *c = (float *)malloc(bytes);
	for (int i = 0; i < n; i++) {
		a[i] = (float)(i % 1000);
		b[i] = (float)(2 * (i % 777));
	}
	cudaDeviceProp prop;
	CHECK(cudaGetDeviceProperties(&prop, 0));
	printf("vecadd: device 0: %s\n", prop.name);
	float *da, *db, *dc;
	CHECK(cudaMalloc(&da, bytes));
	CHECK(cudaMalloc(&db, bytes));
	CHECK(cudaMalloc(&dc, bytes));
	CHECK(cudaMemcpy(da, a, bytes, cudaMemcpyHostToDevice));
	CHECK(cudaMemcpy(db, b, bytes, cudaMemcpyHostToDevice));
	add<<<(n + 255) / 256, 256>>>(da, db, dc, n);
	CHECK(cudaGetLastError());
	CHECK(cudaMemcpy(c, dc, bytes, cudaMemcpyDeviceToHost));
	int bad = 0;
	for (int i = 0; i < n; i++)
		if (c[i] != a[i] + b[i]) bad++;
	if (bad) {
		printf("vecadd: %d of %d elements wrong\n", bad, n);
		return 1;
	}
	printf("vecadd: %d elements ok\n", n);
	return 0;
}
