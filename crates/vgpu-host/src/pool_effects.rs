//! The compute pool's effects: its state file (`<state-dir>/pool.json`, read and written
//! under the store lock), freezing and thawing the workloads a plan names, and keeping
//! the workload records in step. The decisions themselves are the pure `pool` module's.

use anyhow::{Context as _, Result};

use vgpu_cgroups::Cgroup;

use vgpu_cgroups::Layout;
use crate::context::Context;
use vgpu_gpu::GpuInfo;
use vgpu_pool::inventory::Inventory;
use vgpu_pool::inventory::NvmlGpu;
use vgpu_pool::Plan;
use vgpu_pool::Pool;
use vgpu_pool::PoolError;
use vgpu_store::state::atomic;
use vgpu_store::state::intent;
use vgpu_store::state::StateError;
use vgpu_store::state::Store;
use vgpu_store::state::StoreLock;
use vgpu_store::state::SuspendedMemory;
use vgpu_store::state::Workload;

pub const POOL_FILE: &str = "pool.json";

/// A `PoolError` as the CLI reports it: usage errors exit 2.
pub fn pool_error(e: PoolError) -> anyhow::Error {
    if e.is_usage() {
        vgpu_store::error::UsageError::new(e.to_string()).into()
    } else {
        anyhow::Error::new(e)
    }
}

/// The stored pool, if any workload ever used it. A damaged `pool.json` fails every pool
/// operation (and only those) with one line naming the file and the fix.
pub fn load(store: &Store) -> Result<Option<Pool>> {
    match read(store) {
        Ok(pool) => Ok(pool),
        Err(e @ (StateError::Damaged { .. } | StateError::NotRegular { .. })) => Err(anyhow::anyhow!(
            "{e}; pool operations (`vgpu run --tflops`, `vgpu pool`) are refused until `sudo vgpu doctor --repair` \
             sets it aside, which it does once no workload holds pool blocks"
        )),
        Err(e) => Err(e.into()),
    }
}

/// The stored pool, typed: `Damaged`/`NotRegular` when `pool.json` cannot be used.
pub fn read(store: &Store) -> Result<Option<Pool>, StateError> {
    let path = store.state_dir.join(POOL_FILE);
    if std::fs::symlink_metadata(&path).is_err() {
        return Ok(None);
    }
    atomic::read_json(&path).map(Some)
}

pub fn save(store: &Store, pool: &Pool) -> Result<()> {
    atomic::write_json_as(&store.state_dir.join(POOL_FILE), pool, atomic::Durability::Runtime)?;
    Ok(())
}

/// The pool over this host's devices now (NVML GPUs + config devices): the stored one
/// adjusted to the inventory, or a new one. Allocations on devices that disappeared are
/// dropped, and said.
pub fn current(ctx: &Context, store: &Store, gpus: &[GpuInfo]) -> Result<Pool> {
    let nvml_gpus: Vec<NvmlGpu> = gpus.iter().map(|g| NvmlGpu { index: g.index, uuid: g.uuid.clone(), name: g.name.clone() }).collect();
    let inventory = Inventory::build(&nvml_gpus, &ctx.config.pool).map_err(pool_error)?;
    let pool = match load(store)? {
        Some(mut pool) => {
            for dropped in pool.adopt(inventory) {
                tracing::warn!("pool allocation of {} ({}) dropped: its device is gone", dropped.name, dropped.id);
            }
            pool
        }
        None => Pool::new(inventory),
    };
    Ok(pool)
}

