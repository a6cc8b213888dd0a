//! The CUDA driver API as a client sees it, in child processes that `dlopen("libcuda.so.1")`
//! through LD_LIBRARY_PATH: initialization and context rules, every allocation path and
//! what it charges, frees, OOM, launches. The parent checks the shared state afterwards.

mod common;

use std::ffi::{c_uint, c_void};

use common::{in_child, run_ok, Cuda, Fake};
use cudarc::driver::sys::{
    CUarray_format, CUmemAllocationType, CUmemLocationType, CUresult, CUDA_ARRAY3D_DESCRIPTOR,
    CUDA_ARRAY_DESCRIPTOR,
};

const GIB: usize = 1 << 30;
const MIB: usize = 1 << 20;

fn code(r: CUresult) -> u32 {
    r as u32
}

#[test]
fn initialization_and_context_rules() {
    if in_child() {
        let cuda = Cuda::load();
        assert_eq!(
            cuda.device_count(),
            Err(code(CUresult::CUDA_ERROR_NOT_INITIALIZED))
        );
        assert_eq!(
            cuda.alloc(MIB),
            Err(code(CUresult::CUDA_ERROR_NOT_INITIALIZED))
        );
        let init: unsafe extern "C" fn(c_uint) -> u32 = cuda.sym("cuInit");
        // SAFETY: cuInit with a flag the API does not define.
        assert_eq!(unsafe { init(1) }, code(CUresult::CUDA_ERROR_INVALID_VALUE));
        assert_eq!(cuda.init(), 0);
        assert_eq!(cuda.init(), 0, "cuInit is idempotent");
        assert_eq!(cuda.device_count(), Ok(1));
        assert_eq!(cuda.device_name(0), "NVIDIA H100 80GB HBM3");
        assert_eq!(
            cuda.alloc(MIB),
            Err(code(CUresult::CUDA_ERROR_INVALID_CONTEXT)),
            "no current context"
        );
        assert_eq!(
            cuda.mem_info(),
            Err(code(CUresult::CUDA_ERROR_INVALID_CONTEXT))
        );
        assert_eq!(
            cuda.ctx_create(1).err(),
            Some(code(CUresult::CUDA_ERROR_INVALID_DEVICE))
        );

        let ctx = cuda.ctx_create(0).unwrap();
        let get_current: unsafe extern "C" fn(*mut *mut c_void) -> u32 =
            cuda.sym("cuCtxGetCurrent");
        let mut current = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { get_current(&mut current) }, 0);
        assert_eq!(current, ctx);
        let get_device: unsafe extern "C" fn(*mut i32) -> u32 = cuda.sym("cuCtxGetDevice");
        let mut dev = -1;
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { get_device(&mut dev) }, 0);
        assert_eq!(dev, 0);

        // Destroying a context frees what was allocated in it.
        cuda.alloc(GIB).unwrap();
        let (free, total) = cuda.mem_info().unwrap();
        assert_eq!((total, total - free), (80 * GIB, GIB));
        assert_eq!(cuda.ctx_destroy(ctx), 0);
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { get_current(&mut current) }, 0);
        assert!(
            current.is_null(),
            "the destroyed context is no longer current"
        );
        let ctx = cuda.ctx_create(0).unwrap();
        assert_eq!(cuda.mem_info().unwrap().0, 80 * GIB);

        // Primary contexts are reference counted.
        let retain: unsafe extern "C" fn(*mut *mut c_void, i32) -> u32 =
            cuda.sym("cuDevicePrimaryCtxRetain");
        let release: unsafe extern "C" fn(i32) -> u32 = cuda.sym("cuDevicePrimaryCtxRelease_v2");
        let set_current: unsafe extern "C" fn(*mut c_void) -> u32 = cuda.sym("cuCtxSetCurrent");
        let (mut p1, mut p2) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: valid out-pointers and handles from the driver.
        unsafe {
            assert_eq!(retain(&mut p1, 0), 0);
            assert_eq!(retain(&mut p2, 0), 0);
            assert_eq!(p1, p2);
            assert_ne!(p1, ctx);
            assert_eq!(set_current(p1), 0);
            assert_eq!(release(0), 0);
            assert_eq!(release(0), 0);
            assert_eq!(release(0), code(CUresult::CUDA_ERROR_INVALID_CONTEXT));
        }
        assert_eq!(
            cuda.alloc(MIB),
            Err(code(CUresult::CUDA_ERROR_INVALID_CONTEXT)),
            "released primary context"
        );
        return;
    }
    let fake = Fake::new();
    run_ok(&mut fake.rerun("initialization_and_context_rules"));
}

