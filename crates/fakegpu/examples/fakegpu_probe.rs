//! The client side of fakegpu's integration tests: one program, many probes.
//!
//!     fakegpu_probe <probe>
//!
//! The tests (`tests/*.rs`, through `Fake::probe` in `tests/common/mod.rs`) start it with
//! the fake driver's environment: the link directory first on LD_LIBRARY_PATH,
//! FAKEGPU_STATE, FAKEGPU_CONFIG and, for some, CUDA_VISIBLE_DEVICES. Each probe loads
//! the driver the way real clients do (`dlopen("libcuda.so.1")`, nvml-wrapper's
//! `dlopen("libnvidia-ml.so.1")`), checks what only a client can see, and prints
//! `key=value` lines for the parent test to check. A failed check or driver call panics
//! with its message, so the program exits non-zero and the parent test fails with it.
//!
//! `cargo test` builds it as `target/<profile>/examples/fakegpu_probe`. It does not link the
//! fakegpu crate: the only driver in the process is the one it loads.

#[path = "fakegpu_probe/checkpoint.rs"]
mod checkpoint;
#[path = "fakegpu_probe/cuda.rs"]
mod cuda;
#[path = "fakegpu_probe/families.rs"]
mod families;
#[path = "fakegpu_probe/timeline.rs"]
mod timeline;

use std::ffi::{c_char, c_uint, c_void, CStr};
use std::process::ExitCode;

use cuda::Cuda;
use cudarc::driver::sys::{
    CUarray_format, CUmemAllocationType, CUmemLocationType, CUresult, CUDA_ARRAY3D_DESCRIPTOR,
    CUDA_ARRAY_DESCRIPTOR,
};
use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::device::{DeviceArchitecture, GpuLockedClocksSetting, UsedGpuMemory};
use nvml_wrapper::Nvml;

const GIB: usize = 1 << 30;
const MIB: usize = 1 << 20;

/// Every probe: its name (the first argument), the test that runs it, and its body.
const PROBES: &[(&str, &str, fn())] = &[
    // cuda_api.rs
    (
        "init_and_context_rules",
        "cuda_api::initialization_and_context_rules",
        init_and_context_rules,
    ),
    (
        "linear_allocations",
        "cuda_api::linear_allocations_charge_exactly_and_free_exactly",
        linear_allocations,
    ),
    (
        "async_pool_vmm_arrays",
        "cuda_api::async_pool_vmm_and_array_paths",
        async_pool_vmm_arrays,
    ),
    (
        "launches",
        "cuda_api::launches_are_counted_and_synchronize_waits",
        launches,
    ),
    (
        "exit_without_free",
        "cuda_api::exit_without_free_gives_memory_back",
        exit_without_free,
    ),
    // nvml_wrapper.rs
    (
        "nvml_wrapper",
        "nvml_wrapper::nvml_wrapper_reads_and_controls_the_fake",
        nvml_wrapper,
    ),
    // cross_process.rs
    (
        "nvml_memory",
        "cross_process::sigkilled_process_memory_is_reclaimed",
        nvml_memory,
    ),
    (
        "visible_devices",
        "cross_process::cuda_visible_devices_selects_and_orders",
        visible_devices,
    ),
    (
        "two_device_holder",
        "cross_process::two_device_config_is_honoured",
        two_device_holder,
    ),
    (
        "setters",
        "cross_process::setters_need_root_and_support",
        setters,
    ),
    (
        "init",
        "cross_process::bad_config_fails_cleanly_and_says_why",
        init,
    ),
    // timeline.rs
    (
        "events",
        "timeline::events_are_stamped_from_the_queue",
        timeline::events,
    ),
    (
        "streams",
        "timeline::streams_keep_their_own_order",
        timeline::streams,
    ),
    (
        "launch_paths",
        "timeline::every_launch_path_takes_its_simulated_time",
        timeline::launch_paths,
    ),
    (
        "graphs",
        "timeline::graphs_and_stream_capture",
        timeline::graphs,
    ),
    (
        "half_busy",
        "timeline::nvml_utilization_is_exact",
        timeline::half_busy,
    ),
    (
        "queued_then_quiet",
        "timeline::nvml_counts_queued_work_of_a_quiet_process",
        timeline::queued_then_quiet,
    ),
    (
        "utilization",
        "timeline::a_launch_storm_of_two_processes_keeps_nvml_right",
        timeline::utilization,
    ),
    // quota_race.rs
    (
        "grabber",
        "quota_race::racing_processes_never_exceed_the_device",
        grabber,
    ),
    // cuda_families.rs
    (
        "fam_mempool",
        "cuda_families::memory_pools",
        families::mempool,
    ),
    (
        "fam_queries",
        "cuda_families::stream_and_context_queries",
        families::queries,
    ),
    (
        "fam_ipc_exporter",
        "cuda_families::ipc_* (the exporter)",
        families::ipc_exporter,
    ),
    (
        "fam_ipc_importer",
        "cuda_families::ipc_* (the importer)",
        families::ipc_importer,
    ),
    (
        "fam_library",
        "cuda_families::libraries_and_kernels",
        families::library,
    ),
    (
        "fam_pointer",
        "cuda_families::pointer_attributes",
        families::pointer,
    ),
    (
        "fam_occupancy",
        "cuda_families::function_attributes_and_occupancy",
        families::occupancy,
    ),
    (
        "fam_copies",
        "cuda_families::copies_and_fills",
        families::copies,
    ),
    // checkpoint.rs
    (
        "ckpt_target",
        "checkpoint::* (the target)",
        checkpoint::target,
    ),
    (
        "ckpt_ctl",
        "checkpoint::* (the controller)",
        checkpoint::controller,
    ),
];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [name] = args.as_slice() else {
        eprintln!("fakegpu_probe: expected exactly one argument, the probe's name; got {args:?}");
        usage();
        return ExitCode::from(2);
    };
    let Some(&(_, _, probe)) = PROBES.iter().find(|(n, _, _)| n == name) else {
        eprintln!("fakegpu_probe: unknown probe `{name}`");
        usage();
        return ExitCode::from(2);
    };
    // A failed check panics: say which probe before the panic message (exit status 101).
    let default_hook = std::panic::take_hook();
    let failed = format!("fakegpu_probe: probe `{name}` failed");
    std::panic::set_hook(Box::new(move |info| {
        eprintln!("{failed}");
        default_hook(info);
    }));
    probe();
    ExitCode::SUCCESS
}

