//! What a workload is told about memory: the quota as total, the quota's unused part as
//! free (never more than the device really has free, never below zero).

use crate::config;
use crate::ffi::*;
use crate::governor::devices::{self, Target};
use crate::governor::memory;
use crate::guard::Call;
use crate::real::sig;
use crate::state::Mode;

pub unsafe fn mem_get_info(
    call: &Call<CuResult>,
    real: sig::cuMemGetInfo_v2,
    free: *mut usize,
    total: *mut usize,
) -> CuResult {
    // SAFETY: the real function with the program's arguments.
    let rc = call.driver(|| unsafe { real(free, total) });
    if rc != CUDA_SUCCESS || free.is_null() || total.is_null() {
        return rc;
    }
    // SAFETY: the driver succeeded, so both pointers are valid and hold its answer.
    let (real_free, real_total) = unsafe { (free.read() as u64, total.read() as u64) };
    let (new_total, new_free) = match config::mode() {
        Mode::PassThrough => return rc,
        Mode::FailClosed => (real_total, 0),
        Mode::Enforce(vgpu) => match devices::current(vgpu) {
            Ok(Target::Device(device)) => {
                memory::reclaim_for_info(vgpu);
                memory::virtual_info(vgpu, device, real_free)
            }
            Ok(Target::Outside) => (real_total, 0),
            Err(_) => return rc,
        },
    };
    // SAFETY: as above, writable.
    unsafe {
        total.write(new_total as usize);
        free.write(new_free as usize);
    }
    rc
}

pub unsafe fn device_total_mem(
    call: &Call<CuResult>,
    real: sig::cuDeviceTotalMem_v2,
    bytes: *mut usize,
    device: CUdevice,
) -> CuResult {
    // SAFETY: the real function with the program's arguments.
    let rc = call.driver(|| unsafe { real(bytes, device) });
    if rc != CUDA_SUCCESS || bytes.is_null() {
        return rc;
    }
    if let Mode::Enforce(vgpu) = config::mode() {
        if let Some(Target::Device(index)) = devices::of_device(vgpu, device) {
            // SAFETY: the driver succeeded, so `bytes` is writable.
            unsafe { bytes.write(vgpu.usage.quota_bytes(index) as usize) };
        }
    }
    rc
}
