//! Probes of the API families real programs use (for `tests/cuda_families.rs`): memory
//! pools, stream and context queries, IPC, libraries, pointer attributes, function
//! attributes and occupancy, copies and fills.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::io::BufRead;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use cudarc::driver::sys::{
    CUmemAllocationType, CUmemLocationType, CUmemPool_attribute as PA, CUmemorytype,
    CUpointer_attribute as PT, CUresult, CUDA_MEMCPY2D, CUDA_MEMCPY3D,
};

use super::cuda::{Cu, Cuda};

type P = *mut c_void;
const NULL: P = std::ptr::null_mut();
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn code(r: CUresult) -> Cu {
    r as Cu
}

const INVALID_VALUE: Cu = CUresult::CUDA_ERROR_INVALID_VALUE as Cu;
const INVALID_HANDLE: Cu = CUresult::CUDA_ERROR_INVALID_HANDLE as Cu;

/// The driver with a context on device 0.
fn setup() -> (Cuda, P) {
    let cuda = Cuda::load();
    assert_eq!(cuda.init(), 0);
    let ctx = cuda.ctx_create(0).unwrap();
    (cuda, ctx)
}

fn used(cuda: &Cuda) -> u64 {
    let (free, total) = cuda.mem_info().unwrap();
    (total - free) as u64
}

fn stream(cuda: &Cuda, flags: c_uint) -> P {
    let f: unsafe extern "C" fn(*mut P, c_uint) -> Cu = cuda.sym("cuStreamCreate");
    let mut s = NULL;
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { f(&mut s, flags) }, 0);
    s
}

fn function(cuda: &Cuda, name: &std::ffi::CStr) -> P {
    let load: unsafe extern "C" fn(*mut P, *const c_void) -> Cu = cuda.sym("cuModuleLoadData");
    let get: unsafe extern "C" fn(*mut P, P, *const c_char) -> Cu = cuda.sym("cuModuleGetFunction");
    let (mut m, mut f) = (NULL, NULL);
    // SAFETY: valid out-pointers, an image and a C string.
    unsafe {
        assert_eq!(load(&mut m, c"image".as_ptr().cast()), 0);
        assert_eq!(get(&mut f, m, name.as_ptr()), 0);
    }
    f
}

fn launch(cuda: &Cuda, f: P, blocks: c_uint, stream: P) -> Cu {
    cuda.launch_on(f, blocks, stream)
}

fn sync_stream(cuda: &Cuda, s: P) -> Cu {
    let f: unsafe extern "C" fn(P) -> Cu = cuda.sym("cuStreamSynchronize");
    // SAFETY: a stream handle.
    unsafe { f(s) }
}

fn query_stream(cuda: &Cuda, s: P) -> Cu {
    let f: unsafe extern "C" fn(P) -> Cu = cuda.sym("cuStreamQuery");
    // SAFETY: a stream handle.
    unsafe { f(s) }
}

// ----- memory pools -----

type GetAttr = unsafe extern "C" fn(P, PA, *mut c_void) -> Cu;

fn pool_u64(cuda: &Cuda, pool: P, attr: PA) -> u64 {
    let get: GetAttr = cuda.sym("cuMemPoolGetAttribute");
    let mut v = 0u64;
    // SAFETY: a cuuint64_t out-parameter for a cuuint64_t attribute.
    assert_eq!(unsafe { get(pool, attr, (&mut v as *mut u64).cast()) }, 0);
    v
}

fn pool_set_u64(cuda: &Cuda, pool: P, attr: PA, v: u64) -> Cu {
    let set: GetAttr = cuda.sym("cuMemPoolSetAttribute");
    let mut v = v;
    // SAFETY: a cuuint64_t in-parameter for a cuuint64_t attribute.
    unsafe { set(pool, attr, (&mut v as *mut u64).cast()) }
}

