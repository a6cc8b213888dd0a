//! The admission: from a checked request to a recorded workload with its vGPU and cgroup.

use anyhow::{Context as _, Result};
use vgpu_abi::process::ProcessId;
use vgpu_abi::usage::Tenant;

use vgpu_store::admission;

use vgpu_store::admission::AdmissionGpu;
use vgpu_cgroups::Cgroup;
use vgpu_cgroups::Layout;
use vgpu_cgroups::Limits;
use crate::context::Context;
use crate::context::HostGpus;
use crate::lifecycle::Leftovers;
use vgpu_store::error::UsageError;
use vgpu_store::state::workload::WorkloadState;
use vgpu_store::state::workload::WORKLOAD_FORMAT;
use vgpu_store::state::intent;
use vgpu_store::state::Partitions;
use vgpu_store::state::Store;
use vgpu_store::state::Workload;
use vgpu_store::state::DamagedRecord;

use super::ids::{default_name, new_id};
use super::transaction::Admission;
use super::{place, Launched, Placement, Request};

/// Under the store lock: reconcile, place the workload (pool blocks, a partition, GPUs),
/// check admission, create the vGPU, the cgroup and the record. On failure everything done
/// here is undone ([`Admission`]). `host`: the GPUs, and the running watch whose list they
/// are (it removes the leftovers of killed commands: `lifecycle::Leftovers`).
pub fn admit(ctx: &Context, store: &Store, layout: &Layout, host: &HostGpus, request: &Request) -> Result<Launched> {
    let gpus = host.gpus.as_slice();
    let devices: Vec<AdmissionGpu> = gpus
        .iter()
        .map(|g| AdmissionGpu { index: g.index, uuid: g.uuid.clone(), name: g.name.clone(), memory: g.memory_total })
        .collect();
    let lock = store.lock()?;
    // The records as reconcile left them, under this lock: read once. What killed commands
    // left and no record names is the running watch's to sweep, when there is one.
    let leftovers = if host.watch.is_some() { Leftovers::LeftToWatch } else { Leftovers::Sweep };
    let reconciled = crate::lifecycle::reconcile_but_usage(store, &lock, Some(layout), leftovers);
    let workloads = reconciled.workloads;
    let damaged = vgpu_store::state::damaged::damaged_records(&reconciled.damaged);

    if let Some(name) = &request.name {
        if let Some(holder) = workloads.iter().find(|w| &w.name == name) {
            name_taken(name, holder, request.service.as_ref())?;
        }
    }
    let supervisor = ProcessId::current().context("cannot read this process's start time from /proc")?;
    let id = new_id(&workloads, &damaged);
    let mut workload = Workload {
        format: WORKLOAD_FORMAT,
        id: id.clone(),
        name: request.name.clone().unwrap_or_else(|| default_name(&request.argv[0], &id)),
        // Stored bounded; the child gets the whole argv (`request.argv`).
        command: vgpu_store::state::workload::bounded_command(&request.argv),
        user: request.user.clone(),
        gpus: Vec::new(),
        vgpu: id.clone(),
        partition: None,
        priority: request.priority.get(),
        compute_policy: request.compute_policy.unwrap_or(ctx.config.compute.policy),
        pool_blocks: None,
        pool_env: Vec::new(),
        freq_sensitivity: request.freq_sensitivity,
        cgroup: id.clone(),
        cgroup_home: Default::default(),
        supervisor: supervisor.into(),
        pid: None,
        state: WorkloadState::Starting,
        suspended_reason: None,
        suspended_memory: None,
        suspended_by: None,
        created_unix_ms: vgpu_store::clock::now_ms(),
        enforcement: None,
        service: request.service.clone(),
        slurm: None,
    };
    // The cgroup manager's choice, and its effects: a transient scope from systemd, this
    // process moved to its leaf of a delegated cgroup (cgroup/home.rs).
    workload.cgroup_home = vgpu_cgroups::home::settle(layout, ctx.config.cgroup.manager, &id).context("placing the workload's cgroup")?;
    let mut tx = Admission::new(store, &id, lock);

    let partition = match &request.placement {
        Placement::Pool(ask) => {
            place::on_pool(ctx, store, &mut tx, gpus, &devices, request, ask, &mut workload)?;
            None
        }
        Placement::Partition(name) => Some(place::in_partition(store, &devices, name, &mut workload)?),
        Placement::Gpus { wanted, count, compute_pct } => {
            let partitions = Partitions::load(&store.partitions_path())?;
            let chosen = match count {
                // Stage 1 of the carbon planner decides the count. It may ask the intensity
                // source (bounded by [carbon] timeout) while holding the store lock: the
                // decision must see the same workloads the admission below sees.
                Some((min, max)) => crate::carbon::range::gpus_for_range(ctx, *min, *max, request.freq_sensitivity)?
                    .iter()
                    .map(u32::to_string)
                    .collect(),
                None => wanted.clone(),
            };
            place::on_gpus(&devices, &chosen, *compute_pct, request.mem, request.mem_cap.as_ref(), &workloads, &partitions.partitions, &damaged, &mut workload)?;
            None
        }
    };

    // Memory admission for every GPU slice of a vGPU of its own. Pool blocks may have been
    // waited for (the lock released meanwhile) or taken from others (their records
    // rewritten): then as the records are now.
    if workload.partition.is_none() && !request.oversubscribe {
        match &request.placement {
            Placement::Pool(_) => check_memory(store, &devices, &workload)?,
            _ => check_memory_among(store, &devices, &workload, &workloads, &damaged)?,
        }
    }
    // Who may write the vGPU's counters, and whether this workload may use the partition.
    let tenant = vgpu_store::access::tenant_for(&workload, partition.as_ref()).map_err(|e| UsageError::new(e.to_string()))?;
    let turn_max_us = match request.turn_max_us {
        Some(us) => us,
        None => ctx.config.compute.turn_us().map_err(|e| anyhow::anyhow!("[compute] turn: {e}"))?,
    };
    let cgroup = create(store, layout, &mut tx, &workload, tenant, &request.limits, turn_max_us)?;
    tx.commit();
    vgpu_store::stop_point::stop_point("run:recorded");
    Ok(Launched { workload, cgroup })
}

