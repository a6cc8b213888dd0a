//! (a) Every exported function resolves through `dlopen` + `dlsym` of the links, and the
//! export list is complete. (b) cuGetProcAddress_v2 / cuGetProcAddress hand out the right
//! function for a base name, version and flags, and report misses like the real driver.

use std::collections::BTreeSet;
use std::ffi::{c_char, c_int, c_void, CString};

use crate::common::{self, Fake};
use cudarc::driver::sys::{
    CUdriverProcAddressQueryResult as Status, CUdriverProcAddress_flags as Flags, CUresult,
};
use libloading::Library;

const DEFAULT: u64 = Flags::CU_GET_PROC_ADDRESS_DEFAULT as u64;
const LEGACY: u64 = Flags::CU_GET_PROC_ADDRESS_LEGACY_STREAM as u64;
const PER_THREAD: u64 = Flags::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM as u64;

type GetProcAddressV2 =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut u32) -> u32;
type GetProcAddress = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> u32;

fn open(fake: &Fake, name: &str) -> Library {
    // SAFETY: loading the fake driver runs no initializers beyond Rust's own.
    unsafe { Library::new(fake.lib_dir.join(name)) }
        .unwrap_or_else(|e| panic!("dlopen {name}: {e}"))
}

fn address(lib: &Library, name: &str) -> *mut c_void {
    // SAFETY: only the address is taken; nothing is called through it.
    let sym = unsafe { lib.get::<*mut c_void>(name.as_bytes()) }
        .unwrap_or_else(|e| panic!("dlsym {name}: {e}"));
    *sym
}

/// The functions the simulated driver must have (the brief's list).
const REQUIRED_CUDA: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGet",
    "cuDeviceGetCount",
    "cuDeviceGetName",
    "cuDeviceGetUuid",
    "cuDeviceGetUuid_v2",
    "cuDeviceTotalMem_v2",
    "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxCreate_v2",
    "cuCtxCreate_v3",
    "cuCtxCreate_v4",
    "cuCtxDestroy_v2",
    "cuCtxSetCurrent",
    "cuCtxGetCurrent",
    "cuCtxGetDevice",
    "cuCtxSynchronize",
    "cuMemGetInfo_v2",
    "cuMemAlloc_v2",
    "cuMemAllocPitch_v2",
    "cuMemAllocManaged",
    "cuMemFree_v2",
    "cuMemAllocHost_v2",
    "cuMemFreeHost",
    "cuMemAllocAsync",
    "cuMemFreeAsync",
    "cuMemPoolCreate",
    "cuMemPoolDestroy",
    "cuMemAllocFromPoolAsync",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
    "cuMemGetAllocationGranularity",
    "cuArrayCreate_v2",
    "cuArray3DCreate_v2",
    "cuArrayDestroy",
    "cuMipmappedArrayCreate",
    "cuMipmappedArrayDestroy",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cuGraphLaunch",
    "cuLaunchKernel_ptsz",
    "cuLaunchKernelEx_ptsz",
    "cuGraphLaunch_ptsz",
    "cuStreamSynchronize_ptsz",
    "cuMemAllocAsync_ptsz",
    "cuMemFreeAsync_ptsz",
    "cuMemAllocFromPoolAsync_ptsz",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuGetProcAddress",
    "cuGetProcAddress_v2",
    "cuCheckpointProcessGetRestoreThreadId",
    "cuCheckpointProcessGetState",
    "cuCheckpointProcessLock",
    "cuCheckpointProcessCheckpoint",
    "cuCheckpointProcessRestore",
    "cuCheckpointProcessUnlock",
];

const REQUIRED_NVML: &[&str] = &[
    "nvmlInit_v2",
    "nvmlInit",
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlErrorString",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetNVMLVersion",
    "nvmlSystemGetCudaDriverVersion",
    "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetHandleByPciBusId_v2",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetMaxClockInfo",
    "nvmlDeviceGetApplicationsClock",
    "nvmlDeviceGetDefaultApplicationsClock",
    "nvmlDeviceGetSupportedMemoryClocks",
    "nvmlDeviceGetSupportedGraphicsClocks",
    "nvmlDeviceSetGpuLockedClocks",
    "nvmlDeviceResetGpuLockedClocks",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetPowerManagementLimit",
    "nvmlDeviceGetPowerManagementDefaultLimit",
    "nvmlDeviceGetPowerManagementLimitConstraints",
    "nvmlDeviceSetPowerManagementLimit",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetProcessUtilization",
    "nvmlDeviceGetArchitecture",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceSetPersistenceMode",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetNumGpuCores",
    "nvmlDeviceGetTemperature",
];

