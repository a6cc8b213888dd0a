//! Crash consistency: what reconcile does with changes a killed command left half-done.
//!
//! Every multi-step change records an intent first (`state::intent`). Under the store
//! lock, reconcile (`lifecycle::reconcile_store`) then:
//!
//! - **start** (`vgpu run` between creating the cgroup and writing the record): the cgroup
//!   of a workload that has no record is removed (its vGPU directory and pool blocks are
//!   removed by the orphan rules);
//! - **suspend, resume, pool plans**: each workload named is brought to what the saved
//!   state says. The pool state (`pool.json`, saved in one atomic write) is the authority
//!   for the workloads it holds: one it holds suspended is frozen (its blocks are someone
//!   else's: none is handed out twice) and recorded so; any other is thawed and recorded
//!   running, unless its record says it was suspended by hand and it is frozen. So a
//!   `vgpu suspend` that died before recording is undone (thawed: the safe choice, the
//!   user sees it running and may suspend again), a `vgpu resume` that died after thawing
//!   is finished, and a preemption whose plan was not saved is undone. Then the pool is
//!   settled, which finishes what a plan that was saved had started.
//!
//! And, whatever the intents say, on every reconcile:
//!
//! - a live workload whose cgroup is frozen while neither its record nor the pool says it
//!   is suspended is thawed; a manually suspended one found thawed is recorded running;
//!   a throttle recorded by a `vgpu watch` that is gone is cleared from its record; a
//!   workload that a `vgpu watch` froze at an offence and died before thawing is thawed
//!   (so nothing stays frozen forever), and one it was ending (`ended` in its record) has
//!   its remaining processes killed;
//! - a cgroup under `vgpu/` that no record names, holds no process and is older than
//!   [`STRAY_GRACE`] is removed (the grace leaves alone a cgroup another store on the host
//!   is creating: tests and several state directories share the `vgpu/` cgroup parent).

use std::time::Duration;

use anyhow::{Context as _, Result};

use vgpu_cgroups::Cgroup;

use vgpu_cgroups::CgroupError;

use vgpu_cgroups::FreezerState;

use vgpu_cgroups::Layout;
use vgpu_pool::AllocState;
use vgpu_pool::Pool;
use vgpu_store::state::intent;
use vgpu_store::state::intent::Intent;
use vgpu_store::state::intent::Op;
use vgpu_store::state::Store;
use vgpu_store::state::StoreLock;
use vgpu_store::state::Workload;
use vgpu_store::state::WorkloadState;

/// Something reconcile did, or could not do: one line, without the `vgpu: ` prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub warning: bool,
    pub text: String,
}

impl Note {
    pub fn did(text: impl Into<String>) -> Note {
        Note { warning: false, text: text.into() }
    }
    pub fn warn(text: impl Into<String>) -> Note {
        Note { warning: true, text: text.into() }
    }
}

/// How old a cgroup with no record and no process must be before reconcile removes it.
pub const STRAY_GRACE: Duration = Duration::from_secs(60);

/// Finish or undo the changes whose intent was left by a command that died. Call with the
/// store lock held. Returns whether it found any (it may then have rewritten records).
pub fn half_done(store: &Store, lock: &StoreLock, layout: Option<&Layout>, notes: &mut Vec<Note>) -> bool {
    let (intents, damaged) = intent::list(store);
    for e in damaged {
        tracing::warn!("{e}; left in place");
    }
    let mut settle = false;
    let mut found = false;
    for (path, intent) in intents {
        // Changes run under the store lock we hold, so a live writer is not half-way
        // through one; its intent is left by an error it returned, and is dealt with once
        // it has exited. Never touch what a live process may still act on.
        if intent.writer_alive() {
            continue;
        }
        found = true;
        let result = match (intent.op, layout) {
            (_, None) => Ok(()),
            (Op::Start, Some(layout)) => undo_start(store, layout, &intent, notes),
            (Op::Suspend | Op::Resume | Op::Pool, Some(layout)) => realign(store, layout, &intent, notes),
        };
        settle |= intent.op == Op::Pool;
        match result.and_then(|()| intent::remove(&path).map_err(anyhow::Error::from)) {
            Ok(()) => {}
            Err(e) => notes.push(Note::warn(format!("cannot finish the {:?} left by pid {}: {e:#}", intent.op, intent.writer.pid))),
        }
    }
    if settle {
        if let Err(e) = crate::pool_effects::settle(store, lock) {
            notes.push(Note::warn(format!("cannot settle the compute pool: {e:#}")));
        }
    }
    found
}