/// The refusal of a name `holder` already has: who holds it, and for a replica of a
/// service (whose runner retries every round, saying this in its log and `service show`)
/// whether it is an earlier run of the same replica or a workload that took the name before
/// the service existed (`vgpu run --name NAME-<i>` is refused while it does).
fn name_taken(name: &str, holder: &Workload, replica: Option<&vgpu_store::state::ServiceRef>) -> Result<()> {
    let who = format!("workload {} of user {}", holder.id, holder.user.name);
    match (replica, &holder.service) {
        (Some(r), Some(h)) if h.name == r.name => {
            vgpu_store::usage!("replica {} of service {}: its name {name:?} is still held by {who}, replica {} of the service", r.replica, r.name, h.replica)
        }
        (Some(r), _) => vgpu_store::usage!(
            "replica {} of service {}: its name {name:?} is held by {who}, which is no replica of the service (it took the name before the service existed); the replica starts once it ends",
            r.replica,
            r.name
        ),
        (None, _) => vgpu_store::usage!("a workload named {name:?} is already running ({who})"),
    }
}

/// Whether the workload's memory fits on each of its GPUs beside the others' (and no
/// damaged record may hold that GPU).
pub(super) fn check_memory(store: &Store, devices: &[AdmissionGpu], workload: &Workload) -> Result<()> {
    let (others, damaged) = store.workloads();
    check_memory_among(store, devices, workload, &others, &vgpu_store::state::damaged::damaged_records(&damaged))
}