fn usage() {
    eprintln!("usage: fakegpu_probe <probe>, one of:");
    for (name, test, _) in PROBES {
        eprintln!("  {name:24} (for {test})");
    }
}

fn code(r: CUresult) -> u32 {
    r as u32
}

// ----- cuda_api.rs -----

fn init_and_context_rules() {
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
    let get_current: unsafe extern "C" fn(*mut *mut c_void) -> u32 = cuda.sym("cuCtxGetCurrent");
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
}

fn linear_allocations() {
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
}

fn async_pool_vmm_arrays() {
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
    let array_create: unsafe extern "C" fn(*mut *mut c_void, *const CUDA_ARRAY_DESCRIPTOR) -> u32 =
        cuda.sym("cuArrayCreate_v2");
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
    let mip_destroy: unsafe extern "C" fn(*mut c_void) -> u32 = cuda.sym("cuMipmappedArrayDestroy");
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
}

fn launches() {
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
}

/// Allocate 2 GiB and exit without freeing it.
fn exit_without_free() {
    let cuda = Cuda::load();
    assert_eq!(cuda.init(), 0);
    cuda.ctx_create(0).unwrap();
    cuda.alloc(2 * GIB).unwrap();
    std::process::exit(0);
}

// ----- nvml_wrapper.rs -----

