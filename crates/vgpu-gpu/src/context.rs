//! What one CUDA context takes on each GPU, for `vgpu watch`'s `context_allowance = "auto"`:
//! the device memory NVML counts for a process that has a context there, which the shim does
//! not (it counts allocations).
//!
//! [`measure`] asks the driver itself, once: it loads `libcuda.so.1` the way
//! `checkpoint.rs` does (`dlopen`, then `cuGetProcAddress_v2` at CUDA 12.8 after `cuInit`),
//! retains the primary context of every device it sees, reads this process's memory on each
//! GPU from NVML's process lists (by UUID, so `CUDA_VISIBLE_DEVICES` cannot mix them up), and
//! releases the contexts. The library stays loaded (a process keeps the driver it loaded).
//!
//! Where it cannot (no `libcuda`, a GPU hidden from this process, NVML not reporting the
//! memory of processes, as in some containers), [`fallback`] gives a figure per architecture:
//! deliberately below what a bare context takes on such GPUs with current drivers (CUDA 12,
//! lazy module loading), so that it leaves no room a process can fill.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::path::Path;

use nvml_wrapper::enums::device::DeviceArchitecture;
use nvml_wrapper::enums::device::UsedGpuMemory;
use thiserror::Error;

use super::Nvml;

const MIB: u64 = 1 << 20;
/// The CUDA version whose ABI the functions are asked for.
const CUDA_VERSION: c_int = 12080;
const CUDA_SUCCESS: u32 = 0;

/// The figure used for a GPU of `architecture` where no context could be measured, and the
/// architecture's name as the log says it.
pub fn fallback(architecture: Option<&DeviceArchitecture>) -> (u64, &'static str) {
    match architecture {
        Some(DeviceArchitecture::Blackwell) => (384 * MIB, "Blackwell"),
        Some(DeviceArchitecture::Hopper) => (384 * MIB, "Hopper"),
        Some(DeviceArchitecture::Ada) => (256 * MIB, "Ada"),
        Some(DeviceArchitecture::Ampere) => (256 * MIB, "Ampere"),
        Some(DeviceArchitecture::Turing) => (192 * MIB, "Turing"),
        Some(DeviceArchitecture::Volta) => (192 * MIB, "Volta"),
        Some(DeviceArchitecture::Kepler | DeviceArchitecture::Maxwell | DeviceArchitecture::Pascal) => (128 * MIB, "pre-Volta"),
        Some(DeviceArchitecture::Unknown) | None => (128 * MIB, "unknown architecture"),
    }
}

