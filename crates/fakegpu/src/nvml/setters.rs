//! Settings that change the device for every process: locked clocks, power limit,
//! persistence mode. Stored in the device's state file.
//!
//! Checks, in order: a valid handle; NVML_ERROR_NOT_SUPPORTED where the config says the
//! device cannot do it (`clock_locking`, `power_limit_settable`); NVML_ERROR_NO_PERMISSION
//! unless the caller's effective uid is 0; NVML_ERROR_INVALID_ARGUMENT for values out of
//! range.

use std::ffi::c_uint;

use nvml_wrapper_sys::bindings::{self as nv, nvmlDevice_t, nvmlEnableState_t, nvmlReturn_t};

use super::{device, entry, privileged, NvResult, INVALID_ARGUMENT, NOT_SUPPORTED, NO_PERMISSION};
use crate::config::DeviceConfig;
use crate::driver::Device;

fn settable(
    handle: nvmlDevice_t,
    supported: impl FnOnce(&DeviceConfig) -> bool,
) -> NvResult<&'static Device> {
    let d = device(handle)?;
    if !supported(&d.config) {
        return Err(NOT_SUPPORTED);
    }
    if !privileged() {
        return Err(NO_PERMISSION);
    }
    Ok(d)
}

/// A clock argument in MHz, with NVML's symbolic limits: TDP is the default applications
/// clock, UNLIMITED the maximum clock.
fn clock_arg(d: &DeviceConfig, mhz: c_uint) -> NvResult<u32> {
    let value = match mhz {
        nv::nvmlClockLimitId_enum_NVML_CLOCK_LIMIT_ID_TDP => d.default_clock_mhz,
        nv::nvmlClockLimitId_enum_NVML_CLOCK_LIMIT_ID_UNLIMITED => d.max_clock_mhz,
        v if v >= nv::nvmlClockLimitId_enum_NVML_CLOCK_LIMIT_ID_RANGE_START => {
            return Err(INVALID_ARGUMENT)
        }
        v => v,
    };
    if value < d.lowest_clock_mhz() || value > d.max_clock_mhz {
        return Err(INVALID_ARGUMENT);
    }
    Ok(value)
}

/// Kernels then run at the highest supported clock not above `max`; idle, the device sits
/// at `min`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceSetGpuLockedClocks(
    handle: nvmlDevice_t,
    min_mhz: c_uint,
    max_mhz: c_uint,
) -> nvmlReturn_t {
    entry(|| {
        let d = settable(handle, |c| c.clock_locking)?;
        let (min, max) = (
            clock_arg(&d.config, min_mhz)?,
            clock_arg(&d.config, max_mhz)?,
        );
        if min > max {
            return Err(INVALID_ARGUMENT);
        }
        d.state.set_locked_clocks(Some((min, max)));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceResetGpuLockedClocks(handle: nvmlDevice_t) -> nvmlReturn_t {
    entry(|| {
        let d = settable(handle, |c| c.clock_locking)?;
        d.state.set_locked_clocks(None);
        Ok(())
    })
}

/// `limit` in mW within the device's constraints.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceSetPowerManagementLimit(
    handle: nvmlDevice_t,
    limit: c_uint,
) -> nvmlReturn_t {
    entry(|| {
        let d = settable(handle, |c| c.power_limit_settable)?;
        if !(d.config.power_limit_min_mw..=d.config.power_limit_max_mw).contains(&limit) {
            return Err(INVALID_ARGUMENT);
        }
        d.state.set_power_limit_mw(Some(limit));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceSetPersistenceMode(
    handle: nvmlDevice_t,
    mode: nvmlEnableState_t,
) -> nvmlReturn_t {
    entry(|| {
        let d = settable(handle, |_| true)?;
        let on = match mode {
            nv::nvmlEnableState_enum_NVML_FEATURE_ENABLED => true,
            nv::nvmlEnableState_enum_NVML_FEATURE_DISABLED => false,
            _ => return Err(INVALID_ARGUMENT),
        };
        d.state.set_persistence_mode(on);
        Ok(())
    })
}
