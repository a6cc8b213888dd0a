//! Streams: their order, synchronization, and stream capture.
//!
//! Every stream (a created one, the legacy NULL stream of each context, each thread's
//! per-thread default stream) keeps its *ready time*: when the last item queued on it ends.
//! The device runs one FIFO of all processes' work (`busy_until` in the shared state), so an
//! item queued on a stream starts at `max(now, device queue end, stream ready)`
//! (`model::queue_start`). `cuStreamSynchronize`/`cuStreamQuery` wait for / ask about that
//! stream only.
//!
//! While a stream captures, launches on it become kernel nodes of the capture graph and run
//! nothing; synchronizing or querying it is `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`.

use std::ffi::{c_int, c_uint};

use cudarc::driver::sys::{
    cuuint64_t, CUgraph, CUgraphEdgeData, CUgraphNode, CUresult, CUstream, CUstreamCaptureMode,
    CUstreamCaptureStatus, CUstream_flags,
};

use super::ctx::wait_until;
use super::graph::Graph;
use super::launch::{out_handle, Kernel};
use super::process::{self, Process};
use super::{entry, CuResult, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD};
use crate::ffi::{self, now_ns};

/// A stream as the timeline knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct StreamKey {
    pub ctx: u64,
    /// The stream's handle; 0 for the legacy stream, [`CU_STREAM_PER_THREAD`] for a thread's
    /// per-thread default stream.
    pub handle: u64,
    /// The owning thread of a per-thread default stream, else 0.
    pub thread: u64,
}

/// What a stream has queued, and its capture.
#[derive(Debug, Default)]
pub(crate) struct StreamState {
    /// When the last item queued on it ends (ns since the epoch).
    pub ready_ns: u64,
    pub capture: Option<Capture>,
}

/// A stream capture in progress.
#[derive(Debug)]
pub(crate) struct Capture {
    pub graph: u64,
    pub id: u64,
    /// The capture's current dependency set (its last node), handed out by
    /// cuStreamGetCaptureInfo; the buffers stay put while the capture lasts.
    pub deps: Vec<u64>,
    pub edges: Vec<CUgraphEdgeData>,
}

/// Where a launch on a stream goes.
pub(crate) enum Target {
    /// Queue on the device, not before `ready_ns`.
    Queue { device: usize, ready_ns: u64 },
    /// Add to the capture graph.
    Capture { graph: u64 },
}

/// A default (zero) edge: full dependency, ports 0.
const DEFAULT_EDGE: CUgraphEdgeData = CUgraphEdgeData {
    from_port: 0,
    to_port: 0,
    type_: 0,
    reserved: [0; 5],
};

fn thread_id() -> u64 {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::gettid() as u64 }
}

impl Process {
    /// The stream `stream` names for the calling thread; `per_thread` when the caller came in
    /// through a `_ptsz` entry point (NULL then means the per-thread default stream).
    pub(crate) fn stream_key(&self, stream: CUstream, per_thread: bool) -> CuResult<StreamKey> {
        let h = stream as usize;
        let per_thread = h == CU_STREAM_PER_THREAD || (h == 0 && per_thread);
        if h == 0 || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD {
            let ctx = self.current_ctx()?.0;
            return Ok(if per_thread {
                StreamKey {
                    ctx,
                    handle: CU_STREAM_PER_THREAD as u64,
                    thread: thread_id(),
                }
            } else {
                StreamKey {
                    ctx,
                    handle: 0,
                    thread: 0,
                }
            });
        }
        let ctx = self.stream_ctx(stream)?;
        Ok(StreamKey {
            ctx,
            handle: h as u64,
            thread: 0,
        })
    }

    pub(crate) fn stream_state(&mut self, key: StreamKey) -> &mut StreamState {
        self.timelines.entry(key).or_default()
    }

    /// Where work submitted to `key` now goes.
    pub(crate) fn target(&mut self, key: StreamKey) -> CuResult<Target> {
        let device = self.ctx_device(key.ctx)?;
        let state = self.stream_state(key);
        Ok(match &state.capture {
            Some(c) => Target::Capture { graph: c.graph },
            None => Target::Queue {
                device,
                ready_ns: state.ready_ns,
            },
        })
    }