/// Carry out `plan`: suspend what it suspends (`suspension::suspend`: checkpointed where
/// the driver can, then frozen; undoing them all if one fails, so nobody stays suspended
/// for nothing and nothing is recorded), resume what it resumes, record it in the pool,
/// save, and update the workload records. An intent naming the workloads it suspends or
/// resumes is recorded first and removed last: if this process dies between the steps,
/// the next reconcile brings them to what the saved pool says (`recovery.rs`).
///
/// Returns where each suspended workload's memory went. A resume whose memory cannot be
/// put back on the GPU undoes the whole plan and fails with [`ResumeRefused`].
pub fn execute(store: &Store, _lock: &StoreLock, pool: &mut Pool, plan: Plan) -> Result<Vec<(String, SuspendedMemory)>> {
    if plan.is_empty() {
        return Ok(Vec::new());
    }
    let touched: Vec<&str> = plan.suspend().iter().map(|s| s.id.as_str()).chain(plan.resume().iter().map(|r| r.id.as_str())).collect();
    let intent = if touched.is_empty() { None } else { Some(intent::begin(store, intent::Op::Pool, &touched)?) };
    let layout = Layout::detect();
    let (workloads, _) = store.workloads();
    let record_of = |id: &str| workloads.iter().find(|w| w.id == id);
    let cgroup_of = |id: &str| -> Result<Cgroup> {
        let w = record_of(id).context("it has no record")?;
        let layout = layout.as_ref().context("this host has no cgroup filesystem")?;
        Cgroup::open_at(layout, &w.cgroup_home, &w.cgroup).context("its cgroup cannot be opened")
    };
    let mut suspended: Vec<(Cgroup, String, SuspendedMemory)> = Vec::new();
    // The victims with no CUDA context: frozen, they had no device memory to move.
    let mut no_context: Vec<String> = Vec::new();
    let undo_suspensions = |suspended: &[(Cgroup, String, SuspendedMemory)]| {
        for (cgroup, id, memory) in suspended.iter().rev() {
            if let Err(e) = crate::suspension::resume(cgroup, Some(memory)) {
                tracing::warn!("cannot resume {id} again: {e}");
            }
        }
    };
    for s in plan.suspend() {
        // A victim that cannot be suspended is a failed suspension, whatever the reason:
        // recorded as suspended it would keep running on blocks given away.
        match cgroup_of(&s.id).and_then(|cgroup| {
            let (memory, checkpointed) = crate::suspension::suspend_counted(&cgroup)?;
            Ok((cgroup, memory, checkpointed))
        }) {
            Ok((cgroup, memory, checkpointed)) => {
                if checkpointed == 0 {
                    no_context.push(s.id.clone());
                }
                suspended.push((cgroup, s.id.clone(), memory))
            }
            Err(e) => {
                undo_suspensions(&suspended);
                return Err(e).with_context(|| format!("cannot suspend {} ({}) to make room; nothing was changed", s.name, s.id));
            }
        }
    }
    if !suspended.is_empty() {
        vgpu_store::stop_point::stop_point("preempt:frozen");
    }
    let mut resumed: Vec<(Cgroup, &str)> = Vec::new();
    for r in plan.resume() {
        let Ok(cgroup) = cgroup_of(&r.id) else {
            continue;
        };
        let memory = record_of(&r.id).and_then(|w| w.suspended_memory.clone());
        if let Err(e) = crate::suspension::resume(&cgroup, memory.as_ref()) {
            // Put everything back as it was; the caller settles without this one.
            for (cgroup, id) in resumed.iter().rev() {
                match crate::suspension::suspend(cgroup) {
                    Ok(SuspendedMemory::Host) => {}
                    Ok(SuspendedMemory::Device { why }) => {
                        tracing::warn!("{id} is suspended again with its memory on the GPU: {why}")
                    }
                    Err(e) => tracing::warn!("cannot suspend {id} again: {e}"),
                }
            }
            undo_suspensions(&suspended);
            if let Some(intent) = intent {
                intent.done();
            }
            return Err(anyhow::Error::new(ResumeRefused { id: r.id.clone(), reason: e.to_string() }));
        }
        resumed.push((cgroup, &r.id));
    }
    // Who preempted whom, by name: the preemptor may be the request being admitted, which
    // has no record yet.
    let name_of = |id: &str| -> String {
        plan.granted()
            .filter(|a| a.id == id)
            .map(|a| a.name.clone())
            .or_else(|| record_of(id).map(|w| w.name.clone()))
            .unwrap_or_else(|| id.to_string())
    };
    let by: Vec<(String, String)> = plan.suspend().iter().map(|s| (s.id.clone(), name_of(&s.by))).collect();
    let resumed: Vec<String> = resumed.into_iter().map(|(_, id)| id.to_string()).collect();
    let memory: Vec<(String, SuspendedMemory)> = suspended.into_iter().map(|(_, id, m)| (id, m)).collect();
    pool.apply(plan).map_err(pool_error)?;
    save(store, pool)?;
    if intent.is_some() {
        vgpu_store::stop_point::stop_point("preempt:saved");
    }
    for mut w in workloads.clone() {
        if let Some((_, by_name)) = by.iter().find(|(id, _)| *id == w.id) {
            let place = memory.iter().find(|(id, _)| *id == w.id).map(|(_, m)| m.clone()).unwrap_or(SuspendedMemory::Device { why: "unknown".into() });
            let said = match &place {
                SuspendedMemory::Host if no_context.contains(&w.id) => "frozen; it has no CUDA context, so no device memory to move".to_string(),
                SuspendedMemory::Host => "its device memory is in host memory".to_string(),
                SuspendedMemory::Device { why } => {
                    format!("its device memory stays on the GPU: {why}")
                }
            };
            w.set_suspended(format!("preempted by {by_name}"), place);
            store.write_workload(&w)?;
            crate::notice!("suspended {} ({}): preempted by {by_name}; {said}", w.name, w.id);
        } else if resumed.contains(&w.id) {
            w.set_resumed();
            store.write_workload(&w)?;
            crate::notice!("resumed {} ({})", w.name, w.id);
        }
    }
    if let Some(intent) = intent {
        intent.done();
    }
    Ok(memory)
}

/// A plan's resume that the driver refused (its memory does not fit back on the GPU): the
/// plan was undone; settle again without it.
#[derive(Debug, thiserror::Error)]
#[error("cannot resume {id}: {reason}")]
pub struct ResumeRefused {
    pub id: String,
    pub reason: String,
}

