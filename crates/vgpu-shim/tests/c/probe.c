/* Small steps against the driver, one result line each:
 *
 *     probe STEP...     STEP: alloc BYTES | info | total | dev ORDINAL
 *
 * alloc prints "alloc=RC", info "free=F total=T", total "device_total=T"; dev makes a
 * context on device ORDINAL current (device 0 at start). Allocations are kept until exit.
 * Linked against libcuda.
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    CUdevice dev;
    CUcontext ctx;
    CUresult rc;
    if ((rc = cuInit(0)) || (rc = cuDeviceGet(&dev, 0)) || (rc = cuCtxCreate(&ctx, 0, dev))) {
        printf("setup=%d\n", (int)rc);
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "alloc") && i + 1 < argc) {
            CUdeviceptr p;
            printf("alloc=%d\n", (int)cuMemAlloc(&p, strtoull(argv[++i], NULL, 10)));
        } else if (!strcmp(argv[i], "info")) {
            size_t free = 0, total = 0;
            rc = cuMemGetInfo(&free, &total);
            printf("info=%d free=%zu total=%zu\n", (int)rc, free, total);
        } else if (!strcmp(argv[i], "dev") && i + 1 < argc) {
            if ((rc = cuDeviceGet(&dev, atoi(argv[++i]))) || (rc = cuCtxCreate(&ctx, 0, dev))) {
                printf("dev=%d\n", (int)rc);
                return 1;
            }
        } else if (!strcmp(argv[i], "total")) {
            size_t total = 0;
            rc = cuDeviceTotalMem(&total, dev);
            printf("device_total=%zu\n", total);
        } else {
            printf("unknown step %s\n", argv[i]);
            return 2;
        }
    }
    fflush(stdout);
    return 0;
}
