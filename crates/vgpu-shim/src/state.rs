//! This process's place in its vGPU: the [`Mode`] (decided once, by `config`, at the first
//! governed call), the [`Vgpu`] it enforces, and its per-process state file.
//!
//! The per-process file (`procs/<pid>-<start>`) is created at the first reservation, not at
//! `cuInit`: processes that never allocate (nvidia-smi, a parent that only spawns workers)
//! leave no record. A forked child drops the inherited record ([`reset_in_child`], called by
//! the fork handlers in `fork`) and registers its own when it first allocates.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};

use vgpu_abi::process::ProcessId;
use vgpu_abi::procfile::ProcFile;
use vgpu_abi::usage::UsageFile;

use crate::log::vgpu_log_once;

/// The vGPU this process is in.
pub struct Vgpu {
    pub usage: UsageFile,
}

pub enum Mode {
    PassThrough,
    FailClosed,
    Enforce(&'static Vgpu),
}

const UNKNOWN: usize = 0;
const PASS_THROUGH: usize = 1;
const FAIL_CLOSED: usize = 2;

/// UNKNOWN, PASS_THROUGH, FAIL_CLOSED, or the address of a leaked `Vgpu`.
static MODE: AtomicUsize = AtomicUsize::new(UNKNOWN);

/// The mode, or what `decide` decides while there is none yet (`config::mode` passes the
/// decision, made once, at the first governed call).
#[inline(always)]
pub fn decided_or(decide: impl FnOnce() -> Mode) -> Mode {
    match MODE.load(Ordering::Acquire) {
        UNKNOWN => decide(),
        value => decode(value),
    }
}

/// The vGPU, once the mode is decided as enforcing (never decides it).
#[inline]
pub fn joined() -> Option<&'static Vgpu> {
    match MODE.load(Ordering::Acquire) {
        UNKNOWN => None,
        value => match decode(value) {
            Mode::Enforce(vgpu) => Some(vgpu),
            _ => None,
        },
    }
}

/// Set the mode once: `Ok(mode)` if this call set it, `Err(the mode set first)` if another
/// thread was first (a losing `Enforce`'s `Vgpu` is simply leaked).
pub fn settle(mode: Mode) -> Result<Mode, Mode> {
    let value = match mode {
        Mode::PassThrough => PASS_THROUGH,
        Mode::FailClosed => FAIL_CLOSED,
        Mode::Enforce(vgpu) => vgpu as *const Vgpu as usize,
    };
    match MODE.compare_exchange(UNKNOWN, value, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => Ok(decode(value)),
        Err(winner) => Err(decode(winner)),
    }
}

#[inline]
fn decode(value: usize) -> Mode {
    match value {
        PASS_THROUGH => Mode::PassThrough,
        FAIL_CLOSED => Mode::FailClosed,
        // SAFETY: any other value was stored from a leaked, never-freed &'static Vgpu.
        ptr => Mode::Enforce(unsafe { &*(ptr as *const Vgpu) }),
    }
}

static RECORD: AtomicPtr<ProcFile> = AtomicPtr::new(std::ptr::null_mut());
static REGISTERING: AtomicBool = AtomicBool::new(false);

/// This process's record, created on first use; `None` if it cannot be created (then the
/// allocation is refused: an unrecorded reservation could not be reclaimed if we died).
#[inline]
pub fn record(vgpu: &Vgpu) -> Option<&'static ProcFile> {
    let p = RECORD.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: RECORD only ever holds leaked, never-freed ProcFiles.
        return Some(unsafe { &*p });
    }
    register(vgpu)
}

#[cold]
fn register(vgpu: &Vgpu) -> Option<&'static ProcFile> {
    // One registration per process: two would create the same file twice.
    while REGISTERING
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        std::thread::yield_now();
    }
    let mut p = RECORD.load(Ordering::Acquire);
    if p.is_null() {
        let created = ProcessId::current()
            .ok_or_else(|| std::io::Error::other("cannot read this process's start time from /proc"))
            .and_then(|id| vgpu.usage.register(id));
        match created {
            Ok(file) => {
                p = Box::into_raw(Box::new(file));
                RECORD.store(p, Ordering::Release);
            }
            Err(e) => vgpu_log_once!(
                "cannot create this process's state file in {}: {e}; refusing GPU memory allocations until it can",
                vgpu.usage.procs_dir().display()
            ),
        }
    }
    REGISTERING.store(false, Ordering::Release);
    // SAFETY: as in record().
    (!p.is_null()).then(|| unsafe { &*p })
}

/// Fork child: the parent's record stays mapped (leaked): the child just stops using it.
pub fn reset_in_child() {
    RECORD.store(std::ptr::null_mut(), Ordering::Release);
    REGISTERING.store(false, Ordering::Release);
}
