//! Whether a `vgpu watch` runs for a state directory, for `vgpu doctor`: it holds an
//! exclusive `flock` on `<state>/watch.lock` for its whole life (see `Watch::start`).

use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

/// What can be told about the watch of a state directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Running {
    /// Holding the lock; its pid as it wrote it.
    Yes(Option<u32>),
    No,
    /// The lock file cannot be opened (not root) or locked.
    Unknown(String),
}

/// Look without creating anything: the lock file is opened read-only, without following a
/// link or blocking on a FIFO, and a shared lock is tried without waiting.
pub fn running(state_dir: &Path) -> Running {
    held(&state_dir.join(super::INSTANCE_LOCK))
}

/// Whether a lock file of this kind (an exclusive `flock` held for a runner's life, its pid
/// written in it: `watch.lock`, `service-NAME.lock`) is held, looked at as [`running`] does.
pub fn held(path: &Path) -> Running {
    let path = path.to_path_buf();
    let file = match std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC).open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Running::No,
        Err(e) => return Running::Unknown(format!("{}: {e}", path.display())),
    };
    if !file.metadata().map(|m| m.is_file()).unwrap_or(false) {
        return Running::Unknown(format!("{}: not a regular file", path.display()));
    }
    match Flock::lock(file, FlockArg::LockSharedNonblock) {
        Ok(_unlocked_on_drop) => Running::No,
        Err((file, Errno::EWOULDBLOCK)) => {
            let mut buf = [0u8; 24];
            let n = std::os::unix::fs::FileExt::read_at(&file, &mut buf, 0).unwrap_or(0);
            let pid = std::str::from_utf8(&buf[..n]).ok().and_then(|s| s.trim().parse().ok());
            Running::Yes(pid)
        }
        Err((_, e)) => Running::Unknown(format!("{}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_free_and_missing() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(running(dir.path()), Running::No, "no file: never ran");
        let held = vgpu_store::state::StoreLock::acquire_within(&dir.path().join(crate::watch::INSTANCE_LOCK), std::time::Duration::ZERO).unwrap();
        assert_eq!(running(dir.path()), Running::Yes(Some(std::process::id())));
        drop(held);
        assert_eq!(running(dir.path()), Running::No);
    }
}
