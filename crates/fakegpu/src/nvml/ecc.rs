//! ECC: the mode (config key `ecc`, enabled by default as on data-centre parts, which also
//! ship with it enabled: the default mode is always enabled) and error counters, which are
//! all zero (no memory errors are simulated). Counters need ECC enabled
//! (NVML_ERROR_NOT_SUPPORTED otherwise, as on a part whose ECC is off).
//!
//! Page retirement is Volta's and older parts'; from Ampere on, HBM row remapping replaced it
//! (`nvmlDeviceGetRetiredPages*` are NVML_ERROR_NOT_SUPPORTED there and
//! `nvmlDeviceGetRemappedRows` answers: no rows remapped, none pending, no failure), and the
//! other way round before Ampere.

use std::ffi::{c_uint, c_ulonglong};

use nvml_wrapper_sys::bindings::{
    self as nv, nvmlDevice_t, nvmlEccErrorCounts_t, nvmlEnableState_t, nvmlReturn_t,
};

use super::device::{put, put_list, query};
use super::{device, entry, NvResult, INVALID_ARGUMENT, NOT_SUPPORTED};
use crate::config::Architecture;
use crate::driver::Device;

fn enable_state(on: bool) -> nvmlEnableState_t {
    if on {
        nv::nvmlEnableState_enum_NVML_FEATURE_ENABLED
    } else {
        nv::nvmlEnableState_enum_NVML_FEATURE_DISABLED
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEccMode(
    handle: nvmlDevice_t,
    current: *mut nvmlEnableState_t,
    pending: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    entry(|| {
        let d = device(handle)?;
        if current.is_null() || pending.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        put(current, enable_state(d.config.ecc))?;
        put(pending, enable_state(d.config.ecc))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDefaultEccMode(
    handle: nvmlDevice_t,
    default_mode: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    entry(|| query(handle, default_mode, |_| Ok(enable_state(true))))
}

/// Checks an error type and counter type, and that ECC is on.
fn counters(d: &Device, error_type: c_uint, counter_type: c_uint) -> NvResult {
    if error_type >= nv::nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_COUNT
        || counter_type >= nv::nvmlEccCounterType_enum_NVML_ECC_COUNTER_TYPE_COUNT
    {
        return Err(INVALID_ARGUMENT);
    }
    if !d.config.ecc {
        return Err(NOT_SUPPORTED);
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    handle: nvmlDevice_t,
    error_type: c_uint,
    counter_type: c_uint,
    ecc_counts: *mut c_ulonglong,
) -> nvmlReturn_t {
    entry(|| {
        query(handle, ecc_counts, |d| {
            counters(d, error_type, counter_type)?;
            Ok(0)
        })
    })
}

/// Deprecated in nvml.h for nvmlDeviceGetMemoryErrorCounter; all zero.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDetailedEccErrors(
    handle: nvmlDevice_t,
    error_type: c_uint,
    counter_type: c_uint,
    ecc_counts: *mut nvmlEccErrorCounts_t,
) -> nvmlReturn_t {
    entry(|| {
        query(handle, ecc_counts, |d| {
            counters(d, error_type, counter_type)?;
            Ok(nvmlEccErrorCounts_t {
                l1Cache: 0,
                l2Cache: 0,
                deviceMemory: 0,
                registerFile: 0,
            })
        })
    })
}

/// Zero for every location the part has; texture memory and the CBU are older parts'
/// (NVML_ERROR_NOT_SUPPORTED from Volta on).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryErrorCounter(
    handle: nvmlDevice_t,
    error_type: c_uint,
    counter_type: c_uint,
    location_type: c_uint,
    count: *mut c_ulonglong,
) -> nvmlReturn_t {
    entry(|| {
        query(handle, count, |d| {
            if location_type >= nv::nvmlMemoryLocation_enum_NVML_MEMORY_LOCATION_COUNT {
                return Err(INVALID_ARGUMENT);
            }
            counters(d, error_type, counter_type)?;
            let older_only = matches!(
                location_type,
                nv::nvmlMemoryLocation_enum_NVML_MEMORY_LOCATION_TEXTURE_MEMORY
                    | nv::nvmlMemoryLocation_enum_NVML_MEMORY_LOCATION_TEXTURE_SHM
                    | nv::nvmlMemoryLocation_enum_NVML_MEMORY_LOCATION_CBU
            );
            if older_only && d.config.architecture.nvml_value() >= nv::NVML_DEVICE_ARCH_VOLTA {
                return Err(NOT_SUPPORTED);
            }
            Ok(0)
        })
    })
}

/// Row remapping (Ampere on) or page retirement (before).
fn remaps_rows(d: &Device) -> bool {
    d.config.architecture.nvml_value() >= Architecture::Ampere.nvml_value()
}

/// Pages retired for `cause` (none), on a part that retires pages.
fn retired_pages(
    handle: nvmlDevice_t,
    cause: c_uint,
    page_count: *mut c_uint,
    addresses: *mut c_ulonglong,
) -> NvResult {
    let d = device(handle)?;
    if cause >= nv::nvmlPageRetirementCause_enum_NVML_PAGE_RETIREMENT_CAUSE_COUNT {
        return Err(INVALID_ARGUMENT);
    }
    if remaps_rows(d) || !d.config.ecc {
        return Err(NOT_SUPPORTED);
    }
    put_list::<c_ulonglong>(page_count, addresses, &[])
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages(
    handle: nvmlDevice_t,
    cause: c_uint,
    page_count: *mut c_uint,
    addresses: *mut c_ulonglong,
) -> nvmlReturn_t {
    entry(|| retired_pages(handle, cause, page_count, addresses))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages_v2(
    handle: nvmlDevice_t,
    cause: c_uint,
    page_count: *mut c_uint,
    addresses: *mut c_ulonglong,
    _timestamps: *mut c_ulonglong,
) -> nvmlReturn_t {
    entry(|| retired_pages(handle, cause, page_count, addresses))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPagesPendingStatus(
    handle: nvmlDevice_t,
    is_pending: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    entry(|| {
        query(handle, is_pending, |d| {
            if remaps_rows(d) || !d.config.ecc {
                return Err(NOT_SUPPORTED);
            }
            Ok(enable_state(false))
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    handle: nvmlDevice_t,
    corr_rows: *mut c_uint,
    unc_rows: *mut c_uint,
    is_pending: *mut c_uint,
    failure_occurred: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| {
        let d = device(handle)?;
        if [corr_rows, unc_rows, is_pending, failure_occurred]
            .iter()
            .any(|p| p.is_null())
        {
            return Err(INVALID_ARGUMENT);
        }
        if !remaps_rows(d) {
            return Err(NOT_SUPPORTED);
        }
        for out in [corr_rows, unc_rows, is_pending, failure_occurred] {
            put(out, 0)?;
        }
        Ok(())
    })
}
