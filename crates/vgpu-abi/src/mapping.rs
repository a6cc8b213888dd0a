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
    let file = open_no_links(path, writable).map_err(|e| match e.raw_os_error() {
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

/// Open `path` for reading (and writing) without following a symbolic link in *any* of its
/// components (`openat2` with `RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`), never
/// blocking on a FIFO, never inherited. The state directory's own path is resolved once by
/// `vgpu` (so `/var/run/vgpu` works), every name below it is vgpu's: a link anywhere there
/// was planted and is refused (`ELOOP`). On kernels without `openat2` (before 5.6), the last
/// component is still guarded by `O_NOFOLLOW` (and the directories above it are root's).
pub fn open_no_links(path: &Path, writable: bool) -> io::Result<File> {
    use std::os::fd::FromRawFd;
    use std::os::unix::ffi::OsStrExt;
    let access = if writable { libc::O_RDWR } else { libc::O_RDONLY };
    let flags = access | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: open_how is plain integers; all-zero is valid, then every field is set.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = flags as u64;
    how.mode = 0;
    how.resolve = libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: a NUL-terminated path and a fully initialised open_how of the size passed; the
    // returned descriptor is checked and then owned by the File.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            c_path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd >= 0 {
        // SAFETY: a fresh descriptor nothing else owns.
        return Ok(unsafe { File::from_raw_fd(fd as i32) });
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() != Some(libc::ENOSYS) {
        return Err(err);
    }
    OpenOptions::new()
        .read(true)
        .write(writable)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
}

/// Write `bytes` as a new file at `path`: a temporary beside it (created exclusively, never
/// through a link), owned by `owner` when given, with exactly `mode` (not the umask's),
/// then renamed over `path`. Not synced: its users are runtime files (a vGPU's limits and
/// usage, board slots, the watch's metrics textfile, rewritten every round), whole for any
/// reader whatever kills the writer (the page cache outlives it), and describing processes
/// that a crash of the machine ends with them.
pub fn write_new(path: &Path, bytes: &[u8], owner: Option<(u32, u32)>, mode: u32) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("usage"),
        std::process::id()
    ));
    // A leftover of a dead creator with our pid (never a link: removed, not followed).
    let _ = std::fs::remove_file(&tmp);
    let write = || -> io::Result<()> {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::fchown(&file, Some(uid), Some(gid))?;
        }
        // After the chown (which clears set-id bits) and whatever the umask was.
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        file.write_all(bytes)?;
        std::fs::rename(&tmp, path)
    };
    write().inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Make `path` a directory with exactly `mode`: created unless it is there, then opened
/// (never through a link) and checked to be a real directory; then, on the opened
/// directory, given to `owner` — or, with `None`, required to be this process's user's (and
/// given its group when just created, not a set-group-ID parent's) — and set to `mode`,
/// whatever the umask took away. `Err(Unsafe(reason))` for a link, a non-directory, or a
/// directory of another user.
pub fn ensure_dir(path: &Path, mode: u32, owner: Option<(u32, u32)>) -> Result<(), DirError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let created = match std::fs::DirBuilder::new().mode(mode).create(path) {
        Ok(()) => true,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
        Err(e) => return Err(DirError::Io(e)),
    };
    let dir = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) | Some(libc::ENOTDIR) => DirError::Unsafe(match std::fs::symlink_metadata(path) {
                Ok(meta) => format!("a {}, not a directory", kind_name(&meta.file_type())),
                Err(_) => "not a directory".to_string(),
            }),
            _ => DirError::Io(e),
        })?;
    let meta = dir.metadata().map_err(DirError::Io)?;
    let owner = match owner {
        Some(owner) => Some(owner),
        None => {
            // SAFETY: geteuid and getegid cannot fail and touch no memory.
            let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
            if meta.uid() != euid {
                return Err(DirError::Unsafe(format!("owned by uid {}, not by uid {euid} (remove it)", meta.uid())));
            }
            created.then_some((euid, egid))
        }
    };
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::fchown(&dir, Some(uid), Some(gid)).map_err(DirError::Io)?;
    }
    // After any chown (which may clear set-id bits).
    if meta.mode() & 0o7777 != mode || owner.is_some() {
        dir.set_permissions(std::fs::Permissions::from_mode(mode)).map_err(DirError::Io)?;
    }
    Ok(())
}

/// Why [`ensure_dir`] refused.
#[derive(Debug)]
pub enum DirError {
    Io(io::Error),
    /// Not a real directory of the right user: what it is, in words.
    Unsafe(String),
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

/// `MAP_SHARED` mapping of `len` bytes of a file, read-write or read-only, unmapped on
/// drop; or a private copy of them ([`SharedMapping::copy_of`]), freed on drop.
pub struct SharedMapping {
    ptr: *mut u8,
    len: usize,
    writable: bool,
    /// The copy `ptr` points into (8-aligned words), for [`SharedMapping::copy_of`].
    copy: Option<Box<[u64]>>,
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
        truncation_guard::register(ptr as usize, len);
        Ok(SharedMapping {
            ptr: ptr.cast(),
            len,
            writable,
            copy: None,
        })
    }

