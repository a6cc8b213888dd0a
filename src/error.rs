//! Exit codes and the one error type that changes them.
//!
//! 0: success. 1: a runtime failure (something on the host or in the state went wrong).
//! 2: a usage error (bad flag, bad value, bad config): the user must change the request.

use std::fmt;

pub const EXIT_OK: u8 = 0;
pub const EXIT_FAILURE: u8 = 1;
pub const EXIT_USAGE: u8 = 2;

/// An error the user caused by what they asked for; `main` exits 2 on it.
/// Wrap it in `anyhow::Error` (`UsageError::new(..).into()` or `usage!(..)`).
#[derive(Debug)]
pub struct UsageError(pub String);

impl UsageError {
    pub fn new(message: impl Into<String>) -> Self {
        UsageError(message.into())
    }
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// `bail!` for usage errors: `usage!("--mem must be positive, got {v}")`.
#[macro_export]
macro_rules! usage {
    ($($arg:tt)*) => {
        return Err(anyhow::Error::from($crate::error::UsageError::new(format!($($arg)*))))
    };
}

/// The exit code for an error: 2 if any cause in its chain is a usage error, else 1.
pub fn exit_code_for(err: &anyhow::Error) -> u8 {
    if err.chain().any(|cause| cause.is::<UsageError>()) {
        EXIT_USAGE
    } else {
        EXIT_FAILURE
    }
}
