//! Linear device memory: cuMemAlloc, pitch, managed, async and pool allocations, frees,
//! cuMemGetInfo; pinned host memory (real host memory, never counted on a device).
//!
//! Device allocations get distinct, aligned addresses (2 MiB for 2 MiB and more, 512 bytes
//! below) with no host memory behind them, and are charged at exactly the size asked for
//! (pitch × height for pitched ones).

use std::ffi::{c_uint, c_void};

use cudarc::driver::sys::{
    CUdeviceptr, CUmemAllocationType, CUmemAttach_flags, CUmemLocationType, CUmemPoolProps,
    CUmemoryPool, CUresult, CUstream,
};

use super::pointer::Kind;
use super::process::{self, Alloc, Process};
use super::{entry, CuResult, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD};
use crate::ffi;

/// Alignment of large allocations, and the VMM granularity.
pub(crate) const LARGE_PAGE: u64 = 2 << 20;
/// Row alignment of cuMemAllocPitch.
pub(crate) const PITCH_ALIGNMENT: u64 = 512;

impl Process {
    /// Charge `size` bytes on `device` and give them an address; owned by context `ctx`.
    pub(crate) fn alloc_device(&mut self, device: usize, size: u64, ctx: u64) -> CuResult<u64> {
        self.alloc_device_as(device, size, ctx, false, 0)
    }

    /// [`alloc_device`](Self::alloc_device) of managed memory, or from pool `pool`, whose
    /// cached bytes it takes first (then nothing more is charged).
    pub(crate) fn alloc_device_as(
        &mut self,
        device: usize,
        size: u64,
        ctx: u64,
        managed: bool,
        pool: u64,
    ) -> CuResult<u64> {
        if size == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let from_cache = pool != 0 && self.pool_take_cached(pool, size);
        if !from_cache {
            self.charge(device, size)?;
        }
        let align = if size >= LARGE_PAGE {
            LARGE_PAGE
        } else {
            PITCH_ALIGNMENT
        };
        match self.alloc_va(size, align) {
            Ok(ptr) => {
                self.next_buffer_id += 1;
                let id = self.next_buffer_id;
                self.allocs.insert(
                    ptr,
                    Alloc {
                        device,
                        size,
                        ctx,
                        managed,
                        pool,
                        id,
                    },
                );
                if pool != 0 {
                    self.pool_used(pool, size, from_cache);
                }
                Ok(ptr)
            }
            Err(e) => {
                if !from_cache {
                    self.uncharge(device, size);
                }
                Err(e)
            }
        }
    }

    /// Free a pointer returned by [`alloc_device`](Self::alloc_device).
    pub(crate) fn free_device(&mut self, ptr: u64) -> CuResult {
        let alloc = self
            .allocs
            .remove(&ptr)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        self.release_alloc(ptr, alloc);
        Ok(())
    }

    /// Give back the memory of `alloc` (at `ptr`, already out of `allocs`): to its pool,
    /// which keeps it up to its release threshold, or to the device.
    pub(crate) fn release_alloc(&mut self, ptr: u64, alloc: Alloc) {
        if !(alloc.pool != 0 && self.pool_freed(alloc.pool, alloc.size)) {
            self.uncharge(alloc.device, alloc.size);
        }
        self.free_va(ptr);
        self.ipc_forget_export(ptr, alloc.id);
    }

    /// The context a stream belongs to (NULL and the special handles: the current one).
    pub(crate) fn stream_ctx(&self, stream: CUstream) -> CuResult<u64> {
        let h = stream as usize;
        if h == 0 || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD {
            return Ok(self.current_ctx()?.0);
        }
        self.streams
            .get(&(h as u64))
            .copied()
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
    }

    /// The device of context `ctx`.
    pub(crate) fn ctx_device(&self, ctx: u64) -> CuResult<usize> {
        self.contexts
            .get(&ctx)
            .map(|c| c.device)
            .ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)
    }

    /// Allocate in the calling thread's current context.
    fn alloc_current(&mut self, size: u64) -> CuResult<u64> {
        let (ctx, context) = self.current_ctx()?;
        let device = context.device;
        self.alloc_device(device, size, ctx)
    }
}

