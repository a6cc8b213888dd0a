//! No panic crosses the C boundary: every exported function runs its body through [`guard`].

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::log::vgpu_log;

/// Run `body`; if it panics, print one line and return `fallback()` instead (the caller
/// passes "the driver's own answer": the real function called directly).
#[inline(always)]
pub fn guard<R>(what: &'static str, body: impl FnOnce() -> R, fallback: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(r) => r,
        Err(_) => {
            vgpu_log!("internal error in {what}; falling back to the driver's answer");
            fallback()
        }
    }
}
