//! A shared, read-write memory mapping of a whole file: the only way the layouts of
//! [`crate::layout`] are accessed, so that every update is an atomic on shared memory.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Why [`open_regular`] refused a path.
#[derive(Debug)]
pub enum OpenRegularError {
    /// The open (or fstat) failed.
    Io(io::Error),
    /// The path names something other than a regular file (a FIFO, a symbolic link, a
    /// directory, a socket, a device): what it is, in words.
    NotRegular(&'static str),
}

/// Open a shared state file safely in a directory other users may write to: never through a
/// symbolic link (`O_NOFOLLOW`), never blocking on a FIFO (`O_NONBLOCK`), never inherited by
/// a child (`O_CLOEXEC`); then check, on the opened descriptor, that it is a regular file.
/// Returns the file and its length. `O_NONBLOCK` has no effect on a regular file's reads
/// or mappings. Slow paths only (open + fstat).
pub fn open_regular(path: &Path, writable: bool) -> Result<(File, u64), OpenRegularError> {
    let file = OpenOptions::new()
        .read(true)
        .write(writable)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => OpenRegularError::NotRegular("symbolic link"),
            Some(libc::EISDIR) => OpenRegularError::NotRegular("directory"),
            Some(libc::ENXIO) => OpenRegularError::NotRegular("socket or device"),
            _ => OpenRegularError::Io(e),
        })?;
    let meta = file.metadata().map_err(OpenRegularError::Io)?;
    if !meta.file_type().is_file() {
        return Err(OpenRegularError::NotRegular(kind_name(&meta.file_type())));
    }
    Ok((file, meta.len()))
}

/// A file type in words, for reports.
pub fn kind_name(kind: &std::fs::FileType) -> &'static str {
    if kind.is_file() {
        "regular file"
    } else if kind.is_dir() {
        "directory"
    } else if kind.is_symlink() {
        "symbolic link"
    } else if kind.is_fifo() {
        "FIFO"
    } else if kind.is_socket() {
        "socket"
    } else if kind.is_block_device() || kind.is_char_device() {
        "device"
    } else {
        "special file"
    }
}

/// `MAP_SHARED` mapping of `len` bytes of a file, read-write or read-only. Unmapped on drop.
pub struct SharedMapping {
    ptr: *mut u8,
    len: usize,
    writable: bool,
}

// SAFETY: the mapping is plain shared memory; every access through it goes through atomics
// or reads of fields that are immutable after creation, so sharing it between threads is sound.
unsafe impl Send for SharedMapping {}
// SAFETY: as above.
unsafe impl Sync for SharedMapping {}

impl SharedMapping {
    /// Map the first `len` bytes of `file`; `writable` needs a file opened read-write.
    pub fn new(file: &File, len: usize, writable: bool) -> io::Result<SharedMapping> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "cannot map an empty file"));
        }
        // SAFETY: a fresh mapping chosen by the kernel (addr = null) of a valid open fd; the
        // result is checked against MAP_FAILED before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                if writable {
                    libc::PROT_READ | libc::PROT_WRITE
                } else {
                    libc::PROT_READ
                },
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(SharedMapping {
            ptr: ptr.cast(),
            len,
            writable,
        })
    }

    /// Whether stores through this mapping are allowed (a read-only one faults on them).
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A reference to a `T` at `offset`.
    ///
    /// # Safety
    /// `T` must be a `#[repr(C)]` type of integers, byte arrays and atomics (valid for any bit
    /// pattern), and non-atomic fields must not be written while the reference lives. Through
    /// a read-only mapping, the caller must only load.
    pub unsafe fn at<T>(&self, offset: usize) -> &T {
        assert!(
            offset + std::mem::size_of::<T>() <= self.len,
            "mapping access out of bounds"
        );
        assert!(
            offset.is_multiple_of(std::mem::align_of::<T>()),
            "misaligned mapping access"
        );
        // SAFETY: in bounds and aligned (checked above); the caller guarantees T is valid for
        // any bytes. The mapping outlives the reference (tied to &self).
        unsafe { &*self.ptr.add(offset).cast::<T>() }
    }

    /// [`SharedMapping::at`] without the checks, for hot paths whose offsets were validated
    /// when the file was opened.
    ///
    /// # Safety
    /// As [`SharedMapping::at`], and `offset` must be in bounds and aligned for `T`.
    #[inline(always)]
    pub unsafe fn at_unchecked<T>(&self, offset: usize) -> &T {
        debug_assert!(offset + std::mem::size_of::<T>() <= self.len);
        // SAFETY: the caller guarantees bounds, alignment and validity.
        unsafe { &*self.ptr.add(offset).cast::<T>() }
    }

    /// The mapped bytes, for writing a fresh file's immutable fields before it is published.
    ///
    /// # Safety
    /// No other reference into the mapping may be alive and no other process may see the
    /// file yet.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes_mut(&self) -> &mut [u8] {
        // SAFETY: the caller guarantees exclusive access; bounds are the mapping's.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for SharedMapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly what mmap returned; no reference outlives self.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}
