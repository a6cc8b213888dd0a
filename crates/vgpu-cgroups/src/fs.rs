//! Reading and writing cgroupfs files, with errors that name the file.
//!
//! cgroupfs files take one value per `write(2)`, so writes are a single call on a file
//! opened without `O_CREAT`: a missing file means the kernel (or controller) lacks it, and
//! that must be an error, not a new regular file. `O_TRUNC` (what a shell's `>` does) is
//! ignored by cgroupfs and keeps the fake trees of the tests exact.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::thread::sleep;
use std::time::{Duration, Instant};

use super::error::{CgroupError, Result};

pub(crate) const PROCS: &str = "cgroup.procs";

pub(crate) fn io_error(op: &'static str, path: &Path, source: io::Error) -> CgroupError {
    CgroupError::Io { op, path: path.to_path_buf(), source }
}

pub(crate) fn read(path: &Path) -> Result<String> {
    read_text(path).map_err(|e| io_error("read", path, e))
}

/// A cgroupfs file's text: read until the end without asking its size first (cgroupfs
/// files say 0 or 4096, whatever they hold), so one `fstat` fewer than
/// `fs::read_to_string` per file: reconcile and the listings read one or more per workload.
fn read_text(path: &Path) -> io::Result<String> {
    read_all(fs::File::open(path)?)
}

/// Room left in a read's buffer that proves the read reached the end of a cgroup file:
/// more than any one line of one (a pid, a counter, a key and its value).
const LINE_ROOM: usize = 256;

/// [`read_text`] of a file opened already. A read that leaves more than [`LINE_ROOM`] of
/// its buffer unfilled got the rest of the file, and no read that only confirms the end
/// follows (one system call fewer per file: `vgpu ps` reads ~6,000 with 1,000 workloads):
/// cgroupfs files are seq_files, whose read fills the buffer until the next line does not
/// fit or the file ends (`seq_read_iter`); a regular file (the tests' fake trees) is read
/// to its end alike.
fn read_all(mut file: fs::File) -> io::Result<String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) if n < buf.len() - LINE_ROOM => {
                bytes.extend_from_slice(&buf[..n]);
                break;
            }
            Ok(n) => bytes.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    String::from_utf8(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// `None` when the file does not exist, or belongs to a cgroup that is being removed (the
/// kernel answers ENODEV between a concurrent `rmdir` and the directory's disappearance: a
/// `vgpu kill` racing the workload's own clean-up saw it).
pub(crate) fn read_opt(path: &Path) -> Result<Option<String>> {
    match read_text(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENODEV) => Ok(None),
        Err(e) => Err(io_error("read", path, e)),
    }
}

pub(crate) fn write(path: &Path, value: &str) -> Result<()> {
    let mut file = OpenOptions::new().write(true).truncate(true).open(path).map_err(|e| io_error("open for writing", path, e))?;
    let written = file.write(value.as_bytes()).map_err(|e| io_error("write", path, e))?;
    if written != value.len() {
        let short = io::Error::new(io::ErrorKind::WriteZero, format!("short write ({written} of {} bytes)", value.len()));
        return Err(io_error("write", path, short));
    }
    Ok(())
}

pub(crate) fn parse_error(path: &Path, content: &str) -> CgroupError {
    CgroupError::Parse { path: path.to_path_buf(), content: content.trim().to_string() }
}

/// A counter file such as `memory.current` or `pids.current`; `None` when it is missing.
pub(crate) fn read_u64_opt(path: &Path) -> Result<Option<u64>> {
    match read_opt(path)? {
        None => Ok(None),
        Some(text) => text.trim().parse().map(Some).map_err(|_| parse_error(path, &text)),
    }
}

/// The value of `key` in a flat-keyed file (`cgroup.events`, `cpu.stat`): lines of `key value`.
pub(crate) fn keyed_u64(path: &Path, text: &str, key: &str) -> Result<Option<u64>> {
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if words.next() == Some(key) {
            let value = words.next().unwrap_or("");
            return value.parse().map(Some).map_err(|_| parse_error(path, line));
        }
    }
    Ok(None)
}

