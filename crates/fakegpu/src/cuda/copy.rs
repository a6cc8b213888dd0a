//! Copies and fills: `cuMemcpy*` (1D, 2D, 3D for linear memory; host, device, unified,
//! peer; sync and async, with their `_ptds`/`_ptsz` variants) and `cuMemset*`.
//!
//! The simulated memory has no bytes, so nothing is copied: each device range is checked
//! against the live allocations (start and end inside one allocation, else
//! `CUDA_ERROR_INVALID_VALUE`; host pointers are not checked), then the operation takes
//! simulated time, bytes / rate: `copy_gbps` of the device for copies that cross PCIe (host
//! ↔ device, device ↔ another device), `device_copy_gbps` for copies within one device's
//! memory and for fills. Copies run on copy engines, not the SMs: they do not enter the
//! device's kernel FIFO (nor NVML utilization), but they occupy their stream's timeline
//! like a kernel — an async copy starts at `max(now, stream ready)` and later work on the
//! stream waits for it — and a synchronous one blocks its caller until it ends.
//! Synchronous copies and fills run on the legacy stream (the per-thread stream for
//! `_ptds`), which first waits for the context's blocking streams. `cuCtxSynchronize` waits
//! for the process's copies too. A capturing stream records nothing for a copy (graphs
//! hold kernel and empty nodes only) and runs nothing.

use std::ffi::{c_uchar, c_uint, c_ushort, c_void};

use cudarc::driver::sys::{
    CUcontext, CUdeviceptr, CUmemorytype, CUresult, CUstream, CUstream_flags, CUDA_MEMCPY2D,
    CUDA_MEMCPY3D,
};

use super::ctx::wait_until;
use super::pointer::{in_device_window, Kind};
use super::process::{self, Process};
use super::stream::{StreamKey, Target};
use super::{entry, CuResult, CU_STREAM_PER_THREAD};
use crate::ffi::{self, now_ns};

/// One side of a copy.
#[derive(Debug, Clone, Copy)]
enum Mem {
    /// Must be memory the driver knows (device, managed, IPC, mapped or pinned host).
    Device(u64),
    /// Host memory: not checked.
    Host,
    /// Unified addressing: an address in the device window must be device memory, any
    /// other is host memory.
    Unified(u64),
    /// A CUDA array.
    Array(u64),
}

/// Where the work goes.
#[derive(Debug, Clone, Copy)]
enum How {
    /// On the calling thread's legacy stream (per-thread stream with `per_thread`), and
    /// wait for it.
    Sync { per_thread: bool },
    /// Queued on `stream`.
    Async { stream: CUstream, per_thread: bool },
    /// Peer copy: on `ctx`'s legacy stream, and wait for it.
    SyncIn { ctx: u64 },
}

const NON_BLOCKING: u32 = CUstream_flags::CU_STREAM_NON_BLOCKING as u32;

impl Process {
    /// The device `len` bytes at `mem` are on (`None`: host memory), after checking that
    /// they lie in one allocation.
    fn resolve(&self, mem: Mem, len: u64) -> CuResult<Option<usize>> {
        let bad = CUresult::CUDA_ERROR_INVALID_VALUE;
        let ptr = match mem {
            Mem::Host => return Ok(None),
            Mem::Array(handle) => {
                return self.arrays.get(&handle).map(|a| Some(a.device)).ok_or(bad)
            }
            Mem::Unified(ptr) if !in_device_window(ptr) && self.region(ptr).is_none() => {
                return Ok(None)
            }
            Mem::Device(ptr) | Mem::Unified(ptr) => ptr,
        };
        let region = self.region(ptr).ok_or(bad)?;
        let end = ptr.checked_add(len).ok_or(bad)?;
        if end > region.base + region.size {
            return Err(bad);
        }
        Ok(match region.kind {
            Kind::Host => None,
            _ => region.device,
        })
    }

    /// The rate of a copy between `dst` and `src` (devices; `None` for host memory), or of a
    /// fill of `dst` (`src` = `dst`), in GB/s.
    fn copy_rate(
        &self,
        dst: Option<usize>,
        src: Option<usize>,
        ctx_device: usize,
    ) -> CuResult<f64> {
        let config = |d: usize| self.device(d).map(|dev| &dev.config);
        Ok(match (dst, src) {
            (Some(a), Some(b)) if a == b => config(a)?.device_copy_gbps,
            (Some(a), Some(b)) => config(a)?.copy_gbps.min(config(b)?.copy_gbps),
            (Some(d), None) | (None, Some(d)) => config(d)?.copy_gbps,
            (None, None) => config(ctx_device)?.copy_gbps,
        })
    }

