//! Exported wrappers of the linear-memory allocation paths and their frees.

use std::ffi::c_uint;

use crate::ffi::*;
use crate::governor::allocations::Kind;
use crate::governor::devices::{self, Target};
use crate::governor::memory::{self, Admission};
use crate::guard::guard;
use crate::hooks::driver;

/// The current context's device.
fn current(vgpu: &crate::config::Vgpu) -> Result<Option<Target>, CuResult> {
    devices::current(vgpu).map(Some)
}

/// The pointer an allocation wrote (0 if it failed or the out-pointer is NULL).
fn written(rc: CuResult, dptr: *const CUdeviceptr) -> u64 {
    if rc != CUDA_SUCCESS || dptr.is_null() {
        return 0;
    }
    // SAFETY: the driver succeeded, so `dptr` was valid and it wrote the new pointer there.
    unsafe { dptr.read() }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) -> CuResult {
    guard(
        "cuMemAlloc_v2",
        || {
            memory::allocate(memory::admit(bytes as u64, current), Kind::DevicePtr, || {
                let rc = driver!(cuMemAlloc_v2(dptr, bytes));
                (rc, written(rc, dptr))
            })
        },
        || driver!(cuMemAlloc_v2(dptr, bytes)),
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytes: usize, flags: c_uint) -> CuResult {
    // Managed memory is counted on the current device, where it is resident by default.
    guard(
        "cuMemAllocManaged",
        || {
            memory::allocate(memory::admit(bytes as u64, current), Kind::DevicePtr, || {
                let rc = driver!(cuMemAllocManaged(dptr, bytes, flags));
                (rc, written(rc, dptr))
            })
        },
        || driver!(cuMemAllocManaged(dptr, bytes, flags)),
    )
}

/// Pitch alignment assumed before the driver reports the real pitch.
const PITCH_GUESS: u64 = 512;

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element: c_uint,
) -> CuResult {
    guard(
        "cuMemAllocPitch_v2",
        || {
            // Reserve for the usual pitch first, then settle on the real pitch × height.
            let guess = (width as u64)
                .checked_next_multiple_of(PITCH_GUESS)
                .and_then(|w| w.checked_mul(height as u64));
            let Some(guess) = guess else {
                return driver!(cuMemAllocPitch_v2(dptr, pitch, width, height, element));
            };
            match memory::admit(guess, current) {
                Admission::PassThrough => driver!(cuMemAllocPitch_v2(dptr, pitch, width, height, element)),
                Admission::Refuse(rc) => rc,
                Admission::Reserved(mut reservation) => {
                    let rc = driver!(cuMemAllocPitch_v2(dptr, pitch, width, height, element));
                    if rc != CUDA_SUCCESS {
                        reservation.cancel();
                        return rc;
                    }
                    // SAFETY: the driver succeeded, so both out-pointers were valid and written.
                    let (ptr, real_pitch) = unsafe { (dptr.read(), pitch.read()) };
                    let real_bytes = (real_pitch as u64).saturating_mul(height as u64);
                    if !reservation.resize(real_bytes) {
                        // SAFETY: freeing the allocation just made.
                        driver!(cuMemFree_v2(ptr));
                        reservation.cancel();
                        return CUDA_ERROR_OUT_OF_MEMORY;
                    }
                    reservation.commit(Kind::DevicePtr, ptr);
                    CUDA_SUCCESS
                }
            }
        },
        || driver!(cuMemAllocPitch_v2(dptr, pitch, width, height, element)),
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CuResult {
    guard(
        "cuMemFree_v2",
        || memory::free(Kind::DevicePtr, dptr, || driver!(cuMemFree_v2(dptr))),
        || driver!(cuMemFree_v2(dptr)),
    )
}

// ----- stream-ordered allocator -----

/// The stream's device is taken to be the current context's (cudart and frameworks
/// allocate with the stream's device current).
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytes: usize, stream: CUstream) -> CuResult {
    guard(
        "cuMemAllocAsync",
        || {
            memory::allocate(memory::admit(bytes as u64, current), Kind::DevicePtr, || {
                let rc = driver!(cuMemAllocAsync(dptr, bytes, stream));
                (rc, written(rc, dptr))
            })
        },
        || driver!(cuMemAllocAsync(dptr, bytes, stream)),
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytes: usize, stream: CUstream) -> CuResult {
    guard(
        "cuMemAllocAsync_ptsz",
        || {
            memory::allocate(memory::admit(bytes as u64, current), Kind::DevicePtr, || {
                let rc = driver!(cuMemAllocAsync_ptsz(dptr, bytes, stream));
                (rc, written(rc, dptr))
            })
        },
        || driver!(cuMemAllocAsync_ptsz(dptr, bytes, stream)),
    )
}

/// The pool's device: recorded when the pool was created through the shim; other pools
/// (the devices' default pools) are taken to be the current device's.
fn pool_target(vgpu: &crate::config::Vgpu, pool: CUmemoryPool) -> Result<Option<Target>, CuResult> {
    match super::pools::location(pool as u64) {
        Some(super::pools::Location::Host) => Ok(None),
        Some(super::pools::Location::Device(ordinal)) => Ok(devices::of_ordinal(vgpu, ordinal)),
        None => current(vgpu),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CuResult {
    guard(
        "cuMemAllocFromPoolAsync",
        || {
            let admission = memory::admit(bytes as u64, |v| pool_target(v, pool));
            memory::allocate(admission, Kind::DevicePtr, || {
                let rc = driver!(cuMemAllocFromPoolAsync(dptr, bytes, pool, stream));
                (rc, written(rc, dptr))
            })
        },
        || driver!(cuMemAllocFromPoolAsync(dptr, bytes, pool, stream)),
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CuResult {
    guard(
        "cuMemAllocFromPoolAsync_ptsz",
        || {
            let admission = memory::admit(bytes as u64, |v| pool_target(v, pool));
            memory::allocate(admission, Kind::DevicePtr, || {
                let rc = driver!(cuMemAllocFromPoolAsync_ptsz(dptr, bytes, pool, stream));
                (rc, written(rc, dptr))
            })
        },
        || driver!(cuMemAllocFromPoolAsync_ptsz(dptr, bytes, pool, stream)),
    )
}

/// Given back when the free is enqueued (the stream frees it in order; a later allocation
/// on the same stream reuses it).
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) -> CuResult {
    guard(
        "cuMemFreeAsync",
        || memory::free(Kind::DevicePtr, dptr, || driver!(cuMemFreeAsync(dptr, stream))),
        || driver!(cuMemFreeAsync(dptr, stream)),
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) -> CuResult {
    guard(
        "cuMemFreeAsync_ptsz",
        || memory::free(Kind::DevicePtr, dptr, || driver!(cuMemFreeAsync_ptsz(dptr, stream))),
        || driver!(cuMemFreeAsync_ptsz(dptr, stream)),
    )
}
