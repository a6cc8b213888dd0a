/* The quota through each way real programs reach the driver.
 *
 *     paths MODE QUOTA_BYTES
 *
 * MODE: linked   - calls the functions linked from libcuda (-lcuda)
 *       dlsym    - dlopen("libcuda.so.1") + dlsym of the exported names
 *       procaddr - dlopen + dlsym("cuGetProcAddress_v2") once, every function through it
 *                  at CUDA 12000, including cuGetProcAddress itself
 *       ptds     - as procaddr with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
 *
 * Every check failure prints "FAIL: ..." and exits 1; the last line is "ok MODE". Lines
 * "KEY=VALUE" report figures the Rust test asserts on too.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <nvml.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB ((size_t)1 << 20)

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (!(cond)) {                                                          \
            printf("FAIL: %s:%d: %s: ", __FILE__, __LINE__, #cond);            \
            printf(__VA_ARGS__);                                                \
            printf("\n");                                                       \
            exit(1);                                                            \
        }                                                                       \
    } while (0)
#define OK(call) CHECK((rc = (call)) == CUDA_SUCCESS, "%s returned %d", #call, (int)rc)

typedef struct {
    CUresult (*Init)(unsigned);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*CtxCreate)(CUcontext *, unsigned, CUdevice);
    CUresult (*MemGetInfo)(size_t *, size_t *);
    CUresult (*DeviceTotalMem)(size_t *, CUdevice);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemAllocPitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
    CUresult (*MemAllocManaged)(CUdeviceptr *, size_t, unsigned);
    CUresult (*MemAllocAsync)(CUdeviceptr *, size_t, CUstream);
    CUresult (*MemFreeAsync)(CUdeviceptr, CUstream);
    CUresult (*MemPoolCreate)(CUmemoryPool *, const CUmemPoolProps *);
    CUresult (*MemPoolDestroy)(CUmemoryPool);
    CUresult (*MemAllocFromPoolAsync)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*MemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
    CUresult (*MemRelease)(CUmemGenericAllocationHandle);
    CUresult (*ArrayCreate)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
    CUresult (*Array3DCreate)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
    CUresult (*ArrayDestroy)(CUarray);
    CUresult (*MipmappedArrayCreate)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned);
    CUresult (*MipmappedArrayDestroy)(CUmipmappedArray);
    nvmlReturn_t (*NvmlInit)(void);
    nvmlReturn_t (*NvmlHandle)(unsigned, nvmlDevice_t *);
    nvmlReturn_t (*NvmlMemory)(nvmlDevice_t, nvmlMemory_t *);
    nvmlReturn_t (*NvmlMemoryV2)(nvmlDevice_t, nvmlMemory_v2_t *);
} Api;

static Api api;
static const char *mode;

static void fill_linked(void) {
    api.Init = cuInit;
    api.DeviceGet = cuDeviceGet;
    api.CtxCreate = cuCtxCreate; /* cuda.h: cuCtxCreate_v2 */
    api.MemGetInfo = cuMemGetInfo;
    api.DeviceTotalMem = cuDeviceTotalMem;
    api.MemAlloc = cuMemAlloc;
    api.MemFree = cuMemFree;
    api.MemAllocPitch = cuMemAllocPitch;
    api.MemAllocManaged = cuMemAllocManaged;
    api.MemAllocAsync = cuMemAllocAsync;
    api.MemFreeAsync = cuMemFreeAsync;
    api.MemPoolCreate = cuMemPoolCreate;
    api.MemPoolDestroy = cuMemPoolDestroy;
    api.MemAllocFromPoolAsync = cuMemAllocFromPoolAsync;
    api.MemCreate = cuMemCreate;
    api.MemRelease = cuMemRelease;
    api.ArrayCreate = cuArrayCreate;
    api.Array3DCreate = cuArray3DCreate;
    api.ArrayDestroy = cuArrayDestroy;
    api.MipmappedArrayCreate = cuMipmappedArrayCreate;
    api.MipmappedArrayDestroy = cuMipmappedArrayDestroy;
    api.NvmlInit = nvmlInit_v2;
    api.NvmlHandle = nvmlDeviceGetHandleByIndex_v2;
    api.NvmlMemory = nvmlDeviceGetMemoryInfo;
    api.NvmlMemoryV2 = nvmlDeviceGetMemoryInfo_v2;
}

static void *must(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    CHECK(p != NULL, "dlsym(%s): %s", name, dlerror());
    return p;
}

