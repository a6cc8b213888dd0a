//! Temperature, its thresholds and margin, fans.
//!
//! The GPU temperature follows the power draw (`crate::model::temperature_c`: 30 °C idle,
//! 75 °C at full power), so it stays below every threshold. Thresholds are the data-sheet
//! ones of the SXM parts (shutdown 92 °C, slowdown 89 °C, memory maximum 95 °C, GPU maximum
//! operating 87 °C on Hopper, 85 °C before); the acoustic and GPS thresholds belong to
//! consumer boards (NVML_ERROR_NOT_SUPPORTED). Fans: `fans` in the config; with none (every
//! SXM board: the chassis cools it) each fan query is NVML_ERROR_NOT_SUPPORTED, as nvml.h
//! specifies for a device without a fan. With fans, every fan turns at the same speed, 30 %
//! at 30 °C rising linearly to 80 % at 75 °C.

use std::ffi::{c_int, c_uint};

use nvml_wrapper_sys::bindings::{
    self as nv, nvmlDevice_t, nvmlMarginTemperature_t, nvmlReturn_t, nvmlTemperature_t,
};

use super::device::{put, query, versioned};
use super::{
    device, entry, null_arg, NvResult, ARGUMENT_VERSION_MISMATCH, INVALID_ARGUMENT, NOT_SUPPORTED,
};
use crate::config::Architecture;
use crate::driver::Device;
use crate::ffi::{self, now_ns};

/// Only the GPU sensor exists (nvml.h: NVML_TEMPERATURE_COUNT is 1).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    handle: nvmlDevice_t,
    sensor: c_uint,
    temp: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| {
        query(handle, temp, |d| {
            if sensor != nv::nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU {
                return Err(INVALID_ARGUMENT);
            }
            Ok(d.temperature_c(now_ns()))
        })
    })
}

/// The versioned form: `temperature->version` must be nvml.h's `nvmlTemperature_v1`
/// (else NVML_ERROR_ARGUMENT_VERSION_MISMATCH) and `sensorType` the GPU sensor.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureV(
    handle: nvmlDevice_t,
    temperature: *mut nvmlTemperature_t,
) -> nvmlReturn_t {
    entry(|| {
        let d = device(handle)?;
        // SAFETY: `temperature` is NULL or points to an nvmlTemperature_t: three 4-byte
        // fields, version, sensorType (a C enum, read raw), temperature (NVML API contract).
        let [version, sensor, _] =
            unsafe { ffi::read(temperature.cast_const().cast::<[u32; 3]>()) }.map_err(null_arg)?;
        if version != versioned::<nvmlTemperature_t>(1) {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        if sensor != nv::nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU {
            return Err(INVALID_ARGUMENT);
        }
        let celsius = d.temperature_c(now_ns()) as c_int;
        put(
            temperature.cast::<[u32; 3]>(),
            [version, sensor, celsius as u32],
        )
    })
}

/// (shutdown, slowdown, memory maximum, GPU maximum operating), °C.
fn thresholds(d: &Device) -> (u32, u32, u32, u32) {
    let gpu_max = if d.config.architecture == Architecture::Hopper {
        87
    } else {
        85
    };
    (92, 89, 95, gpu_max)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureThreshold(
    handle: nvmlDevice_t,
    threshold_type: c_uint,
    temp: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| {
        query(handle, temp, |d| {
            let (shutdown, slowdown, mem_max, gpu_max) = thresholds(d);
            match threshold_type {
                nv::nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_SHUTDOWN => {
                    Ok(shutdown)
                }
                nv::nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_SLOWDOWN => {
                    Ok(slowdown)
                }
                nv::nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_MEM_MAX => {
                    Ok(mem_max)
                }
                nv::nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_GPU_MAX => {
                    Ok(gpu_max)
                }
                t if t < nv::nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_COUNT => {
                    Err(NOT_SUPPORTED)
                }
                _ => Err(INVALID_ARGUMENT),
            }
        })
    })
}

/// Degrees left before the slowdown threshold; `marginTempInfo->version` must be nvml.h's
/// `nvmlMarginTemperature_v1`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMarginTemperature(
    handle: nvmlDevice_t,
    margin_temp_info: *mut nvmlMarginTemperature_t,
) -> nvmlReturn_t {
    entry(|| {
        let d = device(handle)?;
        // SAFETY: `margin_temp_info` is NULL or points to an nvmlMarginTemperature_t, whose
        // first field is the unsigned int `version` (NVML API contract).
        let version = unsafe { ffi::read(margin_temp_info.cast_const().cast::<c_uint>()) }
            .map_err(null_arg)?;
        if version != versioned::<nvmlMarginTemperature_t>(1) {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        let (_, slowdown, _, _) = thresholds(d);
        put(
            margin_temp_info,
            nvmlMarginTemperature_t {
                version,
                marginTemperature: slowdown as c_int - d.temperature_c(now_ns()) as c_int,
            },
        )
    })
}

/// The device's fans (NVML_ERROR_NOT_SUPPORTED if it has none).
fn fans(d: &Device) -> NvResult<u32> {
    match d.config.fans {
        0 => Err(NOT_SUPPORTED),
        n => Ok(n),
    }
}

/// Fan speed in percent of the maximum: 30 % at 30 °C to 80 % at 75 °C.
fn fan_percent(d: &Device) -> u32 {
    let t = d.temperature_c(now_ns()).clamp(30, 75);
    30 + (t - 30) * 50 / 45
}

/// A fan index (NVML_ERROR_INVALID_ARGUMENT past the last fan).
fn fan_speed(d: &Device, fan: c_uint) -> NvResult<u32> {
    if fan >= fans(d)? {
        return Err(INVALID_ARGUMENT);
    }
    Ok(fan_percent(d))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNumFans(
    handle: nvmlDevice_t,
    num_fans: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| query(handle, num_fans, fans))
}

/// Fan 0's speed.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFanSpeed(
    handle: nvmlDevice_t,
    speed: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| query(handle, speed, |d| fan_speed(d, 0)))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFanSpeed_v2(
    handle: nvmlDevice_t,
    fan: c_uint,
    speed: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| query(handle, speed, |d| fan_speed(d, fan)))
}

/// The automatic fan control's target: what the fan turns at.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTargetFanSpeed(
    handle: nvmlDevice_t,
    fan: c_uint,
    target_speed: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| query(handle, target_speed, |d| fan_speed(d, fan)))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMinMaxFanSpeed(
    handle: nvmlDevice_t,
    min_speed: *mut c_uint,
    max_speed: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| {
        let d = device(handle)?;
        fans(d)?;
        if min_speed.is_null() || max_speed.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        put(min_speed, 30)?;
        put(max_speed, 100)
    })
}
