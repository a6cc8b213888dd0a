//! The admission transaction: what starting a workload has done so far, undone in reverse
//! order when it is dropped without [`Admission::commit`] (an error returned half-way, a
//! panic).
//!
//! A process that is killed runs no destructor: for that case the steps keep the order the
//! next reconcile relies on (`recovery.rs`). The start intent is written before the first
//! step reconcile would have to undo (the vGPU, the cgroup) and removed by `commit`, once the
//! record exists; pool blocks without a record are the pool's orphans
//! (`pool_effects::release_orphans`). The rollback itself runs under the store lock, and leaves
//! the intent in place when an undo fails, so that reconcile tries again once this process
//! has exited.

use std::path::PathBuf;

use vgpu_cgroups::Cgroup;

use vgpu_cgroups::CgroupSpec;
use vgpu_store::state::intent::Pending;
use vgpu_store::state::StateError;
use vgpu_store::state::Store;
use vgpu_store::state::StoreLock;

/// One step done, as it is undone.
#[derive(Debug)]
enum Step {
    /// The pool holds blocks, or a queue entry, for the workload (asked for; releasing what
    /// it does not hold is nothing).
    PoolBlocks,
    /// The start intent is written.
    Intent(Pending),
    /// A vGPU of the workload's own: its directory and board slots. (A partition's vGPU is
    /// the partition's: it outlives its workloads and is never undone.)
    OwnVgpu(PathBuf),
    /// The workload's cgroup exists (with its limits, or some of them): its directories.
    Cgroup(CgroupSpec),
    /// The workload's record is written (waiting for blocks, or starting).
    Record,
}

/// An admission under way for workload `id`: the store lock (released only while waiting for
/// pool blocks) and the steps done.
#[must_use = "dropped without commit(), everything it did is undone"]
pub struct Admission<'s> {
    store: &'s Store,
    id: String,
    lock: Option<StoreLock>,
    done: Vec<Step>,
}

impl<'s> Admission<'s> {
    /// Start admitting workload `id`, under `lock`.
    pub fn new(store: &'s Store, id: &str, lock: StoreLock) -> Admission<'s> {
        Admission { store, id: id.to_string(), lock: Some(lock), done: Vec::new() }
    }

    /// The store lock, taken again if it was released (while waiting).
    pub fn lock(&mut self) -> Result<&StoreLock, StateError> {
        relock(self.store, &mut self.lock)
    }

    /// Release the store lock (while waiting for pool blocks); [`Admission::lock`] takes it again.
    pub fn unlock(&mut self) {
        self.lock = None;
    }

    /// The pool was asked for blocks (granted or queued).
    pub fn asked_pool(&mut self) {
        self.did(Step::PoolBlocks);
    }

    /// The start intent is written.
    pub fn wrote_intent(&mut self, intent: Pending) {
        self.did(Step::Intent(intent));
    }

    /// A vGPU of the workload's own is (being) made in `dir`.
    pub fn made_vgpu(&mut self, dir: PathBuf) {
        self.did(Step::OwnVgpu(dir));
    }

    /// The cgroup exists.
    pub fn made_cgroup(&mut self, cgroup: &Cgroup) {
        self.did(Step::Cgroup(cgroup.spec()));
    }

    /// The record is written.
    pub fn wrote_record(&mut self) {
        if !self.done.iter().any(|s| matches!(s, Step::Record)) {
            self.did(Step::Record);
        }
    }

    fn did(&mut self, step: Step) {
        self.done.push(step);
    }

    /// The workload is admitted: remove the start intent (its record exists now), keep
    /// everything else, release the store lock.
    pub fn commit(mut self) {
        for step in std::mem::take(&mut self.done) {
            if let Step::Intent(intent) = step {
                intent.done();
            }
        }
    }

    /// Undo every step, last first.
    fn rollback(&mut self) {
        let done = std::mem::take(&mut self.done);
        let lock = match relock(self.store, &mut self.lock) {
            Ok(lock) => lock,
            Err(e) => {
                tracing::warn!("{e}: cannot undo the admission of {}; the next command's reconcile does", self.id);
                return;
            }
        };
        let (store, id) = (self.store, self.id.as_str());
        let mut complete = true;
        for step in done.into_iter().rev() {
            let undone = match step {
                Step::Record => store.remove_workload(id).map_err(|e| ("record", e.to_string())),
                Step::Cgroup(spec) => Cgroup::from_spec(&spec).and_then(|c| c.remove()).map_err(|e| ("cgroup", e.to_string())),
                Step::OwnVgpu(dir) => {
                    vgpu_abi::board::release_vgpu(&dir);
                    match std::fs::remove_dir_all(&dir) {
                        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(("vGPU directory", e.to_string())),
                        _ => Ok(()),
                    }
                }
                // All undone: nothing is left for reconcile. Otherwise the intent stays, for
                // reconcile to finish once this process has exited.
                Step::Intent(intent) => {
                    if complete {
                        intent.done();
                    }
                    Ok(())
                }
                Step::PoolBlocks => crate::pool_effects::release(store, lock, id).map_err(|e| ("pool blocks", format!("{e:#}"))),
            };
            if let Err((what, e)) = undone {
                tracing::warn!("undoing the admission of {id}: cannot remove its {what}: {e}");
                complete = false;
            }
        }
    }
}

impl Drop for Admission<'_> {
    fn drop(&mut self) {
        if !self.done.is_empty() {
            self.rollback();
        }
    }
}