    /// A read-only copy of the first `len` bytes of `file`, read with `pread` instead of
    /// mapped: for a single look at a small file (`vgpu ps`' rows), one system call instead
    /// of a mapping, its page fault and its unmapping, and nothing a truncation of the file
    /// can fault (a file shorter than `len` now is an `UnexpectedEof` error). Accessed as a
    /// read-only mapping is: loads only.
    pub fn copy_of(file: &File, len: usize) -> io::Result<SharedMapping> {
        use std::os::unix::fs::FileExt;
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "cannot copy an empty file"));
        }
        let mut words = vec![0u64; len.div_ceil(8)].into_boxed_slice();
        let ptr = words.as_mut_ptr().cast::<u8>();
        // SAFETY: `words` holds at least `len` bytes (len.div_ceil(8) words of 8), owned here
        // and initialized; any bytes are valid u64s.
        let bytes = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
        file.read_exact_at(bytes, 0)?;
        Ok(SharedMapping {
            ptr,
            len,
            writable: false,
            copy: Some(words),
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
        if self.copy.is_some() {
            // A copy: its words are freed with it.
            return;
        }
        truncation_guard::unregister(self.ptr as usize);
        // SAFETY: ptr/len are exactly what mmap returned; no reference outlives self.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}

/// Survive a file being shrunk under a mapping (`vgpu` only; never the shim, which must not
/// touch the host program's signal handlers).
///
/// A vGPU's `usage` and per-process files belong to its tenant, who can `ftruncate` them at
/// any moment, including between `vgpu`'s size check and its next access: the access would
/// then raise SIGBUS and kill a root command (`vgpu ps`, a reconcile) — a way for one tenant
/// to break `vgpu` for everybody. With the guard installed, a SIGBUS inside a live
/// [`SharedMapping`] replaces the faulting page with a private zero page and the access is
/// retried: the command reads zeros (and its writes to that page are lost), goes on, and
/// the file is found damaged by the next open. A SIGBUS anywhere else is not ours: the
/// default action is restored and the fault repeats.
pub mod truncation_guard {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    const SLOTS: usize = 1024;
    static INSTALLED: AtomicBool = AtomicBool::new(false);
    static STARTS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
    static LENS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
    static REPLACED: AtomicUsize = AtomicUsize::new(0);

    /// Install the handler (idempotent). Mappings made before stay unguarded.
    pub fn install() -> std::io::Result<()> {
        if INSTALLED.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        // SAFETY: a zeroed sigaction is valid; the handler only uses async-signal-safe
        // operations (atomics, mmap, sigaction) and the struct lives across the call.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigbus as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut()) != 0 {
                INSTALLED.store(false, Ordering::SeqCst);
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }

    /// Pages replaced so far (tests, reports).
    pub fn pages_replaced() -> usize {
        REPLACED.load(Ordering::SeqCst)
    }

    pub(super) fn register(start: usize, len: usize) {
        if !INSTALLED.load(Ordering::Relaxed) {
            return;
        }
        for i in 0..SLOTS {
            if STARTS[i].load(Ordering::Relaxed) == 0 {
                LENS[i].store(len, Ordering::SeqCst);
                if STARTS[i].compare_exchange(0, start, Ordering::SeqCst, Ordering::Relaxed).is_ok() {
                    return;
                }
            }
        }
        // Full: this mapping is unguarded (a fault in it is fatal, as without the guard).
    }

    pub(super) fn unregister(start: usize) {
        if !INSTALLED.load(Ordering::Relaxed) {
            return;
        }
        for slot in &STARTS {
            if slot.compare_exchange(start, 0, Ordering::SeqCst, Ordering::Relaxed).is_ok() {
                return;
            }
        }
    }

    extern "C" fn on_sigbus(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
        // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
        let addr = unsafe { (*info).si_addr() } as usize;
        // SAFETY: sysconf is async-signal-safe.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let ours = (0..SLOTS).any(|i| {
            let start = STARTS[i].load(Ordering::SeqCst);
            start != 0 && addr >= start && addr < start + LENS[i].load(Ordering::SeqCst)
        });
        if ours {
            let base = addr & !(page - 1);
            // SAFETY: `base` lies inside one of our live mappings; replacing one of its pages
            // with a private zero page changes no memory anything else owns.
            let p = unsafe {
                libc::mmap(
                    base as *mut libc::c_void,
                    page,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                REPLACED.fetch_add(1, Ordering::SeqCst);
                return;
            }
        }
        // Not ours (or the page could not be replaced): the default action, on the re-fault.
        // SAFETY: restoring SIG_DFL with a zeroed sigaction is valid and async-signal-safe.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut());
        }
    }

    #[cfg(test)]
    mod tests {
        use std::io::Write;

        #[test]
        fn no_link_is_followed_in_any_component() {
            let dir = tempfile::tempdir().unwrap();
            std::fs::create_dir(dir.path().join("real")).unwrap();
            std::fs::write(dir.path().join("real/usage"), b"x").unwrap();
            std::os::unix::fs::symlink(dir.path().join("real"), dir.path().join("link")).unwrap();
            assert!(crate::mapping::open_no_links(&dir.path().join("real/usage"), false).is_ok());
            let err = crate::mapping::open_no_links(&dir.path().join("link/usage"), false).unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::ELOOP), "a linked directory on the way is refused");
            assert!(matches!(
                crate::mapping::open_regular(&dir.path().join("link/usage"), true),
                Err(crate::mapping::OpenRegularError::NotRegular("symbolic link"))
            ));
        }

        #[test]
        fn a_file_shrunk_under_a_guarded_mapping_reads_as_zeros() {
            super::install().unwrap();
            let mut file = tempfile::tempfile().unwrap();
            file.write_all(&[7u8; 8192]).unwrap();
            let map = crate::mapping::SharedMapping::new(&file, 8192, true).unwrap();
            // SAFETY: u64 at an aligned, in-bounds offset; no other reference.
            let before: u64 = unsafe { *map.at::<u64>(4096) };
            assert_eq!(before, u64::from_ne_bytes([7; 8]));
            file.set_len(0).unwrap();
            let replaced = super::pages_replaced();
            // SAFETY: as above; the page is now beyond the file's end.
            let after: u64 = unsafe { std::ptr::read_volatile(map.at::<u64>(4096)) };
            assert_eq!(after, 0);
            assert!(super::pages_replaced() > replaced);
        }
    }
}
