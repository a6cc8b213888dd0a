//! THE list of governed functions. Each line declares one driver function (or a `|`-joined
//! pair of twins, e.g. the legacy-stream and per-thread-stream variants, sharing one hook):
//! its C signature, its hook and, for launches, the fast-path predicate.
//!
//! The list is data: `governed!` turns it into `governed_functions!(then)`, which hands the
//! list to the macro `then`. It is expanded twice, from this one text: by `crate::real` into
//! each function's real-driver slot (`crate::real::NAME`) and signature type
//! (`crate::real::sig::FIRST`), and by `crate::interpose::exports` (`governed_exports!`) into
//! each exported wrapper (which runs the hook under `crate::guard::guard`) and its row of the
//! table that `dlsym` and `cuGetProcAddress` consult. Hook and predicate paths are resolved
//! where the wrappers are generated (`interpose::exports`, which imports the modules of
//! `crate::hooks` and `interpose::procaddr`), so this module uses no other.
//!
//! Signatures are copied from NVIDIA's `cuda.h` / `nvml.h`.

/// Declares THE list: defines `governed_functions!($then)`, which expands to
/// `$then! { <the list> }`.
macro_rules! governed {
    (@define ($d:tt) $($list:tt)*) => {
        macro_rules! governed_functions {
            ($d then:ident) => {
                $d then! { $($list)* }
            };
        }
        pub(crate) use governed_functions;
    };
    ($($list:tt)*) => {
        governed!(@define ($) $($list)*);
    };
}

governed! {
    CUDA, CUDA_ERROR_NOT_FOUND => {
        // Joining the vGPU, and how cudart reaches everything else.
        fn cuInit(flags: c_uint) -> CuResult => init::init;
        fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: cuuint64_t) -> CuResult
            => procaddr::get_proc_address;
        fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: cuuint64_t, status: *mut c_int) -> CuResult
            => procaddr::get_proc_address_v2;

        // What a workload is told about memory.
        fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CuResult => info::mem_get_info;
        fn cuDeviceTotalMem_v2(bytes: *mut usize, device: CUdevice) -> CuResult => info::device_total_mem;

        // Linear memory.
        fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) -> CuResult => memory::alloc;
        fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytes: usize, flags: c_uint) -> CuResult => memory::alloc_managed;
        fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, element: c_uint) -> CuResult
            => memory::alloc_pitch;
        fn cuMemFree_v2(dptr: CUdeviceptr) -> CuResult => memory::free;
        fn cuMemAllocAsync | cuMemAllocAsync_ptsz (dptr: *mut CUdeviceptr, bytes: usize, stream: CUstream) -> CuResult
            => memory::alloc_async;
        fn cuMemAllocFromPoolAsync | cuMemAllocFromPoolAsync_ptsz
            (dptr: *mut CUdeviceptr, bytes: usize, pool: CUmemoryPool, stream: CUstream) -> CuResult
            => memory::alloc_from_pool_async;
        fn cuMemFreeAsync | cuMemFreeAsync_ptsz (dptr: CUdeviceptr, stream: CUstream) -> CuResult => memory::free_async;
        fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const CUmemPoolProps) -> CuResult => pools::create;
        fn cuMemPoolDestroy(pool: CUmemoryPool) -> CuResult => pools::destroy;

        // Virtual memory management.
        fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, bytes: usize, prop: *const CUmemAllocationProp, flags: u64) -> CuResult
            => vmm::create;
        fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CuResult => vmm::release;

        // Arrays.
        fn cuArrayCreate_v2(array: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR) -> CuResult => arrays::create_2d;
        fn cuArray3DCreate_v2(array: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR) -> CuResult => arrays::create_3d;
        fn cuArrayDestroy(array: CUarray) -> CuResult => arrays::destroy;
        fn cuMipmappedArrayCreate(array: *mut CUmipmappedArray, desc: *const CUDA_ARRAY3D_DESCRIPTOR, levels: c_uint) -> CuResult
            => arrays::create_mipmapped;
        fn cuMipmappedArrayDestroy(array: CUmipmappedArray) -> CuResult => arrays::destroy_mipmapped;

        // Every way to queue work on a GPU (the compute governor).
        fn cuLaunchKernel | cuLaunchKernel_ptsz (
            f: CUfunction, grid_x: c_uint, grid_y: c_uint, grid_z: c_uint, block_x: c_uint, block_y: c_uint,
            block_z: c_uint, shared_bytes: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void
        ) -> CuResult => launch::kernel, fast if launch::unlimited;
        fn cuLaunchKernelEx | cuLaunchKernelEx_ptsz (
            config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void
        ) -> CuResult => launch::kernel_ex, fast if launch::unlimited;
        fn cuLaunchCooperativeKernel | cuLaunchCooperativeKernel_ptsz (
            f: CUfunction, grid_x: c_uint, grid_y: c_uint, grid_z: c_uint, block_x: c_uint, block_y: c_uint,
            block_z: c_uint, shared_bytes: c_uint, stream: CUstream, params: *mut *mut c_void
        ) -> CuResult => launch::cooperative, fast if launch::unlimited;
        fn cuLaunchCooperativeKernelMultiDevice(list: *mut CUDA_LAUNCH_PARAMS, devices: c_uint, flags: c_uint) -> CuResult
            => launch::cooperative_multi_device, fast if launch::unlimited;
        fn cuGraphLaunch | cuGraphLaunch_ptsz (exec: CUgraphExec, stream: CUstream) -> CuResult => launch::graph, fast if launch::unlimited;
        fn cuLaunch(f: CUfunction) -> CuResult => launch::legacy, fast if launch::unlimited;
        fn cuLaunchGrid(f: CUfunction, grid_width: c_int, grid_height: c_int) -> CuResult => launch::legacy_grid, fast if launch::unlimited;
        fn cuLaunchGridAsync(f: CUfunction, grid_width: c_int, grid_height: c_int, stream: CUstream) -> CuResult
            => launch::legacy_grid_async, fast if launch::unlimited;
    }
    NVML, NVML_ERROR_FUNCTION_NOT_FOUND => {
        fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory: *mut nvmlMemory_t) -> NvmlReturn => nvml::memory_info;
        fn nvmlDeviceGetMemoryInfo_v2(device: nvmlDevice_t, memory: *mut nvmlMemory_v2_t) -> NvmlReturn => nvml::memory_info_v2;
    }
}
