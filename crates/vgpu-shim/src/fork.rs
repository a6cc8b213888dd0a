//! What a `fork` must do to the shim's state.
//!
//! The child is a new process with its own pid, so it must not update its parent's record
//! (the mapping is shared) nor free its parent's allocations. A `pthread_atfork` child
//! handler drops the inherited record, allocation table and listing of the vGPU's other
//! processes (closing its copies of their pidfds); the child registers its own record when
//! it first allocates. The prepare handler takes the allocation-table and listing locks so
//! that no other thread is half-way through an update when the address space is copied.
//!
//! The handlers are installed once, when the process joins a vGPU (`config`).

use std::sync::Once;

use crate::governor::{allocations, compute, devices, memory, pools};
use crate::log::vgpu_log_once;
use crate::state;

static FORK_HANDLERS: Once = Once::new();

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
    memory::lock_peers();
}

unsafe extern "C" fn after_fork_in_parent() {
    // SAFETY: this thread took every lock in before_fork.
    unsafe {
        memory::unlock_peers();
        allocations::unlock_all();
        pools::unlock();
    }
}

unsafe extern "C" fn after_fork_in_child() {
    // SAFETY: the forking thread took every lock in before_fork; it is the only thread here.
    unsafe {
        memory::reset_peers_in_child();
        allocations::reset_in_child();
        pools::unlock();
    }
    devices::reset_in_child();
    compute::reset_in_child();
    state::reset_in_child();
}

/// Register the fork handlers (once, when the process joins a vGPU; never at load time).
pub fn install_handlers() {
    FORK_HANDLERS.call_once(|| {
        // SAFETY: the handlers only take/release the shim's spin locks and reset atomics.
        let rc = unsafe { pthread_atfork(Some(before_fork), Some(after_fork_in_parent), Some(after_fork_in_child)) };
        if rc != 0 {
            vgpu_log_once!("pthread_atfork failed ({rc}); a forked child may misattribute GPU memory");
        }
    });
}
