//! The store lock: an exclusive `flock` on `<state-dir>/lock`, released by the kernel
//! when the holder exits or dies, so no crash can leave it held.
//!
//! It is never waited for forever: [`StoreLock::acquire`] gives up after a deadline
//! ([`DEFAULT_TIMEOUT`], or `VGPU_LOCK_TIMEOUT_MS`) with an error naming the holder. The
//! holder writes its pid into the file once it has the lock (truncate + write: the same
//! inode, which is what `flock` locks) and empties it before letting go. The file is mode
//! 0600: only root can open it, so no other user can take the lock with a read-only open.

use std::fs::File;
use std::io::Read as _;
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use super::StateError;

/// How long a command waits for the store lock by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// Environment override of the wait, in milliseconds.
pub const TIMEOUT_ENV: &str = "VGPU_LOCK_TIMEOUT_MS";

pub struct StoreLock {
    lock: Flock<File>,
}

impl StoreLock {
    /// Take the lock, waiting at most [`timeout`].
    pub fn acquire(path: &Path) -> Result<StoreLock, StateError> {
        StoreLock::acquire_within(path, timeout())
    }

    /// Take the lock, waiting at most `wait`; [`StateError::LockBusy`] naming the holder
    /// when it stayed held.
    pub fn acquire_within(path: &Path, wait: Duration) -> Result<StoreLock, StateError> {
        let mut file = open(path)?;
        let deadline = Instant::now() + wait;
        let mut pause = Duration::from_millis(1);
        let lock = loop {
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => break lock,
                Err((f, Errno::EWOULDBLOCK)) | Err((f, Errno::EINTR)) => {
                    let now = Instant::now();
                    if now >= deadline {
                        let (pid, command) = holder(&f);
                        return Err(StateError::LockBusy { path: path.to_path_buf(), waited: wait, pid, command });
                    }
                    file = f;
                    std::thread::sleep(pause.min(deadline - now));
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
                Err((_, errno)) => return Err(StateError::io(path, std::io::Error::from(errno))),
            }
        };
        // Say who holds it (best effort: the lock is what matters).
        if lock.set_len(0).is_ok() {
            let _ = lock.write_all_at(format!("{}\n", std::process::id()).as_bytes(), 0);
        }
        Ok(StoreLock { lock })
    }
}

impl Drop for StoreLock {
    fn drop(&mut self) {
        // Empty before the lock goes (dropping the Flock unlocks): a later waiter never
        // names a process that no longer holds it, except one killed while holding it.
        let _ = self.lock.set_len(0);
    }
}

/// The wait: `VGPU_LOCK_TIMEOUT_MS` if set to a number, else [`DEFAULT_TIMEOUT`].
pub fn timeout() -> Duration {
    std::env::var(TIMEOUT_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_millis)
        .unwrap_or(DEFAULT_TIMEOUT)
}

/// Open (creating) the lock file: never through a symlink, never blocking on a FIFO, a
/// regular file only, mode 0600.
fn open(path: &Path) -> Result<File, StateError> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| StateError::io(path, e))?;
    let meta = file.metadata().map_err(|e| StateError::io(path, e))?;
    if !meta.file_type().is_file() {
        return Err(not_regular(path, &meta.file_type()));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        // Made before locks were root's alone.
        file.set_permissions(std::fs::Permissions::from_mode(0o600)).map_err(|e| StateError::io(path, e))?;
    }
    Ok(file)
}

pub(super) fn not_regular(path: &Path, kind: &std::fs::FileType) -> StateError {
    StateError::NotRegular { path: path.to_path_buf(), kind: vgpu_abi::mapping::kind_name(kind) }
}

/// The pid the holder wrote, and its command line (sanitised), if it still runs.
fn holder(file: &File) -> (Option<u32>, Option<String>) {
    let mut buf = [0u8; 24];
    let n = file.read_at(&mut buf, 0).unwrap_or(0);
    let pid = std::str::from_utf8(&buf[..n]).ok().and_then(|s| s.trim().parse::<u32>().ok()).filter(|&p| p > 0);
    let command = pid.and_then(command_line);
    (pid, command)
}

/// `/proc/PID/cmdline`, arguments joined by spaces, control and non-ASCII characters as
/// `?`, at most 120 characters: safe to print on one line.
pub fn command_line(pid: u32) -> Option<String> {
    let file = File::open(PathBuf::from(format!("/proc/{pid}/cmdline"))).ok()?;
    let mut raw = Vec::new();
    file.take(4096).read_to_end(&mut raw).ok()?;
    Some(sanitise_command(&raw))
}

fn sanitise_command(raw: &[u8]) -> String {
    const MAX: usize = 120;
    let text: String = raw
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| a.iter().map(|&b| if b.is_ascii_graphic() || b == b' ' { b as char } else { '?' }).collect::<String>())
        .collect::<Vec<_>>()
        .join(" ");
    if text.chars().count() > MAX {
        format!("{}…", text.chars().take(MAX).collect::<String>())
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_out_naming_the_holder_and_writes_its_pid() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        let held = StoreLock::acquire_within(&path, Duration::from_millis(100)).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap().trim(), std::process::id().to_string());
        let p = path.clone();
        let err = std::thread::spawn(move || StoreLock::acquire_within(&p, Duration::from_millis(50)).map(|_| ()))
            .join()
            .unwrap()
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains(&format!("pid {}", std::process::id())), "{msg}");
        assert!(!msg.contains('\n'), "{msg}");
        let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&path).unwrap());
        drop(held);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "", "emptied on release");
        let _again = StoreLock::acquire_within(&path, Duration::from_millis(100)).unwrap();
        assert_eq!(std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&path).unwrap()), ino, "same inode");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn refuses_a_fifo_or_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, b"x").unwrap();
        let link = dir.path().join("lock");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(StoreLock::acquire_within(&link, Duration::ZERO).is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"x");
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let err = StoreLock::acquire_within(&fifo, Duration::ZERO).map(|_| ()).unwrap_err().to_string();
        assert!(err.contains("FIFO"), "{err}");
    }

    #[test]
    fn command_lines_are_one_short_printable_line() {
        assert_eq!(sanitise_command(b"vgpu\0run\0--\0a\nb\x1b[2J\0"), "vgpu run -- a?b?[2J");
        let long = vec![b'x'; 500];
        assert_eq!(sanitise_command(&long).chars().count(), 121);
    }
}