static void fill_nvml_dlsym(void) {
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    CHECK(nvml != NULL, "dlopen libnvidia-ml.so.1: %s", dlerror());
    *(void **)&api.NvmlInit = must(nvml, "nvmlInit_v2");
    *(void **)&api.NvmlHandle = must(nvml, "nvmlDeviceGetHandleByIndex_v2");
    *(void **)&api.NvmlMemory = must(nvml, "nvmlDeviceGetMemoryInfo");
    *(void **)&api.NvmlMemoryV2 = must(nvml, "nvmlDeviceGetMemoryInfo_v2");
}

static void fill_dlsym(void) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CHECK(cuda != NULL, "dlopen libcuda.so.1: %s", dlerror());
#define SYM(field, name) *(void **)&api.field = must(cuda, name)
    SYM(Init, "cuInit");
    SYM(DeviceGet, "cuDeviceGet");
    SYM(CtxCreate, "cuCtxCreate_v2");
    SYM(MemGetInfo, "cuMemGetInfo_v2");
    SYM(DeviceTotalMem, "cuDeviceTotalMem_v2");
    SYM(MemAlloc, "cuMemAlloc_v2");
    SYM(MemFree, "cuMemFree_v2");
    SYM(MemAllocPitch, "cuMemAllocPitch_v2");
    SYM(MemAllocManaged, "cuMemAllocManaged");
    SYM(MemAllocAsync, "cuMemAllocAsync");
    SYM(MemFreeAsync, "cuMemFreeAsync");
    SYM(MemPoolCreate, "cuMemPoolCreate");
    SYM(MemPoolDestroy, "cuMemPoolDestroy");
    SYM(MemAllocFromPoolAsync, "cuMemAllocFromPoolAsync");
    SYM(MemCreate, "cuMemCreate");
    SYM(MemRelease, "cuMemRelease");
    SYM(ArrayCreate, "cuArrayCreate_v2");
    SYM(Array3DCreate, "cuArray3DCreate_v2");
    SYM(ArrayDestroy, "cuArrayDestroy");
    SYM(MipmappedArrayCreate, "cuMipmappedArrayCreate");
    SYM(MipmappedArrayDestroy, "cuMipmappedArrayDestroy");
#undef SYM
    fill_nvml_dlsym();
}

typedef CUresult (*GetProcAddress)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

/* Print which library and symbol a function pointer is. */
static void where(const char *label, void *p) {
    Dl_info info;
    CHECK(dladdr(p, &info) != 0, "dladdr(%s)", label);
    printf("%s=%s:%s\n", label, info.dli_fname ? strrchr(info.dli_fname, '/') + 1 : "?",
           info.dli_sname ? info.dli_sname : "?");
}

static void fill_procaddr(cuuint64_t flags) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CHECK(cuda != NULL, "dlopen libcuda.so.1: %s", dlerror());
    GetProcAddress first = (GetProcAddress)must(cuda, "cuGetProcAddress_v2");
    where("first_getprocaddress", (void *)first);
    /* cudart's bootstrap: fetch cuGetProcAddress through itself, then use that. */
    GetProcAddress gpa = NULL;
    CUdriverProcAddressQueryResult status = -1;
    CUresult rc;
    OK(first("cuGetProcAddress", (void **)&gpa, 12000, 0, &status));
    CHECK(status == CU_GET_PROC_ADDRESS_SUCCESS, "status %d", (int)status);
    where("getprocaddress", (void *)gpa);
    /* Misses stay the driver's: unknown name and too old a version. */
    void *none = (void *)1;
    rc = gpa("cuNoSuchFunction", &none, 12000, 0, &status);
    CHECK(rc == CUDA_ERROR_NOT_FOUND && none == NULL && status == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, "miss: rc %d status %d", rc, status);
    rc = gpa("cuMemCreate", &none, 10000, 0, &status);
    CHECK(rc == CUDA_ERROR_NOT_FOUND && status == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, "old version: rc %d status %d", rc, status);