/// [`check_memory`] beside `others` and `damaged` as given (the records as the caller read
/// them under the lock, or as a plan would leave them).
pub(super) fn check_memory_among(store: &Store, devices: &[AdmissionGpu], workload: &Workload, others: &[Workload], damaged: &[DamagedRecord]) -> Result<()> {
    // Beside the others: a record of its own (a plan's, or one written while it waited)
    // is left out.
    let without_it: Vec<Workload>;
    let others = if others.iter().any(|w| w.id == workload.id) {
        without_it = others.iter().filter(|w| w.id != workload.id).cloned().collect();
        &without_it[..]
    } else {
        others
    };
    let partitions = Partitions::load(&store.partitions_path())?;
    for g in &workload.gpus {
        if let Some(device) = devices.iter().find(|d| d.uuid == g.uuid) {
            admission::check_not_blocked(device, damaged)
                .and_then(|()| admission::check_fits(device, g.mem_bytes, others, &partitions.partitions))
                .map_err(anyhow::Error::msg)?;
        }
    }
    Ok(())
}

/// What `vgpu run` says, once, of a host limit its cgroup cannot enforce (no such
/// controller there): the workload runs without it, rather than being refused (the limit
/// cannot be had on this host at all) or run as if it were enforced. Seen first on a real
/// cgroup v2 tree without controllers, where `--memory` failed the run.
fn unenforceable(limits: &Limits, controller: vgpu_cgroups::Controller, mode: vgpu_cgroups::Mode, cgroup: &Cgroup, w: &Workload) -> String {
    let option = match controller {
        vgpu_cgroups::Controller::Cpu => format!("--cpus {}", limits.cpus.unwrap_or_default()),
        vgpu_cgroups::Controller::Memory => format!("--memory {}", vgpu_abi::size::format_size(limits.memory.unwrap_or_default())),
        vgpu_cgroups::Controller::Pids => format!("--pids {}", limits.pids.unwrap_or_default()),
        other => other.name().to_string(),
    };
    let at = cgroup.paths().first().map(|p| format!(" at {}", p.display())).unwrap_or_default();
    format!(
        "{option} is not enforced: this host's cgroups have no {controller} controller{at} ({}); {} ({}) runs without that limit",
        match mode {
            vgpu_cgroups::Mode::V2 => "not in cgroup.controllers: enable it in the root's cgroup.subtree_control, or the kernel binds it to a v1 hierarchy",
            _ => "no v1 hierarchy of it is mounted",
        },
        w.name,
        w.id
    )
}

/// Create the vGPU, the cgroup and the record, in the order reconcile relies on: the start
/// intent first (if this process dies before the record exists, reconcile removes the
/// cgroup: `recovery.rs`), the record last.
fn create(store: &Store, layout: &Layout, tx: &mut Admission, workload: &Workload, tenant: Tenant, limits: &Limits, turn_max_us: u32) -> Result<Cgroup> {
    tx.wrote_intent(intent::begin(store, intent::Op::Start, &[&workload.id])?);
    let vgpu_dir = store.vgpu_dir(&workload.vgpu);
    if workload.partition.is_none() {
        tx.made_vgpu(vgpu_dir.clone());
    }
    if !workload.gpus.is_empty() {
        super::ensure_vgpu(store, &vgpu_dir, workload, tenant, turn_max_us)?;
    }
    // Inside the systemd unit or scope vgpu runs in when it delegates its subtree (home.rs).
    let layout = layout.within(&workload.cgroup_home).context("the workload's cgroup home")?;
    let cgroup = Cgroup::create(&layout, &workload.cgroup).context("creating the workload's cgroup")?;
    tx.made_cgroup(&cgroup);
    let (enforceable, missing) = cgroup.enforceable(limits).context("reading the cgroup's controllers")?;
    for controller in missing {
        tracing::warn!("{}", unenforceable(limits, controller, layout.mode, &cgroup, workload));
    }
    cgroup.apply(&enforceable).context("setting cgroup limits")?;
    vgpu_store::stop_point::stop_point("run:cgroup-created");
    store.write_workload(workload)?;
    tx.wrote_record();
    Ok(cgroup)
}