fn nvml_wrapper() {
    const GIB: u64 = 1 << 30;
    // Hold 3 GiB and keep the device busy through the CUDA half first.
    let cuda = Cuda::load();
    assert_eq!(cuda.init(), 0);
    cuda.ctx_create(0).unwrap();
    cuda.alloc(3 * GIB as usize).unwrap();

    let nvml = Nvml::init().expect("Nvml::init loads libnvidia-ml.so.1");
    assert_eq!(nvml.device_count().unwrap(), 1);
    assert_eq!(nvml.sys_cuda_driver_version().unwrap(), 12080);
    assert!(!nvml.sys_driver_version().unwrap().is_empty());
    let mut device = nvml.device_by_index(0).unwrap();
    assert_eq!(device.name().unwrap(), "NVIDIA H100 80GB HBM3");
    let uuid = device.uuid().unwrap();
    assert!(uuid.starts_with("GPU-") && uuid.len() == 40, "{uuid}");
    assert_eq!(
        nvml.device_by_uuid(uuid.as_str()).unwrap().index().unwrap(),
        0
    );
    let pci = device.pci_info().unwrap();
    assert_eq!(
        nvml.device_by_pci_bus_id(pci.bus_id.as_str())
            .unwrap()
            .index()
            .unwrap(),
        0
    );

    let memory = device.memory_info().unwrap();
    assert_eq!(
        (memory.total, memory.used, memory.free),
        (80 * GIB, 3 * GIB, 77 * GIB)
    );
    let processes = device.running_compute_processes().unwrap();
    let me = processes
        .iter()
        .find(|p| p.pid == std::process::id())
        .expect("this process is listed");
    assert!(matches!(me.used_gpu_memory, UsedGpuMemory::Used(b) if b == 3 * GIB));

    assert_eq!(device.architecture().unwrap(), DeviceArchitecture::Hopper);
    let cc = device.cuda_compute_capability().unwrap();
    assert_eq!((cc.major, cc.minor), (9, 0));
    assert_eq!(device.num_cores().unwrap(), 132 * 128);
    assert_eq!(device.max_clock_info(Clock::Graphics).unwrap(), 1980);
    assert_eq!(device.max_clock_info(Clock::Memory).unwrap(), 2619);
    assert_eq!(device.supported_memory_clocks().unwrap(), vec![2619]);
    let clocks = device.supported_graphics_clocks(2619).unwrap();
    assert_eq!(
        (clocks.len(), clocks[0], clocks[clocks.len() - 1]),
        (110, 1980, 345)
    );
    assert_eq!(
        device.clock_info(Clock::SM).unwrap(),
        345,
        "idle: the lowest clock"
    );
    assert_eq!(device.power_usage().unwrap(), 70_000, "idle power");
    let limits = device.power_management_limit_constraints().unwrap();
    assert_eq!((limits.min_limit, limits.max_limit), (200_000, 700_000));
    assert_eq!(device.power_management_limit_default().unwrap(), 700_000);

    // Busy: full clock, full power, utilization.
    let f = cuda.function();
    for _ in 0..30 {
        assert_eq!(cuda.launch(f, 132 * 100), 0); // 10 ms each at full clock
    }
    let energy_before = device.total_energy_consumption().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(device.clock_info(Clock::SM).unwrap(), 1980);
    let busy_power = device.power_usage().unwrap();
    assert!(busy_power > 70_000, "busy power {busy_power}");
    assert!(device.utilization_rates().unwrap().gpu > 0);
    assert!(
        device.total_energy_consumption().unwrap() > energy_before,
        "energy accumulates"
    );
    let samples = device.process_utilization_stats(None).unwrap();
    assert!(samples
        .iter()
        .any(|s| s.pid == std::process::id() && s.sm_util > 0));
    assert!(device.temperature(TemperatureSensor::Gpu).unwrap() > 30);

    // Root may lock clocks and cap power; both show while busy (kept busy on purpose, so
    // that a slow machine cannot let the one-second utilization window run out).
    let keep_busy = || assert_eq!(cuda.launch(f, 132 * 100), 0);
    device
        .set_gpu_locked_clocks(GpuLockedClocksSetting::Numeric {
            min_clock_mhz: 1200,
            max_clock_mhz: 1200,
        })
        .unwrap();
    keep_busy();
    assert_eq!(device.clock_info(Clock::SM).unwrap(), 1200);
    let locked_power = device.power_usage().unwrap();
    assert!(locked_power < busy_power, "{locked_power} < {busy_power}");
    device.reset_gpu_locked_clocks().unwrap();
    device.set_power_management_limit(300_000).unwrap();
    assert_eq!(device.power_management_limit().unwrap(), 300_000);
    assert_eq!(device.enforced_power_limit().unwrap(), 300_000);
    keep_busy();
    assert!(device.power_usage().unwrap() <= 300_000);
    assert!(
        device.clock_info(Clock::SM).unwrap() < 1980,
        "the power cap lowers the clock"
    );
    assert!(
        device.set_power_management_limit(100_000).is_err(),
        "below the minimum"
    );
    println!("uuid={uuid}");
}

// ----- cross_process.rs -----

/// What NVML reports: memory used on device 0 and its process count.
fn nvml_memory() {
    let nvml = Nvml::init().unwrap();
    let device = nvml.device_by_index(0).unwrap();
    println!("used={}", device.memory_info().unwrap().used);
    println!(
        "processes={}",
        device.running_compute_processes().unwrap().len()
    );
}

/// What CUDA shows under the inherited CUDA_VISIBLE_DEVICES.
fn visible_devices() {
    let cuda = Cuda::load();
    let init = cuda.init();
    println!("init={init}");
    if init != 0 {
        return;
    }
    let count = cuda.device_count().unwrap();
    println!("count={count}");
    let uuids: Vec<String> = (0..count)
        .map(|d| {
            cuda.device_uuid(d)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        })
        .collect();
    println!("uuids={}", uuids.join(","));
    println!("name0={}", cuda.device_name(0));
}

