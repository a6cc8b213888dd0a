//! What happens to workloads besides starting them: tearing one down, and reconciling the
//! store with reality (supervisors that died, changes a killed command left half-done,
//! cgroups and vGPU directories nobody owns, processes that died holding device memory).
//! Every `vgpu` command that reads or changes workloads calls [`reconcile_store`] (or
//! [`reconcile_but_usage`]) first, under the store lock.

use std::collections::HashSet;
use std::path::Path;

use anyhow::{Context as _, Result};
use vgpu_abi::usage::UsageFile;

use vgpu_cgroups::Cgroup;

use vgpu_cgroups::Layout;
use vgpu_store::state::Partitions;
use vgpu_store::state::StateError;
use vgpu_store::state::Store;
use vgpu_store::state::StoreLock;
use vgpu_store::state::Workload;

/// What reconciliation found.
#[derive(Debug, Default)]
pub struct Reconciled {
    /// Workloads whose supervisor had died, now cleaned up.
    pub cleaned: Vec<Workload>,
    /// Damaged workload files (left in place, reported).
    pub damaged: Vec<StateError>,
    /// What it did and could not do, in order.
    pub notes: Vec<Note>,
    /// The workload records as reconcile left them, read under the store lock (those it
    /// cleaned up are gone, those it changed as changed): the caller, still holding the
    /// lock, acts on these instead of reading every record again.
    pub workloads: Vec<Workload>,
    /// The ids of those whose supervisor it found alive.
    pub alive: HashSet<String>,
}

pub use crate::recovery::Note;

/// Print a note on stderr as commands do (`vgpu: …`, `vgpu: warning: …`); a closed stderr
/// is not an error worth dying for.
pub fn say(note: &Note) {
    use std::io::Write as _;
    let prefix = if note.warning { "vgpu: warning: " } else { "vgpu: " };
    let _ = writeln!(std::io::stderr(), "{prefix}{}", note.text);
}

/// Clean up after dead supervisors and dead processes, and say on stderr what was done
/// ([`reconcile_quietly`], then each note). Call with the store lock held.
pub fn reconcile_store(store: &Store, lock: &StoreLock) -> Reconciled {
    let found = reconcile_quietly(store, lock);
    found.notes.iter().for_each(say);
    found
}

/// [`reconcile_store`] but for giving back the device memory of dead processes in every
/// vGPU (each vGPU's usage file locked and its processes looked at), for a caller that reads
/// no usage — an admission (`vgpu run`) counts quotas — or gives it back in each vGPU as it
/// reads it (`vgpu ps`, [`reclaim_dead_processes_but`] for the rest). Whoever reads usage gives
/// that memory back first: the shim before it refuses an allocation, the listings, the other
/// commands through [`reconcile_store`], `vgpu watch` every interval.
///
/// `layout`: the host's cgroup layout, as the caller detected it (`Layout::detect`), for
/// the caller and the reconcile to read the mount table once.
///
/// `leftovers`: whether it also removes what killed commands left and no record names, or
/// leaves that to a running `vgpu watch`, whose every round sweeps it ([`Leftovers`]):
/// neither an admission nor a listing needs it gone, only the records settled (dead
/// supervisors cleaned up, half-done changes finished, the pool tidied).
pub fn reconcile_but_usage(store: &Store, lock: &StoreLock, layout: Option<&Layout>, leftovers: Leftovers) -> Reconciled {
    if leftovers == Leftovers::LeftToWatch {
        tracing::debug!("what killed commands left (stray cgroups, temporary files, orphan vGPUs) is left to vgpu watch, which sweeps it every round");
    }
    let found = reconcile(store, lock, Sweep::NotUsage, leftovers, layout);
    found.notes.iter().for_each(say);
    found
}

