//! What programs ask at start: stream priorities, flags and contexts; context limits,
//! cache configuration, API version and id; the legacy `cuDeviceGetProperties`.
//!
//! Limits and cache configuration are remembered per context and change nothing else.

use std::ffi::{c_int, c_uint, c_ulonglong};

use cudarc::driver::sys::{
    CUcontext, CUdevice, CUdevice_attribute as A, CUdevprop, CUfunc_cache, CUlimit, CUresult,
    CUstream,
};

use super::init::attribute;
use super::occupancy::check_cache_config;
use super::process::{self, Process};
use super::{entry, CuResult, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD};
use crate::ffi;

/// (least, greatest) stream priority, as on A100 and H100: lower numbers are higher
/// priorities.
pub(crate) const STREAM_PRIORITY_RANGE: (c_int, c_int) = (0, -5);

/// `cuCtxGetApiVersion` of contexts made by the `_v2` and later entry points.
const API_VERSION: c_uint = 3020;

/// Values of the limits cuCtxGetLimit knows, indexed by `CUlimit`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits(pub [u64; 7]);

impl Default for Limits {
    /// The driver's defaults: 1 KiB stack, 1 MiB printf FIFO, 8 MiB malloc heap, sync depth
    /// 2, 2048 pending launches, 32-byte L2 fetch granularity, no persisting L2.
    fn default() -> Limits {
        Limits([1024, 1 << 20, 8 << 20, 2, 2048, 32, 0])
    }
}

/// `CU_LIMIT_MAX_L2_FETCH_GRANULARITY` and `CU_LIMIT_PERSISTING_L2_CACHE_SIZE`.
const L2_FETCH: usize = CUlimit::CU_LIMIT_MAX_L2_FETCH_GRANULARITY as usize;
const PERSISTING_L2: usize = CUlimit::CU_LIMIT_PERSISTING_L2_CACHE_SIZE as usize;

impl Process {
    /// (flags, priority) of a stream; the NULL, legacy and per-thread streams are default
    /// streams of priority 0.
    fn stream_props(&self, stream: CUstream) -> CuResult<(u32, c_int, u64)> {
        let ctx = self.stream_ctx(stream)?;
        let h = stream as usize;
        if h == 0 || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD {
            return Ok((0, 0, ctx));
        }
        let (flags, priority) = self.stream_info.get(&(h as u64)).copied().unwrap_or((0, 0));
        Ok((flags, priority, ctx))
    }

    /// `ctx`, or the current context for NULL.
    fn ctx_or_current(&self, ctx: CUcontext) -> CuResult<u64> {
        let h = ctx as u64;
        if h == 0 {
            return Ok(self.current_ctx()?.0);
        }
        if self.contexts.contains_key(&h) {
            Ok(h)
        } else {
            Err(CUresult::CUDA_ERROR_INVALID_CONTEXT)
        }
    }
}

/// Either pointer may be NULL (that value is not returned).
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetStreamPriorityRange(
    least_priority: *mut c_int,
    greatest_priority: *mut c_int,
) -> CUresult {
    entry(|| {
        process::with(|p| p.current_ctx().map(|_| ()))?;
        let (least, greatest) = STREAM_PRIORITY_RANGE;
        // SAFETY: each is NULL (skipped) or writable (driver API contract).
        unsafe {
            if !least_priority.is_null() {
                ffi::write(least_priority, least)?;
            }
            if !greatest_priority.is_null() {
                ffi::write(greatest_priority, greatest)?;
            }
        }
        Ok(())
    })
}

