//! Intent records: what a multi-step change is about to do, written before its first step
//! and removed after its last (`<state-dir>/intents/<op>-<pid>-<start>.json`).
//!
//! Every such change runs under the store lock, so an intent that a command holding the
//! lock finds was left by a writer that died half-way (the writer's pid and start time say
//! which: a recycled pid cannot pass for it). `lifecycle::reconcile_store` then finishes or
//! undoes the change (`recovery.rs`) and removes the intent.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use vgpu_abi::process::ProcessId;

use super::workload::ProcessIdRecord;
use super::{atomic, StateError, Store};

/// The kinds of multi-step change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// `vgpu run` creating a workload's cgroup and record (the workload is named).
    Start,
    /// `vgpu suspend`: freeze, then record.
    Suspend,
    /// `vgpu resume`: thaw, then record.
    Resume,
    /// A pool plan (preemption, resumption): freeze/thaw, save the pool, record.
    Pool,
}

impl Op {
    fn as_str(self) -> &'static str {
        match self {
            Op::Start => "start",
            Op::Suspend => "suspend",
            Op::Resume => "resume",
            Op::Pool => "pool",
        }
    }
}

/// One intent record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Intent {
    pub op: Op,
    /// The workloads (ids; a workload's cgroup is named by its id) the change touches.
    pub workloads: Vec<String>,
    /// The command making the change.
    pub writer: ProcessIdRecord,
    pub created_unix_ms: u64,
}

impl Intent {
    /// Whether the command that wrote it still runs (the exact process).
    pub fn writer_alive(&self) -> bool {
        ProcessId::from(self.writer).is_alive()
    }
}

/// A written intent. [`Pending::done`] removes it once the change is complete. Dropped
/// without `done` (an error returned half-way, a panic), it stays: the change may be
/// half-done, and once this process has exited reconcile finishes or undoes it.
#[derive(Debug)]
#[must_use = "call done() once the change is complete"]
pub struct Pending {
    path: PathBuf,
}

impl Pending {
    /// The change is complete: remove the intent.
    pub fn done(self) {
        if let Err(e) = remove(&self.path) {
            tracing::warn!("{e}: the intent stays until the next command finds this process gone");
        }
    }
}

/// Record that this process is about to make change `op` to `workloads`. Call with the
/// store lock held, and keep it held until [`Pending::done`].
pub fn begin(store: &Store, op: Op, workloads: &[&str]) -> Result<Pending, StateError> {
    if let Some(bad) = workloads.iter().find(|id| !super::is_plain_name(id)) {
        return Err(StateError::Damaged { path: store.intents_dir(), message: format!("workload id {bad:?} is not a plain name") });
    }
    let writer = ProcessId::current().ok_or_else(|| {
        StateError::io(Path::new("/proc/self/stat"), std::io::Error::other("cannot read this process's start time"))
    })?;
    let dir = ensure_dir(store)?;
    let path = dir.join(format!("{}-{}-{}.json", op.as_str(), writer.pid, writer.start_time));
    let intent = Intent {
        op,
        workloads: workloads.iter().map(|s| s.to_string()).collect(),
        writer: writer.into(),
        created_unix_ms: crate::clock::now_ms(),
    };
    // Runtime state (see `atomic`): a command killed at any step leaves it whole.
    atomic::write_json_as(&path, &intent, atomic::Durability::Runtime)?;
    Ok(Pending { path })
}

/// Every intent record left in the store, with its path; damaged ones are reported by
/// path (reconcile leaves them for a person: it cannot know what they meant).
pub fn list(store: &Store) -> (Vec<(PathBuf, Intent)>, Vec<StateError>) {
    let dir = store.intents_dir();
    let mut good = Vec::new();
    let mut bad = Vec::new();
    match std::fs::symlink_metadata(&dir) {
        Ok(meta) if !meta.file_type().is_dir() => {
            let kind = vgpu_abi::mapping::kind_name(&meta.file_type());
            return (good, vec![StateError::Damaged { path: dir, message: format!("a {kind}, not a directory; not followed") }]);
        }
        _ => {}
    }
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (good, bad),
        Err(e) => return (good, vec![StateError::io(&dir, e)]),
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.ends_with(".json") || name.starts_with(".tmp-") {
            continue;
        }
        let path = entry.path();
        match read(&path) {
            Ok(intent) => good.push((path, intent)),
            Err(e) => bad.push(e),
        }
    }
    good.sort_by_key(|(_, i)| i.created_unix_ms);
    (good, bad)
}