    /// When the legacy stream of `ctx` may start new work: after its own work and the
    /// context's blocking streams' (created without CU_STREAM_NON_BLOCKING, and per-thread
    /// default streams).
    fn legacy_ready(&self, ctx: u64) -> u64 {
        self.timelines
            .iter()
            .filter(|(k, _)| k.ctx == ctx)
            .filter(|(k, _)| {
                k.handle == 0
                    || k.handle == CU_STREAM_PER_THREAD as u64
                    || self
                        .stream_info
                        .get(&k.handle)
                        .is_none_or(|&(flags, _)| flags & NON_BLOCKING == 0)
            })
            .map(|(_, s)| s.ready_ns)
            .max()
            .unwrap_or(0)
    }

    /// Queue a copy of `duration_ns` on stream `key`; returns when it ends (now for a
    /// capturing stream, which records nothing).
    fn queue_copy(&mut self, key: StreamKey, duration_ns: u64) -> CuResult<u64> {
        let now = now_ns();
        match self.target(key)? {
            Target::Capture { .. } => Ok(now),
            Target::Queue { device, ready_ns } => {
                let ready = if key.handle == 0 {
                    ready_ns.max(self.legacy_ready(key.ctx))
                } else {
                    ready_ns
                };
                let end = now.max(ready).saturating_add(duration_ns);
                self.stream_state(key).ready_ns = end;
                let until = self.copies_until.entry(device).or_insert(0);
                *until = (*until).max(end);
                Ok(end)
            }
        }
    }

    /// When the copies this process queued on `device` end.
    pub(crate) fn copies_until(&self, device: usize) -> u64 {
        self.copies_until.get(&device).copied().unwrap_or(0)
    }
}

/// Simulated time of `bytes` at `gbps` (GB/s = bytes per ns).
pub(crate) fn copy_ns(bytes: u64, gbps: f64) -> u64 {
    if bytes == 0 || gbps <= 0.0 {
        return 0;
    }
    (bytes as f64 / gbps).ceil().min(u64::MAX as f64) as u64
}

/// Check, time and queue one copy (`src` `None`: a fill of `dst`): `dst`/`src` with the
/// extent of bytes they span, `bytes` moved.
fn submit(dst: (Mem, u64), src: Option<(Mem, u64)>, bytes: u64, how: How) -> CuResult {
    let deadline = process::with(|p| {
        let key = match how {
            How::Sync { per_thread } => p.stream_key(std::ptr::null_mut(), per_thread)?,
            How::Async { stream, per_thread } => p.stream_key(stream, per_thread)?,
            How::SyncIn { ctx } => StreamKey {
                ctx,
                handle: 0,
                thread: 0,
            },
        };
        let ctx_device = p.ctx_device(key.ctx)?;
        if bytes == 0 {
            return Ok(0);
        }
        let dst_device = p.resolve(dst.0, dst.1)?;
        let src_device = match src {
            Some((mem, len)) => p.resolve(mem, len)?,
            None => dst_device,
        };
        let gbps = p.copy_rate(dst_device, src_device, ctx_device)?;
        let end = p.queue_copy(key, copy_ns(bytes, gbps))?;
        Ok(match how {
            How::Async { .. } => 0,
            _ => end,
        })
    })?;
    wait_until(deadline);
    Ok(())
}

fn linear(dst: Mem, src: Mem, n: usize, how: How) -> CuResult {
    let n = n as u64;
    submit((dst, n), Some((src, n)), n, how)
}

fn peer(
    dst: CUdeviceptr,
    dst_ctx: CUcontext,
    src: CUdeviceptr,
    src_ctx: CUcontext,
    n: usize,
    stream: Option<(CUstream, bool)>,
) -> CuResult {
    let (dst_ctx, src_ctx) = (dst_ctx as u64, src_ctx as u64);
    process::with(|p| {
        for (ctx, ptr) in [(dst_ctx, dst), (src_ctx, src)] {
            let device = p.ctx_device(ctx)?;
            match p.region(ptr) {
                Some(r) if r.device == Some(device) => {}
                _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
            }
        }
        Ok(())
    })?;
    let how = match stream {
        Some((stream, per_thread)) => How::Async { stream, per_thread },
        None => How::SyncIn { ctx: dst_ctx },
    };
    linear(Mem::Device(dst), Mem::Device(src), n, how)
}

