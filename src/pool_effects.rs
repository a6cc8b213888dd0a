//! The compute pool's effects: its state file (`<state-dir>/pool.json`, read and written
//! under the store lock), freezing and thawing the workloads a plan names, and keeping
//! the workload records in step. The decisions themselves are the pure `pool` module's.

use anyhow::{Context as _, Result};

use crate::cgroup::{Cgroup, Layout};
use crate::context::Context;
use crate::gpu::GpuInfo;
use crate::pool::{Inventory, NvmlGpu, Plan, Pool, PoolError};
use crate::state::{atomic, intent, StateError, Store, StoreLock, WorkloadState};

pub const POOL_FILE: &str = "pool.json";

/// A `PoolError` as the CLI reports it: usage errors exit 2.
pub fn pool_error(e: PoolError) -> anyhow::Error {
    if e.is_usage() {
        crate::error::UsageError::new(e.to_string()).into()
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
    atomic::write_json(&store.state_dir.join(POOL_FILE), pool)?;
    Ok(())
}

/// The pool over this host's devices now (NVML GPUs + config devices): the stored one
/// adjusted to the inventory, or a new one. Allocations on devices that disappeared are
/// dropped, and said.
pub fn current(ctx: &Context, store: &Store, gpus: &[GpuInfo]) -> Result<Pool> {
    let nvml_gpus: Vec<NvmlGpu> = gpus.iter().map(NvmlGpu::from).collect();
    let inventory = Inventory::build(&nvml_gpus, &ctx.config.pool).map_err(pool_error)?;
    let pool = match load(store)? {
        Some(mut pool) => {
            for dropped in pool.adopt(inventory) {
                eprintln!("vgpu: warning: pool allocation of {} ({}) dropped: its device is gone", dropped.name, dropped.id);
            }
            pool
        }
        None => Pool::new(inventory),
    };
    Ok(pool)
}

/// Carry out `plan`: freeze what it suspends (undoing the freezes if one fails, so nobody
/// stays frozen for nothing and nothing is recorded), thaw what it resumes, record it in
/// the pool, save, and update the workload records. An intent naming the workloads it
/// freezes or thaws is recorded first and removed last: if this process dies between the
/// steps, the next reconcile brings them to what the saved pool says (`recovery.rs`).
pub fn execute(store: &Store, _lock: &StoreLock, pool: &mut Pool, plan: Plan) -> Result<()> {
    if plan.is_empty() {
        return Ok(());
    }
    let touched: Vec<&str> = plan.suspend().iter().map(|s| s.id.as_str()).chain(plan.resume().iter().map(|r| r.id.as_str())).collect();
    let intent = if touched.is_empty() { None } else { Some(intent::begin(store, intent::Op::Pool, &touched)?) };
    let layout = Layout::detect();
    let (workloads, _) = store.workloads();
    let cgroup_of = |id: &str| -> Result<Cgroup> {
        let w = workloads.iter().find(|w| w.id == id).context("it has no record")?;
        let layout = layout.as_ref().context("this host has no cgroup filesystem")?;
        Cgroup::open(layout, &w.cgroup).context("its cgroup cannot be opened")
    };
    let mut frozen: Vec<Cgroup> = Vec::new();
    for s in plan.suspend() {
        // A victim that cannot be frozen is a failed freeze, whatever the reason: recorded
        // as suspended it would keep running on blocks given away.
        if let Err(e) = cgroup_of(&s.id).and_then(|cgroup| {
            cgroup.freeze()?;
            frozen.push(cgroup);
            Ok(())
        }) {
            for c in &frozen {
                let _ = c.thaw();
            }
            return Err(e).with_context(|| format!("cannot suspend {} ({}) to make room; nothing was changed", s.name, s.id));
        }
    }
    if !frozen.is_empty() {
        crate::stop_point::stop_point("preempt:frozen");
    }
    for r in plan.resume() {
        if let Ok(cgroup) = cgroup_of(&r.id) {
            if let Err(e) = cgroup.thaw() {
                eprintln!("vgpu: warning: cannot resume {} ({}): {e}", r.name, r.id);
            }
        }
    }
    // Who preempted whom, by name: the preemptor may be the request being admitted, which
    // has no record yet.
    let name_of = |id: &str| -> String {
        plan.granted()
            .filter(|a| a.id == id)
            .map(|a| a.name.clone())
            .or_else(|| workloads.iter().find(|w| w.id == id).map(|w| w.name.clone()))
            .unwrap_or_else(|| id.to_string())
    };
    let suspended: Vec<(String, String)> = plan.suspend().iter().map(|s| (s.id.clone(), name_of(&s.by))).collect();
    let resumed: Vec<String> = plan.resume().iter().map(|r| r.id.clone()).collect();
    pool.apply(plan).map_err(pool_error)?;
    save(store, pool)?;
    if intent.is_some() {
        crate::stop_point::stop_point("preempt:saved");
    }
    for mut w in workloads {
        if let Some((_, by_name)) = suspended.iter().find(|(id, _)| *id == w.id) {
            w.state = WorkloadState::Suspended;
            w.suspended_reason = Some(format!("preempted by {by_name}"));
            store.write_workload(&w)?;
            eprintln!("vgpu: suspended {} ({}): preempted by {by_name}", w.name, w.id);
        } else if resumed.contains(&w.id) {
            w.state = WorkloadState::Running;
            w.suspended_reason = None;
            store.write_workload(&w)?;
            eprintln!("vgpu: resumed {} ({})", w.name, w.id);
        }
    }
    if let Some(intent) = intent {
        intent.done();
    }
    Ok(())
}

/// Resume (or start) whoever fits now, as after a release.
pub fn settle(store: &Store, lock: &StoreLock) -> Result<()> {
    let Some(mut pool) = load(store)? else { return Ok(()) };
    let plan = pool.settle();
    execute(store, lock, &mut pool, plan)
}

/// Give a workload's blocks back and resume (or start) whoever now fits.
pub fn release(store: &Store, lock: &StoreLock, id: &str) -> Result<()> {
    let Some(mut pool) = load(store)? else { return Ok(()) };
    if pool.allocation(id).is_none() {
        return Ok(());
    }
    pool.release(id).map_err(pool_error)?;
    save(store, &pool)?;
    let plan = pool.settle();
    execute(store, lock, &mut pool, plan)
}

/// Drop pool entries whose workload record is gone (a `vgpu run` killed while waiting, or
/// between the pool and the record), then settle.
pub fn release_orphans(store: &Store, lock: &StoreLock) -> Result<()> {
    // A damaged pool.json is left for the pool operations to report (and `doctor --repair`).
    let pool = match read(store) {
        Ok(Some(pool)) => pool,
        Ok(None) | Err(StateError::Damaged { .. } | StateError::NotRegular { .. }) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let (workloads, damaged) = store.workloads();
    if !damaged.is_empty() {
        return Ok(());
    }
    let orphans: Vec<String> = pool.allocations().filter(|a| !workloads.iter().any(|w| w.id == a.id)).map(|a| a.id.clone()).collect();
    for id in orphans {
        release(store, lock, &id)?;
    }
    Ok(())
}
