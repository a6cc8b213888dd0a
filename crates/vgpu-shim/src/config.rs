//! Which vGPU this process belongs to: read once, at the first governed driver call (never at
//! load time, never on a hot path).
//!
//! - `VGPU_DIR` unset or empty: the shim passes everything through unchanged.
//! - `VGPU_DIR` set and `$VGPU_DIR/usage` readable: enforcing.
//! - `VGPU_DIR` set but the usage file missing, damaged or of another layout version: fail
//!   closed: this process's device allocations are refused (one line on stderr says why).

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use vgpu_abi::layout::USAGE_FILE;
use vgpu_abi::usage::UsageFile;

use crate::log::vgpu_log;

/// The environment variable naming the vGPU's directory.
pub const VGPU_DIR_ENV: &str = "VGPU_DIR";

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

/// The mode, deciding it on the first call.
#[inline]
pub fn mode() -> Mode {
    match MODE.load(Ordering::Acquire) {
        UNKNOWN => decide(),
        value => decode(value),
    }
}

fn decode(value: usize) -> Mode {
    match value {
        PASS_THROUGH => Mode::PassThrough,
        FAIL_CLOSED => Mode::FailClosed,
        // SAFETY: any other value was stored from a leaked, never-freed &'static Vgpu.
        ptr => Mode::Enforce(unsafe { &*(ptr as *const Vgpu) }),
    }
}

#[cold]
fn decide() -> Mode {
    crate::guard::test_panic::configure();
    let value = match std::env::var_os(VGPU_DIR_ENV) {
        None => PASS_THROUGH,
        Some(dir) if dir.is_empty() => PASS_THROUGH,
        Some(dir) => {
            let path = PathBuf::from(dir).join(USAGE_FILE);
            match UsageFile::open(&path) {
                Ok(usage) => Box::into_raw(Box::new(Vgpu { usage })) as usize,
                Err(e) => {
                    vgpu_log!("{e}; refusing this process's GPU memory allocations ({VGPU_DIR_ENV} is set, so the quota cannot be ignored)");
                    FAIL_CLOSED
                }
            }
        }
    };
    // Two threads deciding at once: the first wins; the loser's mapping is simply leaked.
    match MODE.compare_exchange(UNKNOWN, value, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            if let Mode::Enforce(_) = decode(value) {
                crate::state::install_fork_handlers();
            }
            decode(value)
        }
        Err(winner) => decode(winner),
    }
}