#[derive(Debug, Error)]
pub enum ContextError {
    #[error("cannot load the CUDA driver ({library}): {message}")]
    Load { library: String, message: String },
    #[error("{call} failed: {code}")]
    Driver { call: String, code: u32 },
    #[error("NVML: {0}")]
    Nvml(#[from] nvml_wrapper::error::NvmlError),
}

type GetProcAddress = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> u32;
type Init = unsafe extern "C" fn(c_uint) -> u32;
type DeviceGetCount = unsafe extern "C" fn(*mut c_int) -> u32;
type DeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> u32;
type PrimaryCtxRetain = unsafe extern "C" fn(*mut *mut c_void, c_int) -> u32;
type PrimaryCtxRelease = unsafe extern "C" fn(c_int) -> u32;

/// The driver functions a measurement needs.
struct Driver {
    device_get_count: DeviceGetCount,
    device_get: DeviceGet,
    retain: PrimaryCtxRetain,
    release: PrimaryCtxRelease,
}

impl Driver {
    fn open(library: Option<&Path>) -> Result<Driver, ContextError> {
        let name = library.map(|p| p.display().to_string()).unwrap_or_else(|| crate::CUDA_SONAME.to_string());
        let load_error = |message: String| ContextError::Load { library: name.clone(), message };
        let path = library.map(|p| p.as_os_str().to_owned()).unwrap_or_else(|| crate::CUDA_SONAME.into());
        // SAFETY: loading NVIDIA's driver library (or the simulated one), whose initialisers
        // are meant to run in any process.
        let lib = unsafe { libloading::Library::new(&path) }.map_err(|e| load_error(e.to_string()))?;
        // SAFETY: cuGetProcAddress_v2 has this signature in cuda.h.
        let get_proc: GetProcAddress = *unsafe { lib.get::<GetProcAddress>(b"cuGetProcAddress_v2\0") }
            .map_err(|e| load_error(format!("no cuGetProcAddress_v2 (a driver older than CUDA 12): {e}")))?;
        // The driver stays loaded for the life of the process: unloading a driver that made
        // contexts is not supported, and the functions below point into it.
        std::mem::forget(lib);
        let find = |symbol: &CStr| -> Result<*mut c_void, ContextError> {
            let (mut pfn, mut status): (*mut c_void, c_int) = (std::ptr::null_mut(), 0);
            // SAFETY: a NUL-terminated name and writable out-pointers.
            let code = unsafe { get_proc(symbol.as_ptr(), &mut pfn, CUDA_VERSION, 0, &mut status) };
            if code != CUDA_SUCCESS || pfn.is_null() {
                return Err(ContextError::Driver { call: format!("cuGetProcAddress({})", symbol.to_string_lossy()), code: code.max(1) });
            }
            Ok(pfn)
        };
        // SAFETY (each transmute): the pointer is what the driver returned for exactly that
        // function name at CUDA 12.8, whose signature cuda.h gives as the type.
        let init = unsafe { std::mem::transmute::<*mut c_void, Init>(find(c"cuInit")?) };
        // SAFETY: cuInit(unsigned int) as in cuda.h.
        let code = unsafe { init(0) };
        if code != CUDA_SUCCESS {
            return Err(ContextError::Driver { call: "cuInit".into(), code });
        }
        // SAFETY: see above.
        unsafe {
            Ok(Driver {
                device_get_count: std::mem::transmute::<*mut c_void, DeviceGetCount>(find(c"cuDeviceGetCount")?),
                device_get: std::mem::transmute::<*mut c_void, DeviceGet>(find(c"cuDeviceGet")?),
                retain: std::mem::transmute::<*mut c_void, PrimaryCtxRetain>(find(c"cuDevicePrimaryCtxRetain")?),
                release: std::mem::transmute::<*mut c_void, PrimaryCtxRelease>(find(c"cuDevicePrimaryCtxRelease")?),
            })
        }
    }
}

/// Measure what one context takes on each GPU this process can see: GPU UUID → bytes.
/// GPUs it cannot see, where it cannot make a context, or whose processes' memory NVML does
/// not report, are left out.
pub fn measure(library: Option<&Path>, nvml: &Nvml) -> Result<HashMap<String, u64>, ContextError> {
    let driver = Driver::open(library)?;
    let mut count: c_int = 0;
    // SAFETY: a writable out-pointer.
    let code = unsafe { (driver.device_get_count)(&mut count) };
    if code != CUDA_SUCCESS {
        return Err(ContextError::Driver { call: "cuDeviceGetCount".into(), code });
    }
    // A device whose context cannot be made (exclusive-process mode with a workload on it,
    // no memory left) is left out: it gets its architecture's figure.
    let mut retained = Vec::new();
    for ordinal in 0..count {
        let (mut device, mut ctx): (c_int, *mut c_void) = (0, std::ptr::null_mut());
        // SAFETY: writable out-pointers and an ordinal below the count.
        if unsafe { (driver.device_get)(&mut device, ordinal) } != CUDA_SUCCESS {
            continue;
        }
        // SAFETY: a writable out-pointer and a device handle from cuDeviceGet.
        if unsafe { (driver.retain)(&mut ctx, device) } == CUDA_SUCCESS {
            retained.push(device);
        }
    }
    let measured = own_memory(nvml);
    for device in retained {
        // SAFETY: a device whose primary context this function retained once.
        unsafe { (driver.release)(device) };
    }
    measured
}

/// This process's device memory on each GPU, by NVML: UUID → bytes.
fn own_memory(nvml: &Nvml) -> Result<HashMap<String, u64>, ContextError> {
    let me = std::process::id();
    let mut out = HashMap::new();
    for index in 0..nvml.count()? {
        let device = nvml.device(index)?;
        let listed = device.running_compute_processes()?;
        let own = listed.iter().find(|p| p.pid == me).and_then(|p| match p.used_gpu_memory {
            UsedGpuMemory::Used(bytes) => Some(bytes),
            UsedGpuMemory::Unavailable => None,
        });
        if let Some(bytes) = own {
            out.insert(device.uuid()?, bytes);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_architecture_has_a_figure_and_newer_ones_more() {
        let (hopper, name) = fallback(Some(&DeviceArchitecture::Hopper));
        assert_eq!((hopper, name), (384 * MIB, "Hopper"));
        assert!(fallback(Some(&DeviceArchitecture::Ampere)).0 < hopper);
        assert_eq!(fallback(None), fallback(Some(&DeviceArchitecture::Unknown)));
        assert!(fallback(None).0 > 0);
    }
}
