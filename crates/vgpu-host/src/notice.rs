//! Notices: what a command is doing, for the person watching it, on stderr unless `-q`.
//! The CLI sets `-q` ([`set_quiet`]); the launch and the pool's effects say what they wait for.

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};

/// `-q`: notices are not printed (errors still are).
static QUIET: AtomicBool = AtomicBool::new(false);

/// Set by `main` from `-q`.
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// A notice: what a command is doing, for the person watching it (`vgpu: waiting for the
/// memory…`), on stderr unless `-q`. Not a result (stdout) and not a warning (the log).
pub fn notice(message: std::fmt::Arguments<'_>) {
    if !QUIET.load(Ordering::Relaxed) {
        // Not eprintln!, which panics when stderr is gone (a closed pipe): a notice is
        // dropped then, and the command (`vgpu run` relaying signals) goes on.
        let _ = writeln!(std::io::stderr(), "vgpu: {message}");
    }
}

/// `notice!("waiting for {what}…")`: see [`notice`].
#[macro_export]
macro_rules! notice {
    ($($arg:tt)*) => {
        $crate::notice::notice(format_args!($($arg)*))
    };
}