/// The processes listed in `dir/cgroup.procs`; none when the cgroup is gone.
///
/// The kernel lists a task outside the reader's pid namespace as 0. Those are dropped:
/// nothing here can signal them, and `kill(0, …)` would hit the caller's own group.
pub(crate) fn procs(dir: &Path) -> Result<Vec<i32>> {
    let path = dir.join(PROCS);
    let Some(text) = read_opt(&path)? else { return Ok(Vec::new()) };
    parse_procs(&path, &text)
}

/// [`procs_recursive`] of `parent/name`, with `parent` opened already (`at`): the file is
/// opened relative to it, a walk of two path components through cgroupfs instead of the
/// whole path. `parent` is what `at` was opened from, for errors and for the cgroups nested
/// below (rare: looked at by their whole paths).
pub(crate) fn procs_recursive_at(at: &std::os::fd::OwnedFd, parent: &Path, name: &str, into: &mut Vec<i32>) -> Result<()> {
    use std::os::fd::AsRawFd as _;
    let relative = Path::new(name).join(PROCS);
    let Some(text) = read_opt_at(at, parent, &relative)? else { return Ok(()) };
    into.extend(parse_procs(&parent.join(&relative), &text)?);
    // Sub-cgroups: the directory's link count says whether there is any (`child_dirs`).
    match nix::sys::stat::fstatat(Some(at.as_raw_fd()), Path::new(name), nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR && st.st_nlink == 2 => Ok(()),
        Err(nix::errno::Errno::ENOENT) => Ok(()),
        _ => {
            for child in child_dirs(&parent.join(name))? {
                procs_recursive(&child, into)?;
            }
            Ok(())
        }
    }
}

/// [`read_opt`] of `parent/relative`, with `parent` opened already (`at`): the file is
/// opened relative to it (never through a symlink at its last component).
pub(crate) fn read_opt_at(at: &std::os::fd::OwnedFd, parent: &Path, relative: &Path) -> Result<Option<String>> {
    use std::os::fd::AsRawFd as _;
    let path = parent.join(relative);
    let opened = nix::fcntl::openat(
        Some(at.as_raw_fd()),
        relative,
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NOFOLLOW,
        nix::sys::stat::Mode::empty(),
    );
    let fd = match opened {
        Ok(fd) => fd,
        // Gone, or being removed (as `read_opt`).
        Err(nix::errno::Errno::ENOENT | nix::errno::Errno::ENODEV) => return Ok(None),
        Err(e) => return Err(io_error("read", &path, e.into())),
    };
    // SAFETY: `openat` returned a new descriptor that nothing else owns.
    let file = unsafe { <fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    match read_all(file) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(None),
        Err(e) => Err(io_error("read", &path, e)),
    }
}

/// The pids of a `cgroup.procs` file's text (`path`: for errors).
fn parse_procs(path: &Path, text: &str) -> Result<Vec<i32>> {
    let mut pids = Vec::new();
    for line in text.lines().map(str::trim).filter(|line| !line.is_empty()) {
        let pid: i32 = line.parse().map_err(|_| parse_error(path, line))?;
        if pid < 0 {
            return Err(parse_error(path, line));
        }
        if pid > 0 {
            pids.push(pid);
        }
    }
    Ok(pids)
}

/// The processes of `dir` and of every cgroup below it (a workload run as root may nest).
pub(crate) fn procs_recursive(dir: &Path, into: &mut Vec<i32>) -> Result<()> {
    into.extend(procs(dir)?);
    for child in child_dirs(dir)? {
        procs_recursive(&child, into)?;
    }
    Ok(())
}

/// Sub-cgroups of `dir`; none when `dir` is gone.
///
/// A directory's link count is 2 plus its subdirectories, on cgroupfs (kernfs) as on the
/// usual filesystems: 2 says there is none without listing it (a cgroup lists dozens of
/// control files). Any other count — a filesystem that does not keep it reports 1 — lists it.
fn child_dirs(dir: &Path) -> Result<Vec<PathBuf>> {
    use std::os::unix::fs::MetadataExt;
    match fs::symlink_metadata(dir) {
        Ok(meta) if meta.is_dir() && meta.nlink() == 2 => return Ok(Vec::new()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        _ => {}
    }
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_error("list", dir, e)),
    };
    let mut dirs = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| io_error("list", dir, e))?;
        let is_dir = entry.file_type().map_err(|e| io_error("stat", &entry.path(), e))?.is_dir();
        if is_dir {
            dirs.push(entry.path());
        }
    }
    dirs.sort();
    Ok(dirs)
}