/// Who removes, at a reconcile, what no record names: cgroups under `vgpu/` that belong to
/// no workload, the temporary files of atomic writes that were killed, vGPU directories
/// that belong to no workload or partition and the board slots of vGPUs that are gone.
/// A killed command leaves them; none of them changes what an admission decides (the
/// records and intents do), and each is harmless until it is removed: a stray cgroup is
/// only ever removed once it is empty and past a grace period, a temporary file is never
/// read, an orphan vGPU has no process, and its board slot (one of the 64 others that each
/// vGPU reads) is given back by the next sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leftovers {
    /// This reconcile removes them.
    Sweep,
    /// A running `vgpu watch` removes them: its GPU list is current (it marked it within
    /// two rounds), and each of its rounds reconciles with [`Leftovers::Sweep`]
    /// ([`reconcile_quietly`]). An admission or a listing that found it so leaves them:
    /// 0.2 ms a `vgpu run` with none running, 8 ms with 1000 (issue 28).
    LeftToWatch,
}

impl Leftovers {
    /// [`Leftovers::LeftToWatch`] while the list of a running watch of this driver
    /// (`simulated` or not) is current (`vgpu_store::state::inventory`), else
    /// [`Leftovers::Sweep`].
    pub fn now(store: &Store, simulated: bool) -> Leftovers {
        match vgpu_store::state::inventory::current_list(store, simulated, std::time::SystemTime::now()) {
            Ok(_) => Leftovers::LeftToWatch,
            Err(_) => Leftovers::Sweep,
        }
    }
}

/// Clean up after dead supervisors and dead processes; what was done is in the notes (the
/// workload files are gone afterwards). Call with the store lock held.
pub fn reconcile_quietly(store: &Store, lock: &StoreLock) -> Reconciled {
    reconcile(store, lock, Sweep::All, Leftovers::Sweep, Layout::detect().as_ref())
}

/// What a reconcile looks at besides the workload records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sweep {
    All,
    /// All but the dead processes of every vGPU ([`reconcile_but_usage`]).
    NotUsage,
}

/// The records are read once, and each live workload costs a look at its supervisor and
/// one freezer file; they are read again only after a step that may have rewritten some
/// (a teardown, the pool, a half-done change, an alignment).
fn reconcile(store: &Store, lock: &StoreLock, sweep: Sweep, leftovers: Leftovers, layout: Option<&Layout>) -> Reconciled {
    let mut notes = Vec::new();
    after_a_reboot(store, lock, &mut notes);
    let (records, damaged) = store.workloads();
    let mut out = Reconciled { damaged, notes, ..Reconciled::default() };
    let mut alive: HashSet<String> = HashSet::new();
    let mut remaining = Vec::with_capacity(records.len());
    let mut changed = false;
    for w in records {
        if w.supervisor_alive() {
            alive.insert(w.id.clone());
            remaining.push(w);
            continue;
        }
        // Only a workload of the pool touches its state: a damaged pool.json blocks pool
        // operations, not the clean-up of the others.
        let in_pool = w.pool_blocks.is_some() || w.state == vgpu_store::state::WorkloadState::Waiting;
        let released = |()| if in_pool { crate::pool_effects::release(store, lock, &w.id) } else { Ok(()) };
        // Released blocks may go to other workloads (their records rewritten); a teardown
        // that failed may have removed part of what it had.
        changed = true;
        match teardown(store, &w, layout).and_then(released) {
            Ok(()) => {
                out.notes.push(Note::did(format!("cleaned up workload {} ({}): its supervisor (pid {}) died", w.name, w.id, w.supervisor.pid)));
                out.cleaned.push(w);
            }
            Err(e) => out.notes.push(Note::warn(format!("cannot clean up workload {} ({}): {e:#}", w.name, w.id))),
        }
    }
    let reread = |changed: &mut bool, out: &mut Reconciled, remaining: &mut Vec<Workload>| {
        if std::mem::take(changed) {
            (*remaining, out.damaged) = store.workloads();
        }
    };
    if !out.cleaned.is_empty() {
        // Clocks follow the work: the dead supervisors' GPUs are re-planned without them.
        let ended: Vec<&str> = out.cleaned.iter().map(|w| w.id.as_str()).collect();
        let replanned = crate::carbon::follow::after_reconcile(store, lock, &ended);
        out.notes.extend(replanned.warnings.into_iter().map(Note::warn));
    }
    reread(&mut changed, &mut out, &mut remaining);
    match crate::pool_effects::release_orphans(store, lock, &remaining, !out.damaged.is_empty()) {
        Ok(released) => changed |= released,
        Err(e) => {
            changed = true;
            out.notes.push(Note::warn(format!("cannot tidy the compute pool: {e:#}")));
        }
    }
    // Changes a killed command left half-done, then whatever else is frozen or left over.
    changed |= crate::recovery::half_done(store, lock, layout, &mut out.notes);
    reread(&mut changed, &mut out, &mut remaining);
    changed |= crate::recovery::align_among(store, layout, &remaining, &|w: &Workload| alive.contains(&w.id), &mut out.notes);
    reread(&mut changed, &mut out, &mut remaining);
    if leftovers == Leftovers::Sweep {
        crate::recovery::remove_stray_cgroups_among(store, layout, &remaining, !out.damaged.is_empty());
        crate::recovery::remove_dead_temp_files(store);
        remove_orphan_vgpus(store, &remaining, &out.damaged);
    }
    if sweep == Sweep::All {
        reclaim_dead_processes(store);
    }
    out.workloads = remaining;
    out.alive = alive;
    out
}

