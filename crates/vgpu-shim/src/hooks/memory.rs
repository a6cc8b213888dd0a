//! Hooks of the linear-memory allocation paths and their frees.

use std::ffi::c_uint;

use crate::config;
use crate::ffi::*;
use crate::governor::allocations::Kind;
use crate::governor::devices::{self, Target};
use crate::governor::memory::{self, Admission, Pending};
use crate::governor::pools::{self, Location};
use crate::guard::Call;
use crate::hooks::driver;
use crate::real::sig;
use crate::state::Vgpu;

/// The current context's device.
fn current(vgpu: &Vgpu) -> Result<Option<Target>, CuResult> {
    devices::current(vgpu).map(Some)
}

/// The pointer a successful allocation wrote through `dptr` (0 if `dptr` is NULL).
///
/// # Safety
/// Only after the driver succeeded with this `dptr`.
unsafe fn written(dptr: *const CUdeviceptr) -> u64 {
    if dptr.is_null() {
        return 0;
    }
    // SAFETY: the driver succeeded, so `dptr` was valid and it wrote the new pointer there.
    unsafe { dptr.read() }
}

pub unsafe fn alloc(call: &Call<CuResult>, real: sig::cuMemAlloc_v2, dptr: *mut CUdeviceptr, bytes: usize) -> CuResult {
    memory::allocate(
        call,
        memory::admit(config::mode(), bytes as u64, current),
        Kind::DevicePtr,
        // SAFETY: the real function with the program's arguments.
        || unsafe { real(dptr, bytes) },
        // SAFETY: read only after the driver succeeded.
        || unsafe { written(dptr) },
    )
}

/// Managed memory is counted on the current device, where it is resident by default.
pub unsafe fn alloc_managed(
    call: &Call<CuResult>,
    real: sig::cuMemAllocManaged,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    flags: c_uint,
) -> CuResult {
    memory::allocate(
        call,
        memory::admit(config::mode(), bytes as u64, current),
        Kind::DevicePtr,
        // SAFETY: the real function with the program's arguments.
        || unsafe { real(dptr, bytes, flags) },
        // SAFETY: read only after the driver succeeded.
        || unsafe { written(dptr) },
    )
}

/// Pitch alignment assumed before the driver reports the real pitch.
const PITCH_GUESS: u64 = 512;

pub unsafe fn alloc_pitch(
    call: &Call<CuResult>,
    real: sig::cuMemAllocPitch_v2,
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element: c_uint,
) -> CuResult {
    // SAFETY (both closures): the real function with the program's arguments.
    let driver = || unsafe { real(dptr, pitch, width, height, element) };
    // Reserve for the usual pitch first, then settle on the real pitch × height.
    let guess = (width as u64)
        .checked_next_multiple_of(PITCH_GUESS)
        .and_then(|w| w.checked_mul(height as u64));
    let Some(guess) = guess else {
        return call.driver(driver);
    };
    match memory::admit(config::mode(), guess, current) {
        Admission::PassThrough => call.driver(driver),
        Admission::Refuse(rc) => rc,
        Admission::Reserved(reservation) => {
            // Settled when dropped: committed once the driver succeeded (at the size the
            // reservation has by then), else given back.
            // SAFETY: read only after the driver succeeded.
            let mut pending = Pending::new(reservation, call, Kind::DevicePtr, || unsafe { written(dptr) });
            let rc = call.driver(driver);
            if rc != CUDA_SUCCESS {
                return rc;
            }
            // SAFETY: the driver succeeded, so both out-pointers were valid and written.
            let (ptr, real_pitch) = unsafe { (dptr.read(), pitch.read()) };
            let real_bytes = (real_pitch as u64).saturating_mul(height as u64);
            if pending.reservation().is_some_and(|r| !r.resize(real_bytes)) {
                // SAFETY: freeing the allocation the driver just made.
                driver!(cuMemFree_v2(ptr));
                call.record(CUDA_ERROR_OUT_OF_MEMORY);
                pending.cancel();
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            CUDA_SUCCESS
        }
    }
}

pub unsafe fn free(call: &Call<CuResult>, real: sig::cuMemFree_v2, dptr: CUdeviceptr) -> CuResult {
    // SAFETY: the real function with the program's argument.
    memory::free(call, Kind::DevicePtr, dptr, || unsafe { real(dptr) })
}

// ----- stream-ordered allocator -----

/// The stream's device is taken to be the current context's (cudart and frameworks
/// allocate with the stream's device current).
pub unsafe fn alloc_async(
    call: &Call<CuResult>,
    real: sig::cuMemAllocAsync,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> CuResult {
    memory::allocate(
        call,
        memory::admit(config::mode(), bytes as u64, current),
        Kind::DevicePtr,
        // SAFETY: the real function with the program's arguments.
        || unsafe { real(dptr, bytes, stream) },
        // SAFETY: read only after the driver succeeded.
        || unsafe { written(dptr) },
    )
}

/// The pool's device: recorded when the pool was created through the shim; other pools
/// (the devices' default pools) are taken to be the current device's.
fn pool_target(vgpu: &Vgpu, pool: CUmemoryPool) -> Result<Option<Target>, CuResult> {
    match pools::location(pool as u64) {
        Some(Location::Host) => Ok(None),
        Some(Location::Device(ordinal)) => Ok(devices::of_ordinal(vgpu, ordinal)),
        None => current(vgpu),
    }
}

pub unsafe fn alloc_from_pool_async(
    call: &Call<CuResult>,
    real: sig::cuMemAllocFromPoolAsync,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CuResult {
    memory::allocate(
        call,
        memory::admit(config::mode(), bytes as u64, |v| pool_target(v, pool)),
        Kind::DevicePtr,
        // SAFETY: the real function with the program's arguments.
        || unsafe { real(dptr, bytes, pool, stream) },
        // SAFETY: read only after the driver succeeded.
        || unsafe { written(dptr) },
    )
}

/// Given back when the free is enqueued (the stream frees it in order; a later allocation
/// on the same stream reuses it).
pub unsafe fn free_async(
    call: &Call<CuResult>,
    real: sig::cuMemFreeAsync,
    dptr: CUdeviceptr,
    stream: CUstream,
) -> CuResult {
    // SAFETY: the real function with the program's arguments.
    memory::free(call, Kind::DevicePtr, dptr, || unsafe { real(dptr, stream) })
}