/// Hold 1 GiB on CUDA device 0 and 3 GiB on CUDA device 1, print "ready", and keep them
/// until stdin closes.
fn two_device_holder() {
    let cuda = Cuda::load();
    assert_eq!(cuda.init(), 0);
    let count = cuda.device_count().unwrap();
    cuda.ctx_create(0).unwrap();
    cuda.alloc(GIB).unwrap();
    if count > 1 {
        cuda.ctx_create(1).unwrap();
        cuda.alloc(3 * GIB).unwrap();
        assert_eq!(
            cuda.alloc(38 * GIB),
            Err(code(CUresult::CUDA_ERROR_OUT_OF_MEMORY)),
            "40 GiB devices"
        );
    }
    println!("ready");
    wait_for_stdin_eof();
}

/// Block until the parent closes our stdin (keeps our allocations alive meanwhile).
fn wait_for_stdin_eof() {
    use std::io::Read;
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
}

type SetClocks = unsafe extern "C" fn(*mut c_void, c_uint, c_uint) -> u32;
type SetLimit = unsafe extern "C" fn(*mut c_void, c_uint) -> u32;

/// Try every setter on both devices and print the results; then use device 0 through CUDA.
fn setters() {
    // SAFETY: loading the fake NVML by soname.
    let lib = unsafe { libloading::Library::new("libnvidia-ml.so.1") }.unwrap();
    // SAFETY: signatures as nvml.h declares them.
    unsafe {
        let init = *lib
            .get::<unsafe extern "C" fn() -> u32>(b"nvmlInit_v2")
            .unwrap();
        let by_index = *lib
            .get::<unsafe extern "C" fn(c_uint, *mut *mut c_void) -> u32>(
                b"nvmlDeviceGetHandleByIndex_v2",
            )
            .unwrap();
        let set_clocks = *lib
            .get::<SetClocks>(b"nvmlDeviceSetGpuLockedClocks")
            .unwrap();
        let reset_clocks = *lib
            .get::<unsafe extern "C" fn(*mut c_void) -> u32>(b"nvmlDeviceResetGpuLockedClocks")
            .unwrap();
        let set_limit = *lib
            .get::<SetLimit>(b"nvmlDeviceSetPowerManagementLimit")
            .unwrap();
        let set_persistence = *lib
            .get::<SetLimit>(b"nvmlDeviceSetPersistenceMode")
            .unwrap();
        let get_limit = *lib
            .get::<unsafe extern "C" fn(*mut c_void, *mut c_uint) -> u32>(
                b"nvmlDeviceGetPowerManagementLimit",
            )
            .unwrap();
        assert_eq!(init(), 0);
        for index in 0..2 {
            let mut dev = std::ptr::null_mut();
            assert_eq!(by_index(index, &mut dev), 0);
            println!("clocks{index}={}", set_clocks(dev, 1000, 1200));
            println!("bad_clocks{index}={}", set_clocks(dev, 100, 5000));
            println!("reset{index}={}", reset_clocks(dev));
            println!("limit{index}={}", set_limit(dev, 250_000));
            println!("bad_limit{index}={}", set_limit(dev, 10_000));
            println!("persistence{index}={}", set_persistence(dev, 1));
            let mut limit = 0;
            println!("get_limit{index}={}", get_limit(dev, &mut limit));
        }
    }
    // The unprivileged can still use the GPU.
    let cuda = Cuda::load();
    assert_eq!(cuda.init(), 0);
    cuda.ctx_create(0).unwrap();
    println!("alloc={}", cuda.alloc(1 << 20).err().unwrap_or(0));
}

/// Initialize both halves (CUDA twice) and print the results and NVML's error text.
fn init() {
    let cuda = Cuda::load();
    println!("cu_init={}", cuda.init());
    println!("cu_init_again={}", cuda.init());
    let nvml_init: unsafe extern "C" fn() -> u32 = cuda.sym("nvmlInit_v2");
    let error_string: unsafe extern "C" fn(u32) -> *const c_char = cuda.sym("nvmlErrorString");
    // SAFETY: no arguments; the string is static.
    unsafe {
        let rc = nvml_init();
        println!("nvml_init={rc}");
        println!(
            "nvml_text={}",
            CStr::from_ptr(error_string(rc)).to_string_lossy()
        );
    }
}

// ----- quota_race.rs -----

/// Grab 512 MiB blocks until OOM, free them, 50 rounds; print how many it held at most.
fn grabber() {
    let cuda = Cuda::load();
    assert_eq!(cuda.init(), 0);
    cuda.ctx_create(0).unwrap();
    let mut most = 0;
    for _ in 0..50 {
        let mut held = Vec::new();
        loop {
            match cuda.alloc(GIB / 2) {
                Ok(p) => held.push(p),
                Err(e) => {
                    assert_eq!(e, code(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
                    break;
                }
            }
        }
        most = most.max(held.len());
        for p in held {
            assert_eq!(cuda.free(p), 0);
        }
    }
    println!("most={most}");
}
