//! Memory pools: the default and current pool of each device, pool attributes (release
//! threshold, reuse flags, used and reserved memory with resettable high-water marks),
//! trimming and access.
//!
//! A pool *reserves* device memory (charged to the device like any allocation) and hands
//! it out to stream-ordered allocations (`cuMemAllocAsync`, `cuMemAllocFromPoolAsync`).
//! A freed allocation's memory stays reserved in the pool, up to the release threshold
//! (default 0), and the next allocation that fits in what the pool holds unused takes it
//! without charging the device again. Memory above the threshold goes back to the device
//! at the free (the real driver gives it back at the next synchronization); `cuMemPoolTrimTo`
//! gives back what is unused down to the bytes asked to keep.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};

use cudarc::driver::sys::{
    cuuint64_t, CUdevice, CUmemAccessDesc, CUmemAccess_flags, CUmemLocation, CUmemLocationType,
    CUmemPool_attribute, CUmemoryPool, CUresult,
};

use super::process::{self, Process};
use super::{entry, CuResult};
use crate::ffi;

/// A memory pool of one device.
#[derive(Debug, Clone, Default)]
pub(crate) struct Pool {
    pub ordinal: usize,
    /// Driver device index.
    pub device: usize,
    pub default: bool,
    pub release_threshold: u64,
    /// REUSE_FOLLOW_EVENT_DEPENDENCIES, REUSE_ALLOW_OPPORTUNISTIC,
    /// REUSE_ALLOW_INTERNAL_DEPENDENCIES (all on by default).
    pub reuse: [c_int; 3],
    /// Bytes of live allocations from the pool.
    pub used: u64,
    pub used_high: u64,
    /// Bytes the pool holds on the device (used + cached).
    pub reserved: u64,
    pub reserved_high: u64,
    /// Access granted to other ordinals (`CUmemAccess_flags` as raw integers).
    pub access: HashMap<usize, u32>,
}

const ACCESS_NONE: u32 = CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE as u32;
const ACCESS_READ: u32 = CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ as u32;
const ACCESS_RW: u32 = CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE as u32;

impl Process {
    /// A new pool on CUDA ordinal `ordinal` (checked by the caller).
    pub(crate) fn new_pool(&mut self, ordinal: usize, default: bool) -> u64 {
        let handle = self.new_handle();
        let device = self.visible[ordinal];
        self.pools.insert(
            handle,
            Pool {
                ordinal,
                device,
                default,
                reuse: [1, 1, 1],
                ..Pool::default()
            },
        );
        handle
    }

    /// The default pool of `ordinal`, created on first use.
    pub(crate) fn default_pool_of(&mut self, ordinal: usize) -> CuResult<u64> {
        let existing = *self
            .default_pool
            .get(ordinal)
            .ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)?;
        if existing != 0 {
            return Ok(existing);
        }
        let handle = self.new_pool(ordinal, true);
        self.default_pool[ordinal] = handle;
        Ok(handle)
    }

    /// The pool cuMemAllocAsync takes from on `ordinal`.
    pub(crate) fn current_pool_of(&mut self, ordinal: usize) -> CuResult<u64> {
        match self.current_pool.get(ordinal).copied() {
            Some(0) | None => self.default_pool_of(ordinal),
            Some(pool) if self.pools.contains_key(&pool) => Ok(pool),
            Some(_) => {
                self.current_pool[ordinal] = 0;
                self.default_pool_of(ordinal)
            }
        }
    }

    /// Whether the pool holds `size` unused bytes (the allocation then takes them, counted
    /// by [`pool_used`](Self::pool_used)).
    pub(crate) fn pool_take_cached(&mut self, pool: u64, size: u64) -> bool {
        self.pools
            .get(&pool)
            .is_some_and(|p| p.reserved - p.used >= size)
    }

    /// Count an allocation of `size` from `pool`; `from_cache`: it took reserved memory,
    /// else the pool reserved `size` more.
    pub(crate) fn pool_used(&mut self, pool: u64, size: u64, from_cache: bool) {
        if let Some(p) = self.pools.get_mut(&pool) {
            p.used += size;
            p.used_high = p.used_high.max(p.used);
            if !from_cache {
                p.reserved += size;
                p.reserved_high = p.reserved_high.max(p.reserved);
            }
        }
    }

    /// An allocation of `size` from `pool` was freed: the pool keeps the memory up to its
    /// release threshold and gives the rest back to the device. False if the pool is gone
    /// (the caller gives the memory back).
    pub(crate) fn pool_freed(&mut self, pool: u64, size: u64) -> bool {
        let Some(p) = self.pools.get_mut(&pool) else {
            return false;
        };
        p.used = p.used.saturating_sub(size);
        let keep = p.release_threshold.max(p.used);
        let release = p.reserved.saturating_sub(keep);
        self.pool_release(pool, release);
        true
    }

    /// Give `bytes` of `pool`'s unused reserved memory back to the device.
    fn pool_release(&mut self, pool: u64, bytes: u64) {
        let Some(p) = self.pools.get_mut(&pool) else {
            return;
        };
        let bytes = bytes.min(p.reserved - p.used);
        if bytes == 0 {
            return;
        }
        p.reserved -= bytes;
        let device = p.device;
        self.uncharge(device, bytes);
        if self.pools.get(&pool).is_some_and(|p| p.reserved == 0) {
            self.release_slot_if_unused(device);
        }
    }

    /// Give back the unused memory of every pool of driver device `device`.
    pub(crate) fn trim_pools_of(&mut self, device: usize) {
        let pools: Vec<u64> = self
            .pools
            .iter()
            .filter(|(_, p)| p.device == device)
            .map(|(&h, _)| h)
            .collect();
        for pool in pools {
            self.pool_release(pool, u64::MAX);
        }
    }

    /// cuMemPoolDestroy: unused memory goes back; live allocations stay charged until freed.
    pub(crate) fn destroy_pool(&mut self, pool: u64) -> CuResult {
        let p = self
            .pools
            .get(&pool)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        if p.default {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (ordinal, device) = (p.ordinal, p.device);
        self.pool_release(pool, u64::MAX);
        // Live allocations keep their bytes charged; they are given back when freed.
        self.pools.remove(&pool);
        if self.current_pool.get(ordinal) == Some(&pool) {
            self.current_pool[ordinal] = 0;
        }
        self.release_slot_if_unused(device);
        Ok(())
    }

    fn pool(&mut self, pool: CUmemoryPool) -> CuResult<&mut Pool> {
        self.pools
            .get_mut(&(pool as u64))
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
    }
}

