//! Virtual memory management: physical allocations (`cuMemCreate`) count when created on a
//! device and are given back at `cuMemRelease`. Host-located handles (HOST, HOST_NUMA…) are
//! not device memory. Mapping them (`cuMemMap`) counts nothing more.

use std::ffi::c_int;

use crate::config;
use crate::ffi::*;
use crate::governor::allocations::Kind;
use crate::governor::devices;
use crate::governor::memory;
use crate::guard::Call;
use crate::real::sig;

/// The location of a `CUmemAllocationProp`: `Some(ordinal)` for device memory.
///
/// # Safety
/// `prop` is NULL or readable.
unsafe fn device_ordinal(prop: *const CUmemAllocationProp) -> Option<c_int> {
    if prop.is_null() {
        return None;
    }
    // SAFETY: readable by the contract; the enum field is read as its raw value.
    let (kind, id) = unsafe {
        (
            std::ptr::addr_of!((*prop).location.type_).cast::<u32>().read(),
            std::ptr::addr_of!((*prop).location.id).read(),
        )
    };
    (kind == CU_MEM_LOCATION_TYPE_DEVICE).then_some(id)
}

pub unsafe fn create(
    call: &Call<CuResult>,
    real: sig::cuMemCreate,
    handle: *mut CUmemGenericAllocationHandle,
    bytes: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CuResult {
    // SAFETY: `prop` comes from the program; the driver API requires it readable.
    let ordinal = unsafe { device_ordinal(prop) };
    let admission = memory::admit(config::mode(), bytes as u64, |vgpu| match ordinal {
        None => Ok(None),
        // An ordinal the driver does not know: let it answer.
        Some(o) => Ok(devices::of_ordinal(vgpu, o)),
    });
    memory::allocate(
        call,
        admission,
        Kind::Physical,
        // SAFETY: the real function with the program's arguments.
        || unsafe { real(handle, bytes, prop, flags) },
        || {
            if handle.is_null() {
                0
            } else {
                // SAFETY: the driver succeeded and wrote the new handle.
                unsafe { handle.read() }
            }
        },
    )
}

pub unsafe fn release(
    call: &Call<CuResult>,
    real: sig::cuMemRelease,
    handle: CUmemGenericAllocationHandle,
) -> CuResult {
    // SAFETY: the real function with the program's argument.
    memory::free(call, Kind::Physical, handle, || unsafe { real(handle) })
}