#[test]
fn linear_allocations_charge_exactly_and_free_exactly() {
    if in_child() {
        let cuda = Cuda::load();
        assert_eq!(cuda.init(), 0);
        cuda.ctx_create(0).unwrap();
        let used = || {
            let (free, total) = cuda.mem_info().unwrap();
            total - free
        };

        let a = cuda.alloc(GIB).unwrap();
        let b = cuda.alloc(100).unwrap();
        let c = cuda.alloc(3 * MIB).unwrap();
        assert_eq!(used(), GIB + 100 + 3 * MIB);
        assert_eq!(
            a % (2 << 20) as u64,
            0,
            "large allocations are 2 MiB aligned"
        );
        assert_eq!(b % 512, 0);
        assert!(b >= a + GIB as u64 || b + 100 <= a, "distinct ranges");
        assert_eq!(cuda.alloc(0), Err(code(CUresult::CUDA_ERROR_INVALID_VALUE)));
        assert_eq!(
            cuda.alloc(80 * GIB),
            Err(code(CUresult::CUDA_ERROR_OUT_OF_MEMORY))
        );
        assert_eq!(
            used(),
            GIB + 100 + 3 * MIB,
            "a failed allocation charges nothing"
        );
        assert_eq!(
            cuda.free(a + 8),
            code(CUresult::CUDA_ERROR_INVALID_VALUE),
            "not an allocation's start"
        );
        assert_eq!(cuda.free(a), 0);
        assert_eq!(
            cuda.free(a),
            code(CUresult::CUDA_ERROR_INVALID_VALUE),
            "double free"
        );
        assert_eq!(cuda.free(b), 0);
        assert_eq!(cuda.free(c), 0);
        assert_eq!(used(), 0);

        // Pitch: width rounded up to 512, pitch × height charged.
        let pitch_alloc: unsafe extern "C" fn(*mut u64, *mut usize, usize, usize, c_uint) -> u32 =
            cuda.sym("cuMemAllocPitch_v2");
        let (mut ptr, mut pitch) = (0, 0);
        // SAFETY: valid out-pointers.
        assert_eq!(unsafe { pitch_alloc(&mut ptr, &mut pitch, 1000, 10, 4) }, 0);
        assert_eq!((pitch, used()), (1024, 10240));
        // SAFETY: as above; element size 3 is invalid.
        assert_eq!(
            unsafe { pitch_alloc(&mut ptr, &mut pitch, 1000, 10, 3) },
            code(CUresult::CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(cuda.free(ptr), 0);

        // Managed memory counts on the device.
        let managed: unsafe extern "C" fn(*mut u64, usize, c_uint) -> u32 =
            cuda.sym("cuMemAllocManaged");
        // SAFETY: valid out-pointer; 1 = CU_MEM_ATTACH_GLOBAL.
        assert_eq!(unsafe { managed(&mut ptr, 5 * MIB, 1) }, 0);
        assert_eq!(used(), 5 * MIB);
        assert_eq!(cuda.free(ptr), 0);

        // Pinned host memory is real, writable host memory and never counted.
        let host_alloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> u32 =
            cuda.sym("cuMemAllocHost_v2");
        let host_free: unsafe extern "C" fn(*mut c_void) -> u32 = cuda.sym("cuMemFreeHost");
        let mut host = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the block is 1 MiB of host memory we then write to.
        unsafe {
            assert_eq!(host_alloc(&mut host, MIB), 0);
            std::ptr::write_bytes(host.cast::<u8>(), 0xab, MIB);
        }
        assert_eq!(used(), 0);
        // SAFETY: the pointer from cuMemAllocHost, then one it never returned.
        unsafe {
            assert_eq!(host_free(host), 0);
            assert_eq!(host_free(host), code(CUresult::CUDA_ERROR_INVALID_VALUE));
        }
        return;
    }
    let fake = Fake::new();
    run_ok(&mut fake.rerun("linear_allocations_charge_exactly_and_free_exactly"));
    assert_eq!(fake.states()[0].peak(), GIB as u64 + 100 + 3 * MIB as u64);
}

#[test]
fn async_pool_vmm_and_array_paths() {
    if in_child() {
        let cuda = Cuda::load();
        assert_eq!(cuda.init(), 0);
        cuda.ctx_create(0).unwrap();
        let used = || {
            let (free, total) = cuda.mem_info().unwrap();
            total - free
        };

        // Streams and stream-ordered allocation.
        let stream_create: unsafe extern "C" fn(*mut *mut c_void, c_uint) -> u32 =
            cuda.sym("cuStreamCreate");
        let alloc_async: unsafe extern "C" fn(*mut u64, usize, *mut c_void) -> u32 =
            cuda.sym("cuMemAllocAsync_ptsz");
        let free_async: unsafe extern "C" fn(u64, *mut c_void) -> u32 = cuda.sym("cuMemFreeAsync");
        let mut stream = std::ptr::null_mut();
        let mut ptr = 0;
        // SAFETY: valid out-pointers and handles from the driver.
        unsafe {
            assert_eq!(stream_create(&mut stream, 0), 0);
            assert_eq!(alloc_async(&mut ptr, 7 * MIB, stream), 0);
            assert_eq!(used(), 7 * MIB);
            assert_eq!(
                alloc_async(&mut ptr, MIB, 0xdead as *mut c_void),
                code(CUresult::CUDA_ERROR_INVALID_HANDLE)
            );
            assert_eq!(free_async(ptr, stream), 0);
        }
        assert_eq!(used(), 0);

        // Pools.
        let pool_create: unsafe extern "C" fn(
            *mut *mut c_void,
            *const cudarc::driver::sys::CUmemPoolProps,
        ) -> u32 = cuda.sym("cuMemPoolCreate");
        let pool_alloc: unsafe extern "C" fn(*mut u64, usize, *mut c_void, *mut c_void) -> u32 =
            cuda.sym("cuMemAllocFromPoolAsync");
        let pool_destroy: unsafe extern "C" fn(*mut c_void) -> u32 = cuda.sym("cuMemPoolDestroy");
        // SAFETY: CUmemPoolProps is plain data; zero is a valid start.
        let mut props: cudarc::driver::sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location.type_ = CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = 0;
        let mut pool = std::ptr::null_mut();
        // SAFETY: valid pointers and handles.
        unsafe {
            assert_eq!(pool_create(&mut pool, &props), 0);
            assert_eq!(pool_alloc(&mut ptr, 9 * MIB, pool, stream), 0);
            assert_eq!(used(), 9 * MIB);
            assert_eq!(pool_destroy(pool), 0);
            assert_eq!(free_async(ptr, std::ptr::null_mut()), 0);
        }
        assert_eq!(used(), 0);

        // VMM: device memory counts at cuMemCreate and is given back after release + unmap.
        let granularity: unsafe extern "C" fn(
            *mut usize,
            *const cudarc::driver::sys::CUmemAllocationProp,
            c_uint,
        ) -> u32 = cuda.sym("cuMemGetAllocationGranularity");
        let create: unsafe extern "C" fn(
            *mut u64,
            usize,
            *const cudarc::driver::sys::CUmemAllocationProp,
            u64,
        ) -> u32 = cuda.sym("cuMemCreate");
        let release: unsafe extern "C" fn(u64) -> u32 = cuda.sym("cuMemRelease");
        let reserve: unsafe extern "C" fn(*mut u64, usize, usize, u64, u64) -> u32 =
            cuda.sym("cuMemAddressReserve");
        let address_free: unsafe extern "C" fn(u64, usize) -> u32 = cuda.sym("cuMemAddressFree");
        let map: unsafe extern "C" fn(u64, usize, usize, u64, u64) -> u32 = cuda.sym("cuMemMap");
        let unmap: unsafe extern "C" fn(u64, usize) -> u32 = cuda.sym("cuMemUnmap");
        let set_access: unsafe extern "C" fn(
            u64,
            usize,
            *const cudarc::driver::sys::CUmemAccessDesc,
            usize,
        ) -> u32 = cuda.sym("cuMemSetAccess");
        // SAFETY: plain data.
        let mut prop: cudarc::driver::sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type_ = CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        let (mut g, mut handle, mut host_handle, mut va) = (0, 0, 0, 0);
        // SAFETY: valid pointers; handles and addresses from the driver.
        unsafe {
            assert_eq!(granularity(&mut g, &prop, 0), 0);
            assert_eq!(g, 2 * MIB);
            assert_eq!(
                create(&mut handle, 3 * MIB, &prop, 0),
                code(CUresult::CUDA_ERROR_INVALID_VALUE),
                "not a multiple of 2 MiB"
            );
            assert_eq!(create(&mut handle, 4 * MIB, &prop, 0), 0);
            assert_eq!(used(), 4 * MIB);
            let mut host_prop = prop;
            host_prop.location.type_ = CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST;
            assert_eq!(create(&mut host_handle, 2 * MIB, &host_prop, 0), 0);
            assert_eq!(used(), 4 * MIB, "host-located memory is not device memory");
            assert_eq!(reserve(&mut va, 8 * MIB, 0, 0, 0), 0);
            assert_eq!(map(va, 4 * MIB, 0, handle, 0), 0);
            assert_eq!(
                map(va, 2 * MIB, 0, handle, 0),
                code(CUresult::CUDA_ERROR_ALREADY_MAPPED)
            );
            let access = cudarc::driver::sys::CUmemAccessDesc {
                location: prop.location,
                flags: cudarc::driver::sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            assert_eq!(set_access(va, 4 * MIB, &access, 1), 0);
            assert_eq!(release(handle), 0);
            assert_eq!(used(), 4 * MIB, "still mapped");
            assert_eq!(unmap(va, 4 * MIB), 0);
            assert_eq!(used(), 0);
            assert_eq!(release(handle), code(CUresult::CUDA_ERROR_INVALID_VALUE));
            assert_eq!(release(host_handle), 0);
            assert_eq!(address_free(va, 8 * MIB), 0);
        }

        // Arrays: width × max(h,1) × max(d,1) × channels × element size; mipmaps sum levels.
        let array_create: unsafe extern "C" fn(
            *mut *mut c_void,
            *const CUDA_ARRAY_DESCRIPTOR,
        ) -> u32 = cuda.sym("cuArrayCreate_v2");
        let array3d_create: unsafe extern "C" fn(
            *mut *mut c_void,
            *const CUDA_ARRAY3D_DESCRIPTOR,
        ) -> u32 = cuda.sym("cuArray3DCreate_v2");
        let array_destroy: unsafe extern "C" fn(*mut c_void) -> u32 = cuda.sym("cuArrayDestroy");
        let mip_create: unsafe extern "C" fn(
            *mut *mut c_void,
            *const CUDA_ARRAY3D_DESCRIPTOR,
            c_uint,
        ) -> u32 = cuda.sym("cuMipmappedArrayCreate");
        let mip_destroy: unsafe extern "C" fn(*mut c_void) -> u32 =
            cuda.sym("cuMipmappedArrayDestroy");
        let d2 = CUDA_ARRAY_DESCRIPTOR {
            Width: 1000,
            Height: 100,
            Format: CUarray_format::CU_AD_FORMAT_FLOAT,
            NumChannels: 4,
        };
        let d3 = CUDA_ARRAY3D_DESCRIPTOR {
            Width: 64,
            Height: 64,
            Depth: 16,
            Format: CUarray_format::CU_AD_FORMAT_HALF,
            NumChannels: 2,
            Flags: 0,
        };
        let (mut a2, mut a3, mut mip) = (
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        // SAFETY: valid pointers; handles from the driver.
        unsafe {
            assert_eq!(array_create(&mut a2, &d2), 0);
            assert_eq!(used(), 1000 * 100 * 4 * 4);
            assert_eq!(array3d_create(&mut a3, &d3), 0);
            assert_eq!(used(), 1000 * 100 * 16 + 64 * 64 * 16 * 2 * 2);
            assert_eq!(array_destroy(a2), 0);
            assert_eq!(array_destroy(a3), 0);
            assert_eq!(used(), 0);
            let square = CUDA_ARRAY3D_DESCRIPTOR {
                Width: 256,
                Height: 256,
                Depth: 0,
                NumChannels: 1,
                Format: CUarray_format::CU_AD_FORMAT_UNSIGNED_INT8,
                Flags: 0,
            };
            assert_eq!(mip_create(&mut mip, &square, 3), 0);
            assert_eq!(used(), 256 * 256 + 128 * 128 + 64 * 64);
            assert_eq!(
                array_destroy(mip),
                code(CUresult::CUDA_ERROR_INVALID_HANDLE),
                "not a plain array"
            );
            assert_eq!(mip_destroy(mip), 0);
        }
        assert_eq!(used(), 0);
        return;
    }
    let fake = Fake::new();
    run_ok(&mut fake.rerun("async_pool_vmm_and_array_paths"));
}

#[test]
fn launches_are_counted_and_synchronize_waits() {
    if in_child() {
        let cuda = Cuda::load();
        assert_eq!(cuda.init(), 0);
        cuda.ctx_create(0).unwrap();
        let f = cuda.function();
        // 132 SMs, 100 µs per wave at 1980 MHz: 20 launches of 100 waves = 200 ms.
        let start = std::time::Instant::now();
        for _ in 0..20 {
            assert_eq!(cuda.launch(f, 13_200), 0);
        }
        assert!(
            start.elapsed().as_millis() < 150,
            "launches are asynchronous"
        );
        assert_eq!(cuda.synchronize(), 0);
        let waited = start.elapsed().as_millis();
        assert!(
            (190..2000).contains(&waited),
            "synchronize waited {waited} ms"
        );
        assert_eq!(
            cuda.launch(std::ptr::null_mut(), 1),
            code(CUresult::CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(
            cuda.launch(0x1234 as *mut c_void, 1),
            code(CUresult::CUDA_ERROR_INVALID_HANDLE)
        );
        println!("pid={}", std::process::id());
        return;
    }
    let fake = Fake::new();
    run_ok(&mut fake.rerun("launches_are_counted_and_synchronize_waits"));
    let state = &fake.states()[0];
    assert_eq!(state.launches(), 20);
    assert_eq!(state.used(), 0);
    assert!(
        state.processes().is_empty(),
        "the exited child left no slot"
    );
}

/// A process that exits without freeing gives its memory back, as with the real driver.
#[test]
fn exit_without_free_gives_memory_back() {
    if in_child() {
        let cuda = Cuda::load();
        assert_eq!(cuda.init(), 0);
        cuda.ctx_create(0).unwrap();
        cuda.alloc(2 * GIB).unwrap();
        std::process::exit(0);
    }
    let fake = Fake::new();
    run_ok(&mut fake.rerun("exit_without_free_gives_memory_back"));
    let state = &fake.states()[0];
    assert_eq!((state.used(), state.peak()), (0, 2 * GIB as u64));
}
