//! CUDA arrays, counted by their descriptor's size ([`crate::governor::arrays`]).

use std::ffi::c_uint;

use crate::config;
use crate::ffi::*;
use crate::governor::allocations::Kind;
use crate::governor::arrays::Shape;
use crate::governor::devices;
use crate::governor::memory::{self, Admission};
use crate::guard::Call;
use crate::real::sig;

/// Admit an array of `bytes` (`None`: a shape the driver refuses; it answers itself).
fn admit(bytes: Option<u64>) -> Admission {
    match bytes {
        Some(bytes) => memory::admit(config::mode(), bytes, |vgpu| devices::current(vgpu).map(Some)),
        None => Admission::PassThrough,
    }
}

/// The handle a successful create wrote through `out` (0 if `out` is NULL).
///
/// # Safety
/// Only after the driver succeeded with this `out`.
unsafe fn created<T>(out: *const *mut T) -> u64 {
    if out.is_null() {
        return 0;
    }
    // SAFETY: the driver succeeded, so it wrote the new handle through `out`.
    unsafe { out.read() as u64 }
}

pub unsafe fn create_2d(
    call: &Call<CuResult>,
    real: sig::cuArrayCreate_v2,
    array: *mut CUarray,
    desc: *const CUDA_ARRAY_DESCRIPTOR,
) -> CuResult {
    // SAFETY: a non-NULL descriptor is readable by the driver API's contract.
    let bytes = (!desc.is_null())
        .then(|| unsafe { Shape::of_2d(desc) })
        .and_then(|s| s.bytes());
    memory::allocate(
        call,
        admit(bytes),
        Kind::Array,
        // SAFETY: the real function with the program's arguments.
        || unsafe { real(array, desc) },
        // SAFETY: read only after the driver succeeded.
        || unsafe { created(array) },
    )
}

pub unsafe fn create_3d(
    call: &Call<CuResult>,
    real: sig::cuArray3DCreate_v2,
    array: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
) -> CuResult {
    // SAFETY: as above.
    let bytes = (!desc.is_null())
        .then(|| unsafe { Shape::of_3d(desc) })
        .and_then(|s| s.bytes());
    memory::allocate(
        call,
        admit(bytes),
        Kind::Array,
        // SAFETY: the real function with the program's arguments.
        || unsafe { real(array, desc) },
        // SAFETY: read only after the driver succeeded.
        || unsafe { created(array) },
    )
}

pub unsafe fn destroy(call: &Call<CuResult>, real: sig::cuArrayDestroy, array: CUarray) -> CuResult {
    // SAFETY: the real function with the program's argument.
    memory::free(call, Kind::Array, array as u64, || unsafe { real(array) })
}

pub unsafe fn create_mipmapped(
    call: &Call<CuResult>,
    real: sig::cuMipmappedArrayCreate,
    array: *mut CUmipmappedArray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
    levels: c_uint,
) -> CuResult {
    // SAFETY: as above.
    let bytes = (!desc.is_null() && levels > 0)
        .then(|| unsafe { Shape::of_3d(desc) })
        .and_then(|s| s.mipmapped_bytes(levels));
    memory::allocate(
        call,
        admit(bytes),
        Kind::Mipmap,
        // SAFETY: the real function with the program's arguments.
        || unsafe { real(array, desc, levels) },
        // SAFETY: read only after the driver succeeded.
        || unsafe { created(array) },
    )
}

pub unsafe fn destroy_mipmapped(
    call: &Call<CuResult>,
    real: sig::cuMipmappedArrayDestroy,
    array: CUmipmappedArray,
) -> CuResult {
    // SAFETY: the real function with the program's argument.
    memory::free(call, Kind::Mipmap, array as u64, || unsafe { real(array) })
}
