//! The GPUs as `vgpu watch` last read them through the driver (`<state>/gpus.json`), for
//! the commands that admit a workload (`vgpu run`, a Slurm step, `partition create`,
//! `update`) to take instead of loading the driver's library themselves: their admission
//! reads only each GPU's index, UUID, name and memory, which a running watch reads anyway
//! every interval. Loading NVML was the largest single cost of a short `vgpu run` here
//! (0.3 ms with the simulated driver), and is far more with a real one (`nvmlInit` opens
//! every device).
//!
//! The watch publishes the list when it differs from the one published (at its start,
//! after a GPU falls off the bus, a driver reload), under the store lock like every write
//! of the state directory, and marks it current at every other round (the file's
//! modification time) without rewriting it. A command takes it only while it is current:
//!
//! - written by root (or this user), not writable by anyone else, a regular file (not
//!   followed through a link, never blocked on if a FIFO: `atomic::read_regular`);
//! - its writer, the watch, still runs (the same process: pid and start time);
//! - marked within its `current_for_ms` (two of the watch's intervals and a second);
//! - of the same driver (`simulated`: `vgpu --simulate` and the real driver never mix).
//!
//! Anything else, and the command asks the driver itself, as it did before. A stale list
//! can thus be at most one of the watch's rounds old: a GPU gone meanwhile is admitted on
//! as if NVML had been asked just before it went.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::workload::ProcessIdRecord;
use super::{StateError, Store};

/// Name of the file under the state directory.
pub const FILE: &str = "gpus.json";

/// The layout of the file; a reader takes no other.
pub const FORMAT: u32 = 1;

/// The most the file may hold (it lists a host's GPUs).
const MAX_BYTES: u64 = 1 << 20;

/// One GPU as admission sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishedGpu {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_total_bytes: u64,
}

/// The file's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Published {
    pub format: u32,
    /// The watch that wrote it: the list is current only while it runs.
    pub writer: ProcessIdRecord,
    /// Read through the simulated driver (`--simulate`).
    pub simulated: bool,
    /// How long after its last mark (the file's modification time) the list is current.
    pub current_for_ms: u64,
    pub gpus: Vec<PublishedGpu>,
    /// The library directory whose history the watch records (its `history.db`); none: it
    /// records none (`[history] enabled = false`). A `vgpu run` recording into the same one
    /// leaves its workload's end for the watch ([`super::ended`]). Absent in a list written
    /// by an older watch: none.
    #[serde(default)]
    pub history: Option<PathBuf>,
}

impl Published {
    /// What a watch that runs every `interval` publishes.
    pub fn new(writer: ProcessIdRecord, simulated: bool, interval: Duration, gpus: Vec<PublishedGpu>, history: Option<PathBuf>) -> Published {
        let current_for = interval.saturating_mul(2).saturating_add(Duration::from_secs(1));
        Published { format: FORMAT, writer, simulated, current_for_ms: current_for.as_millis().min(u128::from(u64::MAX)) as u64, gpus, history }
    }
}

impl Store {
    pub fn inventory_path(&self) -> PathBuf {
        self.state_dir.join(FILE)
    }
}

/// Write `published` (0644: any user's `vgpu` may read it), whole or not at all. Under the
/// store lock (`_lock`): its temporary file is one a reconcile would otherwise remove.
pub fn publish(store: &Store, _lock: &super::StoreLock, published: &Published) -> Result<(), StateError> {
    let bytes = serde_json::to_vec_pretty(published).map_err(|e| StateError::io(&store.inventory_path(), std::io::Error::other(e)))?;
    super::atomic::write_atomic_as(&store.inventory_path(), &bytes, 0o644, super::atomic::Durability::Runtime)
}

