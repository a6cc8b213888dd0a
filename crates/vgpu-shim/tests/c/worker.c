/* A workload for the multi-process and multi-thread tests: random allocations and frees.
 *
 *     worker SEED MILLISECONDS MAX_BYTES THREADS
 *
 * Each thread allocates (sizes 1..MAX_BYTES) and frees at random for the given time,
 * taking OUT_OF_MEMORY as a normal answer. Then the process prints "held=BYTES ooms=N
 * allocs=N", and waits for its stdin to close before freeing everything ("freed") and
 * exiting. Any other driver error is printed as "FAIL: ..." with exit code 1.
 */
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define SLOTS 64

typedef struct {
    unsigned long long seed;
    CUcontext ctx;
    CUdeviceptr ptr[SLOTS];
    size_t size[SLOTS];
    size_t held;
    long ooms, allocs;
} Thread;

static double deadline;
static size_t max_bytes;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static unsigned long long next(unsigned long long *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void *run(void *arg) {
    Thread *t = arg;
    CUresult rc = cuCtxSetCurrent(t->ctx);
    if (rc) { printf("FAIL: cuCtxSetCurrent %d\n", rc); exit(1); }
    while (now() < deadline) {
        int slot = next(&t->seed) % SLOTS;
        if (t->ptr[slot]) {
            if ((rc = cuMemFree(t->ptr[slot]))) { printf("FAIL: cuMemFree %d\n", rc); exit(1); }
            t->held -= t->size[slot];
            t->ptr[slot] = 0;
        } else {
            size_t n = 1 + next(&t->seed) % max_bytes;
            rc = cuMemAlloc(&t->ptr[slot], n);
            if (rc == CUDA_SUCCESS) {
                t->size[slot] = n;
                t->held += n;
                t->allocs++;
            } else if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
                t->ptr[slot] = 0;
                t->ooms++;
            } else {
                printf("FAIL: cuMemAlloc %d\n", rc);
                exit(1);
            }
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 5) { printf("FAIL: usage\n"); return 1; }
    unsigned long long seed = strtoull(argv[1], NULL, 10) * 2654435761ull + 1;
    deadline = now() + atof(argv[2]) / 1000.0;
    max_bytes = strtoull(argv[3], NULL, 10);
    int threads = atoi(argv[4]);
    CUdevice dev;
    CUcontext ctx;
    CUresult rc;
    if ((rc = cuInit(0)) || (rc = cuDeviceGet(&dev, 0)) || (rc = cuCtxCreate(&ctx, 0, dev))) {
        printf("FAIL: setup %d\n", rc);
        return 1;
    }
    Thread *t = calloc(threads, sizeof *t);
    pthread_t *id = calloc(threads, sizeof *id);
    for (int i = 0; i < threads; i++) {
        t[i].seed = seed + 7919ull * i;
        t[i].ctx = ctx;
        pthread_create(&id[i], NULL, run, &t[i]);
    }
    size_t held = 0;
    long ooms = 0, allocs = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(id[i], NULL);
        held += t[i].held;
        ooms += t[i].ooms;
        allocs += t[i].allocs;
    }
    printf("held=%zu ooms=%ld allocs=%ld\n", held, ooms, allocs);
    fflush(stdout);
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {}
    for (int i = 0; i < threads; i++)
        for (int s = 0; s < SLOTS; s++)
            if (t[i].ptr[s] && (rc = cuMemFree(t[i].ptr[s]))) { printf("FAIL: final free %d\n", rc); return 1; }
    printf("freed\n");
    return 0;
}
