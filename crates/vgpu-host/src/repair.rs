//! `vgpu doctor --repair`: remove the state files no command can use — damaged workload
//! records and a damaged `pool.json` — once doing so frees nothing that is still in use.
//!
//! - A damaged workload record `workloads/<id>.json` is removed when no process is left in
//!   its cgroup (`vgpu/<id>`, the workload's id is the file's stem) and its supervisor, if
//!   what is left of the file names one, is gone; its cgroup, its own vGPU directory
//!   (`vgpus/<id>`) and its pool allocation go with it. Until then it is left, and said why.
//! - A damaged `pool.json` is set aside as `pool.json.damaged` (the next pool operation
//!   starts an empty pool) when no readable record holds pool blocks and no damaged record
//!   is left: otherwise a new pool would hand out blocks that are still in use.
//!
//! Call under the store lock.

use std::path::{Path, PathBuf};

use serde::Serialize;

use vgpu_cgroups::Cgroup;

use vgpu_cgroups::CgroupError;

use vgpu_cgroups::Layout;
use vgpu_store::state::DamagedRecord;
use vgpu_store::state::Partitions;
use vgpu_store::state::StateError;
use vgpu_store::state::Store;
use vgpu_store::state::StoreLock;
use vgpu_store::state::WorkloadState;

use crate::recovery::Note;

/// What was removed, with what went along with it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Removed {
    pub path: PathBuf,
    /// The workload id (the record's stem), for a workload record.
    #[serde(rename = "workload_id")]
    pub id: Option<String>,
    /// What it was: the problem with it.
    pub problem: String,
    /// Everything removed with it (cgroup, vGPU directory, pool allocation), or where it was
    /// set aside.
    pub also: Vec<String>,
}

/// What was left in place, and why.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Left {
    pub path: PathBuf,
    #[serde(rename = "workload_id")]
    pub id: Option<String>,
    pub problem: String,
    pub reason: String,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Report {
    pub removed: Vec<Removed>,
    pub left: Vec<Left>,
}

/// Repair what can be repaired safely; see the module's documentation.
pub fn repair(store: &Store, lock: &StoreLock) -> Report {
    let mut report = Report::default();
    let (_, errors) = store.workloads();
    let layout = Layout::detect();
    for d in vgpu_store::state::damaged::damaged_records(&errors) {
        match repair_record(store, lock, layout.as_ref(), &d) {
            Ok(also) => report.removed.push(Removed { path: d.path, id: d.id, problem: d.problem, also }),
            Err(reason) => report.left.push(Left { path: d.path, id: d.id, problem: d.problem, reason }),
        }
    }
    repair_pool(store, &mut report);
    report
}

/// The first reconcile of a later boot: what a crash of the machine may have left in a
/// state directory on a disk, whose runtime files are not synced
/// (`vgpu_store::state::atomic`, `vgpu_store::state::boot`): files cut short, all describing
/// processes of the earlier boot, which are gone with it. Before anything else reads them:
///
/// - a damaged workload record goes as `vgpu doctor --repair` removes it (its rules: no
///   process left in its cgroup, its supervisor gone), with its cgroup, vGPU and pool blocks;
/// - a damaged intent is removed: its writer is gone, and so is what it was changing;
/// - a damaged `pool.json` is set aside once no workload whose supervisor runs holds or
///   waits for pool blocks (the earlier boot's are all gone);
/// - the vGPU directory of a partition that no workload of a live supervisor uses is removed
///   with its board slots (its files may be cut short too); its next workload makes it again.
///
/// Readable records go the usual way after this: their supervisors are dead.
pub fn after_reboot(store: &Store, lock: &StoreLock, notes: &mut Vec<Note>) {
    let layout = Layout::detect();
    let (records, errors) = store.workloads();
    for d in vgpu_store::state::damaged::damaged_records(&errors) {
        match repair_record(store, lock, layout.as_ref(), &d) {
            Ok(_) => notes.push(Note::did(format!("removed {}, cut short by a crash of the machine before this boot: {}", d.path.display(), d.problem))),
            Err(reason) => notes.push(Note::warn(format!("left {} ({}): {reason}", d.path.display(), d.problem))),
        }
    }
    let (_, bad_intents) = vgpu_store::state::intent::list(store);
    for e in bad_intents {
        let (StateError::Damaged { path, .. } | StateError::NotRegular { path, .. }) = &e else { continue };
        if path.parent() != Some(store.intents_dir().as_path()) {
            continue; // the directory itself: not removed here
        }
        match remove_entry(path) {
            Ok(()) => notes.push(Note::did(format!("removed {}, cut short by a crash of the machine before this boot", path.display()))),
            Err(reason) => notes.push(Note::warn(format!("left {}: {reason}", path.display()))),
        }
    }
    let live = |w: &&vgpu_store::state::Workload| w.supervisor_alive();
    if matches!(crate::pool_effects::read(store), Err(StateError::Damaged { .. } | StateError::NotRegular { .. }))
        && !records.iter().filter(live).any(|w| w.pool_blocks.is_some() || w.state == WorkloadState::Waiting)
    {
        let path = store.state_dir.join(crate::pool_effects::POOL_FILE);
        let aside = store.state_dir.join(format!("{}.damaged", crate::pool_effects::POOL_FILE));
        match std::fs::rename(&path, &aside) {
            Ok(()) => notes.push(Note::did(format!("set aside {} as {}, cut short by a crash of the machine before this boot", path.display(), aside.display()))),
            Err(e) => notes.push(Note::warn(format!("cannot set aside {}: {e}", path.display()))),
        }
    }
    let partitions = Partitions::load(&store.partitions_path()).unwrap_or_default();
    for p in &partitions.partitions {
        let used = records.iter().filter(live).any(|w| w.partition.as_deref() == Some(p.name.as_str()));
        if !used {
            if let Err(e) = store.remove_vgpu(&p.vgpu_id()) {
                notes.push(Note::warn(format!("cannot remove the vGPU of partition {}: {e}", p.name)));
            }
        }
    }
}

