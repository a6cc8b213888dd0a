//! One-line messages on stderr, written with a single `write(2)`: no stdio lock (a lock a
//! `fork` could copy in the held state), lines never interleave between threads.

use std::sync::atomic::{AtomicBool, Ordering};

/// Write `vgpu: <message>` and a newline to stderr.
pub fn line(message: std::fmt::Arguments<'_>) {
    let text = format!("vgpu: {message}\n");
    let mut rest = text.as_bytes();
    while !rest.is_empty() {
        // SAFETY: writing an initialised buffer of the given length to fd 2.
        let n = unsafe { libc::write(2, rest.as_ptr().cast(), rest.len()) };
        if n <= 0 {
            break;
        }
        rest = &rest[n as usize..];
    }
}

/// A message printed at most once per process.
pub struct Once(AtomicBool);

impl Once {
    pub const fn new() -> Once {
        Once(AtomicBool::new(false))
    }

    pub fn line(&self, message: std::fmt::Arguments<'_>) {
        if !self.0.swap(true, Ordering::Relaxed) {
            line(message);
        }
    }
}

macro_rules! vgpu_log {
    ($($arg:tt)*) => { $crate::log::line(format_args!($($arg)*)) };
}

/// Print a line at most once per process (per call site).
macro_rules! vgpu_log_once {
    ($($arg:tt)*) => {{
        static ONCE: $crate::log::Once = $crate::log::Once::new();
        ONCE.line(format_args!($($arg)*))
    }};
}

pub(crate) use {vgpu_log, vgpu_log_once};
