//! Workload ends left for the watch to record in the history: `<state>/ended/<id>.json`.
//!
//! `vgpu run` records how and when its workload ended in the history (`history.db`). Opening
//! SQLite for that one row (a thread, the open, the WAL, a transaction, the thread's end)
//! cost every `vgpu run` 0.4–0.7 ms, while the watch holds the same history open. So, when a
//! watch runs that records the history `vgpu run` would write (it says so in the GPU list it
//! publishes, [`super::inventory`]), `vgpu run` leaves the end here instead: one small file,
//! written under the store lock just before its workload's record is removed. The watch's
//! history thread records it as `vgpu run` would have (the workload's row, then its end,
//! with the outcome) and then removes the file.
//!
//! What this keeps:
//!
//! - Nothing is lost. A note is removed only once its rows are written; a watch killed in
//!   between records it again (the writes are idempotent: the first end recorded counts,
//!   a workload's start is kept from its first row) at its next start. A note left while no
//!   watch runs any more waits for the next watch.
//! - The exact end. The note is there before the record goes, so the watch (which records
//!   its own end, without an outcome, for a record it no longer finds) finds the note first:
//!   its thread records the notes before the rounds' ends.
//! - What readers see: `vgpu ps -a` lists the notes not yet recorded with the history's
//!   ended workloads ([`pending`]).
//!
//! A note is 0644 like the record it comes from, in a directory checked like the store's
//! others; it is read without following a link or blocking on a FIFO, and bounded.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::atomic::{self, Durability};
use super::{is_plain_name, StateError, StoreLock, Store, Workload};

/// The directory's name under the state directory.
pub const DIR: &str = "ended";

/// The layout of a note; a reader takes no other.
pub const FORMAT: u32 = 1;

/// The most a note may hold (a workload record and two fields).
const MAX_BYTES: u64 = atomic::MAX_RECORD_BYTES;

/// A workload's end, as `vgpu run` saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndNote {
    pub format: u32,
    /// Its record as it was at the end.
    pub workload: Workload,
    pub ended_unix_ms: u64,
    /// How it ended (`exit 0`, `failed: ...`), as the history's `outcome` says it.
    pub outcome: String,
}

impl EndNote {
    pub fn new(workload: Workload, ended_unix_ms: u64, outcome: String) -> EndNote {
        EndNote { format: FORMAT, workload, ended_unix_ms, outcome }
    }
}

/// A note found, and its file (to remove once recorded).
#[derive(Debug, Clone)]
pub struct Found {
    pub path: PathBuf,
    pub note: EndNote,
}

impl Store {
    pub fn ended_dir(&self) -> PathBuf {
        self.state_dir.join(DIR)
    }
}

/// Leave `note` for the watch, whole or not at all. Under the store lock (`_lock`), before
/// the workload's record is removed.
pub fn leave(store: &Store, _lock: &StoreLock, note: &EndNote) -> Result<PathBuf, StateError> {
    let dir = store.ended_dir();
    let path = dir.join(format!("{}.json", note.workload.id));
    if !is_plain_name(&note.workload.id) {
        return Err(StateError::Damaged { path, message: format!("workload id {:?} is not a plain name", note.workload.id) });
    }
    store.ensure_subdir(&dir)?;
    atomic::write_json_as(&path, note, Durability::Runtime)?;
    Ok(path)
}

/// The notes waiting to be recorded, oldest end first, and an error naming each that cannot
/// be read. None when the directory does not exist; an unsafe directory (a link, writable by
/// others) is an error and nothing in it is read.
pub fn pending(store: &Store) -> (Vec<Found>, Vec<StateError>) {
    let dir = store.ended_dir();
    match std::fs::symlink_metadata(&dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (Vec::new(), Vec::new()),
        Err(e) => return (Vec::new(), vec![StateError::io(&dir, e)]),
        Ok(_) => {}
    }
    if let Err(e) = super::dirs::check_dir(&dir) {
        return (Vec::new(), vec![e]);
    }
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) => return (Vec::new(), vec![StateError::io(&dir, e)]),
    };
    let mut found = Vec::new();
    let mut bad = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            bad.push(StateError::Damaged { path, message: "not a plain file name".into() });
            continue;
        };
        if name.starts_with(".tmp-") || !name.ends_with(".json") {
            continue; // a write under way (under the store lock), or not a note
        }
        match read(&path) {
            Ok(note) if format!("{}.json", note.workload.id) == name => found.push(Found { path, note }),
            Ok(note) => bad.push(StateError::Damaged { path, message: format!("it names workload {:?}, not its file's", note.workload.id) }),
            Err(e) => bad.push(e),
        }
    }
    found.sort_by(|a, b| a.note.ended_unix_ms.cmp(&b.note.ended_unix_ms).then_with(|| a.note.workload.id.cmp(&b.note.workload.id)));
    (found, bad)
}

