//! Device queries: identity, memory, power and energy, utilization, architecture and modes;
//! and the helpers every query module uses (`put`, `query`, `put_list`, `put_string`).
//! The other API families have their own modules: `pci`, `clocks`, `thermal`, `ecc`,
//! `media`, `board`, `processes`.
//!
//! Values come from the config and the shared state through the model (`crate::model`):
//! memory used is the device total of all processes; memory utilization is reported as half
//! the GPU utilization; no memory is reserved by the system.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong};

use nvml_wrapper_sys::bindings::{
    self as nv, nvmlDeviceArchitecture_t, nvmlDevice_t, nvmlEnableState_t, nvmlMemory_t,
    nvmlMemory_v2_t, nvmlProcessUtilizationSample_t, nvmlReturn_t, nvmlUtilization_t,
};

use super::{
    copy_error, device, entry, null_arg, NvResult, ARGUMENT_VERSION_MISMATCH, INSUFFICIENT_SIZE,
    INVALID_ARGUMENT, NOT_FOUND,
};
use crate::driver::Device;
use crate::ffi::{self, now_ns};
use crate::model::SAMPLE_WINDOW_NS;

/// Store `value` through an out-parameter (NULL: NVML_ERROR_INVALID_ARGUMENT).
pub(super) fn put<T>(out: *mut T, value: T) -> NvResult {
    // SAFETY: `out` is NULL or writable (NVML API contract).
    unsafe { ffi::write(out, value) }.map_err(null_arg)
}

/// nvml.h's NVML_STRUCT_VERSION(T, v), the `version` a versioned structure must carry.
pub(super) fn versioned<T>(version: u32) -> u32 {
    (std::mem::size_of::<T>() as u32) | (version << 24)
}

/// Apply `query` to the device behind `handle` and store the answer.
pub(super) fn query<T>(
    handle: nvmlDevice_t,
    out: *mut T,
    query: impl FnOnce(&Device) -> NvResult<T>,
) -> NvResult {
    let d = device(handle)?;
    if out.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    put(out, query(d)?)
}

/// nvml.h's list protocol: `*count` holds the capacity of `out` and receives the number of
/// entries; too small a capacity gives NVML_ERROR_INSUFFICIENT_SIZE with the needed count.
pub(super) fn put_list<T: Copy>(count: *mut c_uint, out: *mut T, items: &[T]) -> NvResult {
    // SAFETY: `count` is NULL or readable (NVML API contract).
    let capacity = unsafe { ffi::read(count) }.map_err(null_arg)? as usize;
    put(count, items.len() as c_uint)?;
    if items.len() > capacity {
        return Err(INSUFFICIENT_SIZE);
    }
    if items.is_empty() {
        return Ok(());
    }
    if out.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: `out` holds `capacity` >= items.len() writable entries (NVML API contract).
    unsafe { std::ptr::copy_nonoverlapping(items.as_ptr(), out, items.len()) };
    Ok(())
}

pub(super) fn put_string(
    handle: nvmlDevice_t,
    buf: *mut c_char,
    length: c_uint,
    text: impl FnOnce(&Device) -> String,
) -> NvResult {
    let d = device(handle)?;
    // SAFETY: `buf` is NULL or holds `length` writable bytes (NVML API contract).
    unsafe { ffi::copy_c_string(buf, length as usize, &text(d), false) }.map_err(copy_error)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    handle: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    entry(|| put_string(handle, name, length, |d| d.config.name.clone()))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    handle: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    entry(|| put_string(handle, uuid, length, |d| d.config.uuid.clone()))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(
    handle: nvmlDevice_t,
    index: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| query(handle, index, |d| Ok(d.index as c_uint)))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    handle: nvmlDevice_t,
    minor: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| query(handle, minor, |d| Ok(d.index as c_uint)))
}

/// (total, used) after giving back dead processes' memory.
fn memory(d: &Device) -> (u64, u64) {
    d.state.reclaim_dead();
    let total = d.config.memory;
    (total, d.state.used().min(total))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    handle: nvmlDevice_t,
    out: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    entry(|| {
        query(handle, out, |d| {
            let (total, used) = memory(d);
            Ok(nvmlMemory_t {
                total,
                free: total - used,
                used,
            })
        })
    })
}

/// `version` must be nvml.h's `nvmlMemory_v2` (NVML_STRUCT_VERSION(Memory, 2)).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    handle: nvmlDevice_t,
    out: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    entry(|| {
        let d = device(handle)?;
        // SAFETY: `out` is NULL or points to an nvmlMemory_v2_t (NVML API contract).
        let version = unsafe { ffi::read(out.cast_const()) }
            .map_err(null_arg)?
            .version;
        if version != versioned::<nvmlMemory_v2_t>(2) {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        let (total, used) = memory(d);
        put(
            out,
            nvmlMemory_v2_t {
                version,
                total,
                reserved: 0,
                free: total - used,
                used,
            },
        )
    })
}