/// A `CUmemorytype` side of a 2D/3D copy.
fn side(
    kind: u32,
    host: *const c_void,
    device: CUdeviceptr,
    array: u64,
    offset: u64,
) -> CuResult<Mem> {
    let bad = CUresult::CUDA_ERROR_INVALID_VALUE;
    Ok(match kind {
        x if x == CUmemorytype::CU_MEMORYTYPE_HOST as u32 => {
            if host.is_null() {
                return Err(bad);
            }
            Mem::Host
        }
        x if x == CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 => {
            Mem::Device(device.checked_add(offset).ok_or(bad)?)
        }
        x if x == CUmemorytype::CU_MEMORYTYPE_UNIFIED as u32 => {
            Mem::Unified(device.checked_add(offset).ok_or(bad)?)
        }
        x if x == CUmemorytype::CU_MEMORYTYPE_ARRAY as u32 => Mem::Array(array),
        _ => return Err(bad),
    })
}

/// Byte offset of `(x, y, z)` and extent of a `width` × `height` × `depth` box in memory
/// of `pitch` bytes per row and `rows` rows per slice.
fn box_span(
    (x, y, z): (u64, u64, u64),
    (width, height, depth): (u64, u64, u64),
    pitch: u64,
    rows: u64,
) -> CuResult<(u64, u64)> {
    let bad = CUresult::CUDA_ERROR_INVALID_VALUE;
    if (height > 1 || depth > 1) && pitch < width {
        return Err(bad);
    }
    if depth > 1 && rows < height {
        return Err(bad);
    }
    let mul = |a: u64, b: u64| a.checked_mul(b).ok_or(bad);
    let add = |a: u64, b: u64| a.checked_add(b).ok_or(bad);
    let offset = add(mul(add(mul(z, rows)?, y)?, pitch)?, x)?;
    let last_row = add(
        mul(depth.saturating_sub(1), rows)?,
        height.saturating_sub(1),
    )?;
    let extent = add(mul(last_row, pitch)?, width)?;
    Ok((offset, extent))
}

fn copy_2d(p: *const CUDA_MEMCPY2D, how: How) -> CuResult {
    if p.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: `p` is non-NULL and points to a CUDA_MEMCPY2D (driver API contract); the enum
    // fields are read as raw integers.
    let (src_kind, dst_kind) = unsafe {
        (
            ffi::read_enum(std::ptr::addr_of!((*p).srcMemoryType)),
            ffi::read_enum(std::ptr::addr_of!((*p).dstMemoryType)),
        )
    };
    // SAFETY: as above; every field but the two enums (read raw above) is an integer or a
    // pointer, read one by one.
    let (sx, sy, shost, sdev, sarr, spitch, dx, dy, dhost, ddev, darr, dpitch, w, h) = unsafe {
        (
            std::ptr::addr_of!((*p).srcXInBytes).read_unaligned() as u64,
            std::ptr::addr_of!((*p).srcY).read_unaligned() as u64,
            std::ptr::addr_of!((*p).srcHost).read_unaligned(),
            std::ptr::addr_of!((*p).srcDevice).read_unaligned(),
            std::ptr::addr_of!((*p).srcArray).read_unaligned() as u64,
            std::ptr::addr_of!((*p).srcPitch).read_unaligned() as u64,
            std::ptr::addr_of!((*p).dstXInBytes).read_unaligned() as u64,
            std::ptr::addr_of!((*p).dstY).read_unaligned() as u64,
            std::ptr::addr_of!((*p).dstHost).read_unaligned(),
            std::ptr::addr_of!((*p).dstDevice).read_unaligned(),
            std::ptr::addr_of!((*p).dstArray).read_unaligned() as u64,
            std::ptr::addr_of!((*p).dstPitch).read_unaligned() as u64,
            std::ptr::addr_of!((*p).WidthInBytes).read_unaligned() as u64,
            std::ptr::addr_of!((*p).Height).read_unaligned() as u64,
        )
    };
    let (soff, sext) = box_span((sx, sy, 0), (w, h, 1), spitch, h)?;
    let (doff, dext) = box_span((dx, dy, 0), (w, h, 1), dpitch, h)?;
    let src = side(src_kind, shost, sdev, sarr, soff)?;
    let dst = side(dst_kind, dhost.cast_const(), ddev, darr, doff)?;
    let bytes = w.checked_mul(h).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    submit((dst, dext), Some((src, sext)), bytes, how)
}

