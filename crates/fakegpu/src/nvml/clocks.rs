//! Clocks (every type and id), clock event ("throttle") reasons, performance state.
//!
//! Graphics, SM and video clocks report the core clock, memory the (only) memory clock. The
//! core clock is the busy clock while a kernel ran within the last second, else the idle
//! clock (`crate::driver::Device::current_clock_mhz`), so locked clocks and a power limit
//! show in it. The reasons are the ones that explain that clock now:
//!
//! * `GpuIdle` while no kernel ran within the last second;
//! * `ApplicationsClocksSetting` (`UserDefinedClocks`) while `nvmlDeviceSetGpuLockedClocks`
//!   holds the maximum below the device's highest clock;
//! * `SwPowerCap` while busy and the power limit, not the lock, keeps the clock down.
//!
//! Thermal and hardware slowdowns never happen (the temperature stays below the slowdown
//! threshold); they are still among the supported reasons, as on the real parts.
//! Performance state: P0 while busy or held above the lowest clock, P8 at rest.

use std::ffi::{c_uint, c_ulonglong};

use nvml_wrapper_sys::bindings::{self as nv, nvmlDevice_t, nvmlPstates_t, nvmlReturn_t};

use super::device::{put, put_list, query};
use super::{device, entry, NvResult, INVALID_ARGUMENT, NOT_FOUND};
use crate::driver::Device;
use crate::ffi::now_ns;
use crate::model;

/// Whether a kernel kept the device busy within the last sample window.
pub(super) fn busy(d: &Device, now: u64) -> bool {
    d.utilization(now) > 0.0
}

/// Clock kinds: graphics, SM and video report the core clock, memory the memory clock.
fn clock_kind(kind: c_uint) -> NvResult<bool> {
    match kind {
        nv::nvmlClockType_enum_NVML_CLOCK_GRAPHICS
        | nv::nvmlClockType_enum_NVML_CLOCK_SM
        | nv::nvmlClockType_enum_NVML_CLOCK_VIDEO => Ok(true),
        nv::nvmlClockType_enum_NVML_CLOCK_MEM => Ok(false),
        _ => Err(INVALID_ARGUMENT),
    }
}

fn current_clock(d: &Device, kind: c_uint) -> NvResult<c_uint> {
    Ok(if clock_kind(kind)? {
        d.current_clock_mhz(now_ns())
    } else {
        d.config.memory_clock_mhz
    })
}

fn max_clock(d: &Device, kind: c_uint) -> NvResult<c_uint> {
    Ok(if clock_kind(kind)? {
        d.config.max_clock_mhz
    } else {
        d.config.memory_clock_mhz
    })
}

fn app_clock(d: &Device, kind: c_uint) -> NvResult<c_uint> {
    Ok(if clock_kind(kind)? {
        d.config.default_clock_mhz
    } else {
        d.config.memory_clock_mhz
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    handle: nvmlDevice_t,
    kind: c_uint,
    clock: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| query(handle, clock, |d| current_clock(d, kind)))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(
    handle: nvmlDevice_t,
    kind: c_uint,
    clock: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| query(handle, clock, |d| max_clock(d, kind)))
}

/// Applications clocks cannot be changed here, so they are always the defaults.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetApplicationsClock(
    handle: nvmlDevice_t,
    kind: c_uint,
    clock: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| query(handle, clock, |d| app_clock(d, kind)))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDefaultApplicationsClock(
    handle: nvmlDevice_t,
    kind: c_uint,
    clock: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| query(handle, clock, |d| app_clock(d, kind)))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetClock(
    handle: nvmlDevice_t,
    kind: c_uint,
    id: c_uint,
    clock: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| {
        query(handle, clock, |d| match id {
            nv::nvmlClockId_enum_NVML_CLOCK_ID_CURRENT => current_clock(d, kind),
            nv::nvmlClockId_enum_NVML_CLOCK_ID_APP_CLOCK_TARGET
            | nv::nvmlClockId_enum_NVML_CLOCK_ID_APP_CLOCK_DEFAULT => app_clock(d, kind),
            nv::nvmlClockId_enum_NVML_CLOCK_ID_CUSTOMER_BOOST_MAX => max_clock(d, kind),
            _ => Err(INVALID_ARGUMENT),
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedMemoryClocks(
    handle: nvmlDevice_t,
    count: *mut c_uint,
    clocks: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| {
        let d = device(handle)?;
        put_list(count, clocks, &[d.config.memory_clock_mhz])
    })
}

/// Highest first; NVML_ERROR_NOT_FOUND for a memory clock the device does not have.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedGraphicsClocks(
    handle: nvmlDevice_t,
    memory_clock_mhz: c_uint,
    count: *mut c_uint,
    clocks: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| {
        let d = device(handle)?;
        if memory_clock_mhz != d.config.memory_clock_mhz {
            return Err(NOT_FOUND);
        }
        put_list(count, clocks, &d.config.graphics_clocks)
    })
}

/// The highest clock the device may boost to without an overclock: its maximum clock.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxCustomerBoostClock(
    handle: nvmlDevice_t,
    kind: c_uint,
    clock: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| query(handle, clock, |d| max_clock(d, kind)))
}

