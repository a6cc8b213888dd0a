//! `vgpu ps`'s whole listing: a row per workload, and the processes in no vGPU on their
//! GPUs. Root with the store lock free reconciles first; anyone else reads the store as it is
//! ([`vgpu_store::read_only`]), and the driver fills in what they cannot read.

use super::driver::{self, Driver, UnmanagedRow};
use super::{row_with, Known, Row};
use vgpu_cgroups::Layout;
use vgpu_json::SuspendedReason;
use vgpu_json::WorkloadRef;
use vgpu_store::read_only::Access;
use vgpu_store::read_only::ReadOnly;
use vgpu_store::state::StateError;
use vgpu_store::state::Store;
use vgpu_store::state::Workload;

/// What to list besides the workloads.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Every process of each workload (`ps -a`).
    pub processes: bool,
    /// The processes in no vGPU on the workloads' GPUs (this needs the driver).
    pub unmanaged: bool,
}

/// One listing.
#[derive(Debug)]
pub struct Listing {
    pub rows: Vec<Row>,
    /// With [`Options::unmanaged`]: the processes in no vGPU on the GPUs the workloads use
    /// (empty without a driver).
    pub unmanaged: Option<Vec<UnmanagedRow>>,
    /// Workload records that cannot be read (left in place; each names its file).
    pub damaged: Vec<StateError>,
    /// Why the store was read as it is, if it was (not reconciled first).
    pub read_only: Option<ReadOnly>,
}

/// List the workloads. Never waits for the store lock and, unless it is root's to take at
/// once, writes nothing.
pub fn list(store: &Store, driver: &Driver<'_>, options: Options) -> Result<Listing, StateError> {
    let access = Access::take(store)?;
    let read_only = access.read_only();
    // Root reconciles as every command does, but gives back the memory of dead processes
    // in each vGPU as it reads it (below), not in a sweep of its own first.
    let layout = Layout::detect();
    let reconciled = match &access {
        Access::Writer(lock) => {
            let leftovers = crate::lifecycle::Leftovers::now(store, driver.simulated());
            Some(crate::lifecycle::reconcile_but_usage(store, lock, layout.as_ref(), leftovers))
        }
        Access::ReadOnly(_) => None,
    };
    drop(access);
    // After a reconcile, the records as it left them (read under the lock); else as they are.
    let (workloads, damaged, alive) = match reconciled {
        Some(r) => (r.workloads, r.damaged, Some(r.alive)),
        None => {
            let (workloads, damaged) = store.workloads();
            (workloads, damaged, None)
        }
    };
    let mut reclaimed = std::collections::HashSet::new();
    let known: Vec<Known> = workloads
        .iter()
        .map(|w| Known {
            supervisor_alive: alive.as_ref().map(|a| a.contains(&w.id)),
            // Once per vGPU (a partition's workloads share one).
            reclaim: alive.is_some() && reclaimed.insert(w.vgpu.clone()),
        })
        .collect();
    let pids = super::Pids::new(layout.as_ref());
    let mut rows: Vec<Row> = workloads.iter().zip(&known).map(|(w, k)| row_with(store, &pids, w, options.processes, *k)).collect();
    if alive.is_some() {
        // The vGPUs no row read (a partition's without a workload).
        crate::lifecycle::reclaim_dead_processes_but(store, &reclaimed);
    }
    suspended_by(store, &mut rows, &workloads);
    let unreadable = rows.iter().any(|r| !r.usage_readable || r.gpus.iter().any(|g| g.mem_used.is_none()));
    let mut snapshot = if options.unmanaged || unreadable { driver.snapshot() } else { None };
    if let Some(snapshot) = snapshot.as_mut() {
        snapshot.adopt_descendants(&crate::slurm::step_supervisors(&workloads));
    }
    if let Some(snapshot) = &snapshot {
        for (r, w) in rows.iter_mut().zip(&workloads) {
            driver::fill(r, w, snapshot);
        }
    }
    let unmanaged = options.unmanaged.then(|| snapshot.as_ref().map(|s| driver::unmanaged(s, &workloads)).unwrap_or_default());
    Ok(Listing { rows, unmanaged, damaged, read_only })
}

/// Who preempted each preempted workload: the pool's record of it (a workload id), else the
/// name or id its record's reason gives (`preempted by NAME`). Null when neither is known.
fn suspended_by(store: &Store, rows: &mut [Row], workloads: &[Workload]) {
    let preempted = |r: &Row| r.suspended_reason == Some(SuspendedReason::Preempted);
    if !rows.iter().any(preempted) {
        return;
    }
    let pool = crate::pool_effects::read(store).ok().flatten();
    for row in rows.iter_mut().filter(|r| preempted(r)) {
        let by_pool = pool.as_ref().and_then(|p| p.allocation(&row.id)).and_then(|a| a.preempted_by.clone());
        let by_text = row.suspended_why.as_deref().and_then(|t| t.strip_prefix("preempted by ")).map(str::to_string);
        let found = by_pool
            .iter()
            .find_map(|id| workloads.iter().find(|w| &w.id == id))
            .or_else(|| by_text.as_ref().and_then(|t| workloads.iter().find(|w| &w.id == t).or_else(|| workloads.iter().find(|w| &w.name == t))));
        row.suspended_by = match (found, by_pool) {
            (Some(w), _) => Some(WorkloadRef { id: w.id.clone(), name: w.name.clone() }),
            // Ended since: the pool still says who it was; the record's reason its name.
            (None, Some(id)) => Some(WorkloadRef { name: by_text.unwrap_or_else(|| id.clone()), id }),
            (None, None) => None,
        };
    }
}
