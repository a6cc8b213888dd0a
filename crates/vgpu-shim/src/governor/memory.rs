//! The memory governor: every device allocation reserves its bytes on the vGPU's shared
//! counter *before* the driver is called, and every free gives back exactly what its
//! allocation reserved *after* the driver freed it. So the driver never holds more memory
//! for the vGPU than the counter says, and the counter never passes the quota.
//!
//! An allocation that does not fit is refused with CUDA_ERROR_OUT_OF_MEMORY without
//! calling the driver, once nothing dead processes of the vGPU still hold on the counter
//! could make it fit: if the process's [`Peers`] cannot show that a reclaim would give
//! nothing back (a watched process exited, a process registered since, a reconcile is
//! pending…), it reclaims (under the vGPU lock, listing the live processes afresh) and
//! tries once more. In the steady state a refusal is a failed compare-and-swap, a few
//! atomic loads and one `poll`.

use std::sync::atomic::{AtomicU64, Ordering};

use vgpu_abi::layout::now_unix_ns;
use vgpu_abi::procfile::ProcFile;
use vgpu_abi::usage::{Peers, ReclaimReport};

use super::allocations::{self, Counted, Kind};
use super::devices::Target;
use crate::ffi::*;
use crate::guard::Call;
use crate::log::vgpu_log_once;
use crate::spinlock::SpinLock;
use crate::state::{self, Mode, Vgpu};

/// The other live processes of this process's vGPU as its last reclaim listed them: lets a
/// refusal skip the reclaim when none could help. Held across `fork` by the fork handlers;
/// a child forgets it.
static PEERS: SpinLock<Peers> = SpinLock::new(Peers::new());

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

/// Decide on an allocation of `bytes` in `mode` (the hook's `config::mode()`) on the device
/// `target` finds (`Ok(None)`: not device memory, e.g. a host-located cuMemCreate).
#[inline]
pub fn admit(
    mode: Mode,
    bytes: u64,
    target: impl FnOnce(&'static Vgpu) -> Result<Option<Target>, CuResult>,
) -> Admission {
    match mode {
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
    if !reclaim_could_help(vgpu) {
        return None;
    }
    let report = reclaim(vgpu);
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
    /// The driver allocated: remember what `handle` counted, for its free (the bytes stay
    /// reserved).
    pub fn commit(self, kind: Kind, handle: u64) {
        let this = std::mem::ManuallyDrop::new(self);
        allocations::insert(
            kind,
            handle,
            Counted {
                device: this.device,
                bytes: this.bytes,
            },
        );
    }

    /// The driver refused: give the bytes back.
    pub fn cancel(self) {
        let this = std::mem::ManuallyDrop::new(self);
        this.release();
    }

    fn release(&self) {
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

/// Dropped without [`Reservation::commit`] or [`Reservation::cancel`] (an early return, or a
/// panic unwinding through the hook): the bytes go back.
impl Drop for Reservation {
    fn drop(&mut self) {
        self.release();
    }
}

/// A reservation whose driver call is under way: settled when dropped — committed if the
/// driver recorded success in `call` (even if a panic came between the driver and the
/// commit: the driver holds the memory, so it stays counted, exactly once), else given back.
pub struct Pending<'c, H: FnOnce() -> u64> {
    reservation: Option<Reservation>,
    call: &'c Call<CuResult>,
    kind: Kind,
    handle: Option<H>,
}

impl<'c, H: FnOnce() -> u64> Pending<'c, H> {
    /// `handle` reads the new handle after the driver succeeded (it must not panic).
    pub fn new(reservation: Reservation, call: &'c Call<CuResult>, kind: Kind, handle: H) -> Self {
        Pending {
            reservation: Some(reservation),
            call,
            kind,
            handle: Some(handle),
        }
    }

    /// The reservation, e.g. to resize it.
    pub fn reservation(&mut self) -> Option<&mut Reservation> {
        self.reservation.as_mut()
    }

    /// Give the bytes back now (the hook undid the driver's allocation).
    pub fn cancel(&mut self) {
        if let Some(r) = self.reservation.take() {
            r.cancel();
        }
    }
}

impl<H: FnOnce() -> u64> Drop for Pending<'_, H> {
    fn drop(&mut self) {
        let Some(reservation) = self.reservation.take() else {
            return;
        };
        match (self.call.result(), self.handle.take()) {
            (Some(CUDA_SUCCESS), Some(handle)) => reservation.commit(self.kind, handle()),
            _ => reservation.cancel(),
        }
    }
}

/// Run an admitted allocation: `driver` is the driver call (made through `call`, so its
/// answer is recorded), `handle` reads the new handle after it succeeded; on success the
/// handle is remembered with what it counted.
#[inline]
pub fn allocate(
    call: &Call<CuResult>,
    admission: Admission,
    kind: Kind,
    driver: impl FnOnce() -> CuResult,
    handle: impl FnOnce() -> u64,
) -> CuResult {
    match admission {
        Admission::PassThrough => call.driver(driver),
        Admission::Refuse(rc) => rc,
        Admission::Reserved(reservation) => {
            let _settle = Pending::new(reservation, call, kind, handle);
            call.driver(driver)
        }
    }
}

/// Free `handle` with `driver` (the driver's free, made through `call`) and give back what
/// it counted. The entry is taken out *before* the driver frees, so another thread that gets
/// the same address from the driver right after cannot have its own entry removed by this
/// free; if the driver refuses (or was never called, a panic before it), the entry goes back.
#[inline]
pub fn free(call: &Call<CuResult>, kind: Kind, handle: u64, driver: impl FnOnce() -> CuResult) -> CuResult {
    let _settle = Removed {
        counted: allocations::remove(kind, handle),
        call,
        kind,
        handle,
    };
    call.driver(driver)
}

/// An entry taken out for a free in progress: settled when dropped, also while unwinding.
struct Removed<'c> {
    counted: Option<Counted>,
    call: &'c Call<CuResult>,
    kind: Kind,
    handle: u64,
}

impl Drop for Removed<'_> {
    fn drop(&mut self) {
        let Some(counted) = self.counted.take() else {
            return;
        };
        if self.call.result() == Some(CUDA_SUCCESS) {
            give_back(counted);
        } else {
            allocations::insert(self.kind, self.handle, counted);
        }
    }
}