/// Every reason the simulated parts can report (the data-centre parts have no display).
const SUPPORTED_REASONS: c_ulonglong = (nv::nvmlClocksEventReasonGpuIdle
    | nv::nvmlClocksEventReasonApplicationsClocksSetting
    | nv::nvmlClocksEventReasonSwPowerCap
    | nv::nvmlClocksThrottleReasonHwSlowdown
    | nv::nvmlClocksEventReasonSyncBoost
    | nv::nvmlClocksEventReasonSwThermalSlowdown
    | nv::nvmlClocksThrottleReasonHwThermalSlowdown
    | nv::nvmlClocksThrottleReasonHwPowerBrakeSlowdown)
    as c_ulonglong;

/// The reasons that hold the core clock where it is now (see the module's notes).
pub(super) fn current_reasons(d: &Device, now: u64) -> c_ulonglong {
    let mut reasons = 0;
    let locked_max = d.state.locked_clocks().map(|(_, max)| max);
    if locked_max.is_some_and(|max| max < d.config.max_clock_mhz) {
        reasons |= nv::nvmlClocksEventReasonApplicationsClocksSetting;
    }
    if busy(d, now) {
        let unlimited_power = model::busy_clock_mhz(&d.config, locked_max, u32::MAX);
        if d.busy_clock_mhz() < unlimited_power {
            reasons |= nv::nvmlClocksEventReasonSwPowerCap;
        }
    } else {
        reasons |= nv::nvmlClocksEventReasonGpuIdle;
    }
    c_ulonglong::from(reasons)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksEventReasons(
    handle: nvmlDevice_t,
    clocks_event_reasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    entry(|| {
        query(handle, clocks_event_reasons, |d| {
            Ok(current_reasons(d, now_ns()))
        })
    })
}

/// The deprecated name of nvmlDeviceGetCurrentClocksEventReasons.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    handle: nvmlDevice_t,
    clocks_throttle_reasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    entry(|| {
        query(handle, clocks_throttle_reasons, |d| {
            Ok(current_reasons(d, now_ns()))
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedClocksEventReasons(
    handle: nvmlDevice_t,
    supported_clocks_event_reasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    entry(|| {
        query(handle, supported_clocks_event_reasons, |_| {
            Ok(SUPPORTED_REASONS)
        })
    })
}

/// The deprecated name of nvmlDeviceGetSupportedClocksEventReasons.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedClocksThrottleReasons(
    handle: nvmlDevice_t,
    supported_clocks_throttle_reasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    entry(|| {
        query(handle, supported_clocks_throttle_reasons, |_| {
            Ok(SUPPORTED_REASONS)
        })
    })
}

/// P0 while busy or while locked clocks hold the idle clock above the lowest one; P8 at rest.
pub(super) fn performance_state(d: &Device, now: u64) -> nvmlPstates_t {
    if busy(d, now) || d.current_clock_mhz(now) > d.config.lowest_clock_mhz() {
        nv::nvmlPStates_enum_NVML_PSTATE_0
    } else {
        nv::nvmlPStates_enum_NVML_PSTATE_8
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPerformanceState(
    handle: nvmlDevice_t,
    p_state: *mut nvmlPstates_t,
) -> nvmlReturn_t {
    entry(|| query(handle, p_state, |d| Ok(performance_state(d, now_ns()))))
}

/// The deprecated name of nvmlDeviceGetPerformanceState.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerState(
    handle: nvmlDevice_t,
    p_state: *mut nvmlPstates_t,
) -> nvmlReturn_t {
    entry(|| query(handle, p_state, |d| Ok(performance_state(d, now_ns()))))
}

/// The performance states the device uses: P0 and P8.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedPerformanceStates(
    handle: nvmlDevice_t,
    p_states: *mut nvmlPstates_t,
    size: c_uint,
) -> nvmlReturn_t {
    entry(|| {
        device(handle)?;
        let states = [
            nv::nvmlPStates_enum_NVML_PSTATE_0,
            nv::nvmlPStates_enum_NVML_PSTATE_8,
        ];
        if p_states.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        if (size as usize) < states.len() * std::mem::size_of::<nvmlPstates_t>() {
            return Err(super::INSUFFICIENT_SIZE);
        }
        let slots = size as usize / std::mem::size_of::<nvmlPstates_t>();
        for i in 0..slots {
            let state = states
                .get(i)
                .copied()
                .unwrap_or(nv::nvmlPStates_enum_NVML_PSTATE_UNKNOWN);
            // SAFETY: `p_states` holds `size` bytes, so `slots` entries (NVML API contract).
            put(unsafe { p_states.add(i) }, state)?;
        }
        Ok(())
    })
}
