//! Init and shutdown, versions, error strings, device enumeration and lookup (by PCI bus
//! id: `pci.rs`).

use std::ffi::{c_char, c_int, c_uint, CStr};

use nvml_wrapper_sys::bindings::{self as nv, nvmlDevice_t, nvmlReturn_t};

use super::{copy_error, driver, entry, handle, null_arg, NvResult, INVALID_ARGUMENT, NOT_FOUND};
use crate::ffi;

/// Loads the driver (config and state files) on first use; a bad config gives
/// NVML_ERROR_DRIVER_NOT_LOADED and one stderr line naming the file and key.
#[no_mangle]
pub unsafe extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    entry(super::init)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlInit() -> nvmlReturn_t {
    entry(super::init)
}

/// NVML_INIT_FLAG_NO_GPUS and NVML_INIT_FLAG_NO_ATTACH are accepted (there is nothing to
/// attach to); other bits are NVML_ERROR_INVALID_ARGUMENT.
#[no_mangle]
pub unsafe extern "C" fn nvmlInitWithFlags(flags: c_uint) -> nvmlReturn_t {
    entry(|| {
        if flags & !(nv::NVML_INIT_FLAG_NO_GPUS | nv::NVML_INIT_FLAG_NO_ATTACH) != 0 {
            return Err(INVALID_ARGUMENT);
        }
        super::init()
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    entry(super::shutdown)
}

/// The texts of the real library.
fn error_text(result: nvmlReturn_t) -> &'static CStr {
    match result {
        nv::nvmlReturn_enum_NVML_SUCCESS => c"Success",
        nv::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED => c"Uninitialized",
        nv::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT => c"Invalid Argument",
        nv::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED => c"Not Supported",
        nv::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION => c"Insufficient Permissions",
        nv::nvmlReturn_enum_NVML_ERROR_ALREADY_INITIALIZED => c"Already Initialized",
        nv::nvmlReturn_enum_NVML_ERROR_NOT_FOUND => c"Not Found",
        nv::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE => c"Insufficient Size",
        nv::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_POWER => c"Insufficient External Power",
        nv::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED => c"Driver Not Loaded",
        nv::nvmlReturn_enum_NVML_ERROR_TIMEOUT => c"Timeout",
        nv::nvmlReturn_enum_NVML_ERROR_IRQ_ISSUE => c"Interrupt Request Issue",
        nv::nvmlReturn_enum_NVML_ERROR_LIBRARY_NOT_FOUND => c"NVML Shared Library Not Found",
        nv::nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND => c"Function Not Found",
        nv::nvmlReturn_enum_NVML_ERROR_CORRUPTED_INFOROM => c"Corrupted infoROM",
        nv::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST => c"GPU is lost",
        nv::nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED => c"GPU requires restart",
        nv::nvmlReturn_enum_NVML_ERROR_OPERATING_SYSTEM => {
            c"GPU access blocked by the operating system"
        }
        nv::nvmlReturn_enum_NVML_ERROR_LIB_RM_VERSION_MISMATCH => {
            c"RM has detected an NVML/RM version mismatch"
        }
        nv::nvmlReturn_enum_NVML_ERROR_IN_USE => c"In use by another client",
        nv::nvmlReturn_enum_NVML_ERROR_MEMORY => c"Insufficient Memory",
        nv::nvmlReturn_enum_NVML_ERROR_NO_DATA => c"No data",
        nv::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES => {
            c"Ran out of critical resources, other than memory"
        }
        nv::nvmlReturn_enum_NVML_ERROR_FREQ_NOT_SUPPORTED => {
            c"The requested frequency is not supported"
        }
        nv::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH => {
            c"The provided version is invalid/unsupported"
        }
        nv::nvmlReturn_enum_NVML_ERROR_DEPRECATED => {
            c"The requested functionality has been deprecated"
        }
        nv::nvmlReturn_enum_NVML_ERROR_NOT_READY => c"The system is not ready for the request",
        nv::nvmlReturn_enum_NVML_ERROR_GPU_NOT_FOUND => c"No GPUs were found",
        nv::nvmlReturn_enum_NVML_ERROR_INVALID_STATE => {
            c"Resource not in correct state to perform requested operation"
        }
        _ => c"Unknown Error",
    }
}

/// Works without nvmlInit, like the real one.
#[no_mangle]
pub unsafe extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    ffi::guard(c"Unknown Error".as_ptr(), || error_text(result).as_ptr())
}

fn copy_string(buf: *mut c_char, length: c_uint, text: &str) -> NvResult {
    // SAFETY: `buf` is NULL or holds `length` writable bytes (NVML API contract).
    unsafe { ffi::copy_c_string(buf, length as usize, text, false) }.map_err(copy_error)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    entry(|| {
        driver()?;
        copy_string(version, length, crate::DRIVER_VERSION)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    entry(|| {
        driver()?;
        copy_string(version, length, crate::NVML_VERSION)
    })
}

fn cuda_version(version: *mut c_int) -> NvResult {
    // SAFETY: `version` is NULL or writable (NVML API contract).
    unsafe { ffi::write(version, crate::CUDA_DRIVER_VERSION) }.map_err(null_arg)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) -> nvmlReturn_t {
    entry(|| cuda_version(version))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> nvmlReturn_t {
    entry(|| cuda_version(version))
}

/// The process's command name from /proc (NOT_FOUND once it is gone).
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetProcessName(
    pid: c_uint,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    entry(|| {
        driver()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).map_err(|_| NOT_FOUND)?;
        let first = cmdline.split(|&b| b == 0).next().unwrap_or_default();
        let text = if first.is_empty() {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map_err(|_| NOT_FOUND)?
                .trim_end()
                .to_string()
        } else {
            String::from_utf8_lossy(first).into_owned()
        };
        // SAFETY: `name` is NULL or holds `length` writable bytes (NVML API contract).
        unsafe { ffi::copy_c_string(name, length as usize, &text, true) }.map_err(copy_error)
    })
}

fn count(out: *mut c_uint) -> NvResult {
    let n = driver()?.devices.len() as c_uint;
    // SAFETY: `out` is NULL or writable (NVML API contract).
    unsafe { ffi::write(out, n) }.map_err(null_arg)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(device_count: *mut c_uint) -> nvmlReturn_t {
    entry(|| count(device_count))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount(device_count: *mut c_uint) -> nvmlReturn_t {
    entry(|| count(device_count))
}

fn store_handle(out: *mut nvmlDevice_t, index: usize) -> NvResult {
    // SAFETY: `out` is NULL or writable (NVML API contract).
    unsafe { ffi::write(out, handle(index)) }.map_err(null_arg)
}

fn by_index(index: c_uint, out: *mut nvmlDevice_t) -> NvResult {
    let index = index as usize;
    if driver()?.device(index).is_none() {
        return Err(INVALID_ARGUMENT);
    }
    store_handle(out, index)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    entry(|| by_index(index, device))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    entry(|| by_index(index, device))
}

/// Exact UUID, any case.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    entry(|| {
        // SAFETY: `uuid` is NULL or a C string (NVML API contract).
        let uuid = unsafe { ffi::c_str(uuid) }.ok_or(INVALID_ARGUMENT)?;
        let index = driver()?
            .devices
            .iter()
            .position(|d| d.config.uuid.eq_ignore_ascii_case(uuid))
            .ok_or(NOT_FOUND)?;
        store_handle(device, index)
    })
}
