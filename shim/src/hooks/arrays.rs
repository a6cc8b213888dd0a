//! CUDA arrays, counted by their descriptor's size ([`crate::governor::arrays`]).

use std::ffi::c_uint;

use crate::ffi::*;
use crate::governor::allocations::Kind;
use crate::governor::arrays::Shape;
use crate::governor::devices;
use crate::governor::memory::{self, Admission};
use crate::guard::guard;
use crate::hooks::driver;

/// Admit an array of `bytes` (`None`: a shape the driver refuses; it answers itself).
fn admit(bytes: Option<u64>) -> Admission {
    match bytes {
        Some(bytes) => memory::admit(bytes, |vgpu| devices::current(vgpu).map(Some)),
        None => Admission::PassThrough,
    }
}

/// The handle a successful create wrote.
fn created<T>(rc: CuResult, out: *const *mut T) -> u64 {
    if rc != CUDA_SUCCESS || out.is_null() {
        return 0;
    }
    // SAFETY: the driver succeeded, so it wrote the new handle through `out`.
    unsafe { out.read() as u64 }
}

#[no_mangle]
pub unsafe extern "C" fn cuArrayCreate_v2(array: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR) -> CuResult {
    guard(
        "cuArrayCreate_v2",
        || {
            // SAFETY: a non-NULL descriptor is readable by the driver API's contract.
            let bytes = (!desc.is_null())
                .then(|| unsafe { Shape::of_2d(desc) })
                .and_then(|s| s.bytes());
            memory::allocate(admit(bytes), Kind::Array, || {
                let rc = driver!(cuArrayCreate_v2(array, desc));
                (rc, created(rc, array))
            })
        },
        || driver!(cuArrayCreate_v2(array, desc)),
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuArray3DCreate_v2(array: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR) -> CuResult {
    guard(
        "cuArray3DCreate_v2",
        || {
            // SAFETY: as above.
            let bytes = (!desc.is_null())
                .then(|| unsafe { Shape::of_3d(desc) })
                .and_then(|s| s.bytes());
            memory::allocate(admit(bytes), Kind::Array, || {
                let rc = driver!(cuArray3DCreate_v2(array, desc));
                (rc, created(rc, array))
            })
        },
        || driver!(cuArray3DCreate_v2(array, desc)),
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuArrayDestroy(array: CUarray) -> CuResult {
    guard(
        "cuArrayDestroy",
        || memory::free(Kind::Array, array as u64, || driver!(cuArrayDestroy(array))),
        || driver!(cuArrayDestroy(array)),
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    array: *mut CUmipmappedArray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
    levels: c_uint,
) -> CuResult {
    guard(
        "cuMipmappedArrayCreate",
        || {
            // SAFETY: as above.
            let bytes = (!desc.is_null() && levels > 0)
                .then(|| unsafe { Shape::of_3d(desc) })
                .and_then(|s| s.mipmapped_bytes(levels));
            memory::allocate(admit(bytes), Kind::Mipmap, || {
                let rc = driver!(cuMipmappedArrayCreate(array, desc, levels));
                (rc, created(rc, array))
            })
        },
        || driver!(cuMipmappedArrayCreate(array, desc, levels)),
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(array: CUmipmappedArray) -> CuResult {
    guard(
        "cuMipmappedArrayDestroy",
        || memory::free(Kind::Mipmap, array as u64, || driver!(cuMipmappedArrayDestroy(array))),
        || driver!(cuMipmappedArrayDestroy(array)),
    )
}
