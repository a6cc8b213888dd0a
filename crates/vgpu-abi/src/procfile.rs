//! Per-process state files: `$VGPU_DIR/procs/<pid>-<start_time>`, one per process of the
//! vGPU that reserved memory. The owner maps its file read-write and updates it with atomics
//! (no lock); everyone else maps it read-only. See [`crate::layout::ProcHeader`].

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use crate::layout::{
    now_unix_ns, proc_file_size, ProcDeviceRecord, ProcHeader, LAYOUT_VERSION, MAX_DEVICES, PROC_MAGIC,
};
use crate::mapping::SharedMapping;
use crate::process::ProcessId;
use crate::error::LayoutError;

/// The steps of a process's registration (`UsageFile::register_observed`): its file's, here,
/// and then the vGPU's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegisterStep {
    /// The file is created, empty (under its record's name, or under a temporary name when
    /// it replaces a file of that name).
    Opened,
    /// Its bytes are written (not yet renamed, if it has a temporary name).
    Written,
    /// Published under its record's name, whole; not yet counted in `registrations`.
    Published,
    /// A reclaim is under way: waiting for it to end before reserving anything.
    WaitingForReclaim,
    /// Counted: reservations may begin.
    Ready,
}

/// A mapped per-process file.
pub struct ProcFile {
    path: PathBuf,
    map: SharedMapping,
    device_count: usize,
}

/// `"<pid>-<start_time>"`.
pub fn file_name(id: ProcessId) -> String {
    format!("{}-{}", id.pid, id.start_time)
}

/// The process a per-process file name stands for (`None` for other names, e.g. temporaries).
pub fn parse_file_name(name: &str) -> Option<ProcessId> {
    let (pid, start) = name.split_once('-')?;
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(pid) || !all_digits(start) {
        return None;
    }
    Some(ProcessId {
        pid: pid.parse().ok()?,
        start_time: start.parse().ok()?,
    })
}

/// The process a temporary (being created) file name stands for: `.<pid>-<start>.tmp`.
pub(crate) fn parse_temp_name(name: &str) -> Option<ProcessId> {
    parse_file_name(name.strip_prefix('.')?.strip_suffix(".tmp")?)
}