fn give_back(counted: Counted) {
    // Something was counted, so the mode was decided (as enforcing) before.
    if let Some(vgpu) = state::joined() {
        if let Some(record) = state::record(vgpu) {
            vgpu.usage.release(record, counted.device, counted.bytes);
        }
    }
}

/// Whether a reclaim now could give anything back (`false` only when that is certain).
fn reclaim_could_help(vgpu: &Vgpu) -> bool {
    !vgpu.usage.nothing_to_reclaim(&PEERS.lock())
}

/// Reclaim dead processes' bytes and keep the fresh listing of the live ones.
fn reclaim(vgpu: &Vgpu) -> ReclaimReport {
    let (report, peers) = vgpu.usage.reclaim_dead_quick_listing();
    let old = std::mem::replace(&mut *PEERS.lock(), peers);
    // Closed outside the lock.
    drop(old);
    report
}

/// Fork prepare: hold the listing so the child's copy is whole.
pub fn lock_peers() {
    PEERS.acquire();
}

/// Fork parent: release what [`lock_peers`] took.
///
/// # Safety
/// Only after [`lock_peers`] in this thread.
pub unsafe fn unlock_peers() {
    // SAFETY: taken by this thread in lock_peers(); no guard exists.
    unsafe { PEERS.force_unlock() };
}

/// Fork child: the listing is the parent's (and the child is one of its peers): close the
/// child's copies of the descriptors and forget it, freeing nothing.
///
/// # Safety
/// Only after [`lock_peers`] in the forking thread, in the child.
pub unsafe fn reset_peers_in_child() {
    // SAFETY: this (only) thread holds the lock since lock_peers(); no guard exists.
    unsafe {
        PEERS.get_locked().forget();
        PEERS.force_unlock();
    }
}

static LAST_INFO_RECLAIM_NS: AtomicU64 = AtomicU64::new(0);

/// For memory-info queries: give back dead processes' bytes now and then (at most once a
/// second per process, and only if a reclaim could help), so "free" does not stay low after
/// a worker died.
pub fn reclaim_for_info(vgpu: &Vgpu) {
    let now = now_unix_ns();
    let last = LAST_INFO_RECLAIM_NS.load(Ordering::Relaxed);
    if now.saturating_sub(last) < 1_000_000_000 {
        return;
    }
    if LAST_INFO_RECLAIM_NS
        .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
        .is_ok()
        && reclaim_could_help(vgpu)
    {
        let _ = reclaim(vgpu);
    }
}

/// `(total, free)` the vGPU grants on `device` given what the device really has free: the
/// quota, and the quota's unused part clamped to the real free memory.
pub fn virtual_info(vgpu: &Vgpu, device: usize, real_free: u64) -> (u64, u64) {
    let quota = vgpu.usage.quota_bytes(device);
    let used = vgpu.usage.used_bytes(device);
    (quota, quota.saturating_sub(used).min(real_free))
}