/// The store's boot mark (`vgpu_store::state::boot`): the first reconcile of a boot in a
/// store last reconciled in another repairs what a crash of the machine may have cut short
/// ([`crate::repair::after_reboot`]), then marks it as this boot's.
fn after_a_reboot(store: &Store, lock: &StoreLock, notes: &mut Vec<Note>) {
    use vgpu_store::state::boot::Mark;
    let this = match store.boot_mark() {
        Ok(Mark::ThisBoot) => return,
        Ok(Mark::Unmarked(this)) => this,
        Ok(Mark::Earlier(this)) => {
            crate::repair::after_reboot(store, lock, notes);
            this
        }
        Err(e) => {
            notes.push(Note::warn(format!("cannot tell which boot this is: {e}")));
            return;
        }
    };
    if let Err(e) = store.set_boot_mark(&this) {
        notes.push(Note::warn(format!("cannot mark the store as this boot's: {e}")));
    }
}

/// Stop and remove everything a workload holds: its processes, cgroup, own vGPU, record.
pub fn teardown(store: &Store, w: &Workload, layout: Option<&Layout>) -> Result<()> {
    if let Some(layout) = layout {
        match Cgroup::open_at(layout, &w.cgroup_home, &w.cgroup) {
            Ok(cgroup) => {
                // remove() thaws (a frozen process cannot die), kills what is left, removes.
                cgroup.remove().with_context(|| format!("removing the cgroup of {}", w.id))?;
            }
            Err(vgpu_cgroups::CgroupError::NotFound { .. }) => {}
            Err(e) => return Err(e).with_context(|| format!("opening the cgroup of {}", w.id)),
        }
    }
    // The record goes last: until then it names what is left to remove.
    vgpu_store::stop_point::stop_point("exit:cgroup-removed");
    if w.partition.is_none() {
        anyhow::ensure!(vgpu_store::state::is_plain_name(&w.vgpu), "workload {}: vGPU {:?} is not a plain name", w.id, w.vgpu);
        store.remove_vgpu(&w.vgpu).with_context(|| format!("removing the vGPU of {}", w.id))?;
    }
    store.remove_workload(&w.id)?;
    Ok(())
}

