//! Small files vgpu reads as root (service definitions and their state, workload files):
//! opened without following a symlink and without blocking on a FIFO, checked on the opened
//! descriptor (a regular file, at most a cap), so a path swapped meanwhile cannot pass.
//! The caller may check more on the opened file's metadata (owner, mode) before reading a
//! byte of it.

use std::fs::{File, Metadata};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
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
pub fn open(path: &Path, links: Links, cap: u64) -> Result<(File, Metadata), SmallFileError> {
    let opened = match links {
        Links::Nowhere => vgpu_abi::mapping::open_no_links(path, false),
        Links::NotLast => std::fs::OpenOptions::new()
            .read(true)
            // A FIFO opens at once (and is refused below) instead of waiting for a writer;
            // never a controlling terminal.
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
            .open(path),
    };
    let file = opened.map_err(|e| match e.raw_os_error() {
        Some(libc::ELOOP) => SmallFileError::Link,
        _ => SmallFileError::Io(e),
    })?;
    let meta = file.metadata().map_err(SmallFileError::Io)?;
    if !meta.file_type().is_file() {
        return Err(SmallFileError::NotRegular);
    }
    if meta.len() > cap {
        return Err(SmallFileError::TooLarge(meta.len()));
    }
    Ok((file, meta))
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