pub fn mempool() {
    let (cuda, ctx) = setup();
    let s = stream(&cuda, 0);
    let default_pool: unsafe extern "C" fn(*mut P, c_int) -> Cu =
        cuda.sym("cuDeviceGetDefaultMemPool");
    let get_pool: unsafe extern "C" fn(*mut P, c_int) -> Cu = cuda.sym("cuDeviceGetMemPool");
    let set_pool: unsafe extern "C" fn(c_int, P) -> Cu = cuda.sym("cuDeviceSetMemPool");
    let alloc: unsafe extern "C" fn(*mut u64, usize, P) -> Cu = cuda.sym("cuMemAllocAsync");
    let free: unsafe extern "C" fn(u64, P) -> Cu = cuda.sym("cuMemFreeAsync");
    let trim: unsafe extern "C" fn(P, usize) -> Cu = cuda.sym("cuMemPoolTrimTo");
    let destroy: unsafe extern "C" fn(P) -> Cu = cuda.sym("cuMemPoolDestroy");
    let (mut pool, mut current) = (NULL, NULL);
    // SAFETY: valid out-pointers.
    unsafe {
        assert_eq!(default_pool(&mut pool, 0), 0);
        assert_eq!(get_pool(&mut current, 0), 0);
        assert_eq!(
            default_pool(&mut current, 7),
            code(CUresult::CUDA_ERROR_INVALID_DEVICE)
        );
    }
    assert!(!pool.is_null());
    assert_eq!(current, pool, "the current pool is the default one");

    // Reuse flags are ints, on by default.
    let get: GetAttr = cuda.sym("cuMemPoolGetAttribute");
    let mut flag: c_int = 7;
    // SAFETY: an int out-parameter for an int attribute.
    assert_eq!(
        unsafe {
            get(
                pool,
                PA::CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
                (&mut flag as *mut c_int).cast(),
            )
        },
        0
    );
    assert_eq!(flag, 1);

    // Keep everything freed: memory stays reserved (and on the device).
    assert_eq!(
        pool_set_u64(&cuda, pool, PA::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, u64::MAX),
        0
    );
    assert_eq!(
        pool_u64(&cuda, pool, PA::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD),
        u64::MAX
    );
    let mut ptrs = [0u64; 3];
    for p in &mut ptrs {
        // SAFETY: valid out-pointer, stream from the driver.
        assert_eq!(unsafe { alloc(p, 64 << 20, s) }, 0);
    }
    assert_eq!(
        pool_u64(&cuda, pool, PA::CU_MEMPOOL_ATTR_USED_MEM_CURRENT),
        192 * MIB
    );
    assert_eq!(
        pool_u64(&cuda, pool, PA::CU_MEMPOOL_ATTR_USED_MEM_HIGH),
        192 * MIB
    );
    assert_eq!(
        pool_u64(&cuda, pool, PA::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
        192 * MIB
    );
    // SAFETY: pointers from cuMemAllocAsync.
    unsafe {
        assert_eq!(free(ptrs[0], s), 0);
        assert_eq!(free(ptrs[1], s), 0);
    }
    assert_eq!(
        pool_u64(&cuda, pool, PA::CU_MEMPOOL_ATTR_USED_MEM_CURRENT),
        64 * MIB
    );
    assert_eq!(
        pool_u64(&cuda, pool, PA::CU_MEMPOOL_ATTR_USED_MEM_HIGH),
        192 * MIB
    );
    assert_eq!(
        pool_u64(&cuda, pool, PA::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
        192 * MIB
    );
    assert_eq!(used(&cuda), 192 * MIB, "the pool holds what it reserved");
    // Reuse: no new device memory.
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { alloc(&mut ptrs[0], 64 << 20, s) }, 0);
    assert_eq!(used(&cuda), 192 * MIB);
    assert_eq!(
        pool_u64(&cuda, pool, PA::CU_MEMPOOL_ATTR_USED_MEM_CURRENT),
        128 * MIB
    );
    // High-water marks: read-only except reset by 0.
    assert_eq!(
        pool_set_u64(&cuda, pool, PA::CU_MEMPOOL_ATTR_USED_MEM_HIGH, 5),
        INVALID_VALUE
    );
    assert_eq!(
        pool_set_u64(&cuda, pool, PA::CU_MEMPOOL_ATTR_USED_MEM_CURRENT, 0),
        INVALID_VALUE
    );
    assert_eq!(
        pool_set_u64(&cuda, pool, PA::CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0),
        0
    );
    assert_eq!(
        pool_u64(&cuda, pool, PA::CU_MEMPOOL_ATTR_USED_MEM_HIGH),
        128 * MIB
    );
    // Trim gives back what is unused.
    // SAFETY: a pool handle.
    assert_eq!(unsafe { trim(pool, 0) }, 0);
    assert_eq!(
        pool_u64(&cuda, pool, PA::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
        128 * MIB
    );
    assert_eq!(used(&cuda), 128 * MIB);
    assert_eq!(
        pool_u64(&cuda, pool, PA::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH),
        192 * MIB
    );
    assert_eq!(
        pool_set_u64(&cuda, pool, PA::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, 0),
        0
    );
    assert_eq!(
        pool_u64(&cuda, pool, PA::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH),
        128 * MIB
    );
    // Threshold 0: frees go straight back to the device.
    assert_eq!(
        pool_set_u64(&cuda, pool, PA::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, 0),
        0
    );
    // SAFETY: pointers from cuMemAllocAsync.
    unsafe {
        assert_eq!(free(ptrs[0], s), 0);
        assert_eq!(free(ptrs[2], s), 0);
    }
    assert_eq!(
        pool_u64(&cuda, pool, PA::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
        0
    );
    assert_eq!(used(&cuda), 0);
    // SAFETY: the default pool cannot be destroyed.
    assert_eq!(unsafe { destroy(pool) }, INVALID_VALUE);

    // A created pool made current takes cuMemAllocAsync's allocations.
    let create: unsafe extern "C" fn(*mut P, *const cudarc::driver::sys::CUmemPoolProps) -> Cu =
        cuda.sym("cuMemPoolCreate");
    // SAFETY: CUmemPoolProps is plain data; zero is a valid start.
    let mut props: cudarc::driver::sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
    props.allocType = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type_ = CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    let mut mine = NULL;
    let mut ptr = 0;
    // SAFETY: valid pointers and handles.
    unsafe {
        assert_eq!(create(&mut mine, &props), 0);
        assert_eq!(set_pool(0, mine), 0);
        assert_eq!(get_pool(&mut current, 0), 0);
        assert_eq!(current, mine);
        assert_eq!(alloc(&mut ptr, 5 << 20, s), 0);
    }
    assert_eq!(
        pool_u64(&cuda, mine, PA::CU_MEMPOOL_ATTR_USED_MEM_CURRENT),
        5 * MIB
    );
    assert_eq!(
        pool_u64(&cuda, pool, PA::CU_MEMPOOL_ATTR_USED_MEM_CURRENT),
        0
    );
    // Access: the owner reads and writes.
    let get_access: unsafe extern "C" fn(
        *mut u32,
        P,
        *mut cudarc::driver::sys::CUmemLocation,
    ) -> Cu = cuda.sym("cuMemPoolGetAccess");
    let mut flags = 0u32;
    let mut location = props.location;
    // SAFETY: valid pointers.
    assert_eq!(unsafe { get_access(&mut flags, mine, &mut location) }, 0);
    assert_eq!(flags, 3, "CU_MEM_ACCESS_FLAGS_PROT_READWRITE");
    // SAFETY: pointer and handles from the driver.
    unsafe {
        assert_eq!(free(ptr, s), 0);
        assert_eq!(destroy(mine), 0);
        assert_eq!(get_pool(&mut current, 0), 0);
    }
    assert_eq!(current, pool, "back to the default pool");
    assert_eq!(used(&cuda), 0);

    // Memory a pool keeps goes back when the device's last context goes.
    assert_eq!(
        pool_set_u64(&cuda, pool, PA::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, u64::MAX),
        0
    );
    // SAFETY: valid out-pointer, stream and pointer from the driver.
    unsafe {
        assert_eq!(alloc(&mut ptr, 8 << 20, s), 0);
        assert_eq!(free(ptr, s), 0);
    }
    assert_eq!(used(&cuda), 8 * MIB, "kept by the pool");
    assert_eq!(cuda.ctx_destroy(ctx), 0);
    cuda.ctx_create(0).unwrap();
    assert_eq!(used(&cuda), 0, "given back with the last context");
}

// ----- stream and context queries -----

pub fn queries() {
    let (cuda, ctx) = setup();
    let range: unsafe extern "C" fn(*mut c_int, *mut c_int) -> Cu =
        cuda.sym("cuCtxGetStreamPriorityRange");
    let with_priority: unsafe extern "C" fn(*mut P, c_uint, c_int) -> Cu =
        cuda.sym("cuStreamCreateWithPriority");
    let priority: unsafe extern "C" fn(P, *mut c_int) -> Cu = cuda.sym("cuStreamGetPriority");
    let flags: unsafe extern "C" fn(P, *mut c_uint) -> Cu = cuda.sym("cuStreamGetFlags");
    let get_ctx: unsafe extern "C" fn(P, *mut P) -> Cu = cuda.sym("cuStreamGetCtx");
    let get_limit: unsafe extern "C" fn(*mut usize, c_uint) -> Cu = cuda.sym("cuCtxGetLimit");
    let set_limit: unsafe extern "C" fn(c_uint, usize) -> Cu = cuda.sym("cuCtxSetLimit");
    let get_cache: unsafe extern "C" fn(*mut c_uint) -> Cu = cuda.sym("cuCtxGetCacheConfig");
    let set_cache: unsafe extern "C" fn(c_uint) -> Cu = cuda.sym("cuCtxSetCacheConfig");
    let api: unsafe extern "C" fn(P, *mut c_uint) -> Cu = cuda.sym("cuCtxGetApiVersion");
    let props: unsafe extern "C" fn(*mut cudarc::driver::sys::CUdevprop, c_int) -> Cu =
        cuda.sym("cuDeviceGetProperties");
    let (mut least, mut greatest) = (9, 9);
    let (mut s, mut p, mut f, mut c) = (NULL, 9, 9, NULL);
    // SAFETY: valid out-pointers and handles from the driver.
    unsafe {
        assert_eq!(range(&mut least, &mut greatest), 0);
        assert_eq!((least, greatest), (0, -5));
        assert_eq!(with_priority(&mut s, 1, -10), 0);
        assert_eq!(priority(s, &mut p), 0);
        assert_eq!(p, -5, "clamped to the greatest priority");
        assert_eq!(flags(s, &mut f), 0);
        assert_eq!(f, 1, "CU_STREAM_NON_BLOCKING");
        assert_eq!(get_ctx(s, &mut c), 0);
        assert_eq!(c, ctx);
        assert_eq!(priority(NULL, &mut p), 0);
        assert_eq!(p, 0);
        assert_eq!(priority(0xdead as P, &mut p), INVALID_HANDLE);
        let mut v = 0usize;
        assert_eq!(get_limit(&mut v, 0), 0);
        assert_eq!(v, 1024, "default stack size");
        assert_eq!(get_limit(&mut v, 2), 0);
        assert_eq!(v, 8 << 20, "default malloc heap");
        assert_eq!(set_limit(0, 4096), 0);
        assert_eq!(get_limit(&mut v, 0), 0);
        assert_eq!(v, 4096);
        assert_eq!(
            get_limit(&mut v, 9),
            code(CUresult::CUDA_ERROR_UNSUPPORTED_LIMIT)
        );
        let mut cache = 9;
        assert_eq!(get_cache(&mut cache), 0);
        assert_eq!(cache, 0);
        assert_eq!(set_cache(2), 0);
        assert_eq!(get_cache(&mut cache), 0);
        assert_eq!(cache, 2);
        assert_eq!(set_cache(7), INVALID_VALUE);
        let mut version = 0;
        assert_eq!(api(NULL, &mut version), 0);
        assert_eq!(version, 3020);
        assert_eq!(
            api(0xdead as P, &mut version),
            code(CUresult::CUDA_ERROR_INVALID_CONTEXT)
        );
        let mut prop: cudarc::driver::sys::CUdevprop = std::mem::zeroed();
        assert_eq!(props(&mut prop, 0), 0);
        assert_eq!(prop.maxThreadsPerBlock, 1024);
        assert_eq!(prop.SIMDWidth, 32);
        assert_eq!(prop.clockRate, 1_980_000);
    }
}

// ----- IPC -----

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> [u8; 64] {
    let mut out = [0u8; 64];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex handle");
    }
    out
}

/// Allocates 1 GiB, exports it and an interprocess event recorded behind a long kernel,
/// prints both handles and "ready"; then frees the allocation on a "free" line on stdin
/// and exits at EOF.
pub fn ipc_exporter() {
    let (cuda, _) = setup();
    let get_mem: unsafe extern "C" fn(*mut [u8; 64], u64) -> Cu = cuda.sym("cuIpcGetMemHandle");
    let open_mem: unsafe extern "C" fn(*mut u64, [u8; 64], c_uint) -> Cu =
        cuda.sym("cuIpcOpenMemHandle_v2");
    let get_event: unsafe extern "C" fn(*mut [u8; 64], P) -> Cu = cuda.sym("cuIpcGetEventHandle");
    let event_create: unsafe extern "C" fn(*mut P, c_uint) -> Cu = cuda.sym("cuEventCreate");
    let record: unsafe extern "C" fn(P, P) -> Cu = cuda.sym("cuEventRecord");
    let ptr = cuda.alloc(GIB as usize).unwrap();
    let (mut handle, mut ev_handle) = ([0u8; 64], [0u8; 64]);
    let (mut plain, mut shared) = (NULL, NULL);
    // SAFETY: valid out-pointers and handles from the driver.
    unsafe {
        assert_eq!(
            get_mem(&mut handle, ptr + 4096),
            INVALID_VALUE,
            "not the base"
        );
        assert_eq!(get_mem(&mut handle, ptr), 0);
        let mut mapped = 0;
        assert_eq!(
            open_mem(&mut mapped, handle, 1),
            code(CUresult::CUDA_ERROR_INVALID_CONTEXT),
            "the exporter cannot open its own handle"
        );
        assert_eq!(event_create(&mut plain, 0), 0);
        assert_eq!(get_event(&mut ev_handle, plain), INVALID_VALUE);
        assert_eq!(event_create(&mut shared, 6), 0); // DISABLE_TIMING | INTERPROCESS
        assert_eq!(get_event(&mut ev_handle, shared), 0);
        let long = function(&cuda, c"long");
        assert_eq!(launch(&cuda, long, 1, NULL), 0);
        assert_eq!(record(shared, NULL), 0);
    }
    println!("mem_handle={}", hex(&handle));
    println!("event_handle={}", hex(&ev_handle));
    println!("ready");
    for line in std::io::stdin().lock().lines() {
        if line.unwrap().trim() == "free" {
            assert_eq!(cuda.free(ptr), 0);
            println!("freed");
        }
    }
}

/// Opens `FAM_MEM_HANDLE` (and `FAM_EVENT_HANDLE` if set); with `FAM_EXPECT` set, only
/// checks that opening fails with that code. Otherwise prints what it sees and "ready",
/// keeps the mapping until stdin closes, then closes it.
pub fn ipc_importer() {
    let (cuda, _) = setup();
    let open_mem: unsafe extern "C" fn(*mut u64, [u8; 64], c_uint) -> Cu =
        cuda.sym("cuIpcOpenMemHandle_v2");
    let close_mem: unsafe extern "C" fn(u64) -> Cu = cuda.sym("cuIpcCloseMemHandle");
    let range: unsafe extern "C" fn(*mut u64, *mut usize, u64) -> Cu =
        cuda.sym("cuMemGetAddressRange_v2");
    let handle = unhex(&std::env::var("FAM_MEM_HANDLE").unwrap());
    let mut ptr = 0u64;
    // SAFETY: valid out-pointer; the handle is 64 bytes by value.
    let rc = unsafe { open_mem(&mut ptr, handle, 1) };
    if let Ok(expect) = std::env::var("FAM_EXPECT") {
        assert_eq!(rc, expect.parse::<Cu>().unwrap(), "cuIpcOpenMemHandle_v2");
        println!("open={rc}");
        return;
    }
    assert_eq!(rc, 0, "cuIpcOpenMemHandle_v2");
    let (mut base, mut size) = (0u64, 0usize);
    let mut again = 0u64;
    // SAFETY: valid out-pointers; the handle is 64 bytes by value.
    unsafe {
        assert_eq!(range(&mut base, &mut size, ptr + 100), 0);
        assert_eq!(open_mem(&mut again, handle, 0), 0);
        assert_eq!(close_mem(again), 0);
    }
    assert_eq!((base, size as u64), (ptr, GIB), "the exporter's size");
    assert_eq!(again, ptr, "opened twice: the same mapping");
    // A copy into the mapping is checked against its size.
    let htod: unsafe extern "C" fn(u64, *const c_void, usize) -> Cu = cuda.sym("cuMemcpyHtoD_v2");
    let byte = [0u8; 16];
    // SAFETY: a host buffer of 16 bytes; the fake reads nothing.
    unsafe {
        assert_eq!(htod(ptr + GIB - 16, byte.as_ptr().cast(), 16), 0);
        assert_eq!(htod(ptr + GIB - 8, byte.as_ptr().cast(), 16), INVALID_VALUE);
    }
    println!("used={}", used(&cuda));
    if let Ok(ev) = std::env::var("FAM_EVENT_HANDLE") {
        let open_event: unsafe extern "C" fn(*mut P, [u8; 64]) -> Cu =
            cuda.sym("cuIpcOpenEventHandle");
        let query: unsafe extern "C" fn(P) -> Cu = cuda.sym("cuEventQuery");
        let synchronize: unsafe extern "C" fn(P) -> Cu = cuda.sym("cuEventSynchronize");
        let mut event = NULL;
        // SAFETY: valid out-pointer, a 64-byte handle, then the opened event.
        unsafe {
            assert_eq!(open_event(&mut event, unhex(&ev)), 0);
            assert_eq!(
                query(event),
                code(CUresult::CUDA_ERROR_NOT_READY),
                "the exporter's event waits for its long kernel"
            );
            let start = Instant::now();
            assert_eq!(synchronize(event), 0);
            println!("event_wait_ms={}", start.elapsed().as_millis());
            assert_eq!(query(event), 0);
        }
    }
    println!("ready");
    let _ = std::io::stdin().lock().lines().count();
    // SAFETY: the mapping from cuIpcOpenMemHandle_v2, then again (no longer open).
    unsafe {
        assert_eq!(close_mem(ptr), 0);
        assert_eq!(close_mem(ptr), INVALID_HANDLE);
    }
}

// ----- libraries -----

const PTX: &std::ffi::CStr = c".version 8.0\n.target sm_90\n.address_size 64\n\
    .visible .entry k(\n.param .u64 k_param_0\n)\n{\nret;\n}\n\
    .visible .entry other()\n{\nret;\n}\n";

/// Milliseconds between two events around one launch of `f` on stream `s`.
fn timed_launch(cuda: &Cuda, f: P, s: P) -> f32 {
    let create: unsafe extern "C" fn(*mut P, c_uint) -> Cu = cuda.sym("cuEventCreate");
    let record: unsafe extern "C" fn(P, P) -> Cu = cuda.sym("cuEventRecord");
    let elapsed: unsafe extern "C" fn(*mut f32, P, P) -> Cu = cuda.sym("cuEventElapsedTime");
    let (mut a, mut b) = (NULL, NULL);
    let mut ms = 0.0;
    // SAFETY: valid out-pointers and handles.
    unsafe {
        assert_eq!(create(&mut a, 0), 0);
        assert_eq!(create(&mut b, 0), 0);
        assert_eq!(record(a, s), 0);
        assert_eq!(launch(cuda, f, 1, s), 0);
        assert_eq!(record(b, s), 0);
        assert_eq!(sync_stream(cuda, s), 0);
        assert_eq!(elapsed(&mut ms, a, b), 0);
    }
    ms
}

pub fn library() {
    let (cuda, _) = setup();
    type Load =
        unsafe extern "C" fn(*mut P, *const c_void, P, *mut P, c_uint, P, *mut P, c_uint) -> Cu;
    let load: Load = cuda.sym("cuLibraryLoadData");
    let load_file: unsafe extern "C" fn(
        *mut P,
        *const c_char,
        P,
        *mut P,
        c_uint,
        P,
        *mut P,
        c_uint,
    ) -> Cu = cuda.sym("cuLibraryLoadFromFile");
    let unload: unsafe extern "C" fn(P) -> Cu = cuda.sym("cuLibraryUnload");
    let get_kernel: unsafe extern "C" fn(*mut P, P, *const c_char) -> Cu =
        cuda.sym("cuLibraryGetKernel");
    let count: unsafe extern "C" fn(*mut c_uint, P) -> Cu = cuda.sym("cuLibraryGetKernelCount");
    let enumerate: unsafe extern "C" fn(*mut P, c_uint, P) -> Cu =
        cuda.sym("cuLibraryEnumerateKernels");
    let kernel_function: unsafe extern "C" fn(*mut P, P) -> Cu = cuda.sym("cuKernelGetFunction");
    let get_module: unsafe extern "C" fn(*mut P, P) -> Cu = cuda.sym("cuLibraryGetModule");
    let module_function: unsafe extern "C" fn(*mut P, P, *const c_char) -> Cu =
        cuda.sym("cuModuleGetFunction");
    let kernel_attr: unsafe extern "C" fn(*mut c_int, c_uint, P, c_int) -> Cu =
        cuda.sym("cuKernelGetAttribute");
    let kernel_name: unsafe extern "C" fn(*mut *const c_char, P) -> Cu =
        cuda.sym("cuKernelGetName");
    let (mut lib, mut kernel, mut func, mut module, mut from_module) =
        (NULL, NULL, NULL, NULL, NULL);
    let mut n = 0;
    let mut listed = [NULL; 4];
    // SAFETY: valid out-pointers, a NUL-terminated PTX image, C strings, handles.
    unsafe {
        assert_eq!(
            load_file(
                &mut lib,
                c"/nonexistent/lib.cubin".as_ptr(),
                NULL,
                NULL.cast(),
                0,
                NULL,
                NULL.cast(),
                0
            ),
            code(CUresult::CUDA_ERROR_FILE_NOT_FOUND)
        );
        assert_eq!(
            load(&mut lib, NULL, NULL, NULL.cast(), 0, NULL, NULL.cast(), 0),
            INVALID_VALUE
        );
        assert_eq!(
            load(
                &mut lib,
                PTX.as_ptr().cast(),
                NULL,
                NULL.cast(),
                0,
                NULL,
                NULL.cast(),
                0
            ),
            0
        );
        assert_eq!(count(&mut n, lib), 0);
        assert_eq!(n, 2, "the PTX's two .entry kernels");
        assert_eq!(enumerate(listed.as_mut_ptr(), 4, lib), 0);
        assert_eq!(get_kernel(&mut kernel, lib, c"k".as_ptr()), 0);
        assert_eq!(kernel, listed[0], "the same kernel by name and in the list");
        let mut name = std::ptr::null();
        assert_eq!(kernel_name(&mut name, kernel), 0);
        assert_eq!(std::ffi::CStr::from_ptr(name), c"k");
        let mut regs = 0;
        assert_eq!(kernel_attr(&mut regs, 4, kernel, 0), 0); // NUM_REGS
        assert_eq!(regs, 32);
        assert_eq!(kernel_function(&mut func, kernel), 0);
        assert_eq!(get_module(&mut module, lib), 0);
        assert_eq!(module_function(&mut from_module, module, c"k".as_ptr()), 0);
    }
    // k's wave lasts 50 ms (FAKEGPU_KERNELS): the kernel itself, its function and the
    // library module's function all launch like cuModuleGetFunction's.
    let s = stream(&cuda, 0);
    for (what, f) in [
        ("kernel", kernel),
        ("function", func),
        ("module_function", from_module),
    ] {
        let ms = timed_launch(&cuda, f, s);
        println!("{what}_ms={ms}");
        assert!(ms >= 50.0, "{what}: {ms} ms");
    }
    // SAFETY: handles from the driver; after the unload the kernel is gone.
    unsafe {
        assert_eq!(unload(lib), 0);
        assert_eq!(launch(&cuda, kernel, 1, s), INVALID_HANDLE);
        assert_eq!(unload(lib), INVALID_HANDLE);
    }
}

// ----- pointer attributes -----

fn attr<T: Default>(cuda: &Cuda, a: PT, ptr: u64) -> Result<T, Cu> {
    let f: unsafe extern "C" fn(*mut c_void, PT, u64) -> Cu = cuda.sym("cuPointerGetAttribute");
    let mut v = T::default();
    // SAFETY: `v` has the attribute's type (the caller picks it as cuda.h says).
    let rc = unsafe { f((&mut v as *mut T).cast(), a, ptr) };
    if rc == 0 {
        Ok(v)
    } else {
        Err(rc)
    }
}

pub fn pointer() {
    let (cuda, ctx) = setup();
    let managed_alloc: unsafe extern "C" fn(*mut u64, usize, c_uint) -> Cu =
        cuda.sym("cuMemAllocManaged");
    let host_alloc: unsafe extern "C" fn(*mut P, usize) -> Cu = cuda.sym("cuMemAllocHost_v2");
    let dev = cuda.alloc(MIB as usize).unwrap();
    let (mut managed, mut host) = (0u64, NULL);
    // SAFETY: valid out-pointers.
    unsafe {
        assert_eq!(managed_alloc(&mut managed, MIB as usize, 1), 0);
        assert_eq!(host_alloc(&mut host, MIB as usize), 0);
    }
    let host = host as u64;
    let device_type = CUmemorytype::CU_MEMORYTYPE_DEVICE as u32;
    let host_type = CUmemorytype::CU_MEMORYTYPE_HOST as u32;
    assert_eq!(
        attr::<u32>(&cuda, PT::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dev + 5),
        Ok(device_type)
    );
    assert_eq!(
        attr::<u32>(&cuda, PT::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, managed),
        Ok(device_type)
    );
    assert_eq!(
        attr::<u32>(&cuda, PT::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, host + 7),
        Ok(host_type)
    );
    assert_eq!(
        attr::<usize>(&cuda, PT::CU_POINTER_ATTRIBUTE_CONTEXT, dev),
        Ok(ctx as usize)
    );
    assert_eq!(
        attr::<usize>(&cuda, PT::CU_POINTER_ATTRIBUTE_CONTEXT, host),
        Ok(ctx as usize)
    );
    assert_eq!(
        attr::<u64>(&cuda, PT::CU_POINTER_ATTRIBUTE_DEVICE_POINTER, dev + 5),
        Ok(dev + 5)
    );
    assert_eq!(
        attr::<u64>(&cuda, PT::CU_POINTER_ATTRIBUTE_HOST_POINTER, dev),
        Err(INVALID_VALUE)
    );
    assert_eq!(
        attr::<u64>(&cuda, PT::CU_POINTER_ATTRIBUTE_HOST_POINTER, managed),
        Ok(managed)
    );
    assert_eq!(
        attr::<u8>(&cuda, PT::CU_POINTER_ATTRIBUTE_IS_MANAGED, managed),
        Ok(1)
    );
    assert_eq!(
        attr::<u8>(&cuda, PT::CU_POINTER_ATTRIBUTE_IS_MANAGED, dev),
        Ok(0)
    );
    assert_eq!(
        attr::<c_int>(&cuda, PT::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dev),
        Ok(0)
    );
    assert_eq!(
        attr::<u64>(&cuda, PT::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, dev + 1000),
        Ok(dev)
    );
    assert_eq!(
        attr::<usize>(&cuda, PT::CU_POINTER_ATTRIBUTE_RANGE_SIZE, dev + 1000),
        Ok(MIB as usize)
    );
    assert_eq!(
        attr::<u8>(&cuda, PT::CU_POINTER_ATTRIBUTE_MAPPED, dev),
        Ok(1)
    );
    let id_dev = attr::<u64>(&cuda, PT::CU_POINTER_ATTRIBUTE_BUFFER_ID, dev).unwrap();
    let id_managed = attr::<u64>(&cuda, PT::CU_POINTER_ATTRIBUTE_BUFFER_ID, managed).unwrap();
    assert_ne!(id_dev, id_managed);
    // Past the end (of the last allocation), and nowhere at all.
    assert_eq!(
        attr::<u32>(&cuda, PT::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, managed + MIB),
        Err(INVALID_VALUE)
    );
    assert_eq!(
        attr::<u32>(&cuda, PT::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, 0x10),
        Err(INVALID_VALUE)
    );
    // cuPointerGetAttributes: several at once; no error for an unknown address.
    let many: unsafe extern "C" fn(c_uint, *mut PT, *mut P, u64) -> Cu =
        cuda.sym("cuPointerGetAttributes");
    let mut attrs = [
        PT::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        PT::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
        PT::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
    ];
    let (mut kind, mut size, mut ordinal) = (9u32, 9usize, 9 as c_int);
    let mut data: [P; 3] = [
        (&mut kind as *mut u32).cast(),
        (&mut size as *mut usize).cast(),
        (&mut ordinal as *mut c_int).cast(),
    ];
    // SAFETY: three attributes and three outputs of their types.
    assert_eq!(
        unsafe { many(3, attrs.as_mut_ptr(), data.as_mut_ptr(), managed + 3) },
        0
    );
    assert_eq!((kind, size, ordinal), (device_type, MIB as usize, 0));
    // SAFETY: as above.
    assert_eq!(
        unsafe { many(3, attrs.as_mut_ptr(), data.as_mut_ptr(), 0x10) },
        0
    );
    assert_eq!((kind, size, ordinal), (0, 0, -2));
}

// ----- function attributes and occupancy -----

static CALLBACK_CALLS: AtomicUsize = AtomicUsize::new(0);

/// 256 bytes of dynamic shared memory per thread.
extern "C" fn smem_per_block(block_size: c_int) -> usize {
    CALLBACK_CALLS.fetch_add(1, Ordering::SeqCst);
    block_size as usize * 256
}

pub fn occupancy() {
    let (cuda, _) = setup();
    let f = function(&cuda, c"k");
    let get_attr: unsafe extern "C" fn(*mut c_int, c_uint, P) -> Cu =
        cuda.sym("cuFuncGetAttribute");
    let set_attr: unsafe extern "C" fn(P, c_uint, c_int) -> Cu = cuda.sym("cuFuncSetAttribute");
    let set_cache: unsafe extern "C" fn(P, c_uint) -> Cu = cuda.sym("cuFuncSetCacheConfig");
    let active: unsafe extern "C" fn(*mut c_int, P, c_int, usize) -> Cu =
        cuda.sym("cuOccupancyMaxActiveBlocksPerMultiprocessor");
    let active_flags: unsafe extern "C" fn(*mut c_int, P, c_int, usize, c_uint) -> Cu =
        cuda.sym("cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags");
    type Potential = unsafe extern "C" fn(
        *mut c_int,
        *mut c_int,
        P,
        Option<extern "C" fn(c_int) -> usize>,
        usize,
        c_int,
    ) -> Cu;
    let potential: Potential = cuda.sym("cuOccupancyMaxPotentialBlockSize");
    let available: unsafe extern "C" fn(*mut usize, P, c_int, c_int) -> Cu =
        cuda.sym("cuOccupancyAvailableDynamicSMemPerBlock");
    let get = |a: c_uint| {
        let mut v = -7;
        // SAFETY: valid out-pointer and function.
        assert_eq!(unsafe { get_attr(&mut v, a, f) }, 0, "attribute {a}");
        v
    };
    assert_eq!(get(0), 1024, "MAX_THREADS_PER_BLOCK");
    assert_eq!(get(4), 32, "NUM_REGS");
    assert_eq!(get(5), 90, "PTX_VERSION");
    assert_eq!(get(6), 90, "BINARY_VERSION");
    assert_eq!(get(8), 48 << 10, "MAX_DYNAMIC_SHARED_SIZE_BYTES");
    let blocks = |threads: c_int, smem: usize| {
        let mut n = -1;
        // SAFETY: valid out-pointer and function.
        assert_eq!(unsafe { active(&mut n, f, threads, smem) }, 0);
        n
    };
    assert_eq!(blocks(256, 0), 8, "64 warps per SM");
    assert_eq!(blocks(32, 0), 32, "32 blocks per SM");
    assert_eq!(
        blocks(256, 48 << 10),
        4,
        "228 KiB per SM, 1 KiB reserved per block"
    );
    assert_eq!(
        blocks(256, 64 << 10),
        0,
        "over the function's dynamic limit"
    );
    // SAFETY: valid function; attribute 8 = MAX_DYNAMIC_SHARED_SIZE_BYTES.
    unsafe {
        assert_eq!(set_attr(f, 8, 100 << 10), 0);
        assert_eq!(
            set_attr(f, 8, 300 << 10),
            INVALID_VALUE,
            "over the opt-in maximum"
        );
        assert_eq!(set_attr(f, 0, 512), INVALID_VALUE, "read-only");
        assert_eq!(set_cache(f, 1), 0);
        assert_eq!(set_cache(f, 9), INVALID_VALUE);
    }
    assert_eq!(get(8), 100 << 10);
    assert_eq!(blocks(256, 100 << 10), 2);
    let mut n = 0;
    // SAFETY: valid out-pointer; flag 4 is undefined.
    assert_eq!(unsafe { active_flags(&mut n, f, 256, 0, 4) }, INVALID_VALUE);
    let (mut grid, mut block) = (0, 0);
    // SAFETY: valid out-pointers; the callback is a plain extern "C" fn.
    unsafe {
        assert_eq!(potential(&mut grid, &mut block, f, None, 0, 0), 0);
        assert_eq!((grid, block), (2 * 132, 1024));
        assert_eq!(
            potential(&mut grid, &mut block, f, Some(smem_per_block), 0, 0),
            0
        );
    }
    assert!(
        CALLBACK_CALLS.load(Ordering::SeqCst) >= 32,
        "the callback was called per size"
    );
    // With up to 100 KiB of dynamic shared memory: 224 threads with 56 KiB, 4 blocks = 896
    // threads, the most of any size (96 threads: 9 blocks = 864; 416 and up: over 100 KiB).
    assert_eq!((grid, block), (4 * 132, 224));
    let mut smem = 0usize;
    // SAFETY: valid out-pointer.
    unsafe {
        assert_eq!(available(&mut smem, f, 4, 256), 0);
        assert_eq!(smem, (228 << 10) / 4 - 1024);
        assert_eq!(available(&mut smem, f, 9, 256), 0);
        assert_eq!(smem, 0, "9 blocks of 256 threads never fit");
    }
}

// ----- copies and fills -----

/// Runs with `copy_gbps = 10`, `device_copy_gbps = 100` (the test's config).
pub fn copies() {
    let cuda = Cuda::load();
    assert_eq!(cuda.init(), 0);
    let htod: unsafe extern "C" fn(u64, *const c_void, usize) -> Cu = cuda.sym("cuMemcpyHtoD_v2");
    let dtoh: unsafe extern "C" fn(*mut c_void, u64, usize) -> Cu = cuda.sym("cuMemcpyDtoH_v2");
    let dtod: unsafe extern "C" fn(u64, u64, usize) -> Cu = cuda.sym("cuMemcpyDtoD_v2");
    let htod_async: unsafe extern "C" fn(u64, *const c_void, usize, P) -> Cu =
        cuda.sym("cuMemcpyHtoDAsync_v2");
    let memcpy: unsafe extern "C" fn(u64, u64, usize) -> Cu = cuda.sym("cuMemcpy");
    let memset32: unsafe extern "C" fn(u64, c_uint, usize) -> Cu = cuda.sym("cuMemsetD32_v2");
    let memset8_async: unsafe extern "C" fn(u64, u8, usize, P) -> Cu = cuda.sym("cuMemsetD8Async");
    let memset2d: unsafe extern "C" fn(u64, usize, u8, usize, usize) -> Cu =
        cuda.sym("cuMemsetD2D8_v2");
    let copy2d: unsafe extern "C" fn(*const CUDA_MEMCPY2D) -> Cu = cuda.sym("cuMemcpy2D_v2");
    let copy3d: unsafe extern "C" fn(*const CUDA_MEMCPY3D) -> Cu = cuda.sym("cuMemcpy3D_v2");
    let peer: unsafe extern "C" fn(u64, P, u64, P, usize) -> Cu = cuda.sym("cuMemcpyPeer");
    let host = vec![0u8; 4096];
    let h = host.as_ptr().cast::<c_void>();
    // SAFETY: no context yet.
    assert_eq!(
        unsafe { htod(0, h, 16) },
        code(CUresult::CUDA_ERROR_INVALID_CONTEXT)
    );
    let ctx = cuda.ctx_create(0).unwrap();
    let big = cuda.alloc(GIB as usize).unwrap();
    let small = cuda.alloc(MIB as usize).unwrap();
    // SAFETY: device pointers from the driver and a 4 KiB host buffer the fake never reads;
    // the sizes past it are only checked on the device side.
    unsafe {
        // Ranges: inside one allocation, else CUDA_ERROR_INVALID_VALUE.
        assert_eq!(htod(small, h, 4096), 0);
        assert_eq!(htod(small + MIB - 100, h, 100), 0);
        assert_eq!(
            htod(small + MIB - 100, h, 101),
            INVALID_VALUE,
            "past the end"
        );
        assert_eq!(
            dtoh(host.as_ptr() as P, small + MIB, 1),
            INVALID_VALUE,
            "just past it"
        );
        assert_eq!(
            dtod(small, big + GIB - 10, 20),
            INVALID_VALUE,
            "source past its end"
        );
        assert_eq!(dtod(big, small, MIB as usize), 0);
        assert_eq!(memcpy(small, h as u64, 4096), 0, "unified: host to device");
        assert_eq!(memcpy(small + MIB, h as u64, 1), INVALID_VALUE);
        assert_eq!(memset32(small + 2, 0, 4), INVALID_VALUE, "misaligned");
        assert_eq!(memset32(small, 0, (MIB / 4) as usize), 0);
        assert_eq!(memset32(small, 0, (MIB / 4) as usize + 1), INVALID_VALUE);
        assert_eq!(memset2d(small, 1024, 0, 1000, 1024), 0);
        assert_eq!(memset2d(small, 1024, 0, 1000, 1025), INVALID_VALUE);
        assert_eq!(
            memset2d(small, 512, 0, 1000, 2),
            INVALID_VALUE,
            "pitch < width"
        );
        assert_eq!(peer(big, ctx, small, ctx, 4096), 0);
        assert_eq!(peer(big, ctx, small + MIB - 1, ctx, 2), INVALID_VALUE);

        let mut c2 = CUDA_MEMCPY2D {
            srcXInBytes: 0,
            srcY: 0,
            srcMemoryType: CUmemorytype::CU_MEMORYTYPE_HOST,
            srcHost: h,
            srcDevice: 0,
            srcArray: std::ptr::null_mut(),
            srcPitch: 64,
            dstXInBytes: 0,
            dstY: 0,
            dstMemoryType: CUmemorytype::CU_MEMORYTYPE_DEVICE,
            dstHost: std::ptr::null_mut(),
            dstDevice: small,
            dstArray: std::ptr::null_mut(),
            dstPitch: 1024,
            WidthInBytes: 64,
            Height: 1024,
        };
        assert_eq!(copy2d(&c2), 0);
        c2.dstY = 1;
        assert_eq!(copy2d(&c2), INVALID_VALUE, "one row too far");

        let mut c3 = CUDA_MEMCPY3D {
            srcXInBytes: 0,
            srcY: 0,
            srcZ: 0,
            srcLOD: 0,
            srcMemoryType: CUmemorytype::CU_MEMORYTYPE_DEVICE,
            srcHost: std::ptr::null(),
            srcDevice: big,
            srcArray: std::ptr::null_mut(),
            reserved0: std::ptr::null_mut(),
            srcPitch: 1024,
            srcHeight: 1024,
            dstXInBytes: 0,
            dstY: 0,
            dstZ: 0,
            dstLOD: 0,
            dstMemoryType: CUmemorytype::CU_MEMORYTYPE_DEVICE,
            dstHost: std::ptr::null_mut(),
            dstDevice: small,
            dstArray: std::ptr::null_mut(),
            reserved1: std::ptr::null_mut(),
            dstPitch: 1024,
            dstHeight: 256,
            WidthInBytes: 1024,
            Height: 256,
            Depth: 4,
        };
        assert_eq!(copy3d(&c3), 0, "4 slices of 256 KiB fill 1 MiB");
        c3.Depth = 5;
        assert_eq!(copy3d(&c3), INVALID_VALUE);
    }

    // Time: 1 GiB over a 10 GB/s link takes at least 107 ms; within the device (100 GB/s)
    // at least 10.7 ms.
    let gib_ms = |gbps: f64| GIB as f64 / gbps / 1e6;
    let start = Instant::now();
    // SAFETY: as above.
    assert_eq!(unsafe { htod(big, h, GIB as usize) }, 0);
    let ms = start.elapsed().as_secs_f64() * 1e3;
    println!("htod_ms={ms:.3}");
    assert!(ms >= gib_ms(10.0), "synchronous HtoD of 1 GiB took {ms} ms");
    let start = Instant::now();
    // SAFETY: as above.
    assert_eq!(unsafe { dtod(big, big, GIB as usize) }, 0);
    let ms = start.elapsed().as_secs_f64() * 1e3;
    println!("dtod_ms={ms:.3}");
    assert!(ms >= gib_ms(100.0), "DtoD of 1 GiB took {ms} ms");

    // Async: returns at once, occupies the stream; a kernel behind it waits for it.
    let s = stream(&cuda, 0);
    let start = Instant::now();
    // SAFETY: as above.
    assert_eq!(unsafe { htod_async(big, h, GIB as usize, s) }, 0);
    assert_eq!(query_stream(&cuda, s), code(CUresult::CUDA_ERROR_NOT_READY));
    // SAFETY: as above.
    assert_eq!(unsafe { memset8_async(big, 0, GIB as usize, s) }, 0);
    assert_eq!(sync_stream(&cuda, s), 0);
    let ms = start.elapsed().as_secs_f64() * 1e3;
    println!("async_ms={ms:.3}");
    assert!(
        ms >= gib_ms(10.0) + gib_ms(100.0),
        "async copy + fill took {ms} ms"
    );
    assert_eq!(query_stream(&cuda, s), 0);
    // cuCtxSynchronize waits for copies too.
    let start = Instant::now();
    // SAFETY: as above.
    assert_eq!(unsafe { htod_async(big, h, GIB as usize, s) }, 0);
    assert_eq!(cuda.synchronize(), 0);
    let ms = start.elapsed().as_secs_f64() * 1e3;
    assert!(
        ms >= gib_ms(10.0),
        "cuCtxSynchronize after an async copy: {ms} ms"
    );
}