/// vGPU directories that belong to no workload and no partition: left by a `vgpu run`
/// killed between creating the vGPU and recording the workload. A damaged record may own
/// the vGPU named like itself (vgpu names a workload's record and own vGPU after its id):
/// that one is kept. When the records cannot be listed at all, every vGPU is kept. Board
/// slots whose vGPU directory is gone are removed first. `workloads` and `damaged` are the
/// store's records as the caller read them under the lock.
fn remove_orphan_vgpus(store: &Store, workloads: &[Workload], damaged: &[StateError]) {
    vgpu_abi::board::remove_orphan_slots(&store.state_dir, &store.vgpus_dir());
    let damaged = vgpu_store::state::damaged::damaged_records(damaged);
    if damaged.iter().any(|d| d.path == store.workloads_dir()) {
        return;
    }
    let partitions = Partitions::load(&store.partitions_path()).unwrap_or_default();
    let Ok(entries) = std::fs::read_dir(store.vgpus_dir()) else { return };
    let owners: HashSet<&str> = workloads.iter().map(|w| w.vgpu.as_str()).collect();
    for entry in entries.flatten() {
        let Some(name) = vgpu_dir_name(&entry) else { continue };
        let owned = owners.contains(name.as_str())
            || partitions.partitions.iter().any(|p| p.vgpu_id() == name)
            || damaged.iter().any(|d| d.id.as_deref() == Some(name.as_str()));
        if !owned {
            vgpu_abi::board::release_vgpu(&entry.path());
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Give back the device memory of processes that died (SIGKILL included) in every vGPU.
fn reclaim_dead_processes(store: &Store) {
    reclaim_dead_processes_but(store, &HashSet::new());
}

/// [`reclaim_dead_processes`] in every vGPU but those in `done` (given back already).
pub fn reclaim_dead_processes_but(store: &Store, done: &HashSet<String>) {
    let Ok(entries) = std::fs::read_dir(store.vgpus_dir()) else { return };
    for entry in entries.flatten() {
        if let Some(name) = vgpu_dir_name(&entry).filter(|name| !done.contains(name)) {
            reclaim_vgpu(store, &name);
        }
    }
}

/// The name of an entry of `vgpus/` that is a vGPU directory: a plain name and a real
/// directory (the entry's own type: a symlink is not followed). Anything else is reported
/// and left alone.
fn vgpu_dir_name(entry: &std::fs::DirEntry) -> Option<String> {
    let path = entry.path();
    let Some(name) = entry.file_name().to_str().filter(|n| vgpu_store::state::is_plain_name(n)).map(str::to_owned) else {
        tracing::warn!("{}: not a plain name; skipped", path.display());
        return None;
    };
    match entry.file_type() {
        Ok(kind) if kind.is_dir() => Some(name),
        Ok(kind) => {
            tracing::warn!("{}: a {}, not a vGPU directory; skipped (not opened)", path.display(), vgpu_abi::mapping::kind_name(&kind));
            None
        }
        Err(_) => None,
    }
}

/// Give back the device memory of the dead processes of one vGPU.
/// The usage file is opened without following links or blocking on FIFOs, and so is every
/// per-process file reclaim looks at; entries of `procs/` that are not regular files are
/// removed (root) and reported here.
pub fn reclaim_vgpu(store: &Store, vgpu: &str) {
    if !vgpu_store::state::is_plain_name(vgpu) {
        return;
    }
    let path = store.vgpu_dir(vgpu).join(vgpu_abi::layout::USAGE_FILE);
    match UsageFile::open(&path) {
        Ok(usage) => reclaim_in(&path, &usage),
        Err(e @ vgpu_abi::usage::LayoutError::NotRegular { .. }) => tracing::warn!("{e}"),
        Err(_) => {}
    }
}

/// Give back the device memory of the dead processes of the vGPU whose usage file, at
/// `path`, the caller opened.
pub fn reclaim_in(path: &Path, usage: &UsageFile) {
    report_reclaim(path, &usage.reclaim_dead());
}

/// [`reclaim_in`] for a listing of every vGPU (`vgpu ps`): a vGPU no process ever counted
/// itself in holds nothing to give back, and is neither locked nor listed
/// ([`UsageFile::reclaim_dead_if_any`]). The full reclaims (`vgpu watch`'s, the clean-ups,
/// the shim's before a refusal) still look at every vGPU.
pub fn reclaim_listed(path: &Path, usage: &UsageFile) {
    report_reclaim(path, &usage.reclaim_dead_if_any());
}

fn report_reclaim(path: &Path, report: &vgpu_abi::usage::ReclaimReport) {
    if report.processes > 0 {
        tracing::info!("reclaimed {} bytes from {} dead process(es) in {}", report.bytes, report.processes, path.display());
    }
    for line in &report.errors {
        tracing::warn!("{line}");
    }
}

/// A terminating signal (SIGTERM, SIGINT, SIGHUP, SIGQUIT) was sent to the processes of
/// workload `id`: a frozen process acts on it only once thawed, so if its cgroup is frozen
/// (suspended by hand or preempted) thaw it now and record it as running. Its pool blocks
/// stay as the pool recorded them until it exits. Takes the store lock. Returns whether it
/// thawed anything.
pub fn wake_to_terminate(store: &Store, id: &str, cgroup: &str) -> Result<bool> {
    let _lock = store.lock()?;
    let Some(layout) = Layout::detect() else { return Ok(false) };
    // Where the record says its cgroup is (a delegated unit's subtree, or the roots).
    let home = Workload::read(&store.workload_path(id)).map(|w| w.cgroup_home).unwrap_or_default();
    let cgroup = match Cgroup::open_at(&layout, &home, cgroup) {
        Ok(cgroup) => cgroup,
        Err(vgpu_cgroups::CgroupError::NotFound { .. }) => return Ok(false),
        Err(e) => return Err(e).with_context(|| format!("opening the cgroup of {id}")),
    };
    if cgroup.state().with_context(|| format!("reading the freezer state of {id}"))? == vgpu_cgroups::FreezerState::Thawed {
        return Ok(false);
    }
    crate::suspension::wake(&cgroup).with_context(|| format!("resuming {id}"))?;
    if let Ok(mut record) = Workload::read(&store.workload_path(id)) {
        if record.state == vgpu_store::state::WorkloadState::Suspended {
            record.set_resumed();
            store.write_workload(&record)?;
        }
    }
    Ok(true)
}

/// Find one workload by unique id prefix or name.
pub fn find<'a>(workloads: &'a [Workload], query: &str) -> Result<&'a Workload> {
    let matches: Vec<&Workload> = workloads.iter().filter(|w| w.matches(query)).collect();
    match matches.as_slice() {
        [one] => Ok(one),
        [] => Err(vgpu_store::error::UsageError::new(format!("no workload {query:?} (see `vgpu ps`)")).into()),
        many => Err(vgpu_store::error::UsageError::new(format!(
            "{query:?} matches {} workloads ({}); give more of the id",
            many.len(),
            many.iter().map(|w| w.id.as_str()).collect::<Vec<_>>().join(", ")
        ))
        .into()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;
    use vgpu_cgroups::fake::FakeV1;

    const MOUNTS: [&str; 4] = ["cpu,cpuacct", "memory", "pids", "freezer"];

    #[test]
    fn an_admission_leaves_what_no_record_names_to_a_running_watch_and_a_sweep_removes_it() {
        let fake = FakeV1::new(&MOUNTS);
        let layout = fake.layout();
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(&dir.path().join("run"), &dir.path().join("lib"));
        store.ensure_dirs().unwrap();
        // What a killed command leaves: a cgroup no record names (old, empty), the temporary
        // file of a write, a vGPU no workload owns, and a board slot whose vGPU is gone.
        Cgroup::create(&layout, "stray").unwrap();
        for mount in MOUNTS {
            let stray = std::fs::File::open(fake.root().join(mount).join("vgpu/stray")).unwrap();
            stray.set_modified(SystemTime::now() - crate::recovery::STRAY_GRACE - Duration::from_secs(5)).unwrap();
        }
        let temp = store.workloads_dir().join(".tmp-killed");
        std::fs::write(&temp, "{").unwrap();
        let orphan = store.vgpus_dir().join("0badc0de");
        std::fs::create_dir_all(&orphan).unwrap();
        let board = store.state_dir.join("gpus").join("GPU-0211541f-98f2-4b58-f890-0d35c5986255");
        std::fs::create_dir_all(&board).unwrap();
        let slot = board.join("5ca1ab1e");
        std::fs::write(&slot, [0u8; 64]).unwrap();

        let lock = store.lock().unwrap();
        let found = reconcile_but_usage(&store, &lock, Some(&layout), Leftovers::LeftToWatch);
        assert!(found.notes.is_empty() && found.workloads.is_empty(), "{:?}", found.notes);
        assert_eq!(Cgroup::list(&layout).unwrap(), vec!["stray"]);
        assert!(temp.exists() && orphan.is_dir() && slot.exists());
        reconcile_but_usage(&store, &lock, Some(&layout), Leftovers::Sweep);
        assert!(Cgroup::list(&layout).unwrap().is_empty());
        assert!(!temp.exists() && !orphan.exists() && !slot.exists());
    }
}
