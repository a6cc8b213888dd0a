//! NVML memory queries (`nvidia-smi`, pynvml, nvml-wrapper): inside a vGPU a device shows
//! the quota as total, the vGPU's use as used, and the rest (clamped to what is really
//! free) as free.

use std::ffi::{c_char, c_uint, CStr};

use crate::config;
use crate::ffi::*;
use crate::guard::Call;
use crate::hooks::driver;
use crate::real::sig;
use crate::state::{Mode, Vgpu};

/// `(total, used, free)` to report for `device` given the driver's answer, or `None` to
/// leave the answer as it is. Devices outside the vGPU (and every device when the shim
/// fails closed) keep their figures but show nothing free, as allocations there are refused.
fn virtual_memory(device: nvmlDevice_t, real: (u64, u64, u64)) -> Option<(u64, u64, u64)> {
    let (real_total, real_used, real_free) = real;
    let vgpu: &Vgpu = match config::mode() {
        Mode::Enforce(vgpu) => vgpu,
        Mode::FailClosed => return Some((real_total, real_used, 0)),
        Mode::PassThrough => return None,
    };
    let mut buf = [0 as c_char; 96];
    if driver!(nvmlDeviceGetUUID(device, buf.as_mut_ptr(), buf.len() as c_uint)) != NVML_SUCCESS {
        return None;
    }
    buf[buf.len() - 1] = 0;
    // SAFETY: the buffer is NUL-terminated (last byte forced above) and lives past the use.
    let uuid = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().ok()?;
    let Some(index) = vgpu.usage.find_device_str(uuid) else {
        return Some((real_total, real_used, 0));
    };
    let quota = vgpu.usage.quota_bytes(index);
    let used = vgpu.usage.used_bytes(index).min(quota);
    Some((quota, used, (quota - used).min(real_free)))
}

pub unsafe fn memory_info(
    call: &Call<NvmlReturn>,
    real: sig::nvmlDeviceGetMemoryInfo,
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> NvmlReturn {
    // SAFETY: the real function with the program's arguments.
    let rc = call.driver(|| unsafe { real(device, memory) });
    if rc != NVML_SUCCESS || memory.is_null() {
        return rc;
    }
    // SAFETY: NVML succeeded, so `memory` is valid and holds its answer.
    let m = unsafe { &mut *memory };
    if let Some((total, used, free)) = virtual_memory(device, (m.total, m.used, m.free)) {
        (m.total, m.used, m.free) = (total, used, free);
    }
    rc
}

pub unsafe fn memory_info_v2(
    call: &Call<NvmlReturn>,
    real: sig::nvmlDeviceGetMemoryInfo_v2,
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> NvmlReturn {
    // SAFETY: the real function with the program's arguments.
    let rc = call.driver(|| unsafe { real(device, memory) });
    if rc != NVML_SUCCESS || memory.is_null() {
        return rc;
    }
    // SAFETY: as above.
    let m = unsafe { &mut *memory };
    if let Some((total, used, free)) = virtual_memory(device, (m.total, m.used, m.free)) {
        // Driver-reserved memory is outside the quota: the quota is all there is.
        (m.total, m.reserved, m.used, m.free) = (total, 0, used, free);
    }
    rc
}
