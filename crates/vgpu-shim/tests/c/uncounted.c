/* A pointer the shim never counted, freed through the shim: the driver frees it and its
 * answer comes back unchanged (HAMi-core refused such frees without freeing).
 *
 *     uncounted PATH/TO/libvgpu.so
 *
 * Not preloaded: the program allocates with the real driver first, then loads the shim and
 * frees through the shim's exported cuMemFree_v2.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond, ...) do { if (!(cond)) { printf("FAIL: %s: ", #cond); printf(__VA_ARGS__); printf("\n"); return 1; } } while (0)

int main(int argc, char **argv) {
    CHECK(argc == 2, "usage");
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuInit(0) == CUDA_SUCCESS && cuDeviceGet(&dev, 0) == CUDA_SUCCESS && cuCtxCreate(&ctx, 0, dev) == CUDA_SUCCESS, "setup");
    CUdeviceptr p;
    CHECK(cuMemAlloc(&p, 8 << 20) == CUDA_SUCCESS, "real alloc");
    size_t free_before, free_after, total;
    CHECK(cuMemGetInfo(&free_before, &total) == CUDA_SUCCESS, "info");
    CUdeviceptr bogus = (CUdeviceptr)0x7123456789a0ull;
    CUresult bare = cuMemFree(bogus);

    void *shim = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    CHECK(shim != NULL, "dlopen shim: %s", dlerror());
    CUresult (*shim_free)(CUdeviceptr) = (CUresult (*)(CUdeviceptr))dlsym(shim, "cuMemFree_v2");
    CUresult (*shim_info)(size_t *, size_t *) = (CUresult (*)(size_t *, size_t *))dlsym(shim, "cuMemGetInfo_v2");
    CHECK(shim_free && shim_info, "shim symbols");
    size_t vfree, vtotal;
    CHECK(shim_info(&vfree, &vtotal) == CUDA_SUCCESS, "shim info");
    printf("shim_total=%zu shim_free=%zu\n", vtotal, vfree);

    CUresult through = shim_free(bogus);
    CHECK(through == bare, "bogus free through the shim %d, driver alone %d", through, bare);
    CHECK(shim_free(p) == CUDA_SUCCESS, "uncounted free through the shim");
    CHECK(cuMemGetInfo(&free_after, &total) == CUDA_SUCCESS, "info");
    CHECK(free_after == free_before + (8 << 20), "the driver freed it: %zu -> %zu", free_before, free_after);
    printf("bogus_rc=%d\nok uncounted\n", (int)bare);
    return 0;
}