fn store_ptr(dptr: *mut CUdeviceptr, ptr: u64) -> CuResult {
    // SAFETY: `dptr` is NULL or writable (driver API contract).
    Ok(unsafe { ffi::write(dptr, ptr) }?)
}

/// Allocate with `alloc`, then store the pointer; undo the allocation if `dptr` is NULL.
fn alloc_into(
    dptr: *mut CUdeviceptr,
    alloc: impl FnOnce(&mut Process) -> CuResult<u64>,
) -> CuResult {
    if dptr.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let ptr = process::with(alloc)?;
    store_ptr(dptr, ptr)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    entry(|| alloc_into(dptr, |p| p.alloc_current(bytesize as u64)))
}

/// Pitch = width rounded up to 512 bytes; pitch × height bytes are charged.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width_bytes: usize,
    height: usize,
    element_size: c_uint,
) -> CUresult {
    entry(|| {
        if pitch.is_null() || width_bytes == 0 || height == 0 || ![4, 8, 16].contains(&element_size)
        {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let row = (width_bytes as u64)
            .checked_next_multiple_of(PITCH_ALIGNMENT)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let size = row
            .checked_mul(height as u64)
            .ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
        alloc_into(dptr, |p| p.alloc_current(size))?;
        // SAFETY: `pitch` is non-NULL and writable (driver API contract).
        Ok(unsafe { ffi::write(pitch, row as usize) }?)
    })
}

/// Managed memory is charged to the current context's device in full.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    flags: c_uint,
) -> CUresult {
    entry(|| {
        let global = CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL as c_uint;
        let host = CUmemAttach_flags::CU_MEM_ATTACH_HOST as c_uint;
        if flags != global && flags != host {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        alloc_into(dptr, |p| {
            let (ctx, context) = p.current_ctx()?;
            let device = context.device;
            p.alloc_device_as(device, bytesize as u64, ctx, true, 0)
        })
    })
}

/// Freeing 0 is a no-op; an unknown pointer is CUDA_ERROR_INVALID_VALUE.
#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    entry(|| {
        process::with(|p| {
            p.current_ctx()?;
            if dptr == 0 {
                return Ok(());
            }
            p.free_device(dptr)
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    pbase: *mut CUdeviceptr,
    psize: *mut usize,
    dptr: CUdeviceptr,
) -> CUresult {
    entry(|| {
        let (base, size) = process::with(|p| {
            p.current_ctx()?;
            match p.region(dptr) {
                Some(r) if r.kind != Kind::Host => Ok((r.base, r.size)),
                _ => Err(CUresult::CUDA_ERROR_NOT_FOUND),
            }
        })?;
        // SAFETY: both are NULL (not wanted) or writable (driver API contract).
        unsafe {
            if !pbase.is_null() {
                ffi::write(pbase, base)?;
            }
            if !psize.is_null() {
                ffi::write(psize, size as usize)?;
            }
        }
        Ok(())
    })
}

/// Device memory of the current context's device: total, and total minus what every
/// process uses (device-wide, like the real driver).
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    entry(|| {
        let (free_bytes, total_bytes) = process::with(|p| {
            let device = p.device(p.current_ctx()?.1.device)?;
            let total = device.config.memory;
            Ok((total.saturating_sub(device.state.used()), total))
        })?;
        // SAFETY: both are NULL or writable (driver API contract).
        unsafe {
            ffi::write(free, free_bytes as usize)?;
            ffi::write(total, total_bytes as usize)?;
        }
        Ok(())
    })
}

fn alloc_host(pp: *mut *mut c_void, bytesize: usize) -> CuResult {
    if pp.is_null() || bytesize == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    process::with(|p| {
        let (ctx, _) = p.current_ctx()?;
        let mut mem: *mut c_void = std::ptr::null_mut();
        // SAFETY: posix_memalign writes one pointer to `mem`, a valid local.
        if unsafe { libc::posix_memalign(&mut mem, 4096, bytesize) } != 0 || mem.is_null() {
            return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        }
        p.host.insert(mem as usize, (bytesize, ctx));
        // SAFETY: `pp` is non-NULL and writable (driver API contract).
        unsafe { ffi::write(pp, mem) }?;
        Ok(())
    })
}

/// Real, page-aligned host memory; not device memory, so never charged.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize) -> CUresult {
    entry(|| alloc_host(pp, bytesize))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(
    pp: *mut *mut c_void,
    bytesize: usize,
    _flags: c_uint,
) -> CUresult {
    entry(|| alloc_host(pp, bytesize))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(ptr: *mut c_void) -> CUresult {
    entry(|| {
        process::with(|p| {
            p.current_ctx()?;
            if p.host.remove(&(ptr as usize)).is_none() {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            // SAFETY: `ptr` came from posix_memalign in alloc_host and was not freed since
            // (it was still in the set).
            unsafe { libc::free(ptr) };
            Ok(())
        })
    })
}

fn alloc_async(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) -> CuResult {
    alloc_into(dptr, |p| {
        let ctx = p.stream_ctx(stream)?;
        let ordinal = p
            .contexts
            .get(&ctx)
            .map(|c| c.ordinal)
            .ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
        let pool = p.current_pool_of(ordinal)?;
        let device = p.ctx_device(ctx)?;
        p.alloc_device_as(device, bytesize as u64, ctx, false, pool)
    })
}

/// From the device's current pool (cuDeviceSetMemPool; the default pool otherwise); charged
/// at once (the simulated stream has already reached the allocation).
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
) -> CUresult {
    entry(|| alloc_async(dptr, bytesize, stream))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
) -> CUresult {
    entry(|| alloc_async(dptr, bytesize, stream))
}

fn free_async(dptr: CUdeviceptr, stream: CUstream) -> CuResult {
    process::with(|p| {
        p.stream_ctx(stream)?;
        p.free_device(dptr)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    entry(|| free_async(dptr, stream))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    entry(|| free_async(dptr, stream))
}

/// Pools must be pinned device memory of a visible device.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolCreate(
    pool: *mut CUmemoryPool,
    props: *const CUmemPoolProps,
) -> CUresult {
    entry(|| {
        if pool.is_null() || props.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `props` is non-NULL and points to a CUmemPoolProps (driver API contract);
        // the enum fields are read as raw integers and `id` is a plain int.
        let (alloc_type, location_type, id) = unsafe {
            (
                ffi::read_enum(std::ptr::addr_of!((*props).allocType)),
                ffi::read_enum(std::ptr::addr_of!((*props).location.type_)),
                std::ptr::addr_of!((*props).location.id).read_unaligned(),
            )
        };
        if alloc_type != CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED as u32
            || location_type != CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE as u32
        {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let handle = process::with(|p| {
            p.device_of(id)?;
            Ok(p.new_pool(id as usize, false))
        })?;
        // SAFETY: `pool` is non-NULL and writable (driver API contract).
        Ok(unsafe { ffi::write(pool, handle as usize as CUmemoryPool) }?)
    })
}

/// Allocations from the pool stay valid (and charged) until freed; its cached memory goes
/// back to the device. A default pool cannot be destroyed (CUDA_ERROR_INVALID_VALUE).
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    entry(|| process::with(|p| p.destroy_pool(pool as u64)))
}

fn alloc_from_pool(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CuResult {
    alloc_into(dptr, |p| {
        let device = p
            .pools
            .get(&(pool as u64))
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?
            .device;
        let ctx = p.stream_ctx(stream)?;
        p.alloc_device_as(device, bytesize as u64, ctx, false, pool as u64)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    entry(|| alloc_from_pool(dptr, bytesize, pool, stream))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    entry(|| alloc_from_pool(dptr, bytesize, pool, stream))
}
