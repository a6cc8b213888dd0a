/* Timed driver calls for the shim's overhead benchmark. One "key=value" line per run.
 *
 *     bench launch N          N cuLaunchKernel calls            -> ns_per_launch
 *     bench alloc N BYTES     N cuMemAlloc + cuMemFree pairs    -> ns_per_pair (CPU time)
 *     bench init              one cuInit                        -> init_us
 *     bench first             the process's first cuMemAlloc    -> first_alloc_us
 *                             (with the shim: creates its state file under the vGPU lock)
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double seconds(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define OK(call) do { CUresult rc_ = (call); if (rc_) { printf("error=%d at %s\n", (int)rc_, #call); return 1; } } while (0)

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    if (!strcmp(argv[1], "init")) {
        double t0 = seconds(CLOCK_MONOTONIC);
        OK(cuInit(0));
        printf("init_us=%.1f\n", (seconds(CLOCK_MONOTONIC) - t0) * 1e6);
        return 0;
    }
    CUdevice dev;
    CUcontext ctx;
    OK(cuInit(0));
    OK(cuDeviceGet(&dev, 0));
    OK(cuCtxCreate(&ctx, 0, dev));
    if (!strcmp(argv[1], "first")) {
        CUdeviceptr p;
        double t0 = seconds(CLOCK_MONOTONIC);
        OK(cuMemAlloc(&p, 1 << 20));
        printf("first_alloc_us=%.1f\n", (seconds(CLOCK_MONOTONIC) - t0) * 1e6);
        return 0;
    }
    if (argc < 3) return 2;
    long n = atol(argv[2]);
    if (!strcmp(argv[1], "launch")) {
        CUmodule mod;
        CUfunction f;
        static const char image[] = "fake";
        OK(cuModuleLoadData(&mod, image));
        OK(cuModuleGetFunction(&f, mod, "k"));
        for (int i = 0; i < 1000; i++) OK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, 0, NULL, NULL));
        double t0 = seconds(CLOCK_MONOTONIC);
        for (long i = 0; i < n; i++) OK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, 0, NULL, NULL));
        printf("ns_per_launch=%.2f\n", (seconds(CLOCK_MONOTONIC) - t0) * 1e9 / n);
        return 0;
    }
    if (!strcmp(argv[1], "alloc")) {
        size_t bytes = strtoull(argv[3], NULL, 10);
        CUdeviceptr p;
        for (int i = 0; i < 100; i++) { OK(cuMemAlloc(&p, bytes)); OK(cuMemFree(p)); }
        double t0 = seconds(CLOCK_PROCESS_CPUTIME_ID), w0 = seconds(CLOCK_MONOTONIC);
        for (long i = 0; i < n; i++) { OK(cuMemAlloc(&p, bytes)); OK(cuMemFree(p)); }
        printf("ns_per_pair=%.1f wall_s=%.3f\n", (seconds(CLOCK_PROCESS_CPUTIME_ID) - t0) * 1e9 / n, seconds(CLOCK_MONOTONIC) - w0);
        return 0;
    }
    return 2;
}