/// Read one intent; its workload ids must be plain names (they are joined to paths).
fn read(path: &Path) -> Result<Intent, StateError> {
    let intent: Intent = atomic::read_json(path)?;
    if let Some(bad) = intent.workloads.iter().find(|id| !super::is_plain_name(id)) {
        return Err(StateError::Damaged { path: path.to_path_buf(), message: format!("workload id {bad:?} is not a plain name") });
    }
    Ok(intent)
}

/// Remove an intent once its change has been finished or undone.
pub fn remove(path: &Path) -> Result<(), StateError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StateError::io(path, e)),
    }
}

/// `<state-dir>/intents`, created 0755 if missing and checked like the store's other
/// directories ([`Store::ensure_subdir`]); a symlink there is refused, never followed.
fn ensure_dir(store: &Store) -> Result<PathBuf, StateError> {
    let dir = store.intents_dir();
    store.ensure_subdir(&dir)?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::state::temp_store as store;

    #[test]
    fn written_before_and_removed_after() {
        let (_dir, store) = store();
        let pending = begin(&store, Op::Suspend, &["a1b2c3d4"]).unwrap();
        let (found, bad) = list(&store);
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(found.len(), 1);
        let intent = &found[0].1;
        assert_eq!((intent.op, intent.workloads.as_slice()), (Op::Suspend, &["a1b2c3d4".to_string()][..]));
        assert!(intent.writer_alive());
        drop(pending);
        assert_eq!(list(&store).0.len(), 1, "an intent dropped before done() stays");
        std::fs::remove_file(&found[0].0).unwrap();
        assert!(list(&store).0.is_empty());
    }

    #[test]
    fn a_dead_writer_is_seen_as_dead() {
        let (_dir, store) = store();
        let pending = begin(&store, Op::Pool, &["x"]).unwrap();
        let (mut found, _) = list(&store);
        let (path, mut intent) = found.remove(0);
        // The same pid with another start time is another process (a recycled pid).
        intent.writer.start_time += 1;
        atomic::write_json(&path, &intent).unwrap();
        assert!(!list(&store).0[0].1.writer_alive());
        pending.done();
        assert!(list(&store).0.is_empty());
    }

    #[test]
    fn names_that_are_not_plain_are_refused() {
        let (_dir, store) = store();
        assert!(begin(&store, Op::Start, &["../etc"]).is_err());
        let path = store.intents_dir().join("start-1-1.json");
        std::fs::create_dir_all(store.intents_dir()).unwrap();
        std::fs::write(&path, r#"{"op":"start","workloads":["../x"],"writer":{"pid":1,"start_time":1},"created_unix_ms":0}"#).unwrap();
        let (good, bad) = list(&store);
        assert!(good.is_empty());
        assert!(bad[0].to_string().contains("not a plain name"), "{}", bad[0]);
    }

    #[test]
    fn a_symlinked_intents_directory_is_refused() {
        let (dir, store) = store();
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, store.intents_dir()).unwrap();
        std::fs::write(elsewhere.join("suspend-1-1.json"), r#"{"op":"suspend","workloads":["a"],"writer":{"pid":1,"start_time":1},"created_unix_ms":0}"#).unwrap();
        assert!(begin(&store, Op::Suspend, &["a"]).is_err());
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 1, "nothing written through the link");
        let (good, bad) = list(&store);
        assert!(good.is_empty() && bad[0].to_string().contains("symbolic link"), "not read through the link: {bad:?}");
    }
}
