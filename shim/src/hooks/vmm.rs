//! Virtual memory management: physical allocations (`cuMemCreate`) count when created on a
//! device and are given back at `cuMemRelease`. Host-located handles (HOST, HOST_NUMA…) are
//! not device memory. Mapping them (`cuMemMap`) counts nothing more.

use std::ffi::c_int;

use crate::ffi::*;
use crate::governor::allocations::Kind;
use crate::governor::devices;
use crate::governor::memory;
use crate::guard::guard;
use crate::hooks::driver;

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

#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    bytes: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CuResult {
    guard(
        "cuMemCreate",
        || {
            // SAFETY: `prop` comes from the program; the driver API requires it readable.
            let ordinal = unsafe { device_ordinal(prop) };
            let admission = memory::admit(bytes as u64, |vgpu| match ordinal {
                None => Ok(None),
                // An ordinal the driver does not know: let it answer.
                Some(o) => Ok(devices::of_ordinal(vgpu, o)),
            });
            memory::allocate(admission, Kind::Physical, || {
                let rc = driver!(cuMemCreate(handle, bytes, prop, flags));
                let created = if rc == CUDA_SUCCESS && !handle.is_null() {
                    // SAFETY: the driver succeeded and wrote the new handle.
                    unsafe { handle.read() }
                } else {
                    0
                };
                (rc, created)
            })
        },
        || driver!(cuMemCreate(handle, bytes, prop, flags)),
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CuResult {
    guard(
        "cuMemRelease",
        || memory::free(Kind::Physical, handle, || driver!(cuMemRelease(handle))),
        || driver!(cuMemRelease(handle)),
    )
}
