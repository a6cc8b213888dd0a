//! The media engines (NVENC, NVDEC, NVJPG, OFA) and frame-buffer capture: nothing simulated
//! runs on them, so every utilization is 0 % over the last sample period (1 s, the window
//! of `nvmlDeviceGetUtilizationRates`), and there are no encoder or FBC sessions.

use std::ffi::c_uint;

use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlEncoderSessionInfo_t, nvmlFBCSessionInfo_t, nvmlFBCStats_t, nvmlReturn_t,
};

use super::device::{put, put_list, query};
use super::{device, entry, NvResult, INVALID_ARGUMENT};
use crate::model::SAMPLE_WINDOW_NS;

/// 0 % over one sample window.
fn idle_engine(handle: nvmlDevice_t, utilization: *mut c_uint, period_us: *mut c_uint) -> NvResult {
    device(handle)?;
    if utilization.is_null() || period_us.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    put(utilization, 0)?;
    put(period_us, (SAMPLE_WINDOW_NS / 1000) as c_uint)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEncoderUtilization(
    handle: nvmlDevice_t,
    utilization: *mut c_uint,
    sampling_period_us: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| idle_engine(handle, utilization, sampling_period_us))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDecoderUtilization(
    handle: nvmlDevice_t,
    utilization: *mut c_uint,
    sampling_period_us: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| idle_engine(handle, utilization, sampling_period_us))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetJpgUtilization(
    handle: nvmlDevice_t,
    utilization: *mut c_uint,
    sampling_period_us: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| idle_engine(handle, utilization, sampling_period_us))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetOfaUtilization(
    handle: nvmlDevice_t,
    utilization: *mut c_uint,
    sampling_period_us: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| idle_engine(handle, utilization, sampling_period_us))
}

/// No sessions: count, average FPS and latency all 0.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEncoderStats(
    handle: nvmlDevice_t,
    session_count: *mut c_uint,
    average_fps: *mut c_uint,
    average_latency: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| {
        device(handle)?;
        if session_count.is_null() || average_fps.is_null() || average_latency.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        put(session_count, 0)?;
        put(average_fps, 0)?;
        put(average_latency, 0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEncoderSessions(
    handle: nvmlDevice_t,
    session_count: *mut c_uint,
    session_infos: *mut nvmlEncoderSessionInfo_t,
) -> nvmlReturn_t {
    entry(|| {
        device(handle)?;
        put_list::<nvmlEncoderSessionInfo_t>(session_count, session_infos, &[])
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFBCStats(
    handle: nvmlDevice_t,
    fbc_stats: *mut nvmlFBCStats_t,
) -> nvmlReturn_t {
    entry(|| {
        query(handle, fbc_stats, |_| {
            Ok(nvmlFBCStats_t {
                sessionsCount: 0,
                averageFPS: 0,
                averageLatency: 0,
            })
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFBCSessions(
    handle: nvmlDevice_t,
    session_count: *mut c_uint,
    session_info: *mut nvmlFBCSessionInfo_t,
) -> nvmlReturn_t {
    entry(|| {
        device(handle)?;
        put_list::<nvmlFBCSessionInfo_t>(session_count, session_info, &[])
    })
}