    /// Submit `kernels` to stream `key`: queue them back to back, or capture them.
    pub(crate) fn submit(&mut self, key: StreamKey, kernels: &[Kernel]) -> CuResult {
        match self.target(key)? {
            Target::Capture { graph } => self.capture_kernels(key, graph, kernels),
            Target::Queue { device, ready_ns } => {
                let end = self.queue_kernels(device, ready_ns, kernels)?;
                self.stream_state(key).ready_ns = end;
                Ok(())
            }
        }
    }

    /// Queue `kernels` back to back on `device`, the first not before `ready_ns`; returns
    /// when the last ends.
    pub(crate) fn queue_kernels(
        &mut self,
        device: usize,
        ready_ns: u64,
        kernels: &[Kernel],
    ) -> CuResult<u64> {
        let slot = self.ensure_slot(device)?;
        let dev = self.device(device)?;
        let mut ready = ready_ns;
        for k in kernels {
            ready = dev.launch(Some(slot), ready, k.wave_ns, k.blocks).1;
        }
        Ok(ready)
    }

    fn capture_kernels(&mut self, key: StreamKey, graph: u64, kernels: &[Kernel]) -> CuResult {
        for &k in kernels {
            let node = self.new_handle();
            self.graphs
                .get_mut(&graph)
                .ok_or(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)?
                .add_node(node, Some(k));
            if let Some(c) = self.stream_state(key).capture.as_mut() {
                c.deps = vec![node];
                c.edges = vec![DEFAULT_EDGE];
            }
        }
        Ok(())
    }

    /// When everything queued on `key` ends; capturing streams cannot be waited for.
    fn stream_deadline(&mut self, key: StreamKey) -> CuResult<u64> {
        let state = self.stream_state(key);
        if state.capture.is_some() {
            return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        Ok(state.ready_ns)
    }
}

fn create_stream(out: *mut CUstream, flags: c_uint, priority: c_int) -> CuResult {
    let known = CUstream_flags::CU_STREAM_DEFAULT as c_uint
        | CUstream_flags::CU_STREAM_NON_BLOCKING as c_uint;
    if out.is_null() || flags & !known != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let handle = process::with(|p| {
        let (ctx, _) = p.current_ctx()?;
        let handle = p.new_handle();
        p.streams.insert(handle, ctx);
        let (least, greatest) = super::queries::STREAM_PRIORITY_RANGE;
        p.stream_info
            .insert(handle, (flags, priority.clamp(greatest, least)));
        Ok(handle)
    })?;
    out_handle(out, handle)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(stream: *mut CUstream, flags: c_uint) -> CUresult {
    entry(|| create_stream(stream, flags, 0))
}

/// Priorities are clamped into the device's range (cuCtxGetStreamPriorityRange) and
/// remembered (cuStreamGetPriority); they do not change the order work runs in.
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    stream: *mut CUstream,
    flags: c_uint,
    priority: c_int,
) -> CUresult {
    entry(|| create_stream(stream, flags, priority))
}

/// Queued work still runs (as with the real driver); the handle is gone.
#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy_v2(stream: CUstream) -> CUresult {
    entry(|| {
        process::with(|p| {
            let ctx = p
                .streams
                .remove(&(stream as u64))
                .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
            p.stream_info.remove(&(stream as u64));
            p.timelines.remove(&StreamKey {
                ctx,
                handle: stream as u64,
                thread: 0,
            });
            Ok(())
        })
    })
}

