/* Small steps against the driver, one result line each:
 *
 *     probe STEP...     STEP: alloc BYTES | info | total | dev ORDINAL | stdin
 *
 * alloc prints "alloc=RC", info "free=F total=T", total "device_total=T"; dev makes a
 * context on device ORDINAL current (device 0 at start); stdin reads further steps from
 * stdin, one per line ("alloc 1048576"), answering each at once, until stdin closes.
 * Allocations are kept until exit. Linked against libcuda.
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static CUdevice dev;
static CUcontext ctx;

/* Run the step at words[*i] (advancing *i past its argument); 0 if it is unknown. */
static int step(char **words, int n, int *i) {
    CUresult rc;
    if (!strcmp(words[*i], "alloc") && *i + 1 < n) {
        CUdeviceptr p;
        printf("alloc=%d\n", (int)cuMemAlloc(&p, strtoull(words[++*i], NULL, 10)));
    } else if (!strcmp(words[*i], "info")) {
        size_t free = 0, total = 0;
        rc = cuMemGetInfo(&free, &total);
        printf("info=%d free=%zu total=%zu\n", (int)rc, free, total);
    } else if (!strcmp(words[*i], "dev") && *i + 1 < n) {
        if ((rc = cuDeviceGet(&dev, atoi(words[++*i]))) || (rc = cuCtxCreate(&ctx, 0, dev))) {
            printf("dev=%d\n", (int)rc);
            exit(1);
        }
    } else if (!strcmp(words[*i], "total")) {
        size_t total = 0;
        rc = cuDeviceTotalMem(&total, dev);
        printf("device_total=%zu\n", total);
    } else {
        return 0;
    }
    fflush(stdout);
    return 1;
}

/* The steps on stdin, a line at a time. */
static int steps_from_stdin(void) {
    char line[256];
    while (fgets(line, sizeof line, stdin)) {
        char *words[8];
        int n = 0;
        for (char *w = strtok(line, " \t\n"); w && n < 8; w = strtok(NULL, " \t\n")) words[n++] = w;
        for (int i = 0; i < n; i++) {
            if (!step(words, n, &i)) {
                printf("unknown step %s\n", words[i]);
                return 2;
            }
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    CUresult rc;
    if ((rc = cuInit(0)) || (rc = cuDeviceGet(&dev, 0)) || (rc = cuCtxCreate(&ctx, 0, dev))) {
        printf("setup=%d\n", (int)rc);
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "stdin")) {
            int status = steps_from_stdin();
            if (status) return status;
        } else if (!step(argv, argc, &i)) {
            printf("unknown step %s\n", argv[i]);
            return 2;
        }
    }
    fflush(stdout);
    return 0;
}
