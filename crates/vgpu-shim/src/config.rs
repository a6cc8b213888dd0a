//! Which vGPU this process belongs to: read once, at the first governed driver call (never at
//! load time, never on a hot path).
//!
//! - `VGPU_DIR` unset or empty: the shim passes everything through unchanged.
//! - `VGPU_DIR` set and `$VGPU_DIR/usage` readable: enforcing (then the fork handlers are
//!   installed, `fork`).
//! - `VGPU_DIR` set but the usage file missing, damaged or of another layout version: fail
//!   closed: this process's device allocations are refused (one line on stderr says why).
//!
//! The decision itself is kept in `state`, which the governor reads without deciding.

use std::path::PathBuf;

use vgpu_abi::layout::USAGE_FILE;
use vgpu_abi::usage::UsageFile;

use crate::log::vgpu_log;
use crate::state::{self, Mode, Vgpu};

/// The environment variable naming the vGPU's directory.
pub const VGPU_DIR_ENV: &str = "VGPU_DIR";

/// The mode, deciding it on the first call.
#[inline]
pub fn mode() -> Mode {
    state::decided_or(decide)
}

#[cold]
fn decide() -> Mode {
    crate::guard::test_panic::configure();
    state::test_stop::configure();
    let mode = match std::env::var_os(VGPU_DIR_ENV) {
        None => Mode::PassThrough,
        Some(dir) if dir.is_empty() => Mode::PassThrough,
        Some(dir) => {
            let path = PathBuf::from(dir).join(USAGE_FILE);
            match UsageFile::open(&path) {
                Ok(usage) => Mode::Enforce(Box::leak(Box::new(Vgpu { usage }))),
                Err(e) => {
                    vgpu_log!("{e}; refusing this process's GPU memory allocations ({VGPU_DIR_ENV} is set, so the quota cannot be ignored)");
                    Mode::FailClosed
                }
            }
        }
    };
    // Two threads deciding at once: the first wins; the loser's mapping is simply leaked.
    match state::settle(mode) {
        Ok(mode) => {
            if let Mode::Enforce(_) = mode {
                crate::fork::install_handlers();
                state::identify();
            }
            mode
        }
        Err(winner) => winner,
    }
}