/// Read one note.
pub fn read(path: &Path) -> Result<EndNote, StateError> {
    let bytes = atomic::read_regular(path, MAX_BYTES)?;
    let note: EndNote = serde_json::from_slice(&bytes).map_err(|e| StateError::Damaged { path: path.to_path_buf(), message: e.to_string() })?;
    if note.format != FORMAT {
        return Err(StateError::Damaged { path: path.to_path_buf(), message: format!("format {}, not {FORMAT}", note.format) });
    }
    Ok(note)
}

/// Remove a note once it is recorded (or found damaged); one already gone is removed.
pub fn remove(path: &Path) -> Result<(), StateError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(StateError::io(path, e)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::temp_store;

    fn workload(id: &str) -> Workload {
        let mut w = crate::state::workload::tests::sample();
        w.id = id.to_string();
        w
    }

    /// Leave one workload's end (exit 0), under the store lock.
    fn leave_one(store: &Store, id: &str) {
        let lock = store.lock().expect("lock");
        leave(store, &lock, &EndNote::new(workload(id), 1000, "exit 0".into())).expect("leave");
    }

    #[test]
    fn a_note_left_is_found_then_removed() {
        let (_dir, store) = temp_store();
        assert!(pending(&store).0.is_empty(), "no directory: nothing pending");
        let lock = store.lock().expect("lock");
        let later = EndNote::new(workload("bbbb0002"), 2000, "exit 3".into());
        let first = EndNote::new(workload("aaaa0001"), 1000, "exit 0".into());
        leave(&store, &lock, &later).expect("leave");
        let path = leave(&store, &lock, &first).expect("leave");
        drop(lock);
        let (found, bad) = pending(&store);
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(found.iter().map(|f| f.note.clone()).collect::<Vec<_>>(), vec![first, later], "oldest end first");
        assert_eq!(found[0].path, path);
        remove(&path).expect("remove");
        remove(&path).expect("one already gone is removed");
        assert_eq!(pending(&store).0.len(), 1);
    }

    #[test]
    fn damaged_or_misnamed_notes_are_reported_and_temporary_files_skipped() {
        let (_dir, store) = temp_store();
        leave_one(&store, "aaaa0001");
        let dir = store.ended_dir();
        std::fs::write(dir.join("cccc0003.json"), b"{ cut sh").expect("write");
        std::fs::copy(dir.join("aaaa0001.json"), dir.join("dddd0004.json")).expect("copy");
        std::fs::write(dir.join(".tmp-x1"), b"{").expect("write");
        let (found, bad) = pending(&store);
        assert_eq!(found.len(), 1);
        assert_eq!(bad.len(), 2, "{bad:?}");
        assert!(bad.iter().any(|e| e.to_string().contains("cccc0003")), "{bad:?}");
        assert!(bad.iter().any(|e| e.to_string().contains("dddd0004")), "{bad:?}");
    }

    #[test]
    fn a_link_in_place_of_a_note_is_not_followed() {
        let (dir, store) = temp_store();
        leave_one(&store, "aaaa0001");
        let target = dir.path().join("elsewhere.json");
        std::fs::copy(store.ended_dir().join("aaaa0001.json"), &target).expect("copy");
        std::fs::remove_file(store.ended_dir().join("aaaa0001.json")).expect("remove");
        std::os::unix::fs::symlink(&target, store.ended_dir().join("aaaa0001.json")).expect("link");
        let (found, bad) = pending(&store);
        assert!(found.is_empty());
        assert_eq!(bad.len(), 1, "{bad:?}");
    }
}
