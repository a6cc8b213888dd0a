/* A CUDA driver API client built against NVIDIA's cuda.h and linked with -l:libcuda.so.1.
 *
 *   client            check the basics and print key=value lines
 *   client hold MIB   allocate MIB MiB, print "ready", wait for EOF on stdin, free, exit
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                              \
    do {                                                                         \
        CUresult r_ = (call);                                                    \
        if (r_ != CUDA_SUCCESS) {                                                \
            const char *n_ = "?";                                                \
            cuGetErrorName(r_, &n_);                                             \
            fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #call, n_); \
            return 1;                                                            \
        }                                                                        \
    } while (0)

static const char *name_of(CUresult r) {
    const char *name = "?";
    cuGetErrorName(r, &name);
    return name;
}

int main(int argc, char **argv) {
    CUdeviceptr p = 0;
    printf("before_init=%s\n", name_of(cuMemAlloc(&p, 1)));
    CHECK(cuInit(0));
    int version = 0, count = 0, sms = 0, major = 0;
    CHECK(cuDriverGetVersion(&version));
    CHECK(cuDeviceGetCount(&count));
    printf("version=%d\ncount=%d\n", version, count);
    CUdevice dev;
    CHECK(cuDeviceGet(&dev, 0));
    char name[256];
    CHECK(cuDeviceGetName(name, sizeof name, dev));
    size_t device_total = 0;
    CHECK(cuDeviceTotalMem(&device_total, dev));
    CHECK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    CHECK(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
    printf("name=%s\ntotal=%zu\nsms=%d\ncc_major=%d\n", name, device_total, sms, major);

    printf("no_context=%s\n", name_of(cuMemAlloc(&p, 1)));
    CUcontext ctx;
    CHECK(cuCtxCreate(&ctx, 0, dev));

    if (argc > 2 && strcmp(argv[1], "hold") == 0) {
        size_t mib = strtoull(argv[2], NULL, 10);
        CHECK(cuMemAlloc(&p, mib << 20));
        printf("ready\n");
        fflush(stdout);
        while (getchar() != EOF) {
        }
        CHECK(cuMemFree(p));
        CHECK(cuCtxDestroy(ctx));
        return 0;
    }

    size_t free_bytes = 0, total_bytes = 0;
    CHECK(cuMemAlloc(&p, (size_t)1 << 30));
    CHECK(cuMemGetInfo(&free_bytes, &total_bytes));
    printf("free=%zu\n", free_bytes);
    CUdeviceptr big;
    CUresult oom = cuMemAlloc(&big, total_bytes);
    const char *text = "?";
    cuGetErrorString(oom, &text);
    printf("oom=%s\noom_text=%s\n", name_of(oom), text);
    CHECK(cuMemFree(p));
    printf("double_free=%s\n", name_of(cuMemFree(p)));
    CHECK(cuMemGetInfo(&free_bytes, &total_bytes));
    printf("free_after=%zu\n", free_bytes);
    CHECK(cuCtxDestroy(ctx));
    return 0;
}