fn pool_out(out: *mut CUmemoryPool, handle: u64) -> CuResult {
    // SAFETY: `out` is NULL or writable (driver API contract).
    Ok(unsafe { ffi::write(out, handle as usize as CUmemoryPool) }?)
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(
    pool_out_: *mut CUmemoryPool,
    dev: CUdevice,
) -> CUresult {
    entry(|| {
        if pool_out_.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let handle = process::with(|p| {
            p.device_of(dev)?;
            p.default_pool_of(dev as usize)
        })?;
        pool_out(pool_out_, handle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult {
    entry(|| {
        if pool.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let handle = process::with(|p| {
            p.device_of(dev)?;
            p.current_pool_of(dev as usize)
        })?;
        pool_out(pool, handle)
    })
}

/// The pool must be one of `dev`'s (CUDA_ERROR_INVALID_VALUE otherwise).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceSetMemPool(dev: CUdevice, pool: CUmemoryPool) -> CUresult {
    entry(|| {
        process::with(|p| {
            p.device_of(dev)?;
            let ordinal = dev as usize;
            if p.pool(pool)?.ordinal != ordinal {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            p.current_pool[ordinal] = pool as u64;
            Ok(())
        })
    })
}

const REUSE_FOLLOW: u32 =
    CUmemPool_attribute::CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES as u32;
const REUSE_INTERNAL: u32 =
    CUmemPool_attribute::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES as u32;
const RELEASE_THRESHOLD: u32 = CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD as u32;
const RESERVED_CURRENT: u32 = CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT as u32;
const RESERVED_HIGH: u32 = CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH as u32;
const USED_CURRENT: u32 = CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT as u32;
const USED_HIGH: u32 = CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH as u32;

/// Reuse flags are `int`s, the rest `cuuint64_t`s (cuda.h).
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: CUmemoryPool,
    attr: CUmemPool_attribute,
    value: *mut c_void,
) -> CUresult {
    // SAFETY: `attr` is a local copy of the argument; read as a raw integer.
    let attr = unsafe { ffi::read_enum(&attr) };
    entry(|| {
        if value.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let got = process::with(|p| {
            let pool = p.pool(pool)?;
            Ok(match attr {
                REUSE_FOLLOW..=REUSE_INTERNAL => Err(pool.reuse[(attr - REUSE_FOLLOW) as usize]),
                RELEASE_THRESHOLD => Ok(pool.release_threshold),
                RESERVED_CURRENT => Ok(pool.reserved),
                RESERVED_HIGH => Ok(pool.reserved_high),
                USED_CURRENT => Ok(pool.used),
                USED_HIGH => Ok(pool.used_high),
                _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
            })
        })?;
        // SAFETY: `value` is non-NULL and points to the attribute's type (int for the reuse
        // flags, cuuint64_t otherwise; driver API contract).
        unsafe {
            match got {
                Err(flag) => ffi::write(value.cast::<c_int>(), flag)?,
                Ok(bytes) => ffi::write(value.cast::<cuuint64_t>(), bytes)?,
            }
        }
        Ok(())
    })
}

/// The high-water marks can only be reset (to the current value) by setting 0; the
/// current values are read-only (CUDA_ERROR_INVALID_VALUE).
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: CUmemoryPool,
    attr: CUmemPool_attribute,
    value: *mut c_void,
) -> CUresult {
    // SAFETY: `attr` is a local copy of the argument; read as a raw integer.
    let attr = unsafe { ffi::read_enum(&attr) };
    entry(|| {
        if value.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `value` is non-NULL and points to the attribute's type (int for the reuse
        // flags, cuuint64_t otherwise; driver API contract).
        let (flag, bytes) = unsafe {
            match attr {
                REUSE_FOLLOW..=REUSE_INTERNAL => (ffi::read(value.cast::<c_int>())?, 0),
                _ => (0, ffi::read(value.cast::<cuuint64_t>())?),
            }
        };
        process::with(|p| {
            let handle = pool as u64;
            let pool = p.pool(pool)?;
            match attr {
                REUSE_FOLLOW..=REUSE_INTERNAL => pool.reuse[(attr - REUSE_FOLLOW) as usize] = flag,
                RELEASE_THRESHOLD => pool.release_threshold = bytes,
                RESERVED_HIGH if bytes == 0 => pool.reserved_high = pool.reserved,
                USED_HIGH if bytes == 0 => pool.used_high = pool.used,
                _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
            }
            if attr == RELEASE_THRESHOLD {
                // Lowering the threshold gives back what the pool no longer keeps (the real
                // driver does at the next synchronization).
                let keep = bytes.max(pool.used);
                let excess = pool.reserved.saturating_sub(keep);
                p.pool_release(handle, excess);
            }
            Ok(())
        })
    })
}

/// Give back unused memory until at most `min_bytes_to_keep` are reserved (or none unused
/// is left).
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: CUmemoryPool, min_bytes_to_keep: usize) -> CUresult {
    entry(|| {
        process::with(|p| {
            let handle = pool as u64;
            let pool = p.pool(pool)?;
            let excess = pool.reserved.saturating_sub(min_bytes_to_keep as u64);
            p.pool_release(handle, excess);
            Ok(())
        })
    })
}

/// Access of other devices to the pool's memory. The owning device always has read-write
/// access (changing it is CUDA_ERROR_INVALID_DEVICE); locations must be devices.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAccess(
    pool: CUmemoryPool,
    map: *const CUmemAccessDesc,
    count: usize,
) -> CUresult {
    entry(|| {
        if count > 0 && map.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let mut wanted = Vec::with_capacity(count);
        for i in 0..count {
            // SAFETY: `map` holds `count` descriptors (driver API contract); the enum fields
            // are read as raw integers, `id` is a plain int.
            let (location_type, id, flags) = unsafe {
                let d = map.add(i);
                (
                    ffi::read_enum(std::ptr::addr_of!((*d).location.type_)),
                    std::ptr::addr_of!((*d).location.id).read_unaligned(),
                    ffi::read_enum(std::ptr::addr_of!((*d).flags)),
                )
            };
            if location_type != CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE as u32
                || ![ACCESS_NONE, ACCESS_READ, ACCESS_RW].contains(&flags)
            {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            wanted.push((id, flags));
        }
        process::with(|p| {
            for &(id, _) in &wanted {
                p.device_of(id)?;
            }
            let pool = p.pool(pool)?;
            for &(id, flags) in &wanted {
                let ordinal = id as usize;
                if ordinal == pool.ordinal {
                    if flags != ACCESS_RW {
                        return Err(CUresult::CUDA_ERROR_INVALID_DEVICE);
                    }
                    continue;
                }
                pool.access.insert(ordinal, flags);
            }
            Ok(())
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAccess(
    flags: *mut CUmemAccess_flags,
    pool: CUmemoryPool,
    location: *mut CUmemLocation,
) -> CUresult {
    entry(|| {
        if flags.is_null() || location.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `location` is non-NULL and points to a CUmemLocation (driver API
        // contract); the enum field is read as a raw integer, `id` is a plain int.
        let (location_type, id) = unsafe {
            (
                ffi::read_enum(std::ptr::addr_of!((*location).type_)),
                std::ptr::addr_of!((*location).id).read_unaligned(),
            )
        };
        if location_type != CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE as u32 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let access = process::with(|p| {
            p.device_of(id)?;
            let pool = p.pool(pool)?;
            let ordinal = id as usize;
            Ok(if ordinal == pool.ordinal {
                ACCESS_RW
            } else {
                pool.access.get(&ordinal).copied().unwrap_or(ACCESS_NONE)
            })
        })?;
        // SAFETY: `flags` is non-NULL and points to a 4-byte C enum (driver API contract);
        // written as the raw integer.
        Ok(unsafe { ffi::write(flags.cast::<u32>(), access) }?)
    })
}