fn stream_priority(stream: CUstream, out: *mut c_int) -> CuResult {
    if out.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let (_, priority, _) = process::with(|p| p.stream_props(stream))?;
    // SAFETY: `out` is non-NULL and writable (driver API contract).
    Ok(unsafe { ffi::write(out, priority) }?)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetPriority(stream: CUstream, priority: *mut c_int) -> CUresult {
    entry(|| stream_priority(stream, priority))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetPriority_ptsz(
    stream: CUstream,
    priority: *mut c_int,
) -> CUresult {
    entry(|| stream_priority(stream, priority))
}

fn stream_flags(stream: CUstream, out: *mut c_uint) -> CuResult {
    if out.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let (flags, _, _) = process::with(|p| p.stream_props(stream))?;
    // SAFETY: `out` is non-NULL and writable (driver API contract).
    Ok(unsafe { ffi::write(out, flags) }?)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetFlags(stream: CUstream, flags: *mut c_uint) -> CUresult {
    entry(|| stream_flags(stream, flags))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetFlags_ptsz(stream: CUstream, flags: *mut c_uint) -> CUresult {
    entry(|| stream_flags(stream, flags))
}

fn stream_ctx(stream: CUstream, out: *mut CUcontext) -> CuResult {
    if out.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let (_, _, ctx) = process::with(|p| p.stream_props(stream))?;
    // SAFETY: `out` is non-NULL and writable (driver API contract).
    Ok(unsafe { ffi::write(out, ctx as usize as CUcontext) }?)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCtx(stream: CUstream, pctx: *mut CUcontext) -> CUresult {
    entry(|| stream_ctx(stream, pctx))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCtx_ptsz(stream: CUstream, pctx: *mut CUcontext) -> CUresult {
    entry(|| stream_ctx(stream, pctx))
}

fn stream_device(stream: CUstream, out: *mut CUdevice) -> CuResult {
    if out.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let ordinal = process::with(|p| {
        let (_, _, ctx) = p.stream_props(stream)?;
        p.contexts
            .get(&ctx)
            .map(|c| c.ordinal)
            .ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)
    })?;
    // SAFETY: `out` is non-NULL and writable (driver API contract).
    Ok(unsafe { ffi::write(out, ordinal as CUdevice) }?)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetDevice(stream: CUstream, device: *mut CUdevice) -> CUresult {
    entry(|| stream_device(stream, device))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetDevice_ptsz(
    stream: CUstream,
    device: *mut CUdevice,
) -> CUresult {
    entry(|| stream_device(stream, device))
}

/// Limits beyond `CU_LIMIT_PERSISTING_L2_CACHE_SIZE` (CUDA 12.x's shared-memory and CIG
/// limits) are CUDA_ERROR_UNSUPPORTED_LIMIT.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetLimit(pvalue: *mut usize, limit: CUlimit) -> CUresult {
    // SAFETY: `limit` is a local copy of the argument; read as a raw integer.
    let limit = unsafe { ffi::read_enum(&limit) } as usize;
    entry(|| {
        if pvalue.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let v = process::with(|p| {
            let limits = p.current_ctx()?.1.limits;
            limits
                .0
                .get(limit)
                .copied()
                .ok_or(CUresult::CUDA_ERROR_UNSUPPORTED_LIMIT)
        })?;
        // SAFETY: `pvalue` is non-NULL and writable (driver API contract).
        Ok(unsafe { ffi::write(pvalue, v as usize) }?)
    })
}

/// The L2 fetch granularity must be 0, 32, 64 or 128 bytes; the persisting L2 size is
/// capped at three quarters of the L2 cache (`cudaDevAttrMaxPersistingL2CacheSize`).
#[no_mangle]
pub unsafe extern "C" fn cuCtxSetLimit(limit: CUlimit, value: usize) -> CUresult {
    // SAFETY: `limit` is a local copy of the argument; read as a raw integer.
    let limit = unsafe { ffi::read_enum(&limit) } as usize;
    entry(|| {
        process::with(|p| {
            let (ctx, context) = p.current_ctx()?;
            let device = context.device;
            if limit >= Limits::default().0.len() {
                return Err(CUresult::CUDA_ERROR_UNSUPPORTED_LIMIT);
            }
            let mut value = value as u64;
            if limit == L2_FETCH && ![0, 32, 64, 128].contains(&value) {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            if limit == PERSISTING_L2 {
                let config = &p.device(device)?.config;
                let l2 = attribute(config, A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE as c_uint)
                    .unwrap_or(0)
                    .max(0) as u64;
                value = value.min(l2 / 4 * 3);
            }
            if let Some(c) = p.contexts.get_mut(&ctx) {
                c.limits.0[limit] = value;
            }
            Ok(())
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCacheConfig(pconfig: *mut CUfunc_cache) -> CUresult {
    entry(|| {
        if pconfig.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let config = process::with(|p| Ok(p.current_ctx()?.1.cache_config))?;
        // SAFETY: `pconfig` is non-NULL and points to a 4-byte C enum (driver API
        // contract); written as the raw integer.
        Ok(unsafe { ffi::write(pconfig.cast::<u32>(), config) }?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCacheConfig(config: CUfunc_cache) -> CUresult {
    // SAFETY: `config` is a local copy of the argument; read as a raw integer.
    let config = unsafe { ffi::read_enum(&config) };
    entry(|| {
        check_cache_config(config)?;
        process::with(|p| {
            let (ctx, _) = p.current_ctx()?;
            if let Some(c) = p.contexts.get_mut(&ctx) {
                c.cache_config = config;
            }
            Ok(())
        })
    })
}

/// 3020 for every context (NULL: the current one).
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetApiVersion(ctx: CUcontext, version: *mut c_uint) -> CUresult {
    entry(|| {
        if version.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        process::with(|p| p.ctx_or_current(ctx).map(|_| ()))?;
        // SAFETY: `version` is non-NULL and writable (driver API contract).
        Ok(unsafe { ffi::write(version, API_VERSION) }?)
    })
}

/// Unique over the process's lifetime (NULL: the current context).
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetId(ctx: CUcontext, ctx_id: *mut c_ulonglong) -> CUresult {
    entry(|| {
        if ctx_id.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let id = process::with(|p| {
            let h = p.ctx_or_current(ctx)?;
            Ok(p.contexts.get(&h).map_or(0, |c| c.id))
        })?;
        // SAFETY: `ctx_id` is non-NULL and writable (driver API contract).
        Ok(unsafe { ffi::write(ctx_id, id) }?)
    })
}

/// The legacy properties, from the same figures as cuDeviceGetAttribute.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetProperties(prop: *mut CUdevprop, dev: CUdevice) -> CUresult {
    entry(|| {
        if prop.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let value = process::with(|p| {
            let device = p.device_of(dev)?;
            let config = &p.device(device)?.config;
            let a = |x: A| attribute(config, x as c_uint).unwrap_or(0);
            Ok(CUdevprop {
                maxThreadsPerBlock: a(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
                maxThreadsDim: [
                    a(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X),
                    a(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y),
                    a(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z),
                ],
                maxGridSize: [
                    a(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X),
                    a(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y),
                    a(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z),
                ],
                sharedMemPerBlock: a(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK),
                totalConstantMemory: a(A::CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY),
                SIMDWidth: a(A::CU_DEVICE_ATTRIBUTE_WARP_SIZE),
                memPitch: a(A::CU_DEVICE_ATTRIBUTE_MAX_PITCH),
                regsPerBlock: a(A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK),
                clockRate: a(A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE),
                textureAlign: a(A::CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT),
            })
        })?;
        // SAFETY: `prop` is non-NULL and points to a writable CUdevprop (driver API
        // contract).
        Ok(unsafe { ffi::write(prop, value) }?)
    })
}
