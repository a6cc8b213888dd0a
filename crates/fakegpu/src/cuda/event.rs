//! Events, stamped from the simulated timeline.
//!
//! Recording an event queues a zero-length item on its stream: it is stamped
//! `max(now, device queue end, stream ready)` at record time — when the device, which runs
//! one FIFO of every process's work, reaches it — and the stream's ready time moves there.
//! So an event recorded on an idle stream while another process's work is queued is stamped
//! when that work ends, and `elapsed(event before a kernel, event after it)` is exactly the
//! kernel's duration when nothing else was queued in between. The event is complete once
//! the clock passes its stamp.
//!
//! Recording on a capturing stream is accepted and leaves the event as it was (it becomes
//! part of the capture, and gets no timestamp).

use std::ffi::{c_float, c_uint};

use cudarc::driver::sys::{CUevent, CUevent_flags, CUresult, CUstream};

use super::ctx::wait_until;
use super::ipc::{read_shared_stamp, write_shared_stamp};
use super::launch::out_handle;
use super::process::{self, Process};
use super::stream::Target;
use super::{entry, CuResult};
use crate::ffi::{self, now_ns};
use crate::model;

#[derive(Debug, Clone, Copy)]
pub(crate) struct Event {
    pub ctx: u64,
    pub flags: u32,
    /// When the device reaches it (ns since the epoch); `None` until first recorded.
    pub stamp_ns: Option<u64>,
}

const DISABLE_TIMING: u32 = CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
const INTERPROCESS: u32 = CUevent_flags::CU_EVENT_INTERPROCESS as u32;
/// `CU_EVENT_RECORD_EXTERNAL`.
const RECORD_EXTERNAL: u32 = 1;
/// `CU_EVENT_WAIT_EXTERNAL`.
const WAIT_EXTERNAL: u32 = 1;

impl Process {
    /// The event; one shared with another process (IPC) has the latest stamp of either.
    fn event(&self, event: CUevent) -> CuResult<Event> {
        let mut ev = self
            .events
            .get(&(event as u64))
            .copied()
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        if let Some(path) = self.shared_events.get(&(event as u64)) {
            ev.stamp_ns = read_shared_stamp(path).or(ev.stamp_ns);
        }
        Ok(ev)
    }

    /// Stamp `event` as the next item of `stream`.
    fn record(&mut self, event: CUevent, stream: CUstream, per_thread: bool) -> CuResult {
        let ev = self.event(event)?;
        let key = self.stream_key(stream, per_thread)?;
        if key.ctx != ev.ctx {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        }
        match self.target(key)? {
            Target::Capture { .. } => Ok(()),
            Target::Queue { device, ready_ns } => {
                let slot = self.slot(device);
                let stamp = self.device(device)?.event_stamp(slot, ready_ns);
                self.stream_state(key).ready_ns = stamp;
                if let Some(e) = self.events.get_mut(&(event as u64)) {
                    e.stamp_ns = Some(stamp);
                }
                if let Some(path) = self.shared_events.get(&(event as u64)) {
                    write_shared_stamp(path, stamp);
                }
                Ok(())
            }
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(event: *mut CUevent, flags: c_uint) -> CUresult {
    entry(|| {
        let known = CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32 | DISABLE_TIMING | INTERPROCESS;
        let interprocess_without_timing_off =
            flags & INTERPROCESS != 0 && flags & DISABLE_TIMING == 0;
        if event.is_null() || flags & !known != 0 || interprocess_without_timing_off {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let handle = process::with(|p| {
            let (ctx, _) = p.current_ctx()?;
            let handle = p.new_handle();
            p.events.insert(
                handle,
                Event {
                    ctx,
                    flags,
                    stamp_ns: None,
                },
            );
            Ok(handle)
        })?;
        out_handle(event, handle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventDestroy_v2(event: CUevent) -> CUresult {
    entry(|| {
        process::with(|p| {
            p.shared_events.remove(&(event as u64));
            p.events
                .remove(&(event as u64))
                .map(|_| ())
                .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
        })
    })
}

fn record(event: CUevent, stream: CUstream, flags: c_uint, per_thread: bool) -> CuResult {
    if flags & !RECORD_EXTERNAL != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    process::with(|p| p.record(event, stream, per_thread))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecord(event: CUevent, stream: CUstream) -> CUresult {
    entry(|| record(event, stream, 0, false))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecord_ptsz(event: CUevent, stream: CUstream) -> CUresult {
    entry(|| record(event, stream, 0, true))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecordWithFlags(
    event: CUevent,
    stream: CUstream,
    flags: c_uint,
) -> CUresult {
    entry(|| record(event, stream, flags, false))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecordWithFlags_ptsz(
    event: CUevent,
    stream: CUstream,
    flags: c_uint,
) -> CUresult {
    entry(|| record(event, stream, flags, true))
}

/// A never-recorded event is complete.
#[no_mangle]
pub unsafe extern "C" fn cuEventQuery(event: CUevent) -> CUresult {
    entry(|| {
        let ev = process::with(|p| p.event(event))?;
        match ev.stamp_ns {
            Some(stamp) if stamp > now_ns() => Err(CUresult::CUDA_ERROR_NOT_READY),
            _ => Ok(()),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventSynchronize(event: CUevent) -> CUresult {
    entry(|| {
        let ev = process::with(|p| p.event(event))?;
        wait_until(ev.stamp_ns.unwrap_or(0));
        Ok(())
    })
}

/// Milliseconds between two completed, timed events.
fn elapsed(ms: *mut c_float, start: CUevent, end: CUevent) -> CuResult {
    if ms.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let (a, b) = process::with(|p| Ok((p.event(start)?, p.event(end)?)))?;
    let stamp = |e: Event| match e.stamp_ns {
        Some(s) if e.flags & DISABLE_TIMING == 0 => Ok(s),
        _ => Err(CUresult::CUDA_ERROR_INVALID_HANDLE),
    };
    let (from, to) = (stamp(a)?, stamp(b)?);
    if from.max(to) > now_ns() {
        return Err(CUresult::CUDA_ERROR_NOT_READY);
    }
    // SAFETY: `ms` is non-NULL and writable (driver API contract).
    Ok(unsafe { ffi::write(ms, model::elapsed_ms(from, to)) }?)
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(
    ms: *mut c_float,
    start: CUevent,
    end: CUevent,
) -> CUresult {
    entry(|| elapsed(ms, start, end))
}

/// CUDA 12.8's version: the same signature and results.
#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime_v2(
    ms: *mut c_float,
    start: CUevent,
    end: CUevent,
) -> CUresult {
    entry(|| elapsed(ms, start, end))
}

/// Later work on `stream` starts no earlier than `event`'s stamp (on a capturing stream the
/// wait is accepted and adds nothing).
fn wait_event(stream: CUstream, event: CUevent, flags: c_uint, per_thread: bool) -> CuResult {
    if flags & !WAIT_EXTERNAL != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    process::with(|p| {
        let ev = p.event(event)?;
        let key = p.stream_key(stream, per_thread)?;
        let state = p.stream_state(key);
        if state.capture.is_none() {
            state.ready_ns = state.ready_ns.max(ev.stamp_ns.unwrap_or(0));
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamWaitEvent(
    stream: CUstream,
    event: CUevent,
    flags: c_uint,
) -> CUresult {
    entry(|| wait_event(stream, event, flags, false))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamWaitEvent_ptsz(
    stream: CUstream,
    event: CUevent,
    flags: c_uint,
) -> CUresult {
    entry(|| wait_event(stream, event, flags, true))
}
