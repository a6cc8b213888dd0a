//! Memory pools created through the shim: their location is remembered
//! ([`crate::governor::pools`]), since allocations from a host-located pool are not device
//! memory.

use crate::ffi::*;
use crate::governor::pools::{self, Location};
use crate::guard::Call;
use crate::real::sig;

pub unsafe fn create(
    call: &Call<CuResult>,
    real: sig::cuMemPoolCreate,
    pool: *mut CUmemoryPool,
    props: *const CUmemPoolProps,
) -> CuResult {
    // SAFETY: the real function with the program's arguments.
    let rc = call.driver(|| unsafe { real(pool, props) });
    if rc == CUDA_SUCCESS && !pool.is_null() && !props.is_null() {
        // SAFETY: the driver accepted both pointers: `props` is readable (its enum
        // field read as a raw value) and `pool` was written.
        let (kind, id, handle) = unsafe {
            (
                std::ptr::addr_of!((*props).location.type_).cast::<u32>().read(),
                std::ptr::addr_of!((*props).location.id).read(),
                pool.read() as u64,
            )
        };
        let location = if kind == CU_MEM_LOCATION_TYPE_DEVICE {
            Location::Device(id)
        } else {
            Location::Host
        };
        pools::insert(handle, location);
    }
    rc
}

pub unsafe fn destroy(call: &Call<CuResult>, real: sig::cuMemPoolDestroy, pool: CUmemoryPool) -> CuResult {
    // SAFETY: the real function with the program's arguments.
    let rc = call.driver(|| unsafe { real(pool) });
    if rc == CUDA_SUCCESS {
        pools::remove(pool as u64);
    }
    rc
}
