//! This process's per-process state file and what a `fork` must do to the shim's state.
//!
//! The per-process file (`procs/<pid>-<start>`) is created at the first reservation, not at
//! `cuInit`: processes that never allocate (nvidia-smi, a parent that only spawns workers)
//! leave no record.
//!
//! Fork: the child is a new process with its own pid, so it must not update its parent's
//! record (the mapping is shared) nor free its parent's allocations. A `pthread_atfork`
//! child handler drops the inherited record and allocation table; the child registers its
//! own record when it first allocates. The prepare handler takes the allocation-table locks
//! so that no other thread is half-way through an update when the address space is copied.

use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::Once;

use vgpu_abi::process::ProcessId;
use vgpu_abi::procfile::ProcFile;

use crate::config::Vgpu;
use crate::governor::{allocations, devices};
use crate::hooks::pools;
use crate::log::vgpu_log_once;

static RECORD: AtomicPtr<ProcFile> = AtomicPtr::new(std::ptr::null_mut());
static REGISTERING: AtomicBool = AtomicBool::new(false);
static FORK_HANDLERS: Once = Once::new();

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

extern "C" {
    // glibc (libc_nonshared.a).
    fn pthread_atfork(
        prepare: Option<unsafe extern "C" fn()>,
        parent: Option<unsafe extern "C" fn()>,
        child: Option<unsafe extern "C" fn()>,
    ) -> libc::c_int;
}

unsafe extern "C" fn before_fork() {
    pools::lock();
    allocations::lock_all();
}

unsafe extern "C" fn after_fork_in_parent() {
    // SAFETY: this thread took every lock in before_fork.
    unsafe {
        allocations::unlock_all();
        pools::unlock();
    }
}

unsafe extern "C" fn after_fork_in_child() {
    // SAFETY: the forking thread took every lock in before_fork; it is the only thread here.
    unsafe {
        allocations::reset_in_child();
        pools::unlock();
    }
    devices::reset_in_child();
    crate::governor::compute::reset_in_child();
    // The parent's record stays mapped (leaked): the child just stops using it.
    RECORD.store(std::ptr::null_mut(), Ordering::Release);
    REGISTERING.store(false, Ordering::Release);
}

/// Register the fork handlers (once, when the process joins a vGPU; never at load time).
pub fn install_fork_handlers() {
    FORK_HANDLERS.call_once(|| {
        // SAFETY: the handlers only take/release the shim's spin locks and reset atomics.
        let rc = unsafe { pthread_atfork(Some(before_fork), Some(after_fork_in_parent), Some(after_fork_in_child)) };
        if rc != 0 {
            vgpu_log_once!("pthread_atfork failed ({rc}); a forked child may misattribute GPU memory");
        }
    });
}
