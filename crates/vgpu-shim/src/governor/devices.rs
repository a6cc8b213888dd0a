//! Which device of the vGPU a CUDA device is: matched by UUID (`cuDeviceGetUuid`), so the
//! mapping holds whatever `CUDA_VISIBLE_DEVICES` did to ordinals. Built once after the driver
//! is initialised; lock-free (threads racing to build it write the same values).

use std::ffi::c_int;
use std::sync::atomic::{AtomicI32, AtomicU8, Ordering};

use crate::ffi::*;
use crate::real;
use crate::state::Vgpu;

const MAX_VISIBLE: usize = 64;
/// Table value of a visible device that is not part of the vGPU.
const NOT_IN_VGPU: i32 = -1;

const UNMAPPED: u8 = 0;
const MAPPED: u8 = 1;

static STATE: AtomicU8 = AtomicU8::new(UNMAPPED);
/// Number of visible devices (valid when MAPPED).
static VISIBLE: AtomicI32 = AtomicI32::new(0);
/// (CUdevice, vGPU device index or NOT_IN_VGPU) per visible ordinal.
static TABLE: [(AtomicI32, AtomicI32); MAX_VISIBLE] =
    [const { (AtomicI32::new(0), AtomicI32::new(NOT_IN_VGPU)) }; MAX_VISIBLE];

/// Where an allocation goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// This device of the vGPU.
    Device(usize),
    /// A device the vGPU does not include: allocations are refused.
    Outside,
}

/// Build the table if the driver is initialised (call after a successful `cuInit`).
pub fn map(vgpu: &Vgpu) -> bool {
    if STATE.load(Ordering::Acquire) == MAPPED {
        return true;
    }
    let mut count: c_int = 0;
    // SAFETY: a valid out-pointer.
    if unsafe { real::cuDeviceGetCount(&mut count) } != CUDA_SUCCESS {
        return false;
    }
    let count = (count.max(0) as usize).min(MAX_VISIBLE);
    for (ordinal, (handle, index)) in TABLE.iter().enumerate().take(count) {
        let mut device: CUdevice = 0;
        // SAFETY: valid out-pointer and an ordinal below the count.
        if unsafe { real::cuDeviceGet(&mut device, ordinal as c_int) } != CUDA_SUCCESS {
            return false;
        }
        let vgpu_index = uuid_of(device)
            .and_then(|uuid| vgpu.usage.find_device(&uuid))
            .map_or(NOT_IN_VGPU, |i| i as i32);
        handle.store(device, Ordering::Relaxed);
        index.store(vgpu_index, Ordering::Relaxed);
    }
    VISIBLE.store(count as i32, Ordering::Relaxed);
    STATE.store(MAPPED, Ordering::Release);
    true
}

fn uuid_of(device: CUdevice) -> Option<[u8; 16]> {
    let mut uuid = [0u8; 16];
    // SAFETY: a 16-byte out-buffer (CUuuid) and a device handle from cuDeviceGet.
    let mut rc = unsafe { real::cuDeviceGetUuid_v2(&mut uuid, device) };
    if rc == CUDA_ERROR_NOT_FOUND {
        // SAFETY: as above; drivers before CUDA 11.4 only have the first ABI.
        rc = unsafe { real::cuDeviceGetUuid(&mut uuid, device) };
    }
    (rc == CUDA_SUCCESS).then_some(uuid)
}

/// The vGPU device of CUDA device handle `device`.
pub fn of_device(vgpu: &Vgpu, device: CUdevice) -> Option<Target> {
    if !map(vgpu) {
        return None;
    }
    let visible = VISIBLE.load(Ordering::Relaxed) as usize;
    TABLE[..visible]
        .iter()
        .find(|(d, _)| d.load(Ordering::Relaxed) == device)
        .map(|(_, i)| target(i))
}

/// The vGPU device of device ordinal `ordinal` (as in `CUmemLocation::id`).
pub fn of_ordinal(vgpu: &Vgpu, ordinal: c_int) -> Option<Target> {
    if !map(vgpu) || ordinal < 0 || ordinal >= VISIBLE.load(Ordering::Relaxed) {
        return None;
    }
    Some(target(&TABLE[ordinal as usize].1))
}

/// The vGPU device of the calling thread's current context. With one visible device no
/// driver call is needed. `Err` carries the driver's error (e.g. no current context).
pub fn current(vgpu: &Vgpu) -> Result<Target, CuResult> {
    if map(vgpu) && VISIBLE.load(Ordering::Relaxed) == 1 {
        return Ok(target(&TABLE[0].1));
    }
    let mut device: CUdevice = 0;
    // SAFETY: a valid out-pointer.
    let rc = unsafe { real::cuCtxGetDevice(&mut device) };
    if rc != CUDA_SUCCESS {
        return Err(rc);
    }
    of_device(vgpu, device).ok_or(CUDA_ERROR_INVALID_VALUE)
}

fn target(index: &AtomicI32) -> Target {
    match index.load(Ordering::Relaxed) {
        i if i >= 0 => Target::Device(i as usize),
        _ => Target::Outside,
    }
}

/// Fork child: the child must initialise the driver again; map anew then.
pub fn reset_in_child() {
    STATE.store(UNMAPPED, Ordering::Release);
}