/// Remove one damaged record and what it owned, or say why not.
fn repair_record(store: &Store, lock: &StoreLock, layout: Option<&Layout>, d: &DamagedRecord) -> Result<Vec<String>, String> {
    if d.path == store.workloads_dir() {
        return Err("the workload records cannot be listed; fix the directory's permissions".into());
    }
    let mut also = Vec::new();
    if let Some(sup) = d.supervisor.filter(|s| s.is_alive()) {
        return Err(format!("its supervisor `vgpu run` (pid {}) still runs; stop it first (e.g. kill {})", sup.pid, sup.pid));
    }
    if let Some(id) = &d.id {
        // Its cgroup: a name no cgroup may have means there is none.
        match layout.map(|l| Cgroup::open(l, id)) {
            None | Some(Err(CgroupError::NotFound { .. } | CgroupError::InvalidName { .. })) => {}
            Some(Err(e)) => return Err(format!("cannot open its cgroup vgpu/{id}: {e}")),
            Some(Ok(cgroup)) => match cgroup.remove_if_empty() {
                Ok(()) => also.push(format!("cgroup vgpu/{id}")),
                Err(CgroupError::Populated { pids, .. }) => {
                    let list: Vec<String> = pids.iter().map(i32::to_string).collect();
                    return Err(format!(
                        "processes {} still run in its cgroup vgpu/{id}; stop them first (e.g. kill {})",
                        list.join(", "),
                        list.join(" ")
                    ));
                }
                Err(e) => return Err(format!("cannot remove its cgroup vgpu/{id}: {e}")),
            },
        }
        // Its own vGPU (never a partition's).
        let partitions = Partitions::load(&store.partitions_path()).map_err(|e| format!("cannot read the partitions: {e}"))?;
        let dir = store.vgpu_dir(id);
        let is_partitions = partitions.partitions.iter().any(|p| p.vgpu_id() == *id);
        if !is_partitions && std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
            store.remove_vgpu(id).map_err(|e| e.to_string())?;
            also.push(dir.display().to_string());
        }
        // Its pool allocation, if the pool can be read.
        if let Ok(Some(pool)) = crate::pool_effects::read(store) {
            if pool.allocation(id).is_some() {
                crate::pool_effects::release(store, lock, id).map_err(|e| format!("cannot release its pool blocks: {e:#}"))?;
                also.push("its pool blocks".into());
            }
        }
    }
    remove_entry(&d.path)?;
    Ok(also)
}

/// Remove a record's directory entry itself: a file or symlink is unlinked (never
/// followed), an empty directory removed.
fn remove_entry(path: &Path) -> Result<(), String> {
    let result = match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    };
    result.map_err(|e| format!("cannot remove it: {e}"))
}

fn repair_pool(store: &Store, report: &mut Report) {
    let path = store.state_dir.join(crate::pool_effects::POOL_FILE);
    let problem = match crate::pool_effects::read(store) {
        Err(e @ (StateError::Damaged { .. } | StateError::NotRegular { .. })) => e.to_string(),
        _ => return,
    };
    let left = |reason: String| Left { path: path.clone(), id: None, problem: problem.clone(), reason };
    if !report.left.is_empty() {
        report.left.push(left("damaged workload records are left, and they may hold pool blocks".into()));
        return;
    }
    let (workloads, _) = store.workloads();
    let holders: Vec<String> = workloads
        .iter()
        .filter(|w| w.pool_blocks.is_some() || w.state == WorkloadState::Waiting)
        .map(|w| format!("{} ({})", w.name, w.id))
        .collect();
    if !holders.is_empty() {
        report.left.push(left(format!(
            "workloads {} hold (or wait for) pool blocks: a new pool would hand them out again; stop them first",
            holders.join(", ")
        )));
        return;
    }
    let aside = store.state_dir.join(format!("{}.damaged", crate::pool_effects::POOL_FILE));
    match std::fs::rename(&path, &aside) {
        Ok(()) => report.removed.push(Removed {
            path: path.clone(),
            id: None,
            problem: problem.clone(),
            also: vec![format!("set aside as {}; the next pool operation starts an empty pool", aside.display())],
        }),
        Err(e) => report.left.push(left(format!("cannot set it aside: {e}"))),
    }
}
