//! Memory pools created through the shim, with their location: allocations from a
//! host-located pool are not device memory. Filled by the `cuMemPoolCreate` /
//! `cuMemPoolDestroy` hooks; held across `fork` by the fork handlers.

use std::collections::HashMap;

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

/// Remember a pool the driver created.
pub fn insert(pool: u64, location: Location) {
    POOLS.lock().get_or_insert_with(HashMap::new).insert(pool, location);
}

/// Forget a pool the driver destroyed.
pub fn remove(pool: u64) {
    if let Some(map) = POOLS.lock().as_mut() {
        map.remove(&pool);
    }
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
