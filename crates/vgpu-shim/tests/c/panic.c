/* One allocation and its free, paused in between so the test can look at the counters.
 *
 *     panic BYTES
 *
 * Prints "alloc=RC ptr=P" after cuMemAlloc, then "waiting" and waits for a line on stdin,
 * then "free=RC" after cuMemFree and "ok panic". Run with VGPU_SHIM_TEST_PANIC set to make
 * the shim panic inside one of these calls. Linked against libcuda.
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    CUdevice dev;
    CUcontext ctx;
    CUresult rc;
    if (argc != 2) return 2;
    if ((rc = cuInit(0)) || (rc = cuDeviceGet(&dev, 0)) || (rc = cuCtxCreate(&ctx, 0, dev))) {
        printf("setup=%d\n", (int)rc);
        return 1;
    }
    CUdeviceptr p = 0;
    rc = cuMemAlloc(&p, strtoull(argv[1], NULL, 10));
    printf("alloc=%d ptr=%llu\nwaiting\n", (int)rc, (unsigned long long)p);
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 3;
    printf("free=%d\nok panic\n", (int)cuMemFree(p));
    return 0;
}