fn synchronize(stream: CUstream, per_thread: bool) -> CuResult {
    let deadline = process::with(|p| {
        let key = p.stream_key(stream, per_thread)?;
        p.stream_deadline(key)
    })?;
    wait_until(deadline);
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(stream: CUstream) -> CUresult {
    entry(|| synchronize(stream, false))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize_ptsz(stream: CUstream) -> CUresult {
    entry(|| synchronize(stream, true))
}

fn query(stream: CUstream, per_thread: bool) -> CuResult {
    let deadline = process::with(|p| {
        let key = p.stream_key(stream, per_thread)?;
        p.stream_deadline(key)
    })?;
    if deadline > now_ns() {
        Err(CUresult::CUDA_ERROR_NOT_READY)
    } else {
        Ok(())
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamQuery(stream: CUstream) -> CUresult {
    entry(|| query(stream, false))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamQuery_ptsz(stream: CUstream) -> CUresult {
    entry(|| query(stream, true))
}

// ----- capture -----

fn begin_capture(stream: CUstream, mode: u32, per_thread: bool) -> CuResult {
    if mode > CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED as u32 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    process::with(|p| {
        let key = p.stream_key(stream, per_thread)?;
        if key.handle == 0 {
            // The legacy stream cannot be captured.
            return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        if p.stream_state(key).capture.is_some() {
            return Err(CUresult::CUDA_ERROR_ILLEGAL_STATE);
        }
        let graph = p.new_handle();
        p.graphs.insert(graph, Graph::new(key.ctx));
        p.next_capture_id += 1;
        let id = p.next_capture_id;
        p.stream_state(key).capture = Some(Capture {
            graph,
            id,
            deps: Vec::new(),
            edges: Vec::new(),
        });
        Ok(())
    })
}

/// CUDA 10.0's signature: global mode.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture(stream: CUstream) -> CUresult {
    entry(|| begin_capture(stream, 0, false))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_ptsz(stream: CUstream) -> CUresult {
    entry(|| begin_capture(stream, 0, true))
}

/// The mode is checked and otherwise ignored (no API is refused during capture).
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2(
    stream: CUstream,
    mode: CUstreamCaptureMode,
) -> CUresult {
    // SAFETY: `mode` is a local copy of the argument; read as a raw integer.
    let mode = unsafe { ffi::read_enum(&mode) };
    entry(|| begin_capture(stream, mode, false))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2_ptsz(
    stream: CUstream,
    mode: CUstreamCaptureMode,
) -> CUresult {
    // SAFETY: as in cuStreamBeginCapture_v2.
    let mode = unsafe { ffi::read_enum(&mode) };
    entry(|| begin_capture(stream, mode, true))
}

fn end_capture(stream: CUstream, graph: *mut CUgraph, per_thread: bool) -> CuResult {
    if graph.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let handle = process::with(|p| {
        let key = p.stream_key(stream, per_thread)?;
        p.stream_state(key)
            .capture
            .take()
            .map(|c| c.graph)
            .ok_or(CUresult::CUDA_ERROR_ILLEGAL_STATE)
    })?;
    out_handle(graph, handle)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture(stream: CUstream, graph: *mut CUgraph) -> CUresult {
    entry(|| end_capture(stream, graph, false))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture_ptsz(
    stream: CUstream,
    graph: *mut CUgraph,
) -> CUresult {
    entry(|| end_capture(stream, graph, true))
}

/// What cuStreamGetCaptureInfo reports.
struct CaptureInfo {
    status: CUstreamCaptureStatus,
    id: u64,
    graph: u64,
    deps: *const u64,
    edges: *const CUgraphEdgeData,
    count: usize,
}

fn capture_info(stream: CUstream, per_thread: bool) -> CuResult<CaptureInfo> {
    process::with(|p| {
        let key = p.stream_key(stream, per_thread)?;
        Ok(match &p.stream_state(key).capture {
            Some(c) => CaptureInfo {
                status: CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE,
                id: c.id,
                graph: c.graph,
                deps: if c.deps.is_empty() {
                    std::ptr::null()
                } else {
                    c.deps.as_ptr()
                },
                edges: if c.edges.is_empty() {
                    std::ptr::null()
                } else {
                    c.edges.as_ptr()
                },
                count: c.deps.len(),
            },
            None => CaptureInfo {
                status: CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE,
                id: 0,
                graph: 0,
                deps: std::ptr::null(),
                edges: std::ptr::null(),
                count: 0,
            },
        })
    })
}

fn is_capturing(
    stream: CUstream,
    status: *mut CUstreamCaptureStatus,
    per_thread: bool,
) -> CuResult {
    let info = capture_info(stream, per_thread)?;
    // SAFETY: `status` is NULL or writable (driver API contract).
    Ok(unsafe { ffi::write(status, info.status) }?)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing(
    stream: CUstream,
    status: *mut CUstreamCaptureStatus,
) -> CUresult {
    entry(|| is_capturing(stream, status, false))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing_ptsz(
    stream: CUstream,
    status: *mut CUstreamCaptureStatus,
) -> CUresult {
    entry(|| is_capturing(stream, status, true))
}

/// The out-parameters of every cuStreamGetCaptureInfo version; NULL ones are skipped, except
/// the status, which is required. Id, graph and dependencies are only written while active.
struct InfoOut {
    status: *mut CUstreamCaptureStatus,
    id: *mut cuuint64_t,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    edges: *mut *const CUgraphEdgeData,
    count: *mut usize,
}

fn get_capture_info(stream: CUstream, out: InfoOut, per_thread: bool) -> CuResult {
    if out.status.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let info = capture_info(stream, per_thread)?;
    let active = info.status == CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE;
    // SAFETY: every pointer is NULL (skipped) or writable for its type (driver API contract).
    unsafe {
        ffi::write(out.status, info.status)?;
        if active {
            if !out.id.is_null() {
                ffi::write(out.id, info.id)?;
            }
            if !out.graph.is_null() {
                ffi::write(out.graph, info.graph as usize as CUgraph)?;
            }
            if !out.deps.is_null() {
                ffi::write(out.deps, info.deps.cast::<CUgraphNode>())?;
            }
            if !out.edges.is_null() {
                ffi::write(out.edges, info.edges)?;
            }
            if !out.count.is_null() {
                ffi::write(out.count, info.count)?;
            }
        }
    }
    Ok(())
}

fn out_v1(status: *mut CUstreamCaptureStatus, id: *mut cuuint64_t) -> InfoOut {
    InfoOut {
        status,
        id,
        graph: std::ptr::null_mut(),
        deps: std::ptr::null_mut(),
        edges: std::ptr::null_mut(),
        count: std::ptr::null_mut(),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo(
    stream: CUstream,
    status: *mut CUstreamCaptureStatus,
    id: *mut cuuint64_t,
) -> CUresult {
    entry(|| get_capture_info(stream, out_v1(status, id), false))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_ptsz(
    stream: CUstream,
    status: *mut CUstreamCaptureStatus,
    id: *mut cuuint64_t,
) -> CUresult {
    entry(|| get_capture_info(stream, out_v1(status, id), true))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v2(
    stream: CUstream,
    status: *mut CUstreamCaptureStatus,
    id: *mut cuuint64_t,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    count: *mut usize,
) -> CUresult {
    let edges = std::ptr::null_mut();
    let out = InfoOut {
        status,
        id,
        graph,
        deps,
        edges,
        count,
    };
    entry(|| get_capture_info(stream, out, false))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v2_ptsz(
    stream: CUstream,
    status: *mut CUstreamCaptureStatus,
    id: *mut cuuint64_t,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    count: *mut usize,
) -> CUresult {
    let edges = std::ptr::null_mut();
    let out = InfoOut {
        status,
        id,
        graph,
        deps,
        edges,
        count,
    };
    entry(|| get_capture_info(stream, out, true))
}

/// Edge data, when asked for, is all default (zero), one per dependency.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v3(
    stream: CUstream,
    status: *mut CUstreamCaptureStatus,
    id: *mut cuuint64_t,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    edges: *mut *const CUgraphEdgeData,
    count: *mut usize,
) -> CUresult {
    let out = InfoOut {
        status,
        id,
        graph,
        deps,
        edges,
        count,
    };
    entry(|| get_capture_info(stream, out, false))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v3_ptsz(
    stream: CUstream,
    status: *mut CUstreamCaptureStatus,
    id: *mut cuuint64_t,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    edges: *mut *const CUgraphEdgeData,
    count: *mut usize,
) -> CUresult {
    let out = InfoOut {
        status,
        id,
        graph,
        deps,
        edges,
        count,
    };
    entry(|| get_capture_info(stream, out, true))
}
