//! What each governed function does around its driver call. The exports themselves are
//! generated from the list in `crate::governed` (by `crate::interpose::exports`): each runs
//! its hook under [`crate::guard::guard`], handing it a [`crate::guard::Call`] (through which
//! the hook calls the driver, exactly once) and the real function (of type
//! `crate::real::sig::FIRST`). The hooks decide the mode (`crate::config::mode`) and hand it
//! to the governor. The hooks' safety contract is the CUDA driver / NVML API's own.
#![allow(clippy::missing_safety_doc)]

pub mod arrays;
pub mod info;
pub mod init;
pub mod launch;
pub mod memory;
pub mod nvml;
pub mod pools;
pub mod vmm;

/// Call the real driver function: `driver!(cuMemAlloc_v2(dptr, bytes))`.
macro_rules! driver {
    ($name:ident ( $($arg:expr),* $(,)? )) => {
        // SAFETY: the driver's own function of the same C signature (crate::real), called
        // with the arguments the program passed to the wrapper, unchanged or checked.
        unsafe { $crate::real::$name($($arg),*) }
    };
}
pub(crate) use driver;