/// Mark the published list current now (its modification time), not through a link.
pub fn mark_current(store: &Store) -> std::io::Result<()> {
    let path = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(store.inventory_path().as_os_str())).map_err(std::io::Error::other)?;
    // SAFETY: a NUL-terminated path; a null `times` sets both times to now.
    let rc = unsafe { libc::utimensat(libc::AT_FDCWD, path.as_ptr(), std::ptr::null(), libc::AT_SYMLINK_NOFOLLOW) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Take the list back (the watch stops, or cannot read the GPUs): the commands ask the
/// driver themselves again.
pub fn withdraw(store: &Store) -> std::io::Result<()> {
    match std::fs::remove_file(store.inventory_path()) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Why a published list was not taken (said at debug level by the caller).
#[derive(Debug, thiserror::Error)]
pub enum NotCurrent {
    #[error("none published (no vgpu watch runs)")]
    Missing,
    #[error("{0}")]
    Unreadable(String),
    #[error("written by uid {0}, not root")]
    Owner(u32),
    #[error("writable by others (mode {0:04o})")]
    Mode(u32),
    #[error("format {0}, not {FORMAT}")]
    Format(u32),
    #[error("its watch (pid {0}) no longer runs")]
    WriterGone(u32),
    #[error("not marked for {0} ms (its watch is late)")]
    Late(u128),
    #[error("read through the {}", if *.0 { "simulated driver" } else { "real driver" })]
    OtherDriver(bool),
}

/// A published list found current, and when its watch last marked it: the end of the
/// watch's latest round (it lists the workloads before it marks the list).
#[derive(Debug, Clone)]
pub struct Current {
    pub published: Published,
    pub marked: SystemTime,
}

/// The published list, if it is current for a command of this driver (`simulated`) now,
/// with its mark.
pub fn current_list(store: &Store, simulated: bool, now: SystemTime) -> Result<Current, NotCurrent> {
    let path = store.inventory_path();
    let unreadable = |e: &dyn std::fmt::Display| NotCurrent::Unreadable(format!("{}: {e}", path.display()));
    let (bytes, meta) = match super::atomic::read_regular_with_meta(&path, MAX_BYTES) {
        Ok(read) => read,
        Err(StateError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => return Err(NotCurrent::Missing),
        Err(e) => return Err(NotCurrent::Unreadable(e.to_string())),
    };
    check_owner(&meta)?;
    let published: Published = serde_json::from_slice(&bytes).map_err(|e| unreadable(&e))?;
    if published.format != FORMAT {
        return Err(NotCurrent::Format(published.format));
    }
    if published.simulated != simulated {
        return Err(NotCurrent::OtherDriver(published.simulated));
    }
    let marked = meta.modified().map_err(|e| unreadable(&e))?;
    // A mark ahead of the clock (set back meanwhile) counts as now.
    let age = now.duration_since(marked).unwrap_or_default();
    if age > Duration::from_millis(published.current_for_ms) {
        return Err(NotCurrent::Late(age.as_millis()));
    }
    if !vgpu_abi::process::ProcessId::from(published.writer).is_alive() {
        return Err(NotCurrent::WriterGone(published.writer.pid));
    }
    Ok(Current { published, marked })
}

/// Root's or this user's, and no one else may write it.
fn check_owner(meta: &std::fs::Metadata) -> Result<(), NotCurrent> {
    // SAFETY: geteuid cannot fail and touches no memory.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != 0 && meta.uid() != me {
        return Err(NotCurrent::Owner(meta.uid()));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(NotCurrent::Mode(meta.mode() & 0o7777));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::temp_store;
    use std::os::unix::fs::PermissionsExt;

    fn gpu(index: u32) -> PublishedGpu {
        PublishedGpu { index, uuid: format!("GPU-{index}"), name: "NVIDIA H100".into(), memory_total_bytes: 80 << 30 }
    }

    /// The GPUs of the list, if it is current.
    fn current(store: &Store, simulated: bool, now: SystemTime) -> Result<Vec<PublishedGpu>, NotCurrent> {
        current_list(store, simulated, now).map(|current| current.published.gpus)
    }

    fn me() -> ProcessIdRecord {
        vgpu_abi::process::ProcessId::current().expect("this process").into()
    }

    #[test]
    fn a_list_published_by_a_running_writer_is_current_until_it_is_late() {
        let (_dir, store) = temp_store();
        let now = SystemTime::now();
        assert!(matches!(current(&store, false, now), Err(NotCurrent::Missing)));
        let published = Published::new(me(), false, Duration::from_secs(1), vec![gpu(0), gpu(1)], None);
        assert_eq!(published.current_for_ms, 3000);
        publish(&store, &store.lock().expect("lock"), &published).expect("publish");
        let mode = std::fs::metadata(store.inventory_path()).expect("file").permissions().mode() & 0o7777;
        assert_eq!(mode, 0o644);
        assert_eq!(current(&store, false, SystemTime::now()).expect("current"), vec![gpu(0), gpu(1)]);
        // Not for the other driver.
        assert!(matches!(current(&store, true, SystemTime::now()), Err(NotCurrent::OtherDriver(false))));
        // Late past its time (as seen 4 s on), current again once marked.
        let later = SystemTime::now() + Duration::from_secs(4);
        assert!(matches!(current(&store, false, later), Err(NotCurrent::Late(_))));
        let marked_at = SystemTime::now();
        mark_current(&store).expect("mark");
        let modified = std::fs::metadata(store.inventory_path()).expect("file").modified().expect("mtime");
        assert!(modified + Duration::from_millis(10) >= marked_at, "marked now");
        // Withdrawn: none.
        withdraw(&store).expect("withdraw");
        withdraw(&store).expect("withdrawn twice");
        assert!(matches!(current(&store, false, SystemTime::now()), Err(NotCurrent::Missing)));
    }

    #[test]
    fn a_list_whose_writer_is_gone_or_that_others_could_write_is_not_taken() {
        let (dir, store) = temp_store();
        // A writer that no longer runs: pid 1 with another start time.
        let gone = ProcessIdRecord { pid: 1, start_time: u64::MAX };
        publish(&store, &store.lock().expect("lock"), &Published::new(gone, false, Duration::from_secs(1), vec![gpu(0)], None)).expect("publish");
        assert!(matches!(current(&store, false, SystemTime::now()), Err(NotCurrent::WriterGone(1))));
        let lock = store.lock().expect("lock");
        publish(&store, &lock, &Published::new(me(), false, Duration::from_secs(1), vec![gpu(0)], None)).expect("publish");
        // Writable by others: refused.
        std::fs::set_permissions(store.inventory_path(), std::fs::Permissions::from_mode(0o666)).expect("chmod");
        assert!(matches!(current(&store, false, SystemTime::now()), Err(NotCurrent::Mode(0o666))));
        // Another format: refused.
        let mut other = Published::new(me(), false, Duration::from_secs(1), vec![gpu(0)], None);
        other.format = FORMAT + 1;
        publish(&store, &lock, &other).expect("publish");
        assert!(matches!(current(&store, false, SystemTime::now()), Err(NotCurrent::Format(_))));
        // A link, or a FIFO, in its place: refused, not followed, not blocked on.
        std::fs::remove_file(store.inventory_path()).expect("rm");
        let elsewhere = dir.path().join("elsewhere.json");
        std::fs::write(&elsewhere, serde_json::to_vec(&Published::new(me(), false, Duration::from_secs(1), vec![gpu(0)], None)).expect("json")).expect("write");
        std::os::unix::fs::symlink(&elsewhere, store.inventory_path()).expect("symlink");
        assert!(matches!(current(&store, false, SystemTime::now()), Err(NotCurrent::Unreadable(_))));
        std::fs::remove_file(store.inventory_path()).expect("rm");
        nix::unistd::mkfifo(&store.inventory_path(), nix::sys::stat::Mode::from_bits_truncate(0o644)).expect("mkfifo");
        assert!(matches!(current(&store, false, SystemTime::now()), Err(NotCurrent::Unreadable(_))));
        // Nor is a link followed when it is marked.
        std::fs::remove_file(store.inventory_path()).expect("rm");
        std::os::unix::fs::symlink(&elsewhere, store.inventory_path()).expect("symlink");
        let before = std::fs::metadata(&elsewhere).expect("target").modified().expect("mtime");
        let _ = mark_current(&store);
        assert_eq!(std::fs::metadata(&elsewhere).expect("target").modified().expect("mtime"), before);
    }

    #[test]
    fn the_list_names_the_history_its_watch_records_and_an_older_list_names_none() {
        let (dir, store) = temp_store();
        let lib = dir.path().join("lib");
        let before = SystemTime::now() - Duration::from_millis(50);
        publish(&store, &store.lock().expect("lock"), &Published::new(me(), false, Duration::from_secs(1), vec![gpu(0)], Some(lib.clone()))).expect("publish");
        let found = current_list(&store, false, SystemTime::now()).expect("current");
        assert_eq!(found.published.history, Some(lib));
        assert!(found.marked >= before, "marked when written");
        // A list from a watch that did not say: it records no history a command can count on.
        let mut json: serde_json::Value = serde_json::from_slice(&std::fs::read(store.inventory_path()).expect("read")).expect("json");
        json.as_object_mut().expect("object").remove("history");
        let bytes = serde_json::to_vec(&json).expect("bytes");
        crate::state::atomic::write_atomic_as(&store.inventory_path(), &bytes, 0o644, crate::state::atomic::Durability::Runtime).expect("write");
        assert_eq!(current_list(&store, false, SystemTime::now()).expect("current").published.history, None);
    }
}
