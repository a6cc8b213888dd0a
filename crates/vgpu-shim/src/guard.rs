//! No panic crosses the C boundary, and no panic makes the shim call the driver twice.
//!
//! Every export runs its hook through [`guard`]. The hook reaches the real driver only
//! through the [`Call`] recorder it is handed, which remembers the driver's answer. If the
//! hook panics, `guard` prints one line and returns
//! - the recorded answer when the driver was already called (it allocated, freed or launched:
//!   calling it again would allocate twice, free twice or launch twice), or
//! - the fallback (the real function, called once) when the driver was not called yet.
//!
//! Cleanup that a panic must not skip (a reservation given back, a counted allocation
//! committed) lives in `Drop` impls of the governor, which run while unwinding.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::log::vgpu_log;

/// The driver call of one exported call: records the driver's answer.
pub struct Call<R: Copy> {
    what: &'static str,
    result: Cell<Option<R>>,
}

impl<R: Copy> Call<R> {
    /// Call the driver (`driver` runs it) and record its answer.
    #[inline(always)]
    pub fn driver(&self, driver: impl FnOnce() -> R) -> R {
        test_panic::point(self.what, test_panic::BEFORE_DRIVER);
        let r = driver();
        self.result.set(Some(r));
        test_panic::point(self.what, test_panic::AFTER_DRIVER);
        r
    }

    /// The driver's answer, if it was called.
    #[inline(always)]
    pub fn result(&self) -> Option<R> {
        self.result.get()
    }

    /// Replace the recorded answer (the hook undid what the driver did, e.g. freed an
    /// allocation it must refuse, and answers `r` instead).
    #[inline(always)]
    pub fn record(&self, r: R) {
        self.result.set(Some(r));
    }
}

/// Run `body` with a fresh [`Call`]. If it panics, print one line and return the driver's
/// recorded answer, or `fallback()` (the real function) if the driver was not called.
#[inline(always)]
pub fn guard<R: Copy>(what: &'static str, body: impl FnOnce(&Call<R>) -> R, fallback: impl FnOnce() -> R) -> R {
    let call = Call {
        what,
        result: Cell::new(None),
    };
    match catch_unwind(AssertUnwindSafe(|| body(&call))) {
        Ok(r) => r,
        Err(_) => recover(what, call.result(), fallback),
    }
}

#[cold]
#[inline(never)]
fn recover<R>(what: &'static str, recorded: Option<R>, fallback: impl FnOnce() -> R) -> R {
    match recorded {
        Some(r) => {
            vgpu_log!("internal error in {what} after the driver answered; returning its answer");
            r
        }
        None => {
            vgpu_log!("internal error in {what}; falling back to the driver's answer");
            fallback()
        }
    }
}

/// `VGPU_SHIM_TEST_PANIC=<hook>:<point>` makes the named hook panic at that point, so the
/// tests can prove what a panic does. Read once with the rest of the configuration (the
/// first governed call); until then and without it, each point is one relaxed load of a
/// `false` and a branch the CPU predicts.
pub mod test_panic {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::OnceLock;

    pub const ENV: &str = "VGPU_SHIM_TEST_PANIC";
    pub const BEFORE_DRIVER: &str = "before_driver";
    pub const AFTER_DRIVER: &str = "after_driver";

    static ARMED: AtomicBool = AtomicBool::new(false);
    static TARGET: OnceLock<(String, String)> = OnceLock::new();

    /// Read the variable (called once, by `config`).
    #[cold]
    pub fn configure() {
        let Some(value) = std::env::var_os(ENV) else {
            return;
        };
        let value = value.to_string_lossy();
        let Some((hook, point)) = value.split_once(':') else {
            return;
        };
        if TARGET.set((hook.to_string(), point.to_string())).is_ok() {
            ARMED.store(true, Ordering::Release);
        }
    }

    /// Panic here if the tests asked for it.
    #[inline(always)]
    pub fn point(hook: &'static str, point: &'static str) {
        if ARMED.load(Ordering::Relaxed) {
            check(hook, point);
        }
    }

    #[cold]
    #[inline(never)]
    fn check(hook: &str, point: &str) {
        if let Some((h, p)) = TARGET.get() {
            if h == hook && p == point {
                panic!("{ENV}: injected panic in {hook} at {point}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn a_panic_after_the_driver_returns_its_answer_without_calling_it_again() {
        let calls = Cell::new(0);
        let rc = {
            guard(
                "t",
                |c: &Call<u32>| {
                    c.driver(|| {
                        calls.set(calls.get() + 1);
                        7
                    });
                    panic!("after the driver");
                },
                || {
                    calls.set(calls.get() + 1);
                    99
                },
            )
        };
        assert_eq!((rc, calls.get()), (7, 1), "the driver's answer, the driver called once");
    }

    #[test]
    fn a_panic_before_the_driver_calls_the_fallback_once() {
        let calls = Cell::new(0);
        let rc = {
            guard(
                "t",
                |_: &Call<u32>| -> u32 { panic!("before the driver") },
                || {
                    calls.set(calls.get() + 1);
                    99
                },
            )
        };
        assert_eq!((rc, calls.get()), (99, 1));
    }

    #[test]
    fn a_recorded_answer_replaces_the_drivers() {
        let rc = {
            guard(
                "t",
                |c: &Call<u32>| {
                    c.driver(|| 0);
                    c.record(2);
                    panic!("after undoing")
                },
                || 99,
            )
        };
        assert_eq!(rc, 2);
    }
}