/// A `vgpu run` died between creating the cgroup and writing the record: remove the cgroup
/// of each named workload that has no record (one with a record is the record's business:
/// a dead supervisor's workload is torn down by reconcile). The intent names ids only, so
/// this finds cgroups under each hierarchy's `vgpu/` (cgroupfs manager); one made in a
/// delegated unit's or a transient scope's subtree goes with that unit, which ends with its
/// dead `vgpu run` (cgroup/home.rs).
fn undo_start(store: &Store, layout: &Layout, intent: &Intent, notes: &mut Vec<Note>) -> Result<()> {
    for id in &intent.workloads {
        if std::fs::symlink_metadata(store.workload_path(id)).is_ok() {
            continue;
        }
        match Cgroup::open(layout, id) {
            Ok(cgroup) => {
                cgroup.remove().with_context(|| format!("removing the cgroup of {id}"))?;
                notes.push(Note::did(format!("removed the cgroup of {id}: its `vgpu run` died before recording it")));
            }
            Err(CgroupError::NotFound { .. }) => {}
            Err(e) => return Err(e).with_context(|| format!("opening the cgroup of {id}")),
        }
    }
    Ok(())
}

/// Bring every workload an intent names to what the saved state says (freezing again where
/// the pool holds it suspended).
fn realign(store: &Store, layout: &Layout, intent: &Intent, notes: &mut Vec<Note>) -> Result<()> {
    let pool = Known::load(store);
    let (workloads, _) = store.workloads();
    for w in workloads.iter().filter(|w| intent.workloads.contains(&w.id) && w.supervisor_alive()) {
        if let Some(what) = align(store, layout, &pool, &workloads, w, true)? {
            notes.push(Note::did(format!("{} ({}) {what}", w.name, w.id)));
        }
    }
    Ok(())
}

/// The generic rule, on every reconcile: no live workload stays frozen unless its record or
/// the pool says it is suspended; a manual suspension found thawed is recorded as undone.
/// Returns whether it rewrote a record.
pub fn align_all(store: &Store, layout: Option<&Layout>, notes: &mut Vec<Note>) -> bool {
    let (workloads, _) = store.workloads();
    align_among(store, layout, &workloads, &|w: &Workload| w.supervisor_alive(), notes)
}

/// [`align_all`] over `workloads`, the store's records as the caller read them under the
/// lock, of which those `alive` says have a live supervisor are looked at.
///
/// Most are running and thawed: for them [`align`] can do nothing (it acts on a workload
/// only when its cgroup is frozen or its record says suspended), so a running workload's
/// cgroup is looked at through its one freezer file, and [`align`] (which opens the cgroup
/// in every hierarchy and reads the pool) runs only when that says frozen or cannot be read.
pub fn align_among(store: &Store, layout: Option<&Layout>, workloads: &[Workload], alive: &dyn Fn(&Workload) -> bool, notes: &mut Vec<Note>) -> bool {
    let Some(layout) = layout else { return false };
    let mut pool = None;
    let mut rewrote = false;
    let cgroups = vgpu_cgroups::CgroupReaders::new(layout);
    for w in workloads.iter().filter(|w| alive(w)) {
        match finish_end(layout, w) {
            Ok(Some(n)) => notes.push(Note::did(format!("{} ({}): killed {n} process(es) the vgpu watch that ended it left", w.name, w.id))),
            Ok(None) => {}
            Err(e) => notes.push(Note::warn(format!("cannot finish ending {} ({}): {e:#}", w.name, w.id))),
        }
        let thawed = w.state != WorkloadState::Suspended
            && matches!(cgroups.freezer_state(&w.cgroup_home, &w.cgroup), Ok(FreezerState::Thawed));
        if !thawed {
            let pool = pool.get_or_insert_with(|| Known::load(store));
            match align(store, layout, pool, workloads, w, false) {
                Ok(Some(what)) => {
                    rewrote = true;
                    notes.push(Note::did(format!("{} ({}) {what}", w.name, w.id)))
                }
                Ok(None) => {}
                Err(e) => notes.push(Note::warn(format!("cannot check whether {} ({}) is frozen: {e:#}", w.name, w.id))),
            }
        }
        match clear_dead_throttle(store, w) {
            Ok(true) => {
                rewrote = true;
                notes.push(Note::did(format!("{} ({}) is no longer throttled: the vgpu watch that throttled it is gone", w.name, w.id)))
            }
            Ok(false) => {}
            Err(e) => notes.push(Note::warn(format!("cannot clear the throttle of {} ({}): {e:#}", w.name, w.id))),
        }
    }
    rewrote
}

