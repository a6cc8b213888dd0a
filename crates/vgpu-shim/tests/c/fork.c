/* One quota for a parent and its forked child (as DataLoader workers share one).
 *
 *     fork QUOTA
 *
 * The parent holds 3/4 of the quota and forks. The child initialises CUDA again (a child
 * cannot use its parent's context), is refused 1/2 (OUT_OF_MEMORY: the parent's 3/4 counts),
 * gets 1/8, and exits without freeing. The parent then sees the dead child's 1/8 given back
 * and gets exactly the last 1/4.
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(cond, ...) do { if (!(cond)) { printf("FAIL: %s: ", #cond); printf(__VA_ARGS__); printf("\n"); fflush(stdout); exit(1); } } while (0)

static void setup(void) {
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuInit(0) == CUDA_SUCCESS && cuDeviceGet(&dev, 0) == CUDA_SUCCESS && cuCtxCreate(&ctx, 0, dev) == CUDA_SUCCESS, "setup");
}

int main(int argc, char **argv) {
    CHECK(argc == 2, "usage");
    size_t quota = strtoull(argv[1], NULL, 10);
    setup();
    CUdeviceptr held, p;
    CHECK(cuMemAlloc(&held, quota / 4 * 3) == CUDA_SUCCESS, "parent 3/4");
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        setup();
        CUresult rc = cuMemAlloc(&p, quota / 2);
        printf("child_half=%d\n", (int)rc);
        rc = cuMemAlloc(&p, quota / 8);
        printf("child_eighth=%d\n", (int)rc);
        fflush(stdout);
        _exit(0);
    }
    int status;
    CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0, "child");
    size_t free, total;
    CHECK(cuMemGetInfo(&free, &total) == CUDA_SUCCESS, "info");
    printf("parent_free=%zu\n", free);
    CHECK(free == quota / 4, "the dead child's share is back: free %zu", free);
    CHECK(cuMemAlloc(&p, quota / 4) == CUDA_SUCCESS, "parent last 1/4");
    CHECK(cuMemAlloc(&p, 1) == CUDA_ERROR_OUT_OF_MEMORY, "full");
    printf("ok fork\n");
    return 0;
}
