/* Every kernel launch path, through each way programs reach the driver.
 *
 *     launch MODE     MODE: linked | dlsym | procaddr | ptds
 *
 * linked   - the functions as linked from libcuda (every exported symbol, twins included)
 * dlsym    - dlopen("libcuda.so.1") + dlsym of every exported symbol
 * procaddr - cuGetProcAddress_v2 (from dlsym) of every base name at CUDA 12000
 * ptds     - the same with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
 *
 * For each function: "fn.LABEL=LIBRARY:SYMBOL" (dladdr of the pointer); when libvgpu.so is
 * preloaded the pointer must also equal the shim's own export (dlsym on the shim's handle).
 * Then every pointer launches once (each launch queues exactly one kernel); "launched=N".
 * Any failure prints "FAIL: ..." and exits 1; the last line is "ok MODE".
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (!(cond)) {                                                          \
            printf("FAIL: %s:%d: %s: ", __FILE__, __LINE__, #cond);            \
            printf(__VA_ARGS__);                                                \
            printf("\n");                                                       \
            exit(1);                                                            \
        }                                                                       \
    } while (0)
#define OK(call)                                                                \
    do {                                                                        \
        CUresult rc_ = (call);                                                  \
        CHECK(rc_ == CUDA_SUCCESS, "%s returned %d", #call, (int)rc_);          \
    } while (0)

/* Not declared by cuda.h unless built with per-thread default streams. */
CUresult cuLaunchKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void **, void **);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                        unsigned, CUstream, void **);
CUresult cuGraphLaunch_ptsz(CUgraphExec, CUstream);
/* Deprecated: cuda.h still declares them, marked deprecated. */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

typedef CUresult (*Kernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           CUstream, void **, void **);
typedef CUresult (*KernelEx)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*Cooperative)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                CUstream, void **);
typedef CUresult (*MultiDevice)(CUDA_LAUNCH_PARAMS *, unsigned, unsigned);
typedef CUresult (*GraphLaunch)(CUgraphExec, CUstream);
typedef CUresult (*Legacy)(CUfunction);
typedef CUresult (*LegacyGrid)(CUfunction, int, int);
typedef CUresult (*LegacyGridAsync)(CUfunction, int, int, CUstream);
typedef CUresult (*GetProcAddress)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

enum kind { KERNEL, KERNEL_EX, COOPERATIVE, MULTI_DEVICE, GRAPH, LEGACY, LEGACY_GRID, LEGACY_GRID_ASYNC };

struct entry {
    const char *symbol; /* exported symbol */
    const char *base;   /* cuGetProcAddress name */
    int per_thread;     /* a _ptsz variant */
    enum kind kind;
    void *linked;
};

static struct entry entries[] = {
    {"cuLaunchKernel", "cuLaunchKernel", 0, KERNEL, (void *)cuLaunchKernel},
    {"cuLaunchKernel_ptsz", "cuLaunchKernel", 1, KERNEL, (void *)cuLaunchKernel_ptsz},
    {"cuLaunchKernelEx", "cuLaunchKernelEx", 0, KERNEL_EX, (void *)cuLaunchKernelEx},
    {"cuLaunchKernelEx_ptsz", "cuLaunchKernelEx", 1, KERNEL_EX, (void *)cuLaunchKernelEx_ptsz},
    {"cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel", 0, COOPERATIVE, (void *)cuLaunchCooperativeKernel},
    {"cuLaunchCooperativeKernel_ptsz", "cuLaunchCooperativeKernel", 1, COOPERATIVE,
     (void *)cuLaunchCooperativeKernel_ptsz},
    {"cuLaunchCooperativeKernelMultiDevice", "cuLaunchCooperativeKernelMultiDevice", 0, MULTI_DEVICE,
     (void *)cuLaunchCooperativeKernelMultiDevice},
    {"cuGraphLaunch", "cuGraphLaunch", 0, GRAPH, (void *)cuGraphLaunch},
    {"cuGraphLaunch_ptsz", "cuGraphLaunch", 1, GRAPH, (void *)cuGraphLaunch_ptsz},
    {"cuLaunch", "cuLaunch", 0, LEGACY, (void *)cuLaunch},
    {"cuLaunchGrid", "cuLaunchGrid", 0, LEGACY_GRID, (void *)cuLaunchGrid},
    {"cuLaunchGridAsync", "cuLaunchGridAsync", 0, LEGACY_GRID_ASYNC, (void *)cuLaunchGridAsync},
};
#define N_ENTRIES (sizeof entries / sizeof entries[0])

/* The preloaded shim's handle, or NULL without it. */
static void *shim_handle(void) {
    const char *preload = getenv("LD_PRELOAD");
    if (!preload || !*preload) return NULL;
    return dlopen(preload, RTLD_NOW | RTLD_NOLOAD);
}

