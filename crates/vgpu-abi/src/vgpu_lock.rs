//! The per-vGPU lock for the slow paths (process registration, reclaim, reconcile). The hot
//! path (reserve/release) never takes it.
//!
//! It is an open-file-description lock (`F_OFD_SETLK`) on the first byte of the usage file:
//! - the kernel drops it when the holder dies, SIGKILL included: no lock a dead process holds;
//! - threads of one process exclude each other (each acquisition opens its own description);
//! - waiting is bounded (non-blocking attempts with back-off), so a holder that is stopped
//!   or frozen (`vgpu suspend`) makes others give up after the timeout instead of hanging;
//! - it is released explicitly before the descriptor is closed, so a copy of the descriptor
//!   inherited by a child forked meanwhile does not keep it; and a child forked while its
//!   parent held it closes its inherited copy (a `pthread_atfork` handler), so a parent that
//!   dies while holding it does not leave it held by the child.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, IntoRawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

/// The descriptor whose lock this process currently holds, or -1.
static HELD_FD: AtomicI32 = AtomicI32::new(-1);
static ATFORK: Once = Once::new();

extern "C" {
    // glibc: in libc_nonshared.a (it passes __dso_handle to __register_atfork).
    fn pthread_atfork(
        prepare: Option<unsafe extern "C" fn()>,
        parent: Option<unsafe extern "C" fn()>,
        child: Option<unsafe extern "C" fn()>,
    ) -> libc::c_int;
}

unsafe extern "C" fn close_inherited_lock_in_child() {
    let fd = HELD_FD.swap(-1, Ordering::SeqCst);
    if fd >= 0 {
        // SAFETY: `fd` is this (child) process's copy of the descriptor the forking thread
        // held; nothing else in the child owns it (that thread does not exist here).
        unsafe { libc::close(fd) };
    }
}

/// The held lock; released on drop.
pub struct VgpuLock {
    file: Option<File>,
}

impl VgpuLock {
    /// Take the lock of the vGPU whose usage file is `usage_path`, waiting at most `timeout`.
    /// `ErrorKind::WouldBlock` when it stayed busy.
    pub fn acquire(usage_path: &Path, timeout: Duration) -> io::Result<VgpuLock> {
        ATFORK.call_once(|| {
            // SAFETY: registers a handler that only touches an atomic and closes one fd;
            // async-signal-safe as a post-fork child handler must be.
            unsafe { pthread_atfork(None, None, Some(close_inherited_lock_in_child)) };
        });
        // Never through a symlink, never blocking on a FIFO (the flags cost no system call).
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(usage_path)?;
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_micros(20);
        loop {
            match set_lock(&file, libc::F_WRLCK as libc::c_short) {
                Ok(()) => break,
                Err(e) if is_busy(&e) => {
                    if Instant::now() >= deadline {
                        return Err(io::Error::new(
                            io::ErrorKind::WouldBlock,
                            format!("{}: vGPU lock busy for {timeout:?}", usage_path.display()),
                        ));
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(2));
                }
                Err(e) => return Err(e),
            }
        }
        HELD_FD.store(file.as_raw_fd(), Ordering::SeqCst);
        Ok(VgpuLock { file: Some(file) })
    }
}

impl Drop for VgpuLock {
    fn drop(&mut self) {
        if let Some(file) = self.file.take() {
            // Unlock explicitly first: a child forked meanwhile shares this description.
            let _ = set_lock(&file, libc::F_UNLCK as libc::c_short);
            HELD_FD.store(-1, Ordering::SeqCst);
            let fd = file.into_raw_fd();
            // SAFETY: we own `fd` (taken out of the File above) and close it exactly once.
            unsafe { libc::close(fd) };
        }
    }
}

fn is_busy(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EAGAIN) | Some(libc::EACCES) | Some(libc::EINTR)
    )
}

fn set_lock(file: &File, kind: libc::c_short) -> io::Result<()> {
    // SAFETY: flock is a plain C struct; all-zero is a valid value (pid must be 0 for OFD).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = 0;
    fl.l_len = 1;
    // SAFETY: valid fd and a valid flock struct that outlives the call.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &fl) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excludes_threads_and_times_out() {
        let dir = tempfile_dir();
        let path = dir.join("usage");
        std::fs::write(&path, [0u8; 64]).unwrap();
        let held = VgpuLock::acquire(&path, Duration::from_millis(10)).unwrap();
        let p2 = path.clone();
        let err = std::thread::spawn(move || VgpuLock::acquire(&p2, Duration::from_millis(30)).map(|_| ()))
            .join()
            .unwrap()
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        drop(held);
        VgpuLock::acquire(&path, Duration::from_millis(10)).unwrap();
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn released_when_holder_is_killed() {
        let dir = tempfile_dir();
        let path = dir.join("usage");
        std::fs::write(&path, [0u8; 64]).unwrap();
        // A child takes the lock with flock-compatible OFD semantics and is SIGKILLed.
        let script = format!(
            "import fcntl,struct,os,time\nf=open('{}','r+b')\nfcntl.fcntl(f, 37, struct.pack('hhqqi', fcntl.F_WRLCK, 0, 0, 1, 0))\nprint('locked', flush=True)\ntime.sleep(30)",
            path.display()
        );
        let mut child = std::process::Command::new("python3")
            .args(["-c", &script])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        use std::io::BufRead;
        io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "locked");
        assert!(VgpuLock::acquire(&path, Duration::from_millis(20)).is_err());
        child.kill().unwrap();
        child.wait().unwrap();
        VgpuLock::acquire(&path, Duration::from_millis(200)).unwrap();
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "vgpu-lock-test-{}-{}",
            std::process::id(),
            crate::layout::now_unix_ns()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
