//! This process's place in its vGPU: the [`Mode`] (decided once, by `config`, at the first
//! governed call), the [`Vgpu`] it enforces, and its per-process state file.
//!
//! The per-process file (`procs/<pid>-<start>`) is created at the first reservation, not at
//! `cuInit`: processes that never allocate (nvidia-smi, a parent that only spawns workers)
//! leave no record. Only the process's identity (its start time, from `/proc`) is read when
//! it joins the vGPU ([`identify`]). A forked child drops the inherited record and identity
//! ([`reset_in_child`], called by the fork handlers in `fork`) and registers its own when it
//! first allocates.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};

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

/// This process's pid and start time, read when it joined the vGPU; pid 0: not read.
static ME_PID: AtomicU32 = AtomicU32::new(0);
static ME_START: AtomicU64 = AtomicU64::new(0);

/// Read this process's identity now (`config`, when the process joins a vGPU), so that its
/// first allocation does not have to.
pub fn identify() {
    if let Some(id) = ProcessId::current() {
        ME_START.store(id.start_time, Ordering::Relaxed);
        ME_PID.store(id.pid, Ordering::Release);
    }
}

/// This process's identity: the one read when it joined, if it is still this process's.
fn identity() -> Option<ProcessId> {
    let pid = ME_PID.load(Ordering::Acquire);
    // SAFETY: getpid has no preconditions and cannot fail.
    if pid != 0 && pid == unsafe { libc::getpid() } as u32 {
        return Some(ProcessId {
            pid,
            start_time: ME_START.load(Ordering::Relaxed),
        });
    }
    ProcessId::current()
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
        let created = identity()
            .ok_or_else(|| std::io::Error::other("cannot read this process's start time from /proc"))
            .and_then(|id| vgpu.usage.register_observed(id, &mut test_stop::at));
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
    ME_PID.store(0, Ordering::Release);
}

/// `VGPU_SHIM_TEST_STOP=register:<step>` (`opened`, `written`, `counted`) makes the
/// process stop itself (SIGSTOP) at that step of its registration, so that the tests can
/// kill it exactly there. Read once with the rest of the configuration (the first governed
/// call); without it, each step is one relaxed load.
pub mod test_stop {
    use std::sync::atomic::{AtomicU8, Ordering};

    use vgpu_abi::usage::RegisterStep;

    pub const ENV: &str = "VGPU_SHIM_TEST_STOP";

    const NONE: u8 = 0;
    static STEP: AtomicU8 = AtomicU8::new(NONE);

    fn code(step: RegisterStep) -> u8 {
        match step {
            RegisterStep::Opened => 1,
            RegisterStep::Written => 2,
            RegisterStep::Published => 3,
            RegisterStep::WaitingForReclaim => 4,
            RegisterStep::Ready => 5,
        }
    }

    /// Read the variable (called once, by `config`).
    #[cold]
    pub fn configure() {
        let Some(value) = std::env::var_os(ENV) else {
            return;
        };
        let step = match value.to_str() {
            Some("register:opened") => RegisterStep::Opened,
            Some("register:written") => RegisterStep::Written,
            Some("register:counted") => RegisterStep::Ready,
            _ => return,
        };
        STEP.store(code(step), Ordering::Relaxed);
    }

    /// Stop here if the tests asked for it.
    pub fn at(step: RegisterStep) {
        if STEP.load(Ordering::Relaxed) == code(step) {
            // SAFETY: raise has no memory preconditions; SIGSTOP stops the whole process
            // until a SIGCONT (or the test's SIGKILL).
            unsafe { libc::raise(libc::SIGSTOP) };
        }
    }
}