fn copy_3d(p: *const CUDA_MEMCPY3D, how: How) -> CuResult {
    if p.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: `p` is non-NULL and points to a CUDA_MEMCPY3D (driver API contract); the enum
    // fields are read as raw integers, the rest are integers and pointers read one by one.
    let (src, dst, w, h, d, reserved) = unsafe {
        let r = |f: *const usize| f.read_unaligned() as u64;
        let src = (
            ffi::read_enum(std::ptr::addr_of!((*p).srcMemoryType)),
            std::ptr::addr_of!((*p).srcHost).read_unaligned(),
            std::ptr::addr_of!((*p).srcDevice).read_unaligned(),
            std::ptr::addr_of!((*p).srcArray).read_unaligned() as u64,
            (
                r(std::ptr::addr_of!((*p).srcXInBytes)),
                r(std::ptr::addr_of!((*p).srcY)),
                r(std::ptr::addr_of!((*p).srcZ)),
            ),
            r(std::ptr::addr_of!((*p).srcPitch)),
            r(std::ptr::addr_of!((*p).srcHeight)),
        );
        let dst = (
            ffi::read_enum(std::ptr::addr_of!((*p).dstMemoryType)),
            std::ptr::addr_of!((*p).dstHost)
                .read_unaligned()
                .cast_const(),
            std::ptr::addr_of!((*p).dstDevice).read_unaligned(),
            std::ptr::addr_of!((*p).dstArray).read_unaligned() as u64,
            (
                r(std::ptr::addr_of!((*p).dstXInBytes)),
                r(std::ptr::addr_of!((*p).dstY)),
                r(std::ptr::addr_of!((*p).dstZ)),
            ),
            r(std::ptr::addr_of!((*p).dstPitch)),
            r(std::ptr::addr_of!((*p).dstHeight)),
        );
        let reserved = !std::ptr::addr_of!((*p).reserved0)
            .read_unaligned()
            .is_null()
            || !std::ptr::addr_of!((*p).reserved1)
                .read_unaligned()
                .is_null();
        (
            src,
            dst,
            r(std::ptr::addr_of!((*p).WidthInBytes)),
            r(std::ptr::addr_of!((*p).Height)),
            r(std::ptr::addr_of!((*p).Depth)),
            reserved,
        )
    };
    if reserved {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let (soff, sext) = box_span(src.4, (w, h, d), src.5, src.6)?;
    let (doff, dext) = box_span(dst.4, (w, h, d), dst.5, dst.6)?;
    let s = side(src.0, src.1, src.2, src.3, soff)?;
    let t = side(dst.0, dst.1, dst.2, dst.3, doff)?;
    let bytes = w
        .checked_mul(h)
        .and_then(|x| x.checked_mul(d))
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    submit((t, dext), Some((s, sext)), bytes, how)
}

/// A fill of `count` elements of `elem` bytes at `dst` (aligned to `elem`).
fn fill(dst: CUdeviceptr, elem: u64, count: usize, how: How) -> CuResult {
    if !dst.is_multiple_of(elem) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let bytes = (count as u64)
        .checked_mul(elem)
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    submit((Mem::Device(dst), bytes), None, bytes, how)
}

/// A 2D fill: `height` rows of `width` elements of `elem` bytes, `pitch` bytes apart.
fn fill_2d(
    dst: CUdeviceptr,
    pitch: usize,
    elem: u64,
    width: usize,
    height: usize,
    how: How,
) -> CuResult {
    let bad = CUresult::CUDA_ERROR_INVALID_VALUE;
    if !dst.is_multiple_of(elem) || (height > 1 && !(pitch as u64).is_multiple_of(elem)) {
        return Err(bad);
    }
    let row = (width as u64).checked_mul(elem).ok_or(bad)?;
    let (_, extent) = box_span(
        (0, 0, 0),
        (row, height as u64, 1),
        pitch as u64,
        height as u64,
    )?;
    let bytes = row.checked_mul(height as u64).ok_or(bad)?;
    let extent = if bytes == 0 { 0 } else { extent };
    submit((Mem::Device(dst), extent), None, bytes, how)
}

const fn sync(per_thread: bool) -> How {
    How::Sync { per_thread }
}

const fn on(stream: CUstream, per_thread: bool) -> How {
    How::Async { stream, per_thread }
}

// ----- generated-style wrappers: cuda.h's exported names and signatures -----

#[no_mangle]
pub unsafe extern "C" fn cuMemcpy(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    byte_count: usize,
) -> CUresult {
    entry(|| {
        linear(
            Mem::Unified(dst),
            Mem::Unified(src),
            byte_count,
            sync(false),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpy_ptds(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    byte_count: usize,
) -> CUresult {
    entry(|| linear(Mem::Unified(dst), Mem::Unified(src), byte_count, sync(true)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyAsync(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    byte_count: usize,
    stream: CUstream,
) -> CUresult {
    entry(|| {
        linear(
            Mem::Unified(dst),
            Mem::Unified(src),
            byte_count,
            on(stream, false),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyAsync_ptsz(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    byte_count: usize,
    stream: CUstream,
) -> CUresult {
    entry(|| {
        linear(
            Mem::Unified(dst),
            Mem::Unified(src),
            byte_count,
            on(stream, true),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    dst_device: CUdeviceptr,
    _src_host: *const c_void,
    byte_count: usize,
) -> CUresult {
    entry(|| linear(Mem::Device(dst_device), Mem::Host, byte_count, sync(false)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2_ptds(
    dst_device: CUdeviceptr,
    _src_host: *const c_void,
    byte_count: usize,
) -> CUresult {
    entry(|| linear(Mem::Device(dst_device), Mem::Host, byte_count, sync(true)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(
    _dst_host: *mut c_void,
    src_device: CUdeviceptr,
    byte_count: usize,
) -> CUresult {
    entry(|| linear(Mem::Host, Mem::Device(src_device), byte_count, sync(false)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2_ptds(
    _dst_host: *mut c_void,
    src_device: CUdeviceptr,
    byte_count: usize,
) -> CUresult {
    entry(|| linear(Mem::Host, Mem::Device(src_device), byte_count, sync(true)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoD_v2(
    dst_device: CUdeviceptr,
    src_device: CUdeviceptr,
    byte_count: usize,
) -> CUresult {
    entry(|| {
        linear(
            Mem::Device(dst_device),
            Mem::Device(src_device),
            byte_count,
            sync(false),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoD_v2_ptds(
    dst_device: CUdeviceptr,
    src_device: CUdeviceptr,
    byte_count: usize,
) -> CUresult {
    entry(|| {
        linear(
            Mem::Device(dst_device),
            Mem::Device(src_device),
            byte_count,
            sync(true),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst_device: CUdeviceptr,
    _src_host: *const c_void,
    byte_count: usize,
    stream: CUstream,
) -> CUresult {
    entry(|| {
        linear(
            Mem::Device(dst_device),
            Mem::Host,
            byte_count,
            on(stream, false),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2_ptsz(
    dst_device: CUdeviceptr,
    _src_host: *const c_void,
    byte_count: usize,
    stream: CUstream,
) -> CUresult {
    entry(|| {
        linear(
            Mem::Device(dst_device),
            Mem::Host,
            byte_count,
            on(stream, true),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    _dst_host: *mut c_void,
    src_device: CUdeviceptr,
    byte_count: usize,
    stream: CUstream,
) -> CUresult {
    entry(|| {
        linear(
            Mem::Host,
            Mem::Device(src_device),
            byte_count,
            on(stream, false),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2_ptsz(
    _dst_host: *mut c_void,
    src_device: CUdeviceptr,
    byte_count: usize,
    stream: CUstream,
) -> CUresult {
    entry(|| {
        linear(
            Mem::Host,
            Mem::Device(src_device),
            byte_count,
            on(stream, true),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoDAsync_v2(
    dst_device: CUdeviceptr,
    src_device: CUdeviceptr,
    byte_count: usize,
    stream: CUstream,
) -> CUresult {
    entry(|| {
        linear(
            Mem::Device(dst_device),
            Mem::Device(src_device),
            byte_count,
            on(stream, false),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoDAsync_v2_ptsz(
    dst_device: CUdeviceptr,
    src_device: CUdeviceptr,
    byte_count: usize,
    stream: CUstream,
) -> CUresult {
    entry(|| {
        linear(
            Mem::Device(dst_device),
            Mem::Device(src_device),
            byte_count,
            on(stream, true),
        )
    })
}

/// Each pointer must lie in memory of its context's device.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyPeer(
    dst_device: CUdeviceptr,
    dst_context: CUcontext,
    src_device: CUdeviceptr,
    src_context: CUcontext,
    byte_count: usize,
) -> CUresult {
    entry(|| {
        peer(
            dst_device,
            dst_context,
            src_device,
            src_context,
            byte_count,
            None,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyPeer_ptds(
    dst_device: CUdeviceptr,
    dst_context: CUcontext,
    src_device: CUdeviceptr,
    src_context: CUcontext,
    byte_count: usize,
) -> CUresult {
    entry(|| {
        peer(
            dst_device,
            dst_context,
            src_device,
            src_context,
            byte_count,
            None,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyPeerAsync(
    dst_device: CUdeviceptr,
    dst_context: CUcontext,
    src_device: CUdeviceptr,
    src_context: CUcontext,
    byte_count: usize,
    stream: CUstream,
) -> CUresult {
    entry(|| {
        peer(
            dst_device,
            dst_context,
            src_device,
            src_context,
            byte_count,
            Some((stream, false)),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyPeerAsync_ptsz(
    dst_device: CUdeviceptr,
    dst_context: CUcontext,
    src_device: CUdeviceptr,
    src_context: CUcontext,
    byte_count: usize,
    stream: CUstream,
) -> CUresult {
    entry(|| {
        peer(
            dst_device,
            dst_context,
            src_device,
            src_context,
            byte_count,
            Some((stream, true)),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2D_v2(copy: *const CUDA_MEMCPY2D) -> CUresult {
    entry(|| copy_2d(copy, sync(false)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2D_v2_ptds(copy: *const CUDA_MEMCPY2D) -> CUresult {
    entry(|| copy_2d(copy, sync(true)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2DUnaligned_v2(copy: *const CUDA_MEMCPY2D) -> CUresult {
    entry(|| copy_2d(copy, sync(false)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2DUnaligned_v2_ptds(copy: *const CUDA_MEMCPY2D) -> CUresult {
    entry(|| copy_2d(copy, sync(true)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2DAsync_v2(
    copy: *const CUDA_MEMCPY2D,
    stream: CUstream,
) -> CUresult {
    entry(|| copy_2d(copy, on(stream, false)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2DAsync_v2_ptsz(
    copy: *const CUDA_MEMCPY2D,
    stream: CUstream,
) -> CUresult {
    entry(|| copy_2d(copy, on(stream, true)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpy3D_v2(copy: *const CUDA_MEMCPY3D) -> CUresult {
    entry(|| copy_3d(copy, sync(false)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpy3D_v2_ptds(copy: *const CUDA_MEMCPY3D) -> CUresult {
    entry(|| copy_3d(copy, sync(true)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpy3DAsync_v2(
    copy: *const CUDA_MEMCPY3D,
    stream: CUstream,
) -> CUresult {
    entry(|| copy_3d(copy, on(stream, false)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpy3DAsync_v2_ptsz(
    copy: *const CUDA_MEMCPY3D,
    stream: CUstream,
) -> CUresult {
    entry(|| copy_3d(copy, on(stream, true)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8_v2(dst: CUdeviceptr, _uc: c_uchar, n: usize) -> CUresult {
    entry(|| fill(dst, 1, n, sync(false)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8_v2_ptds(dst: CUdeviceptr, _uc: c_uchar, n: usize) -> CUresult {
    entry(|| fill(dst, 1, n, sync(true)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD16_v2(dst: CUdeviceptr, _us: c_ushort, n: usize) -> CUresult {
    entry(|| fill(dst, 2, n, sync(false)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD16_v2_ptds(
    dst: CUdeviceptr,
    _us: c_ushort,
    n: usize,
) -> CUresult {
    entry(|| fill(dst, 2, n, sync(true)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD32_v2(dst: CUdeviceptr, _ui: c_uint, n: usize) -> CUresult {
    entry(|| fill(dst, 4, n, sync(false)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD32_v2_ptds(dst: CUdeviceptr, _ui: c_uint, n: usize) -> CUresult {
    entry(|| fill(dst, 4, n, sync(true)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8Async(
    dst: CUdeviceptr,
    _uc: c_uchar,
    n: usize,
    stream: CUstream,
) -> CUresult {
    entry(|| fill(dst, 1, n, on(stream, false)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8Async_ptsz(
    dst: CUdeviceptr,
    _uc: c_uchar,
    n: usize,
    stream: CUstream,
) -> CUresult {
    entry(|| fill(dst, 1, n, on(stream, true)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD16Async(
    dst: CUdeviceptr,
    _us: c_ushort,
    n: usize,
    stream: CUstream,
) -> CUresult {
    entry(|| fill(dst, 2, n, on(stream, false)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD16Async_ptsz(
    dst: CUdeviceptr,
    _us: c_ushort,
    n: usize,
    stream: CUstream,
) -> CUresult {
    entry(|| fill(dst, 2, n, on(stream, true)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD32Async(
    dst: CUdeviceptr,
    _ui: c_uint,
    n: usize,
    stream: CUstream,
) -> CUresult {
    entry(|| fill(dst, 4, n, on(stream, false)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD32Async_ptsz(
    dst: CUdeviceptr,
    _ui: c_uint,
    n: usize,
    stream: CUstream,
) -> CUresult {
    entry(|| fill(dst, 4, n, on(stream, true)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D8_v2(
    dst: CUdeviceptr,
    dst_pitch: usize,
    _uc: c_uchar,
    width: usize,
    height: usize,
) -> CUresult {
    entry(|| fill_2d(dst, dst_pitch, 1, width, height, sync(false)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D8_v2_ptds(
    dst: CUdeviceptr,
    dst_pitch: usize,
    _uc: c_uchar,
    width: usize,
    height: usize,
) -> CUresult {
    entry(|| fill_2d(dst, dst_pitch, 1, width, height, sync(true)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D16_v2(
    dst: CUdeviceptr,
    dst_pitch: usize,
    _us: c_ushort,
    width: usize,
    height: usize,
) -> CUresult {
    entry(|| fill_2d(dst, dst_pitch, 2, width, height, sync(false)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D16_v2_ptds(
    dst: CUdeviceptr,
    dst_pitch: usize,
    _us: c_ushort,
    width: usize,
    height: usize,
) -> CUresult {
    entry(|| fill_2d(dst, dst_pitch, 2, width, height, sync(true)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D32_v2(
    dst: CUdeviceptr,
    dst_pitch: usize,
    _ui: c_uint,
    width: usize,
    height: usize,
) -> CUresult {
    entry(|| fill_2d(dst, dst_pitch, 4, width, height, sync(false)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D32_v2_ptds(
    dst: CUdeviceptr,
    dst_pitch: usize,
    _ui: c_uint,
    width: usize,
    height: usize,
) -> CUresult {
    entry(|| fill_2d(dst, dst_pitch, 4, width, height, sync(true)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D8Async(
    dst: CUdeviceptr,
    dst_pitch: usize,
    _uc: c_uchar,
    width: usize,
    height: usize,
    stream: CUstream,
) -> CUresult {
    entry(|| fill_2d(dst, dst_pitch, 1, width, height, on(stream, false)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D8Async_ptsz(
    dst: CUdeviceptr,
    dst_pitch: usize,
    _uc: c_uchar,
    width: usize,
    height: usize,
    stream: CUstream,
) -> CUresult {
    entry(|| fill_2d(dst, dst_pitch, 1, width, height, on(stream, true)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D16Async(
    dst: CUdeviceptr,
    dst_pitch: usize,
    _us: c_ushort,
    width: usize,
    height: usize,
    stream: CUstream,
) -> CUresult {
    entry(|| fill_2d(dst, dst_pitch, 2, width, height, on(stream, false)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D16Async_ptsz(
    dst: CUdeviceptr,
    dst_pitch: usize,
    _us: c_ushort,
    width: usize,
    height: usize,
    stream: CUstream,
) -> CUresult {
    entry(|| fill_2d(dst, dst_pitch, 2, width, height, on(stream, true)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D32Async(
    dst: CUdeviceptr,
    dst_pitch: usize,
    _ui: c_uint,
    width: usize,
    height: usize,
    stream: CUstream,
) -> CUresult {
    entry(|| fill_2d(dst, dst_pitch, 4, width, height, on(stream, false)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D32Async_ptsz(
    dst: CUdeviceptr,
    dst_pitch: usize,
    _ui: c_uint,
    width: usize,
    height: usize,
    stream: CUstream,
) -> CUresult {
    entry(|| fill_2d(dst, dst_pitch, 4, width, height, on(stream, true)))
}
