//! Small files vgpu reads as root (service definitions and their state, workload files):
//! opened without following a symlink and without opening anything but a regular file (a
//! FIFO, a device or a terminal is refused before it is opened: `O_PATH` first), checked on
//! the descriptor (a regular file, at most a cap), so a path swapped meanwhile cannot pass.
//! The caller may check more on the opened file's metadata (owner, mode) before reading a
//! byte of it.

use std::fs::{File, Metadata};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// Why a small file was not read.
#[derive(Debug)]
pub enum SmallFileError {
    Io(std::io::Error),
    /// A symbolic link where the file should be.
    Link,
    /// Not a regular file (a directory, a FIFO, a device, a socket).
    NotRegular,
    /// Larger than the cap: its size.
    TooLarge(u64),
}

/// Which symbolic links the path may not go through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    /// None in any component (`openat2(RESOLVE_NO_SYMLINKS)`): files under vgpu's own
    /// directories.
    Nowhere,
    /// Not the file itself (`O_NOFOLLOW`); its directories may be links (an admin's
    /// `/etc/vgpu/workloads` may be one).
    NotLast,
}

/// Open `path` for reading under `links`: a regular file of at most `cap` bytes.
///
/// The path is first opened with `O_PATH` (no open of the file itself: a device's driver,
/// a FIFO's other end or a terminal see nothing), checked on that descriptor (not a link, a
/// regular file, not above the cap), and only then opened for reading, through the checked
/// descriptor (`/proc/thread-self/fd/N`, the same inode whatever the path says now). Both
/// opens are made with the calling thread's credentials: through `identity::as_user`, the
/// caller's.
pub fn open(path: &Path, links: Links, cap: u64) -> Result<(File, Metadata), SmallFileError> {
    let handle = open_path(path, links).map_err(|e| match e.raw_os_error() {
        Some(libc::ELOOP) => SmallFileError::Link,
        _ => SmallFileError::Io(e),
    })?;
    let meta = handle.metadata().map_err(SmallFileError::Io)?;
    if meta.file_type().is_symlink() {
        return Err(SmallFileError::Link);
    }
    if !meta.file_type().is_file() {
        return Err(SmallFileError::NotRegular);
    }
    if meta.len() > cap {
        return Err(SmallFileError::TooLarge(meta.len()));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        // A regular file already; O_NONBLOCK and O_NOCTTY in case it ever were not.
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(format!("/proc/thread-self/fd/{}", handle.as_raw_fd()))
        .map_err(SmallFileError::Io)?;
    let opened = file.metadata().map_err(SmallFileError::Io)?;
    if (opened.dev(), opened.ino()) != (meta.dev(), meta.ino()) || !opened.file_type().is_file() {
        return Err(SmallFileError::Io(std::io::Error::other("the file changed while it was opened")));
    }
    Ok((file, opened))
}

/// An `O_PATH` descriptor of `path` itself (a final symbolic link is not followed: the
/// descriptor is the link's), without following a link anywhere for [`Links::Nowhere`].
fn open_path(path: &Path, links: Links) -> std::io::Result<File> {
    use std::os::fd::FromRawFd;
    use std::os::unix::ffi::OsStrExt;
    let flags = libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    if links == Links::Nowhere {
        let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        // SAFETY: open_how is plain integers; all-zero is valid, then every field is set.
        let mut how: libc::open_how = unsafe { std::mem::zeroed() };
        how.flags = flags as u64;
        how.mode = 0;
        how.resolve = libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
        // SAFETY: a NUL-terminated path and a fully initialised open_how of the size passed;
        // the returned descriptor is checked and then owned by the File.
        let fd = unsafe {
            libc::syscall(libc::SYS_openat2, libc::AT_FDCWD, c_path.as_ptr(), &how as *const libc::open_how, std::mem::size_of::<libc::open_how>())
        };
        if fd >= 0 {
            // SAFETY: a fresh descriptor nothing else owns.
            return Ok(unsafe { File::from_raw_fd(fd as i32) });
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::ENOSYS) {
            return Err(err);
        }
        // Before Linux 5.6: the last component is still not followed (and vgpu's own
        // directories above it are root's).
    }
    std::fs::OpenOptions::new().read(true).custom_flags(flags).open(path)
}

/// The bytes of a file [`open`] opened, at most `cap` (it may have grown since).
pub fn read(file: File, cap: u64) -> Result<Vec<u8>, SmallFileError> {
    let mut bytes = Vec::new();
    file.take(cap + 1).read_to_end(&mut bytes).map_err(SmallFileError::Io)?;
    match bytes.len() as u64 {
        n if n > cap => Err(SmallFileError::TooLarge(n)),
        _ => Ok(bytes),
    }
}