#[test]
fn every_function_resolves_through_both_links() {
    let fake = Fake::new();
    let cuda = open(&fake, "libcuda.so.1");
    let nvml = open(&fake, "libnvidia-ml.so.1");
    for name in fakegpu::cuda_symbols()
        .iter()
        .chain(fakegpu::nvml_symbols())
    {
        assert!(!address(&cuda, name).is_null(), "{name} via libcuda.so.1");
        assert!(
            !address(&nvml, name).is_null(),
            "{name} via libnvidia-ml.so.1"
        );
    }
    // Both sonames are one library: one state, one set of functions.
    assert_eq!(address(&cuda, "cuInit"), address(&nvml, "cuInit"));
    for name in REQUIRED_CUDA {
        assert!(fakegpu::cuda_symbols().contains(name), "{name} is required");
    }
    for name in REQUIRED_NVML {
        assert!(fakegpu::nvml_symbols().contains(name), "{name} is required");
    }
}

/// The lists the tests and cuGetProcAddress use are exactly what the ELF exports.
#[test]
fn export_lists_match_the_dynamic_symbol_table() {
    let out = common::run_ok(
        std::process::Command::new("nm")
            .args(["-D", "--defined-only"])
            .arg(common::library()),
    );
    let exported: BTreeSet<&str> = out
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .collect();
    let driver_api: BTreeSet<&str> = exported
        .iter()
        .copied()
        .filter(|s| s.starts_with("cu") || s.starts_with("nvml"))
        .collect();
    let listed: BTreeSet<&str> = fakegpu::cuda_symbols()
        .iter()
        .chain(fakegpu::nvml_symbols())
        .copied()
        .collect();
    assert_eq!(driver_api, listed);
    assert_eq!(
        driver_api.len(),
        exported.len(),
        "nothing but the driver API is exported: {exported:?}"
    );
}

struct ProcAddress {
    lib: Library,
    v2: GetProcAddressV2,
    v1: GetProcAddress,
}

impl ProcAddress {
    fn load(fake: &Fake) -> ProcAddress {
        let lib = open(fake, "libcuda.so.1");
        // SAFETY: the signatures are cudaTypedefs.h's PFN_cuGetProcAddress_v12000 / _v11030.
        let (v2, v1) = unsafe {
            (
                *lib.get::<GetProcAddressV2>(b"cuGetProcAddress_v2").unwrap(),
                *lib.get::<GetProcAddress>(b"cuGetProcAddress").unwrap(),
            )
        };
        ProcAddress { lib, v2, v1 }
    }

    /// (result, pfn, status).
    fn get(&self, symbol: &str, version: c_int, flags: u64) -> (u32, *mut c_void, u32) {
        let name = CString::new(symbol).unwrap();
        let mut pfn = std::ptr::dangling_mut::<c_void>();
        let mut status = 0xffff_u32;
        // SAFETY: valid C string and out-pointers.
        let rc = unsafe { (self.v2)(name.as_ptr(), &mut pfn, version, flags, &mut status) };
        (rc, pfn, status)
    }

    fn found(&self, symbol: &str, version: c_int, flags: u64) -> *mut c_void {
        let (rc, pfn, status) = self.get(symbol, version, flags);
        assert_eq!(
            (rc, status),
            (0, Status::CU_GET_PROC_ADDRESS_SUCCESS as u32),
            "{symbol} at {version} flags {flags}"
        );
        assert!(!pfn.is_null());
        pfn
    }

    fn dlsym(&self, symbol: &str) -> *mut c_void {
        address(&self.lib, symbol)
    }
}