/// The lock in `slot`, taken if it is not held.
fn relock<'a>(store: &Store, slot: &'a mut Option<StoreLock>) -> Result<&'a StoreLock, StateError> {
    let lock = match slot.take() {
        Some(lock) => lock,
        None => store.lock()?,
    };
    Ok(slot.insert(lock))
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_store::state::intent;

    use vgpu_store::state::temp_store as store;

    /// Intent, vGPU directory and record, as `admit` makes them (no cgroup: that needs root).
    fn half_admitted<'s>(store: &'s Store, id: &str) -> Admission<'s> {
        let mut tx = Admission::new(store, id, store.lock().unwrap());
        tx.wrote_intent(intent::begin(store, intent::Op::Start, &[id]).unwrap());
        let dir = store.vgpu_dir(id);
        std::fs::create_dir_all(dir.join("procs")).unwrap();
        tx.made_vgpu(dir);
        let mut w = vgpu_store::state::workload::tests::sample();
        w.id = id.to_string();
        store.write_workload(&w).unwrap();
        tx.wrote_record();
        tx
    }

    #[test]
    fn dropped_undoes_everything_and_removes_its_intent() {
        let (_dir, store) = store();
        drop(half_admitted(&store, "a1b2c3d4"));
        assert!(!store.workload_path("a1b2c3d4").exists(), "the record is removed");
        assert!(!store.vgpu_dir("a1b2c3d4").exists(), "the vGPU directory is removed");
        assert!(intent::list(&store).0.is_empty(), "all undone: no intent is left for reconcile");
        store.lock().unwrap(); // and the lock is free
    }

    #[test]
    fn committed_keeps_everything_but_the_intent() {
        let (_dir, store) = store();
        half_admitted(&store, "a1b2c3d4").commit();
        assert!(store.workload_path("a1b2c3d4").exists());
        assert!(store.vgpu_dir("a1b2c3d4").is_dir());
        assert!(intent::list(&store).0.is_empty(), "the record exists: the intent is done");
    }

    #[test]
    fn an_undo_that_fails_leaves_the_intent_for_reconcile() {
        let (_dir, store) = store();
        let mut tx = half_admitted(&store, "a1b2c3d4");
        // A cgroup that cannot be reopened from its spec (not under `vgpu/`).
        let bogus = CgroupSpec::V2 { name: "a1b2c3d4".into(), dir: "/nonexistent/a1b2c3d4".into() };
        tx.did(Step::Cgroup(bogus));
        tx.unlock(); // the rollback takes the lock again
        drop(tx);
        assert!(!store.workload_path("a1b2c3d4").exists());
        assert_eq!(intent::list(&store).0.len(), 1, "the intent stays");
    }
}