/* Print which library and symbol `p` is; with the shim loaded, it must be the shim's export. */
static void where(void *shim, const char *label, const char *expected, void *p) {
    Dl_info info;
    CHECK(p != NULL, "%s: no pointer", label);
    CHECK(dladdr(p, &info) != 0, "dladdr(%s)", label);
    printf("fn.%s=%s:%s\n", label, info.dli_fname ? strrchr(info.dli_fname, '/') + 1 : "?",
           info.dli_sname ? info.dli_sname : "?");
    if (shim) {
        void *own = dlsym(shim, expected);
        CHECK(own != NULL, "the shim does not export %s", expected);
        CHECK(own == p, "%s: %p is not the shim's %s (%p)", label, p, expected, own);
    }
}

static void launch(struct entry *e, void *p, CUfunction f, CUstream stream, CUgraphExec exec) {
    CUlaunchConfig config;
    CUDA_LAUNCH_PARAMS params;
    memset(&config, 0, sizeof config);
    memset(&params, 0, sizeof params);
    switch (e->kind) {
    case KERNEL: OK(((Kernel)p)(f, 2, 1, 1, 32, 1, 1, 0, stream, NULL, NULL)); break;
    case KERNEL_EX:
        config.gridDimX = config.gridDimY = config.gridDimZ = 1;
        config.blockDimX = 32, config.blockDimY = config.blockDimZ = 1;
        config.hStream = stream;
        OK(((KernelEx)p)(&config, f, NULL, NULL));
        /* A NULL config is the driver's to refuse (and launches nothing). */
        CHECK(((KernelEx)p)(NULL, f, NULL, NULL) != CUDA_SUCCESS, "NULL config accepted");
        break;
    case COOPERATIVE: OK(((Cooperative)p)(f, 1, 1, 1, 32, 1, 1, 0, stream, NULL)); break;
    case MULTI_DEVICE:
        params.function = f;
        params.gridDimX = params.gridDimY = params.gridDimZ = 1;
        params.blockDimX = 32, params.blockDimY = params.blockDimZ = 1;
        params.hStream = stream;
        OK(((MultiDevice)p)(&params, 1, 0));
        CHECK(((MultiDevice)p)(NULL, 0, 0) != CUDA_SUCCESS, "empty list accepted");
        break;
    case GRAPH: OK(((GraphLaunch)p)(exec, stream)); break;
    case LEGACY: OK(((Legacy)p)(f)); break;
    case LEGACY_GRID: OK(((LegacyGrid)p)(f, 2, 1)); break;
    case LEGACY_GRID_ASYNC: OK(((LegacyGridAsync)p)(f, 2, 1, stream)); break;
    }
}

int main(int argc, char **argv) {
    CHECK(argc == 2, "usage: launch MODE");
    const char *mode = argv[1];
    void *shim = shim_handle();
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f;
    CUstream stream;
    OK(cuInit(0));
    OK(cuDeviceGet(&dev, 0));
    OK(cuCtxCreate(&ctx, 0, dev));
    static const char image[] = "fake";
    OK(cuModuleLoadData(&mod, image));
    OK(cuModuleGetFunction(&f, mod, "k"));
    OK(cuFuncSetBlockShape(f, 32, 1, 1));
    OK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    /* A graph of one kernel. */
    CUgraph graph;
    CUgraphNode node;
    CUgraphExec exec;
    CUDA_KERNEL_NODE_PARAMS kp;
    memset(&kp, 0, sizeof kp);
    kp.func = f;
    kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1;
    kp.blockDimX = 32, kp.blockDimY = kp.blockDimZ = 1;
    OK(cuGraphCreate(&graph, 0));
    OK(cuGraphAddKernelNode(&node, graph, NULL, 0, &kp));
    OK(cuGraphInstantiateWithFlags(&exec, graph, 0));

    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CHECK(cuda != NULL, "dlopen libcuda.so.1: %s", dlerror());
    GetProcAddress gpa = (GetProcAddress)dlsym(cuda, "cuGetProcAddress_v2");
    CHECK(gpa != NULL, "dlsym cuGetProcAddress_v2");
    int launched = 0;
    for (size_t i = 0; i < N_ENTRIES; i++) {
        struct entry *e = &entries[i];
        void *p = NULL;
        const char *label = e->symbol, *expected = e->symbol;
        if (!strcmp(mode, "linked")) {
            p = e->linked;
        } else if (!strcmp(mode, "dlsym")) {
            p = dlsym(cuda, e->symbol);
        } else if (!strcmp(mode, "procaddr") || !strcmp(mode, "ptds")) {
            int per_thread = !strcmp(mode, "ptds");
            /* Each base name once; it resolves to the legacy or the per-thread twin. */
            if (e->per_thread) continue;
            label = e->base;
            for (size_t j = 0; j < N_ENTRIES; j++) {
                if (!strcmp(entries[j].base, e->base) && entries[j].per_thread == per_thread) expected = entries[j].symbol;
            }
            CUdriverProcAddressQueryResult status;
            OK(gpa(e->base, &p, 12000, per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0, &status));
            CHECK(status == CU_GET_PROC_ADDRESS_SUCCESS, "%s: status %d", e->base, (int)status);
        } else {
            CHECK(0, "unknown mode %s", mode);
        }
        where(shim, label, expected, p);
        launch(e, p, f, stream, exec);
        launched++;
    }
    OK(cuCtxSynchronize());
    printf("launched=%d\n", launched);
    printf("ok %s\n", mode);
    return 0;
}
