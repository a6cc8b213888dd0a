/* Timed driver calls for the shim's overhead benchmark. One "key=value" line per run.
 *
 *     bench launch N          N cuLaunchKernel calls            -> ns_per_launch
 *     bench alloc N BYTES     N cuMemAlloc + cuMemFree pairs    -> ns_per_pair (CPU time)
 *     bench init              one cuInit                        -> init_us
 *     bench first             the process's first cuMemAlloc    -> first_alloc_us
 *                             (with the shim: creates its state file)
 *     bench ctx               the process's first cuCtxCreate   -> ctx_create_us
 *     bench primary           cuDevicePrimaryCtxRetain + cuCtxSetCurrent (what cudart does)
 *                                                               -> primary_us
 *     bench refuse N PARTS    takes 1/PARTS of what cuMemGetInfo says the device (or the
 *                             vGPU) has, prints "ready", waits for a line on stdin, then
 *                             makes N cuMemAlloc(1 MiB) calls that must all be refused
 *                             (PARTS processes together fill it), prints its figures and
 *                             holds its memory until its stdin closes
 *                                                               -> us_per_refusal (wall),
 *                                                                  cpu_us_per_refusal
 *     bench race MS MAX SEED  prints "ready", waits for a line on stdin, then allocates
 *                             (1..MAX bytes) and frees at random for MS milliseconds, an
 *                             OUT_OF_MEMORY being a normal answer; prints its figures and
 *                             frees everything once its stdin closes
 *                                                               -> ops (allocation attempts
 *                                                                  and frees), ooms, allocs,
 *                                                                  seconds
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double seconds(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define OK(call) do { CUresult rc_ = (call); if (rc_) { printf("error=%d at %s\n", (int)rc_, #call); return 1; } } while (0)

/* Say "ready" and wait for a line on stdin: every process starts its timed part together. */
static void ready_then_wait(void) {
    char c;
    printf("ready\n");
    fflush(stdout);
    while (read(0, &c, 1) == 1 && c != '\n') {}
}

/* After the timed part: stay (holding what we hold) until the bench closes our stdin, so
 * that no process exits while others are still timed. */
static void hold_until_eof(void) {
    char buf[16];
    fflush(stdout);
    while (read(0, buf, sizeof buf) > 0) {}
}

static unsigned long long next(unsigned long long *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

#define SLOTS 64

static int race(double ms, size_t max, unsigned long long seed) {
    CUdeviceptr ptr[SLOTS] = {0};
    long ops = 0, ooms = 0, allocs = 0;
    seed = seed * 2654435761ull + 1;
    ready_then_wait();
    double t0 = seconds(CLOCK_MONOTONIC), deadline = t0 + ms / 1000.0, t = t0;
    while (t < deadline) {
        for (int i = 0; i < 64; i++, ops++) {
            int slot = next(&seed) % SLOTS;
            if (ptr[slot]) {
                OK(cuMemFree(ptr[slot]));
                ptr[slot] = 0;
            } else {
                CUresult rc = cuMemAlloc(&ptr[slot], 1 + next(&seed) % max);
                if (rc == CUDA_SUCCESS) {
                    allocs++;
                } else if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
                    ptr[slot] = 0;
                    ooms++;
                } else {
                    printf("error=%d at cuMemAlloc\n", (int)rc);
                    return 1;
                }
            }
        }
        t = seconds(CLOCK_MONOTONIC);
    }
    printf("ops=%ld ooms=%ld allocs=%ld seconds=%.6f\n", ops, ooms, allocs, t - t0);
    hold_until_eof();
    for (int s = 0; s < SLOTS; s++)
        if (ptr[s]) OK(cuMemFree(ptr[s]));
    return 0;
}

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
    if (!strcmp(argv[1], "ctx")) {
        double t0 = seconds(CLOCK_MONOTONIC);
        OK(cuCtxCreate(&ctx, 0, dev));
        printf("ctx_create_us=%.1f\n", (seconds(CLOCK_MONOTONIC) - t0) * 1e6);
        return 0;
    }
    if (!strcmp(argv[1], "primary")) {
        double t0 = seconds(CLOCK_MONOTONIC);
        OK(cuDevicePrimaryCtxRetain(&ctx, dev));
        OK(cuCtxSetCurrent(ctx));
        printf("primary_us=%.1f\n", (seconds(CLOCK_MONOTONIC) - t0) * 1e6);
        return 0;
    }
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
    if (!strcmp(argv[1], "refuse")) {
        if (argc < 4) return 2;
        long parts = atol(argv[3]);
        size_t free_bytes, total;
        OK(cuMemGetInfo(&free_bytes, &total));
        CUdeviceptr fill, p;
        OK(cuMemAlloc(&fill, total / parts));
        ready_then_wait();
        double t0 = seconds(CLOCK_PROCESS_CPUTIME_ID), w0 = seconds(CLOCK_MONOTONIC);
        for (long i = 0; i < n; i++) {
            CUresult rc = cuMemAlloc(&p, 1 << 20);
            if (rc != CUDA_ERROR_OUT_OF_MEMORY) {
                printf("error=%d: refusal %ld was not OUT_OF_MEMORY\n", (int)rc, i);
                return 1;
            }
        }
        printf("us_per_refusal=%.3f cpu_us_per_refusal=%.3f\n", (seconds(CLOCK_MONOTONIC) - w0) * 1e6 / n,
               (seconds(CLOCK_PROCESS_CPUTIME_ID) - t0) * 1e6 / n);
        hold_until_eof();
        return 0;
    }
    if (!strcmp(argv[1], "race")) {
        if (argc < 5) return 2;
        return race(atof(argv[2]), strtoull(argv[3], NULL, 10), strtoull(argv[4], NULL, 10));
    }
    return 2;
}