/// A workload whose record says a `vgpu watch` that is gone ended it (its second offence)
/// and that still has processes: that watch died before killing them all (perhaps with the
/// cgroup frozen). Kill them (thawing it), as it would have. How many there were.
fn finish_end(layout: &Layout, w: &Workload) -> Result<Option<usize>> {
    let ended_by_dead_watch = w
        .enforcement
        .as_ref()
        .is_some_and(|e| e.action == vgpu_store::state::EnforcementAction::Ended && !vgpu_abi::process::ProcessId::from(e.by).is_alive());
    if !ended_by_dead_watch {
        return Ok(None);
    }
    let cgroup = match Cgroup::open_at(layout, &w.cgroup_home, &w.cgroup) {
        Ok(cgroup) => cgroup,
        Err(CgroupError::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    if cgroup.pids()?.is_empty() {
        return Ok(None);
    }
    Ok(Some(cgroup.kill_all()?))
}

/// Whether a `vgpu watch` that is gone recorded an offence of `w` (it may have died with
/// the cgroup frozen at the offence).
fn offence_by_dead_watch(w: &Workload) -> bool {
    w.enforcement.as_ref().is_some_and(|e| e.action.is_offence() && !vgpu_abi::process::ProcessId::from(e.by).is_alive())
}

/// A throttle recorded by a `vgpu watch` that is gone (killed: it could not clean up) ends
/// with it: `align` has thawed the cgroup; the record stops saying throttled. Reads the
/// record again (`align` may have rewritten it). Whether it cleared one.
fn clear_dead_throttle(store: &Store, w: &Workload) -> Result<bool> {
    if !w.enforcement.as_ref().is_some_and(|e| e.action == vgpu_store::state::EnforcementAction::Throttled) || throttled_by_live_watch(w) {
        return Ok(false);
    }
    let mut record = Workload::read(&store.workload_path(&w.id))?;
    if record.enforcement.as_ref().map(|e| (e.action, e.by)) != w.enforcement.as_ref().map(|e| (e.action, e.by)) {
        return Ok(false);
    }
    record.enforcement = None;
    store.write_workload(&record)?;
    Ok(true)
}

/// What the pool says, as far as it can be read.
enum Known {
    Pool(Option<Pool>),
    /// `pool.json` is damaged: workloads that hold blocks are left as they are.
    Unreadable,
}

impl Known {
    fn load(store: &Store) -> Known {
        match crate::pool_effects::load(store) {
            Ok(pool) => Known::Pool(pool),
            Err(_) => Known::Unreadable,
        }
    }
}

/// A live `vgpu watch` duty-cycles its freezer: frozen half the time is what it should be.
/// (Once that watch is gone, the rules below thaw it.)
fn throttled_by_live_watch(w: &Workload) -> bool {
    w.enforcement.as_ref().is_some_and(|e| {
        e.action == vgpu_store::state::EnforcementAction::Throttled && vgpu_abi::process::ProcessId::from(e.by).is_alive()
    })
}

fn preempted(w: &Workload) -> bool {
    w.state == WorkloadState::Suspended && w.suspended_reason.as_deref().is_some_and(|r| r.starts_with("preempted"))
}

/// Make one workload's cgroup and record agree with the saved state; say what was done.
/// `refreeze`: freeze it again if the pool holds it suspended and it runs (only for the
/// workloads of a dead writer's intent: a live `vgpu kill` thaws to kill).
fn align(store: &Store, layout: &Layout, pool: &Known, all: &[Workload], w: &Workload, refreeze: bool) -> Result<Option<&'static str>> {
    if w.state == WorkloadState::Waiting || throttled_by_live_watch(w) {
        return Ok(None);
    }
    // A Slurm step's tasks are not in its cgroup, which no suspension of it freezes: its
    // record follows Slurm's stops (`slurm::follow_suspensions`).
    if w.slurm.is_some() && w.state == WorkloadState::Suspended {
        return Ok(None);
    }
    let cgroup = match Cgroup::open_at(layout, &w.cgroup_home, &w.cgroup) {
        Ok(cgroup) => cgroup,
        Err(CgroupError::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let frozen = cgroup.state()? != FreezerState::Thawed;
    let alloc = match pool {
        Known::Pool(pool) => pool.as_ref().and_then(|p| p.allocation(&w.id)).map(|a| (a.state, a.preempted_by.clone())),
        Known::Unreadable if w.pool_blocks.is_some() => return Ok(None),
        Known::Unreadable => None,
    };
    let mut record = w.clone();
    let what = match alloc {
        Some((AllocState::Waiting, _)) => return Ok(None),
        Some((AllocState::Suspended, by)) => {
            if !frozen && !refreeze {
                return Ok(None);
            }
            if frozen && preempted(w) {
                return Ok(None);
            }
            let memory = if frozen { crate::suspension::memory_of(&cgroup) } else { crate::suspension::suspend(&cgroup)? };
            let by = by.map(|id| all.iter().find(|o| o.id == id).map(|o| o.name.clone()).unwrap_or(id)).unwrap_or_else(|| "a higher priority".into());
            record.set_suspended(format!("preempted by {by}"), memory);
            if frozen {
                "recorded as suspended: the pool gave its blocks away before the change was recorded"
            } else {
                "suspended again: the pool holds it suspended (a change was cut short)"
            }
        }
        _ => {
            let suspended = w.state == WorkloadState::Suspended;
            if frozen && suspended && !preempted(w) {
                return Ok(None); // suspended by hand and frozen: true
            }
            if !frozen && !suspended {
                // Running and thawed. A suspension killed between checkpointing its
                // processes and freezing them left them locked: let them run.
                if refreeze && crate::suspension::resume(&cgroup, None)? > 0 {
                    return Ok(Some("resumed: a suspension cut short had left its GPU work locked"));
                }
                return Ok(None);
            }
            if frozen {
                // Thawed, and its memory put back; if that does not fit, it stays
                // suspended (the pool holds its turn, or it was suspended by hand).
                if let Err(e) = crate::suspension::resume(&cgroup, w.suspended_memory.as_ref()) {
                    tracing::warn!("{} ({}): {e}", w.name, w.id);
                    return Ok(None);
                }
                record.set_resumed();
                if !suspended && offence_by_dead_watch(w) {
                    "thawed: the vgpu watch that froze it at an offence died before thawing it"
                } else if !suspended {
                    "thawed: a change froze it and died before recording it"
                } else {
                    "thawed: the pool gave its blocks back"
                }
            } else {
                // A resume thawed it and died: finish it (restore what is still on the host).
                if let Err(e) = crate::suspension::resume(&cgroup, w.suspended_memory.as_ref()) {
                    tracing::warn!("{} ({}): {e}", w.name, w.id);
                    return Ok(None);
                }
                record.set_resumed();
                "recorded as running: a resume thawed it and died before recording it"
            }
        }
    };
    store.write_workload(&record)?;
    Ok(Some(what))
}

/// Remove the cgroups under `vgpu/` that no record names and that hold no process (after
/// [`STRAY_GRACE`]). Nothing is removed while a record or an intent is damaged: it might
/// name one of them.
pub fn remove_stray_cgroups(store: &Store, layout: Option<&Layout>) {
    let (workloads, damaged) = store.workloads();
    remove_stray_cgroups_among(store, layout, &workloads, !damaged.is_empty());
}

/// [`remove_stray_cgroups`] with the store's records as the caller read them under the lock
/// (`damaged`: whether any could not be read).
pub fn remove_stray_cgroups_among(store: &Store, layout: Option<&Layout>, workloads: &[Workload], damaged: bool) {
    let Some(layout) = layout else { return };
    let (intents, bad_intents) = intent::list(store);
    if damaged || !bad_intents.is_empty() {
        return;
    }
    let Ok(names) = Cgroup::list(layout) else { return };
    let recorded: std::collections::HashSet<&str> = workloads.iter().map(|w| w.cgroup.as_str()).collect();
    for name in names {
        let claimed = recorded.contains(name.as_str()) || intents.iter().any(|(_, i)| i.workloads.contains(&name) && i.writer_alive());
        if claimed {
            continue;
        }
        // Old enough and empty (a live workload's of another store, or a new one, is ruled
        // out with a read or two).
        let Ok(Some(cgroup)) = Cgroup::open_if_idle(layout, &name, STRAY_GRACE) else { continue };
        match cgroup.remove_if_empty() {
            Ok(()) => tracing::info!("removed cgroup {}/{name}: no workload record names it and it holds no process", vgpu_cgroups::PARENT),
            Err(e) => tracing::debug!("leaving cgroup {name}: {e}"),
        }
    }
}

/// Remove the temporary files of atomic writes (`.tmp-*`) that a killed writer left in the
/// state directory, its records, its intents and the ends left for the watch. Every such write happens under the store
/// lock, which the caller holds: a temporary file found now has no writer. Only regular
/// files are removed; nothing is followed.
pub fn remove_dead_temp_files(store: &Store) {
    for dir in [store.state_dir.clone(), store.workloads_dir(), store.intents_dir(), store.ended_dir()] {
        if !std::fs::symlink_metadata(&dir).is_ok_and(|m| m.file_type().is_dir()) {
            continue; // missing, or not a directory (a link is not followed)
        }
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let is_temp = entry.file_name().to_str().is_some_and(|n| n.starts_with(".tmp-"));
            if is_temp && entry.file_type().is_ok_and(|t| t.is_file()) {
                match std::fs::remove_file(entry.path()) {
                    Ok(()) => tracing::info!("removed {}: left by a write that was killed", entry.path().display()),
                    Err(e) => tracing::warn!("cannot remove {}: {e}", entry.path().display()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;
    use vgpu_cgroups::fake::FakeV1;

    fn age(fake: &FakeV1, name: &str, by: Duration) {
        for mount in ["cpu,cpuacct", "memory", "pids", "freezer"] {
            let dir = fake.root().join(mount).join("vgpu").join(name);
            let file = std::fs::File::open(&dir).unwrap();
            file.set_modified(SystemTime::now() - by).unwrap();
        }
    }

    #[test]
    fn only_old_empty_unnamed_cgroups_are_removed() {
        let fake = FakeV1::new(&["cpu,cpuacct", "memory", "pids", "freezer"]);
        let layout = fake.layout();
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(&dir.path().join("run"), &dir.path().join("lib"));
        store.ensure_dirs().unwrap();
        for name in ["stray", "fresh", "busy", "claimed"] {
            Cgroup::create(&layout, name).unwrap();
        }
        let old = STRAY_GRACE + Duration::from_secs(5);
        for name in ["stray", "busy", "claimed"] {
            age(&fake, name, old);
        }
        std::fs::write(fake.root().join("pids/vgpu/busy/cgroup.procs"), "1\n").unwrap();
        // A live writer (this process) is creating "claimed".
        let pending = intent::begin(&store, Op::Start, &["claimed"]).unwrap();
        remove_stray_cgroups(&store, Some(&layout));
        assert_eq!(Cgroup::list(&layout).unwrap(), vec!["busy", "claimed", "fresh"]);
        pending.done();
        remove_stray_cgroups(&store, Some(&layout));
        assert_eq!(Cgroup::list(&layout).unwrap(), vec!["busy", "fresh"]);
    }

    #[test]
    fn temporary_files_of_killed_writes_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(&dir.path().join("run"), &dir.path().join("lib"));
        store.ensure_dirs().unwrap();
        std::fs::create_dir_all(store.intents_dir()).unwrap();
        std::fs::create_dir_all(store.ended_dir()).unwrap();
        let temps = [store.workloads_dir().join(".tmp-a1"), store.intents_dir().join(".tmp-b2"), store.state_dir.join(".tmp-c3"), store.ended_dir().join(".tmp-d4")];
        for t in &temps {
            std::fs::write(t, "{").unwrap();
        }
        let kept = store.workloads_dir().join(".tmp-dir");
        std::fs::create_dir(&kept).unwrap();
        remove_dead_temp_files(&store);
        assert!(temps.iter().all(|t| !t.exists()));
        assert!(kept.is_dir(), "only regular files are removed");
    }

    #[test]
    fn nothing_is_removed_while_an_intent_is_damaged() {
        let fake = FakeV1::new(&["cpu,cpuacct", "memory", "pids", "freezer"]);
        let layout = fake.layout();
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(&dir.path().join("run"), &dir.path().join("lib"));
        store.ensure_dirs().unwrap();
        Cgroup::create(&layout, "stray").unwrap();
        age(&fake, "stray", STRAY_GRACE * 2);
        std::fs::create_dir_all(store.intents_dir()).unwrap();
        std::fs::write(store.intents_dir().join("start-1-1.json"), "{ damaged").unwrap();
        remove_stray_cgroups(&store, Some(&layout));
        assert_eq!(Cgroup::list(&layout).unwrap(), vec!["stray"]);
    }

    #[test]
    fn a_throttle_ends_with_the_watch_that_recorded_it() {
        use vgpu_store::state::Enforcement;
        use vgpu_store::state::EnforcementAction;
        let fake = FakeV1::new(&["cpu,cpuacct", "memory", "pids", "freezer"]);
        let layout = fake.layout();
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(&dir.path().join("run"), &dir.path().join("lib"));
        store.ensure_dirs().unwrap();
        let me = vgpu_abi::process::ProcessId::current().unwrap();
        let mut w = vgpu_store::state::workload::tests::sample();
        w.supervisor = me.into();
        let throttle = |by: vgpu_abi::process::ProcessId| Enforcement {
            action: EnforcementAction::Throttled,
            reason: "GPU 0 at 97% by the driver, share 30%, the shim sees 0%".into(),
            pids: vec![7],
            by: by.into(),
            since_unix_ms: 0,
        };
        let cgroup = Cgroup::create(&layout, &w.cgroup).unwrap();
        fake.kernel_populate(&w.cgroup);
        // A live watch (this process) duty-cycles it: left frozen and throttled.
        w.enforcement = Some(throttle(me));
        store.write_workload(&w).unwrap();
        cgroup.freeze().unwrap();
        let mut notes = Vec::new();
        align_all(&store, Some(&layout), &mut notes);
        assert_eq!(cgroup.state().unwrap(), FreezerState::Frozen);
        assert!(notes.is_empty(), "{notes:?}");
        assert!(Workload::read(&store.workload_path(&w.id)).unwrap().enforcement.is_some());
        // Its watch was killed: thawed and the throttle cleared, frozen or not.
        let dead = vgpu_abi::process::ProcessId { start_time: me.start_time + 1, ..me };
        for frozen in [true, false] {
            w.enforcement = Some(throttle(dead));
            store.write_workload(&w).unwrap();
            if frozen {
                cgroup.freeze().unwrap();
            }
            let mut notes = Vec::new();
            align_all(&store, Some(&layout), &mut notes);
            assert_eq!(cgroup.state().unwrap(), FreezerState::Thawed);
            assert!(notes.iter().any(|n| !n.warning && n.text.ends_with("is no longer throttled: the vgpu watch that throttled it is gone")), "{notes:?}");
            let record = Workload::read(&store.workload_path(&w.id)).unwrap();
            assert_eq!(record.enforcement, None, "frozen: {frozen}");
            assert_eq!(record.state, WorkloadState::Running);
        }
    }

    #[test]
    fn a_dead_runs_cgroup_without_a_record_is_removed_at_once() {
        let fake = FakeV1::new(&["cpu,cpuacct", "memory", "pids", "freezer"]);
        let layout = fake.layout();
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(&dir.path().join("run"), &dir.path().join("lib"));
        store.ensure_dirs().unwrap();
        let lock = store.lock().unwrap();
        Cgroup::create(&layout, "a1b2c3d4").unwrap();
        Cgroup::create(&layout, "other").unwrap();
        let pending = intent::begin(&store, Op::Start, &["a1b2c3d4"]).unwrap();
        // Its writer "dies": another start time is another process.
        let (found, _) = intent::list(&store);
        let (path, mut dead) = found.into_iter().next().unwrap();
        dead.writer.start_time += 1;
        vgpu_store::state::atomic::write_json(&path, &dead).unwrap();
        drop(pending);
        let mut notes = Vec::new();
        half_done(&store, &lock, Some(&layout), &mut notes);
        assert_eq!(Cgroup::list(&layout).unwrap(), vec!["other"]);
        assert_eq!(notes, [Note::did("removed the cgroup of a1b2c3d4: its `vgpu run` died before recording it")]);
        assert!(intent::list(&store).0.is_empty(), "the intent is removed once undone");
    }
}