pub(super) fn percent(fraction: f64) -> c_uint {
    (fraction * 100.0).round().clamp(0.0, 100.0) as c_uint
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    handle: nvmlDevice_t,
    out: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    entry(|| {
        query(handle, out, |d| {
            let gpu = percent(d.utilization(now_ns()));
            Ok(nvmlUtilization_t {
                gpu,
                memory: gpu / 2,
            })
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    handle: nvmlDevice_t,
    power: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| query(handle, power, |d| Ok(d.power_mw(now_ns()))))
}

/// mJ since the state file was created (never decreasing).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEnergyConsumption(
    handle: nvmlDevice_t,
    energy: *mut c_ulonglong,
) -> nvmlReturn_t {
    entry(|| query(handle, energy, |d| Ok(d.energy_mj(now_ns()))))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimit(
    handle: nvmlDevice_t,
    limit: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| query(handle, limit, |d| Ok(d.power_limit_mw())))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementDefaultLimit(
    handle: nvmlDevice_t,
    limit: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| query(handle, limit, |d| Ok(d.config.power_limit_default_mw)))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimitConstraints(
    handle: nvmlDevice_t,
    min_limit: *mut c_uint,
    max_limit: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| {
        let d = device(handle)?;
        if min_limit.is_null() || max_limit.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        put(min_limit, d.config.power_limit_min_mw)?;
        put(max_limit, d.config.power_limit_max_mw)
    })
}

/// The only limit simulated is the NVML one, so it is also the enforced one.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEnforcedPowerLimit(
    handle: nvmlDevice_t,
    limit: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| query(handle, limit, |d| Ok(d.power_limit_mw())))
}

/// One sample per process whose kernels kept the device busy during the window
/// `[max(last_seen_us, now − 1 s), now]`: `smUtil` is its busy time in the window ÷ the
/// window's length, exactly, from the device timeline (kernels still queued count for the
/// part already run); `timeStamp` is now, in µs. `utilization` NULL: the count only, with
/// NVML_ERROR_INSUFFICIENT_SIZE. None: NVML_ERROR_NOT_FOUND.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    handle: nvmlDevice_t,
    utilization: *mut nvmlProcessUtilizationSample_t,
    count: *mut c_uint,
    last_seen_us: c_ulonglong,
) -> nvmlReturn_t {
    entry(|| {
        let d = device(handle)?;
        let now = now_ns();
        let from = now
            .saturating_sub(SAMPLE_WINDOW_NS)
            .max(last_seen_us.saturating_mul(1000));
        let window = now.saturating_sub(from);
        let samples: Vec<nvmlProcessUtilizationSample_t> = if window == 0 {
            Vec::new()
        } else {
            d.process_busy_ns(from, now)
                .into_iter()
                .map(|(pid, busy)| {
                    let sm = percent(busy as f64 / window as f64);
                    nvmlProcessUtilizationSample_t {
                        pid,
                        timeStamp: now / 1000,
                        smUtil: sm,
                        memUtil: sm / 2,
                        encUtil: 0,
                        decUtil: 0,
                    }
                })
                .collect()
        };
        if samples.is_empty() {
            return Err(NOT_FOUND);
        }
        if utilization.is_null() {
            put(count, samples.len() as c_uint)?;
            return Err(INSUFFICIENT_SIZE);
        }
        put_list(count, utilization, &samples)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetArchitecture(
    handle: nvmlDevice_t,
    arch: *mut nvmlDeviceArchitecture_t,
) -> nvmlReturn_t {
    entry(|| query(handle, arch, |d| Ok(d.config.architecture.nvml_value())))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    handle: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> nvmlReturn_t {
    entry(|| {
        let d = device(handle)?;
        if major.is_null() || minor.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let (ma, mi) = d.config.compute_capability;
        put(major, ma as c_int)?;
        put(minor, mi as c_int)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(
    handle: nvmlDevice_t,
    mode: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    entry(|| {
        query(handle, mode, |d| {
            Ok(if d.state.persistence_mode() {
                nv::nvmlEnableState_enum_NVML_FEATURE_ENABLED
            } else {
                nv::nvmlEnableState_enum_NVML_FEATURE_DISABLED
            })
        })
    })
}

/// MIG is not simulated: always disabled, now and pending.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    handle: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| {
        device(handle)?;
        if current.is_null() || pending.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        put(current, nv::NVML_DEVICE_MIG_DISABLE)?;
        put(pending, nv::NVML_DEVICE_MIG_DISABLE)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNumGpuCores(
    handle: nvmlDevice_t,
    cores: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| {
        query(handle, cores, |d| {
            Ok(d.config
                .sm_count
                .saturating_mul(d.config.architecture.cores_per_sm()))
        })
    })
}
