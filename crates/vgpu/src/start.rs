//! How the `vgpu` binary starts: from C's `main` (`#![no_main]` in `src/main.rs`), not through
//! Rust's runtime start (`fn main`, `std::rt::lang_start`).
//!
//! That start places the main thread's stack-overflow guard through glibc's
//! `pthread_getattr_np`, which opens and parses `/proc/self/maps` line by line: 50–90 µs of
//! every command on a 2-core VM (issue 28, `benches/run_overhead.rs`). What else it does,
//! vgpu needs, and [`run`] does it:
//!
//! - **Standard descriptors.** A descriptor 0, 1 or 2 that is closed at the start is opened
//!   on `/dev/null`, so that no file vgpu opens later (a state file, the store's lock) takes
//!   its number and receives what is printed, or is inherited by a workload as its output.
//! - **SIGPIPE is ignored** (a write to a closed pipe is an `EPIPE` error, not death);
//!   `main` sets it back to its default for the listings, as before. Processes started
//!   through `std::process::Command` get it at its default, as they did.
//! - **A panic** ends vgpu with exit status 101 after its message, as Rust's start did.
//! - **Standard output is flushed** on the way out (`std::process::exit` still does it
//!   itself).
//!
//! What is left out: the message on a stack overflow (a `SIGSEGV` ends vgpu either way) and
//! the main thread's name in a panic message (`<unnamed>` instead of `main`).

use std::io::Write as _;

/// The exit status of a command that panicked, as Rust's own start gives it.
pub const PANICKED: u8 = 101;

/// Run `command` as vgpu's main: after [`standard_fds`] and with SIGPIPE ignored; its exit
/// status, or [`PANICKED`].
pub fn run(command: impl FnOnce() -> u8) -> i32 {
    standard_fds();
    // SAFETY: sets one signal's disposition, before any thread of ours runs.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(command)).unwrap_or(PANICKED);
    // A closed pipe or a full disk: nothing is left to say it on.
    let _ = std::io::stdout().flush();
    i32::from(code)
}

/// Open each of descriptors 0, 1 and 2 that is closed on `/dev/null`. `open` takes the
/// lowest free number, and the lower ones are open by then, so each lands on its own.
/// Aborts when one cannot be opened: vgpu must not run with a standard descriptor free.
pub fn standard_fds() {
    for fd in 0..3 {
        // SAFETY: asks for a descriptor's flags; nothing is changed.
        let closed = unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EBADF);
        // SAFETY: opens /dev/null (a NUL-terminated path) without keeping any pointer.
        if closed && unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) } != fd {
            std::process::abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_commands_status_is_the_exit_status_and_a_panic_is_101() {
        assert_eq!(run(|| 0), 0);
        assert_eq!(run(|| 3), 3);
        assert_eq!(run(|| panic!("a test's panic")), i32::from(PANICKED));
    }
}