#define GPA(field, name)                                                          \
    do {                                                                          \
        OK(gpa(name, (void **)&api.field, 12000, flags, &status));                \
        CHECK(status == CU_GET_PROC_ADDRESS_SUCCESS && api.field, "%s", name);     \
    } while (0)
    GPA(Init, "cuInit");
    GPA(DeviceGet, "cuDeviceGet");
    /* cuCtxCreate at 12000 is the v4 ABI (with CUctxCreateParams); the v2 one is 3020. */
    OK(gpa("cuCtxCreate", (void **)&api.CtxCreate, 3020, flags, &status));
    GPA(MemGetInfo, "cuMemGetInfo");
    GPA(DeviceTotalMem, "cuDeviceTotalMem");
    GPA(MemAlloc, "cuMemAlloc");
    GPA(MemFree, "cuMemFree");
    GPA(MemAllocPitch, "cuMemAllocPitch");
    GPA(MemAllocManaged, "cuMemAllocManaged");
    GPA(MemAllocAsync, "cuMemAllocAsync");
    GPA(MemFreeAsync, "cuMemFreeAsync");
    GPA(MemPoolCreate, "cuMemPoolCreate");
    GPA(MemPoolDestroy, "cuMemPoolDestroy");
    GPA(MemAllocFromPoolAsync, "cuMemAllocFromPoolAsync");
    GPA(MemCreate, "cuMemCreate");
    GPA(MemRelease, "cuMemRelease");
    GPA(ArrayCreate, "cuArrayCreate");
    GPA(Array3DCreate, "cuArray3DCreate");
    GPA(ArrayDestroy, "cuArrayDestroy");
    GPA(MipmappedArrayCreate, "cuMipmappedArrayCreate");
    GPA(MipmappedArrayDestroy, "cuMipmappedArrayDestroy");
#undef GPA
    where("memalloc", (void *)api.MemAlloc);
    /* CUDA 11.3's cuGetProcAddress (no status argument) is governed the same way. */
    typedef CUresult (*GetProcAddressV1)(const char *, void **, int, cuuint64_t);
    GetProcAddressV1 v1 = (GetProcAddressV1)must(cuda, "cuGetProcAddress");
    void *v1_alloc = NULL;
    OK(v1("cuMemAlloc", &v1_alloc, 11030, flags));
    where("v1_getprocaddress", (void *)v1);
    where("v1_memalloc", v1_alloc);
    where("memallocasync", (void *)api.MemAllocAsync);
    where("memfreeasync", (void *)api.MemFreeAsync);
    fill_nvml_dlsym();
}

static size_t free_now(void) {
    size_t free = 0, total = 0;
    CUresult rc;
    OK(api.MemGetInfo(&free, &total));
    return free;
}

/* Run `body`, which must leave `expect` more bytes counted (then undo it). */
#define COUNTED(label, expect, body, undo)                                                   \
    do {                                                                                     \
        size_t before_ = free_now();                                                         \
        body;                                                                                \
        size_t during_ = free_now();                                                         \
        CHECK(before_ - during_ == (size_t)(expect), "%s counted %zu, expected %zu", label,   \
              before_ - during_, (size_t)(expect));                                          \
        undo;                                                                                \
        CHECK(free_now() == before_, "%s: free did not give back exactly", label);            \
        printf("counted_%s=%zu\n", label, (size_t)(expect));                                  \
    } while (0)

