//! The memory governor: every device allocation reserves its bytes on the vGPU's shared
//! counter *before* the driver is called, and every free gives back exactly what its
//! allocation reserved *after* the driver freed it. So the driver never holds more memory
//! for the vGPU than the counter says, and the counter never passes the quota.
//!
//! An allocation that does not fit is refused with CUDA_ERROR_OUT_OF_MEMORY without
//! calling the driver, after one attempt to give back what dead processes of the vGPU
//! still hold on the counter.

use std::sync::atomic::{AtomicU64, Ordering};

use vgpu_abi::layout::now_unix_ns;
use vgpu_abi::procfile::ProcFile;

use super::allocations::{self, Counted, Kind};
use super::devices::Target;
use crate::config::{self, Mode, Vgpu};
use crate::ffi::*;
use crate::log::vgpu_log_once;
use crate::state;

/// The decision on one allocation.
pub enum Admission {
    /// Not governed (no vGPU, not device memory, or the driver will refuse it anyway):
    /// call the driver and count nothing.
    PassThrough,
    /// Refused: return this code without calling the driver.
    Refuse(CuResult),
    /// Bytes reserved: call the driver, then [`Reservation::commit`] or [`Reservation::cancel`].
    Reserved(Reservation),
}

/// Bytes reserved on the vGPU's counter for one allocation in progress.
#[must_use]
pub struct Reservation {
    vgpu: &'static Vgpu,
    record: &'static ProcFile,
    device: usize,
    bytes: u64,
}

/// Decide on an allocation of `bytes` on the device `target` finds (`Ok(None)`: not device
/// memory, e.g. a host-located cuMemCreate).
#[inline]
pub fn admit(bytes: u64, target: impl FnOnce(&'static Vgpu) -> Result<Option<Target>, CuResult>) -> Admission {
    match config::mode() {
        Mode::PassThrough => Admission::PassThrough,
        Mode::FailClosed => Admission::Refuse(CUDA_ERROR_OUT_OF_MEMORY),
        // Zero bytes: the driver answers (CUDA_ERROR_INVALID_VALUE); nothing to count.
        Mode::Enforce(_) if bytes == 0 => Admission::PassThrough,
        Mode::Enforce(vgpu) => match target(vgpu) {
            Ok(None) => Admission::PassThrough,
            Err(rc) => Admission::Refuse(rc),
            Ok(Some(Target::Outside)) => {
                vgpu_log_once!("refusing an allocation on a GPU that is not part of this vGPU");
                Admission::Refuse(CUDA_ERROR_OUT_OF_MEMORY)
            }
            Ok(Some(Target::Device(device))) => match state::record(vgpu) {
                None => Admission::Refuse(CUDA_ERROR_OUT_OF_MEMORY),
                Some(record) => match reserve(vgpu, record, device, bytes) {
                    Some(r) => Admission::Reserved(r),
                    None => Admission::Refuse(CUDA_ERROR_OUT_OF_MEMORY),
                },
            },
        },
    }
}

fn reserve(vgpu: &'static Vgpu, record: &'static ProcFile, device: usize, bytes: u64) -> Option<Reservation> {
    if vgpu.usage.try_reserve(record, device, bytes).is_ok() {
        return Some(Reservation {
            vgpu,
            record,
            device,
            bytes,
        });
    }
    // Before refusing: what dead processes still hold may be what is missing.
    let report = vgpu.usage.reclaim_dead_quick();
    if (report.processes > 0 || report.reconciled) && vgpu.usage.try_reserve(record, device, bytes).is_ok() {
        return Some(Reservation {
            vgpu,
            record,
            device,
            bytes,
        });
    }
    None
}

impl Reservation {
    /// The driver allocated: remember what `handle` counted, for its free.
    pub fn commit(self, kind: Kind, handle: u64) {
        allocations::insert(
            kind,
            handle,
            Counted {
                device: self.device,
                bytes: self.bytes,
            },
        );
    }

    /// The driver refused: give the bytes back.
    pub fn cancel(self) {
        self.vgpu.usage.release(self.record, self.device, self.bytes);
    }

    /// Change the reservation to `bytes` (the driver's real size, e.g. pitch × height).
    /// `false` if growing did not fit the quota (the reservation is unchanged then).
    pub fn resize(&mut self, bytes: u64) -> bool {
        if bytes > self.bytes {
            if self
                .vgpu
                .usage
                .try_reserve(self.record, self.device, bytes - self.bytes)
                .is_err()
            {
                return false;
            }
        } else if bytes < self.bytes {
            self.vgpu.usage.release(self.record, self.device, self.bytes - bytes);
        }
        self.bytes = bytes;
        true
    }
}

/// Run an admitted allocation: `call` runs the driver and returns its code and the new
/// handle; on success the handle is remembered with what it counted.
#[inline]
pub fn allocate(admission: Admission, kind: Kind, call: impl FnOnce() -> (CuResult, u64)) -> CuResult {
    match admission {
        Admission::PassThrough => call().0,
        Admission::Refuse(rc) => rc,
        Admission::Reserved(reservation) => {
            let (rc, handle) = call();
            if rc == CUDA_SUCCESS {
                reservation.commit(kind, handle);
            } else {
                reservation.cancel();
            }
            rc
        }
    }
}

/// Free `handle` with `call` (the driver's free) and give back what it counted. The entry
/// is taken out *before* the driver frees, so another thread that gets the same address
/// from the driver right after cannot have its own entry removed by this free; if the
/// driver refuses, the entry goes back.
#[inline]
pub fn free(kind: Kind, handle: u64, call: impl FnOnce() -> CuResult) -> CuResult {
    let counted = allocations::remove(kind, handle);
    let rc = call();
    if let Some(counted) = counted {
        if rc == CUDA_SUCCESS {
            give_back(counted);
        } else {
            allocations::insert(kind, handle, counted);
        }
    }
    rc
}

fn give_back(counted: Counted) {
    if let Mode::Enforce(vgpu) = config::mode() {
        if let Some(record) = state::record(vgpu) {
            vgpu.usage.release(record, counted.device, counted.bytes);
        }
    }
}

static LAST_INFO_RECLAIM_NS: AtomicU64 = AtomicU64::new(0);

/// For memory-info queries: give back dead processes' bytes now and then (at most once a
/// second per process), so "free" does not stay low after a worker died.
pub fn reclaim_for_info(vgpu: &Vgpu) {
    let now = now_unix_ns();
    let last = LAST_INFO_RECLAIM_NS.load(Ordering::Relaxed);
    if now.saturating_sub(last) < 1_000_000_000 {
        return;
    }
    if LAST_INFO_RECLAIM_NS
        .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
        .is_ok()
    {
        let _ = vgpu.usage.reclaim_dead_quick();
    }
}

/// `(total, free)` the vGPU grants on `device` given what the device really has free: the
/// quota, and the quota's unused part clamped to the real free memory.
pub fn virtual_info(vgpu: &Vgpu, device: usize, real_free: u64) -> (u64, u64) {
    let quota = vgpu.usage.quota_bytes(device);
    let used = vgpu.usage.used_bytes(device);
    (quota, quota.saturating_sub(used).min(real_free))
}