#[test]
fn versioned_and_per_thread_lookups() {
    let fake = Fake::new();
    let p = ProcAddress::load(&fake);
    assert_eq!(
        p.found("cuMemAlloc", 12000, DEFAULT),
        p.dlsym("cuMemAlloc_v2")
    );
    assert_eq!(
        p.found("cuMemAlloc", 12000, PER_THREAD),
        p.dlsym("cuMemAlloc_v2"),
        "no per-thread variant: legacy"
    );
    assert_eq!(
        p.found("cuGetProcAddress", 12000, DEFAULT),
        p.dlsym("cuGetProcAddress_v2")
    );
    assert_eq!(
        p.found("cuGetProcAddress", 11030, DEFAULT),
        p.dlsym("cuGetProcAddress")
    );
    assert_eq!(
        p.found("cuCtxCreate", 3020, DEFAULT),
        p.dlsym("cuCtxCreate_v2")
    );
    assert_eq!(
        p.found("cuCtxCreate", 11040, DEFAULT),
        p.dlsym("cuCtxCreate_v3")
    );
    assert_eq!(
        p.found("cuCtxCreate", 12080, DEFAULT),
        p.dlsym("cuCtxCreate_v4")
    );
    assert_eq!(
        p.found("cuDeviceGetUuid", 11040, DEFAULT),
        p.dlsym("cuDeviceGetUuid_v2")
    );
    assert_eq!(
        p.found("cuDeviceGetUuid", 9020, DEFAULT),
        p.dlsym("cuDeviceGetUuid")
    );
    assert_eq!(
        p.found("cuGraphInstantiate", 12000, DEFAULT),
        p.dlsym("cuGraphInstantiateWithFlags")
    );
    for base in [
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cuGraphLaunch",
        "cuStreamSynchronize",
        "cuMemAllocAsync",
        "cuMemFreeAsync",
        "cuMemAllocFromPoolAsync",
    ] {
        assert_eq!(
            p.found(base, 12000, PER_THREAD),
            p.dlsym(&format!("{base}_ptsz")),
            "{base}"
        );
        assert_eq!(p.found(base, 12000, LEGACY), p.dlsym(base), "{base}");
        assert_eq!(p.found(base, 12000, DEFAULT), p.dlsym(base), "{base}");
    }
}

#[test]
fn misses_report_status() {
    let fake = Fake::new();
    let p = ProcAddress::load(&fake);
    let not_found = CUresult::CUDA_ERROR_NOT_FOUND as u32;
    let (rc, pfn, status) = p.get("cuMemCreate", 10000, DEFAULT);
    assert_eq!(
        (rc, pfn, status),
        (
            not_found,
            std::ptr::null_mut(),
            Status::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT as u32
        )
    );
    let (rc, pfn, status) = p.get("cuNoSuchFunction", 12000, DEFAULT);
    assert_eq!(
        (rc, pfn, status),
        (
            not_found,
            std::ptr::null_mut(),
            Status::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND as u32
        )
    );
    // A real driver function the fake does not simulate is its NOT_SUPPORTED stub
    // (gen_exports.py), never a wrong one.
    assert_eq!(
        p.found("cuTexRefCreate", 12000, DEFAULT),
        p.dlsym("cuTexRefCreate")
    );
    // Exported names are not base names.
    assert_eq!(p.get("cuMemAlloc_v2", 12000, DEFAULT).0, not_found);
    assert_eq!(
        p.get("cuInit", 12000, 0x80).0,
        CUresult::CUDA_ERROR_INVALID_VALUE as u32
    );

    // symbolStatus is optional.
    let name = CString::new("cuInit").unwrap();
    let mut pfn = std::ptr::null_mut();
    // SAFETY: valid C string and out-pointer; NULL status is allowed.
    let rc = unsafe {
        (p.v2)(
            name.as_ptr(),
            &mut pfn,
            12000,
            DEFAULT,
            std::ptr::null_mut(),
        )
    };
    assert_eq!((rc, pfn), (0, p.dlsym("cuInit")));
    // The CUDA 11.3 signature resolves the same way.
    let name = CString::new("cuMemAlloc").unwrap();
    // SAFETY: as above.
    let rc = unsafe { (p.v1)(name.as_ptr(), &mut pfn, 12000, DEFAULT) };
    assert_eq!((rc, pfn), (0, p.dlsym("cuMemAlloc_v2")));
}

/// Every exported CUDA function comes back from cuGetProcAddress_v2 for its own base name,
/// version and flavour, and what comes back can be called.
#[test]
fn every_export_round_trips() {
    let fake = Fake::new();
    let p = ProcAddress::load(&fake);
    for symbol in fakegpu::cuda_symbols() {
        let row = vgpu_abi::cuda_procs::by_symbol(symbol)
            .unwrap_or_else(|| panic!("{symbol} is not in cuda_procs"));
        let flags = if row.per_thread { PER_THREAD } else { LEGACY };
        assert_eq!(
            p.found(row.name, row.version, flags),
            p.dlsym(symbol),
            "{symbol}"
        );
    }
    let version = p.found("cuDriverGetVersion", 12000, DEFAULT);
    // SAFETY: PFN_cuDriverGetVersion_v2020's signature.
    let f: unsafe extern "C" fn(*mut c_int) -> u32 = unsafe { std::mem::transmute(version) };
    let mut v = 0;
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { f(&mut v) }, 0);
    assert_eq!(v, 12080);
}