int main(int argc, char **argv) {
    CHECK(argc == 3, "usage: paths MODE QUOTA");
    mode = argv[1];
    size_t quota = strtoull(argv[2], NULL, 10);
    if (!strcmp(mode, "linked")) fill_linked();
    else if (!strcmp(mode, "dlsym")) fill_dlsym();
    else if (!strcmp(mode, "procaddr")) fill_procaddr(CU_GET_PROC_ADDRESS_DEFAULT);
    else if (!strcmp(mode, "ptds")) fill_procaddr(CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    else CHECK(0, "unknown mode %s", mode);

    CUresult rc;
    CUdevice dev;
    CUcontext ctx;
    OK(api.Init(0));
    OK(api.DeviceGet(&dev, 0));
    OK(api.CtxCreate(&ctx, 0, dev));

    /* Reported sizes: the quota. */
    size_t free = 0, total = 0, dtotal = 0;
    OK(api.MemGetInfo(&free, &total));
    CHECK(total == quota && free == quota, "cuMemGetInfo: free %zu total %zu, quota %zu", free, total, quota);
    OK(api.DeviceTotalMem(&dtotal, dev));
    CHECK(dtotal == quota, "cuDeviceTotalMem %zu", dtotal);
    printf("total=%zu\n", total);

    /* Inside fits, crossing is refused with OUT_OF_MEMORY, freeing makes room again. */
    CUdeviceptr a = 0, b = 0;
    OK(api.MemAlloc(&a, quota / 2 + quota / 8));
    rc = api.MemAlloc(&b, quota / 2);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "crossing the quota returned %d", rc);
    CHECK(free_now() == quota - (quota / 2 + quota / 8), "free after one allocation");
    OK(api.MemFree(a));
    OK(api.MemAlloc(&b, quota / 2));
    OK(api.MemFree(b));
    CHECK(free_now() == quota, "all given back");

    /* Each allocation path counts exactly; its free gives back exactly. */
    CUdeviceptr p = 0;
    size_t pitch = 0;
    COUNTED("pitch", pitch * 10, OK(api.MemAllocPitch(&p, &pitch, 1000, 10, 4)), OK(api.MemFree(p)));
    CHECK(pitch >= 1000, "pitch %zu", pitch);
    COUNTED("managed", MiB, OK(api.MemAllocManaged(&p, MiB, CU_MEM_ATTACH_GLOBAL)), OK(api.MemFree(p)));
    COUNTED("async", 2 * MiB, OK(api.MemAllocAsync(&p, 2 * MiB, 0)), OK(api.MemFreeAsync(p, 0)));
    rc = api.MemAllocAsync(&p, quota + 1, 0);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "async over quota: %d", rc);

    CUmemPoolProps pool_props;
    memset(&pool_props, 0, sizeof pool_props);
    pool_props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    pool_props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    pool_props.location.id = 0;
    CUmemoryPool pool;
    OK(api.MemPoolCreate(&pool, &pool_props));
    COUNTED("pool", 3 * MiB, OK(api.MemAllocFromPoolAsync(&p, 3 * MiB, pool, 0)), OK(api.MemFreeAsync(p, 0)));
    rc = api.MemAllocFromPoolAsync(&p, quota + 1, pool, 0);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "pool over quota: %d", rc);
    OK(api.MemPoolDestroy(pool));

    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemGenericAllocationHandle handle;
    COUNTED("vmm", 2 * MiB, OK(api.MemCreate(&handle, 2 * MiB, &prop, 0)), OK(api.MemRelease(handle)));
    rc = api.MemCreate(&handle, quota + 2 * MiB, &prop, 0);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "cuMemCreate over quota: %d", rc);
    /* Host-located physical memory is not device memory: not counted, released through. */
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
    COUNTED("vmm_host", 0, OK(api.MemCreate(&handle, 2 * MiB, &prop, 0)), OK(api.MemRelease(handle)));

    CUDA_ARRAY_DESCRIPTOR d2 = {.Width = 100, .Height = 50, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 4};
    CUarray arr;
    COUNTED("array", 100 * 50 * 16, OK(api.ArrayCreate(&arr, &d2)), OK(api.ArrayDestroy(arr)));
    CUDA_ARRAY3D_DESCRIPTOR d3 = {.Width = 64, .Height = 64, .Depth = 4, .Format = CU_AD_FORMAT_UNSIGNED_INT8, .NumChannels = 1};
    COUNTED("array3d", 64 * 64 * 4, OK(api.Array3DCreate(&arr, &d3)), OK(api.ArrayDestroy(arr)));
    CUDA_ARRAY3D_DESCRIPTOR dm = {.Width = 64, .Height = 16, .Depth = 0, .Format = CU_AD_FORMAT_UNSIGNED_INT8, .NumChannels = 1};
    CUmipmappedArray mip;
    COUNTED("mipmap", 64 * 16 + 32 * 8 + 16 * 4 + 8 * 2, OK(api.MipmappedArrayCreate(&mip, &dm, 4)), OK(api.MipmappedArrayDestroy(mip)));
    CUDA_ARRAY_DESCRIPTOR huge = {.Width = quota / 16 + 1, .Height = 1, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 4};
    rc = api.ArrayCreate(&arr, &huge);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "array over quota: %d", rc);

    /* A free of something never counted is the driver's business: its answer, unchanged. */
    rc = api.MemFree((CUdeviceptr)0x7123456789a0ull);
    printf("uncounted_free_rc=%d\n", (int)rc);

    /* NVML sees the vGPU too. */
    OK(api.MemAlloc(&a, 5 * MiB));
    nvmlDevice_t nd;
    CHECK(api.NvmlInit() == NVML_SUCCESS, "nvmlInit");
    CHECK(api.NvmlHandle(0, &nd) == NVML_SUCCESS, "nvml handle");
    nvmlMemory_t m;
    CHECK(api.NvmlMemory(nd, &m) == NVML_SUCCESS, "nvmlDeviceGetMemoryInfo");
    CHECK(m.total == quota && m.used == 5 * MiB && m.free == quota - 5 * MiB, "nvml v1: total %llu used %llu free %llu", m.total, m.used, m.free);
    nvmlMemory_v2_t m2;
    memset(&m2, 0, sizeof m2);
    m2.version = nvmlMemory_v2;
    CHECK(api.NvmlMemoryV2(nd, &m2) == NVML_SUCCESS, "nvmlDeviceGetMemoryInfo_v2");
    CHECK(m2.total == quota && m2.used == 5 * MiB && m2.free == quota - 5 * MiB && m2.reserved == 0, "nvml v2: total %llu used %llu free %llu", m2.total, m2.used, m2.free);
    printf("nvml_total=%llu\n", m.total);
    OK(api.MemFree(a));

    printf("ok %s\n", mode);
    return 0;
}