/// Resume (or start) whoever fits now, as after a release. A suspended workload whose
/// memory is in host memory resumes only once it fits beside the others'; until then it
/// keeps its turn and its blocks wait for it, unless others can use them meanwhile.
pub fn settle(store: &Store, lock: &StoreLock) -> Result<()> {
    let Some(mut pool) = load(store)? else {
        return Ok(());
    };
    settle_pool(store, lock, &mut pool)
}

/// [`settle`] on a pool already loaded.
pub fn settle_pool(store: &Store, lock: &StoreLock, pool: &mut Pool) -> Result<()> {
    let mut held = std::collections::BTreeSet::new();
    // Each round holds one more workload back, so this ends.
    loop {
        let plan = pool.settle_without(&held);
        if let Some(id) = first_not_fitting(store, &plan)? {
            held.insert(id);
            continue;
        }
        match execute(store, lock, pool, plan) {
            Ok(_) => return Ok(()),
            Err(e) => match e.downcast::<ResumeRefused>() {
                Ok(refused) => {
                    tracing::warn!("{refused}; it stays suspended");
                    held.insert(refused.id);
                }
                Err(e) => return Err(e),
            },
        }
    }
}

/// The first workload the plan resumes whose memory, in host memory, does not fit back
/// beside what the others hold (those the plan suspends still hold theirs: whether the
/// driver can move it is known only once tried).
fn first_not_fitting(store: &Store, plan: &Plan) -> Result<Option<String>> {
    if plan.resume().is_empty() {
        return Ok(None);
    }
    let (mut workloads, _) = store.workloads();
    let partitions = vgpu_store::state::Partitions::load(&store.partitions_path())?;
    for r in plan.resume() {
        let Some(at) = workloads.iter().position(|w| w.id == r.id) else {
            continue;
        };
        if vgpu_store::admission::check_fits_back(&workloads[at], &workloads, &partitions.partitions).is_err() {
            return Ok(Some(r.id.clone()));
        }
        workloads[at].set_resumed();
    }
    Ok(None)
}

/// Plan a pool request: [`Pool::admit`], whose settling of others leaves out those whose
/// memory would not fit back (as [`settle`] does). The outer error is the store's; the
/// inner one the pool's decision.
pub fn admit(store: &Store, pool: &Pool, request: &vgpu_pool::Request) -> Result<Result<Plan, PoolError>> {
    plan_fitting(store, |held| pool.admit_without(request, held))
}

/// Plan with `plan`, holding back (from its settling) each workload whose memory would not
/// fit back, until none is left.
pub fn plan_fitting(store: &Store, plan: impl Fn(&std::collections::BTreeSet<String>) -> Result<Plan, PoolError>) -> Result<Result<Plan, PoolError>> {
    let mut held = std::collections::BTreeSet::new();
    loop {
        let planned = match plan(&held) {
            Ok(planned) => planned,
            Err(e) => return Ok(Err(e)),
        };
        match first_not_fitting(store, &planned)? {
            Some(id) => {
                held.insert(id);
            }
            None => return Ok(Ok(planned)),
        }
    }
}

/// The workload records as `plan` would leave them: those it resumes running, and those it
/// suspends with their memory on the host if `victims_release_memory`, else held.
pub fn planned_workloads(store: &Store, plan: &Plan, victims_release_memory: bool) -> Vec<Workload> {
    let (mut workloads, _) = store.workloads();
    for w in &mut workloads {
        if plan.resume().iter().any(|r| r.id == w.id) {
            w.set_resumed();
        } else if victims_release_memory && plan.suspend().iter().any(|s| s.id == w.id) {
            w.set_suspended("planned".into(), SuspendedMemory::Host);
        }
    }
    workloads
}

/// Give a workload's blocks back and resume (or start) whoever now fits.
pub fn release(store: &Store, lock: &StoreLock, id: &str) -> Result<()> {
    let Some(mut pool) = load(store)? else {
        return Ok(());
    };
    if pool.allocation(id).is_none() {
        return Ok(());
    }
    pool.release(id).map_err(pool_error)?;
    save(store, &pool)?;
    settle_pool(store, lock, &mut pool)
}

/// Drop pool entries whose workload record is gone (a `vgpu run` killed while waiting, or
/// between the pool and the record), then settle. `workloads` are the store's records as the caller read them under the lock (`damaged`:
/// whether any could not be read). Returns whether it released any (settling the pool may
/// then have rewritten other records).
pub fn release_orphans(store: &Store, lock: &StoreLock, workloads: &[vgpu_store::state::Workload], damaged: bool) -> Result<bool> {
    // A damaged pool.json is left for the pool operations to report (and `doctor --repair`).
    let pool = match read(store) {
        Ok(Some(pool)) => pool,
        Ok(None) | Err(StateError::Damaged { .. } | StateError::NotRegular { .. }) => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    if damaged {
        return Ok(false);
    }
    let recorded: std::collections::HashSet<&str> = workloads.iter().map(|w| w.id.as_str()).collect();
    let orphans: Vec<String> = pool.allocations().filter(|a| !recorded.contains(a.id.as_str())).map(|a| a.id.clone()).collect();
    for id in &orphans {
        release(store, lock, id)?;
    }
    Ok(!orphans.is_empty())
}
