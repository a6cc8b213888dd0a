//! What this process counted, by handle: so that a free gives back exactly what its
//! allocation counted, and a free of something never counted is passed through untouched.
//!
//! Sharded by handle so that threads allocating at once rarely meet on one lock. Every
//! shard is a [`SpinLock`], which the fork handlers can hold across `fork` and release in
//! both processes.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use crate::spinlock::SpinLock;

/// The handle namespaces (a device pointer and an array handle may have equal values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// cuMemAlloc*, cuMemAllocPitch, cuMemAllocManaged, cuMemAlloc(FromPool)Async.
    DevicePtr,
    /// cuArrayCreate / cuArray3DCreate.
    Array,
    /// cuMipmappedArrayCreate.
    Mipmap,
    /// cuMemCreate.
    Physical,
}

/// One counted allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counted {
    /// Device index in the vGPU's usage file.
    pub device: usize,
    pub bytes: u64,
}

const SHARDS: usize = 16;

/// SipHash with fixed keys: the keys are handles the driver hands out, which the program
/// cannot choose, and fixed keys spare each allocating thread a `getrandom` call.
type Table = HashMap<(Kind, u64), Counted, BuildHasherDefault<DefaultHasher>>;

type Shard = SpinLock<Option<Table>>;

static TABLE: [Shard; SHARDS] = [const { SpinLock::new(None) }; SHARDS];

fn shard(handle: u64) -> &'static Shard {
    // Device pointers are at least 256-byte aligned; mix in the higher bits.
    let h = (handle >> 9) ^ (handle >> 21) ^ (handle >> 33);
    &TABLE[(h as usize) % SHARDS]
}

/// Remember a counted allocation.
pub fn insert(kind: Kind, handle: u64, counted: Counted) {
    let mut shard = shard(handle).lock();
    shard.get_or_insert_with(Table::default).insert((kind, handle), counted);
}

/// Forget an allocation, returning what it counted (`None`: never counted here).
pub fn remove(kind: Kind, handle: u64) -> Option<Counted> {
    let mut shard = shard(handle).lock();
    shard.as_mut()?.remove(&(kind, handle))
}

/// Fork prepare: hold every shard (in order) so the copied table is consistent.
pub fn lock_all() {
    for shard in &TABLE {
        shard.acquire();
    }
}

/// Fork parent: release what [`lock_all`] took.
///
/// # Safety
/// Only after [`lock_all`] in this thread.
pub unsafe fn unlock_all() {
    for shard in &TABLE {
        // SAFETY: held by this thread since lock_all; no guard exists.
        unsafe { shard.force_unlock() };
    }
}

/// Fork child: the parent's allocations are not the child's to free or count. Clearing
/// keeps the maps' memory, so this allocates nothing.
///
/// # Safety
/// Only after [`lock_all`] in the forking thread, in the child.
pub unsafe fn reset_in_child() {
    for shard in &TABLE {
        // SAFETY: this (only) thread holds every shard since lock_all.
        unsafe {
            if let Some(map) = shard.get_locked() {
                map.clear();
            }
            shard.force_unlock();
        }
    }
}
