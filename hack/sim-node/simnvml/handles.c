// The C side of hack/sim-node/simnvml: the table that NVML handles point into, and the library's own
// path (for the state directory next to the driver root it was loaded from).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>

// nvml.h declares nvmlDevice_t, nvmlGpuInstance_t and nvmlComputeInstance_t as pointers to
// structs it leaves opaque: here all three point at entries of one table.
struct simnvml_handle {
	char unused;
};

#define SIMNVML_HANDLES 65536
static struct simnvml_handle simnvml_handles[SIMNVML_HANDLES];

void *simnvml_handle(int id) {
	if (id < 0 || id >= SIMNVML_HANDLES)
		return NULL;
	return &simnvml_handles[id];
}

int simnvml_handle_id(void *h) {
	uintptr_t a = (uintptr_t)h, b = (uintptr_t)simnvml_handles;
	if (a < b || a >= b + sizeof simnvml_handles)
		return -1;
	return (int)((a - b) / sizeof(struct simnvml_handle));
}

const char *simnvml_self_path(void) {
	Dl_info info;
	if (dladdr((void *)simnvml_self_path, &info) == 0)
		return NULL;
	return info.dli_fname;
}
