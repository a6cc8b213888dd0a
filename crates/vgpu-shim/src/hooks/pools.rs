//! Memory pools created through the shim, with their location: allocations from a
//! host-located pool are not device memory.

use std::collections::HashMap;

use crate::ffi::*;
use crate::governed::sig;
use crate::guard::Call;
use crate::spinlock::SpinLock;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    /// A device pool, by device ordinal.
    Device(i32),
    Host,
}

static POOLS: SpinLock<Option<HashMap<u64, Location>>> = SpinLock::new(None);

/// Where `pool` lives, if it was created through the shim.
pub fn location(pool: u64) -> Option<Location> {
    POOLS.lock().as_ref()?.get(&pool).copied()
}

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
        POOLS.lock().get_or_insert_with(HashMap::new).insert(handle, location);
    }
    rc
}

pub unsafe fn destroy(call: &Call<CuResult>, real: sig::cuMemPoolDestroy, pool: CUmemoryPool) -> CuResult {
    // SAFETY: the real function with the program's arguments.
    let rc = call.driver(|| unsafe { real(pool) });
    if rc == CUDA_SUCCESS {
        if let Some(map) = POOLS.lock().as_mut() {
            map.remove(&(pool as u64));
        }
    }
    rc
}

/// Fork prepare.
pub fn lock() {
    POOLS.acquire();
}

/// Fork parent/child: release what [`lock`] took. The pools stay known in the child too;
/// the child cannot use its parent's pools anyway.
///
/// # Safety
/// Only after [`lock`] in this thread.
pub unsafe fn unlock() {
    // SAFETY: taken by this thread in lock(); no guard exists.
    unsafe { POOLS.force_unlock() };
}