impl ProcFile {
    /// Create and publish the file of process `id` in `procs_dir`, calling `observe` at each
    /// step (a test stop point).
    ///
    /// The bytes go into the new, empty file with one `pwrite`, so a reader sees either an
    /// empty file (a record still being made: too short, skipped as damaged, and holding
    /// nothing, since its process reserves only once this returns) or the whole record. If
    /// a file of that name exists (this process before an `exec`, or something put there),
    /// a fresh one replaces it: written under a temporary name, then renamed over it.
    pub(crate) fn create(
        procs_dir: &Path,
        id: ProcessId,
        device_count: usize,
        observe: &mut dyn FnMut(RegisterStep),
    ) -> io::Result<ProcFile> {
        let name = file_name(id);
        let path = procs_dir.join(&name);
        let bytes = initial_bytes(id, device_count);
        let file = match create_new(&path) {
            Ok(file) => {
                observe(RegisterStep::Opened);
                if let Err(e) = fill(&file, &bytes) {
                    let _ = std::fs::remove_file(&path);
                    return Err(e);
                }
                observe(RegisterStep::Written);
                file
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                // procs/ is writable by the tenant's processes: whatever is at the temporary
                // name (a leftover of ours, or a symlink or FIFO put there to make us write
                // through it) is unlinked, and the file is created fresh, never through a link.
                let tmp = procs_dir.join(format!(".{name}.tmp"));
                let file = match create_new(&tmp) {
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        let _ = std::fs::remove_file(&tmp);
                        create_new(&tmp)?
                    }
                    other => other?,
                };
                observe(RegisterStep::Opened);
                let written = fill(&file, &bytes);
                observe(RegisterStep::Written);
                if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, &path)) {
                    let _ = std::fs::remove_file(&tmp);
                    return Err(e);
                }
                file
            }
            Err(e) => return Err(e),
        };
        let map = SharedMapping::new(&file, bytes.len(), true)?;
        Ok(ProcFile {
            path,
            map,
            device_count,
        })
    }

    /// Map an existing per-process file read-only and check its layout.
    pub fn open(path: &Path) -> Result<ProcFile, LayoutError> {
        let io_err = |e| LayoutError::Io {
            path: path.to_path_buf(),
            source: e,
        };
        // procs/ is writable by every user: never through a symlink, never blocking on a
        // FIFO someone put there, and only a regular file is mapped.
        let (file, len) = crate::mapping::open_regular(path, false).map_err(|e| LayoutError::from_open(path, e))?;
        let len = len as usize;
        if len < std::mem::size_of::<ProcHeader>() {
            return Err(LayoutError::Truncated {
                path: path.to_path_buf(),
                len,
                expected: std::mem::size_of::<ProcHeader>(),
            });
        }
        let map = SharedMapping::new(&file, len, false).map_err(io_err)?;
        // SAFETY: ProcHeader is plain data valid for any bytes; offset 0 is page-aligned; we
        // only load through this read-only mapping.
        let header: &ProcHeader = unsafe { map.at(0) };
        if header.magic != PROC_MAGIC {
            return Err(LayoutError::BadMagic {
                path: path.to_path_buf(),
                what: "vgpu per-process file",
            });
        }
        if header.version != LAYOUT_VERSION {
            return Err(LayoutError::Version {
                path: path.to_path_buf(),
                found: header.version,
            });
        }
        let device_count = header.device_count as usize;
        if device_count == 0 || device_count > MAX_DEVICES {
            return Err(LayoutError::Corrupt {
                path: path.to_path_buf(),
                reason: format!("device count {device_count} (allowed 1..={MAX_DEVICES})"),
            });
        }
        if len != proc_file_size(device_count) {
            return Err(LayoutError::Truncated {
                path: path.to_path_buf(),
                len,
                expected: proc_file_size(device_count),
            });
        }
        Ok(ProcFile {
            path: path.to_path_buf(),
            map,
            device_count,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn device_count(&self) -> usize {
        self.device_count
    }

    /// Whether this process owns (may update) the file.
    pub fn is_writable(&self) -> bool {
        self.map.is_writable()
    }

    pub fn header(&self) -> &ProcHeader {
        // SAFETY: validated at open/create: the mapping holds a ProcHeader at offset 0, which
        // is plain data; its non-atomic fields are never written after publication.
        unsafe { self.map.at(0) }
    }

    /// The figures of device `index` (panics if out of range: a caller bug, not bad input).
    pub fn device(&self, index: usize) -> &ProcDeviceRecord {
        assert!(index < self.device_count, "device index {index} out of range");
        // SAFETY: in range of the validated length; ProcDeviceRecord is atomics only.
        unsafe {
            self.map
                .at(std::mem::size_of::<ProcHeader>() + index * std::mem::size_of::<ProcDeviceRecord>())
        }
    }

    pub fn id(&self) -> ProcessId {
        let h = self.header();
        ProcessId {
            pid: h.pid,
            start_time: h.start_time,
        }
    }

    /// `Some(ops)` if no update was in flight at the moment of the read, `ops` being the
    /// number of updates begun so far; `None` if one was.
    ///
    /// `ops_ended` is read before `ops_begun`: both only grow and `ended ≤ begun`, so equal
    /// values mean that at the instant `ops_begun` was read, `ended == begun`.
    pub fn quiescent_ops(&self) -> Option<u64> {
        let h = self.header();
        let ended = h.ops_ended.load(Ordering::SeqCst);
        let begun = h.ops_begun.load(Ordering::SeqCst);
        (begun == ended).then_some(begun)
    }

    /// Bytes in use per device.
    pub fn used(&self) -> Vec<u64> {
        (0..self.device_count)
            .map(|i| self.device(i).used_bytes.load(Ordering::SeqCst))
            .collect()
    }

    /// GPU time charged per device, ns.
    pub fn compute_ns(&self) -> Vec<u64> {
        (0..self.device_count)
            .map(|i| self.device(i).compute_ns.load(Ordering::Relaxed))
            .collect()
    }

    /// Peak bytes per device.
    pub fn peaks(&self) -> Vec<u64> {
        (0..self.device_count)
            .map(|i| self.device(i).peak_bytes.load(Ordering::Relaxed))
            .collect()
    }
}

/// A new file at `path` (never through a link; fails if anything is there), 0644 whatever
/// the umask (others of the vGPU read it to audit and reconcile).
fn create_new(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(path)?;
    file.set_permissions(std::fs::Permissions::from_mode(0o644))?;
    Ok(file)
}

/// Write a new record's `bytes` into its empty `file` in one piece.
fn fill(file: &File, bytes: &[u8]) -> io::Result<()> {
    file.write_all_at(bytes, 0)
}

/// A fresh record of `id`: the header, then zeroed device records.
fn initial_bytes(id: ProcessId, device_count: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; proc_file_size(device_count)];
    let now = now_unix_ns();
    let header = ProcHeader {
        magic: PROC_MAGIC,
        version: LAYOUT_VERSION,
        device_count: device_count as u32,
        pid: id.pid,
        _pad: 0,
        start_time: id.start_time,
        ops_begun: 0.into(),
        ops_ended: 0.into(),
        last_update_unix_ns: now.into(),
        created_unix_ns: now,
    };
    // SAFETY: ProcHeader is repr(C) plain data; viewing it as bytes is sound.
    let raw = unsafe {
        std::slice::from_raw_parts((&header as *const ProcHeader).cast::<u8>(), std::mem::size_of::<ProcHeader>())
    };
    bytes[..raw.len()].copy_from_slice(raw);
    bytes
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Run `f` on a thread; fail (instead of hanging the test run) if it blocks.
    pub(crate) fn without_blocking<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(std::time::Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("{what} blocked"))
    }

    pub(crate) fn mkfifo(path: &Path) {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0, "mkfifo {}", path.display());
    }

    #[test]
    fn open_refuses_a_fifo_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("999999-1");
        mkfifo(&path);
        let p = path.clone();
        let result = without_blocking("ProcFile::open of a FIFO", move || ProcFile::open(&p).map(|_| ()));
        match result {
            Err(LayoutError::NotRegular { path: named, kind }) => {
                assert_eq!(named, path);
                assert_eq!(kind, "FIFO");
            }
            other => panic!("expected NotRegular, got {other:?}"),
        }
        let msg = ProcFile::open(&path).err().unwrap().to_string();
        assert!(msg.contains("999999-1") && msg.contains("FIFO"), "{msg}");
    }

    #[test]
    fn open_does_not_follow_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        // A valid-looking target: following the link would map it.
        let target = dir.path().join("target");
        std::fs::write(&target, vec![0u8; 4096]).unwrap();
        let link = dir.path().join("999999-1");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let l = link.clone();
        let result = without_blocking("ProcFile::open of a symlink", move || ProcFile::open(&l).map(|_| ()));
        assert!(
            matches!(result, Err(LayoutError::NotRegular { kind: "symbolic link", .. })),
            "{result:?}"
        );
        // A symlink to a FIFO: neither followed nor blocked on.
        let fifo = dir.path().join("fifo");
        mkfifo(&fifo);
        let link2 = dir.path().join("999999-2");
        std::os::unix::fs::symlink(&fifo, &link2).unwrap();
        let result = without_blocking("ProcFile::open of a symlink to a FIFO", move || ProcFile::open(&link2).map(|_| ()));
        assert!(matches!(result, Err(LayoutError::NotRegular { .. })), "{result:?}");
        // A directory.
        let sub = dir.path().join("999999-3");
        std::fs::create_dir(&sub).unwrap();
        assert!(matches!(ProcFile::open(&sub), Err(LayoutError::NotRegular { kind: "directory", .. })));
    }

    #[test]
    fn create_does_not_write_through_a_planted_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"keep me").unwrap();
        let id = ProcessId::current().unwrap();
        let tmp = dir.path().join(format!(".{}.tmp", file_name(id)));
        std::os::unix::fs::symlink(&victim, &tmp).unwrap();
        // The record's name is taken too, so the temporary is used.
        std::fs::write(dir.path().join(file_name(id)), b"old").unwrap();
        let file = ProcFile::create(dir.path(), id, 1, &mut |_| {}).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
        assert_eq!(file.id(), id);
        assert!(std::fs::symlink_metadata(file.path()).unwrap().file_type().is_file());
    }

    #[test]
    fn names_round_trip() {
        let id = ProcessId {
            pid: 4242,
            start_time: 987654321,
        };
        assert_eq!(parse_file_name(&file_name(id)), Some(id));
        assert_eq!(parse_temp_name(&format!(".{}.tmp", file_name(id))), Some(id));
        for bad in ["", "12", "-1", "1-", "a-1", "1-2-3", ".1-2.tmp", "1-2.tmp"] {
            assert_eq!(parse_file_name(bad), None, "{bad:?}");
        }
    }
}