/// `mkdir`; `Ok(false)` if it already existed.
pub(crate) fn ensure_dir(path: &Path) -> Result<bool> {
    match fs::create_dir(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(io_error("create", path, e)),
    }
}

/// [`create_new_dir`], its parent made first only where that is missing (the first
/// workload of a hierarchy makes `<mount>/vgpu`).
pub(crate) fn create_new_dir_and_parent(path: &Path) -> Result<()> {
    match fs::create_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(parent) = path.parent() {
                ensure_dir(parent)?;
            }
            create_new_dir(path)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Err(CgroupError::AlreadyExists { path: path.to_path_buf() }),
        Err(e) => Err(io_error("create", path, e)),
    }
}

/// `mkdir` of a workload's cgroup: it must be new.
pub(crate) fn create_new_dir(path: &Path) -> Result<()> {
    match fs::create_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Err(CgroupError::AlreadyExists { path: path.to_path_buf() }),
        Err(e) => Err(io_error("create", path, e)),
    }
}

/// `rmdir` of `dir` and any sub-cgroups, deepest first. A missing directory is fine.
/// `EBUSY` is retried until `timeout`: a task that just died leaves `cgroup.procs` a
/// moment before the kernel stops counting the cgroup as populated.
pub(crate) fn remove_tree(dir: &Path, timeout: Duration) -> Result<()> {
    for child in child_dirs(dir)? {
        remove_tree(&child, timeout)?;
    }
    let start = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && start.elapsed() < timeout => {
                sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(20));
            }
            Err(e) => return Err(io_error("remove", dir, e)),
        }
    }
}

/// Calls `done` until it says yes or `timeout` passes; returns whether it said yes.
pub(crate) fn poll_until(timeout: Duration, mut done: impl FnMut() -> Result<bool>) -> Result<bool> {
    let start = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        if done()? {
            return Ok(true);
        }
        let elapsed = start.elapsed();
        if elapsed >= timeout {
            return Ok(false);
        }
        sleep(pause.min(timeout - elapsed));
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_never_creates() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cpu.max");
        let err = write(&path, "max").unwrap_err();
        assert!(matches!(err, CgroupError::Io { op: "open for writing", .. }), "{err}");
        assert!(!path.exists());
    }

    #[test]
    fn procs_and_keys() {
        let dir = tempfile::tempdir().unwrap();
        assert!(procs(&dir.path().join("gone")).unwrap().is_empty());
        fs::write(dir.path().join(PROCS), "12\n 34\n\n").unwrap();
        assert_eq!(procs(dir.path()).unwrap(), vec![12, 34]);
        fs::write(dir.path().join(PROCS), "0\n12\n").unwrap();
        assert_eq!(procs(dir.path()).unwrap(), vec![12], "0: a task outside our pid namespace");
        for bad in ["12\nabc\n", "-1\n"] {
            fs::write(dir.path().join(PROCS), bad).unwrap();
            assert!(matches!(procs(dir.path()), Err(CgroupError::Parse { .. })), "{bad:?}");
        }
        let events = Path::new("cgroup.events");
        assert_eq!(keyed_u64(events, "populated 1\nfrozen 0\n", "frozen").unwrap(), Some(0));
        assert_eq!(keyed_u64(events, "populated 1\n", "frozen").unwrap(), None);
        assert!(keyed_u64(events, "frozen x\n", "frozen").is_err());
    }

    #[test]
    fn remove_tree_is_idempotent_and_depth_first() {
        let dir = tempfile::tempdir().unwrap();
        let leaf = dir.path().join("a");
        fs::create_dir_all(leaf.join("b/c")).unwrap();
        remove_tree(&leaf, Duration::from_millis(10)).unwrap();
        assert!(!leaf.exists());
        remove_tree(&leaf, Duration::from_millis(10)).unwrap();
    }
}
