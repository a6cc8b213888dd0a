//! `vgpu partition create|list|update|remove`: persistent named vGPUs.

use anyhow::{Context as _, Result};
use clap::{Args, Subcommand};
use serde::Serialize;
use vgpu_abi::size::format_size;

use vgpu_store::admission;

use vgpu_store::admission::AdmissionGpu;

use vgpu_store::admission::MemSpec;
use vgpu_store::compute::ComputePolicy;
use vgpu_store::compute::LiveChange;
use vgpu_host::context::Context;
use vgpu_store::error::UsageError;
use vgpu_json::WorkloadRef;
use crate::output::print_json;
use crate::output::table;
use vgpu_store::state::partition::valid_name;
use vgpu_store::state::Partition;
use vgpu_store::state::Partitions;
use vgpu_store::state::Store;

#[derive(Debug, Args)]
pub struct PartitionArgs {
    #[command(subcommand)]
    pub command: PartitionCommand,
}

#[derive(Debug, Subcommand)]
pub enum PartitionCommand {
    /// Define a partition: a slice of one GPU that workloads share with --partition NAME
    Create(CreateArgs),
    /// List partitions
    List(crate::args::JsonArgs),
    /// Change a partition's memory, compute share or policy, live for the workloads running in it
    Update(UpdateArgs),
    /// Remove a partition (refused while a workload uses it)
    Remove(RemoveArgs),
}

/// `partition create`'s help heading for who may use the partition.
const ACCESS: &str = "Access";

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Partition name (letters, digits, '-', '_', '.')
    pub name: String,
    /// The GPU, by index or UUID (one GPU per partition)
    #[arg(long, value_name = "INDEX|UUID", help_heading = crate::commands::run::GPU_SLICE)]
    pub gpu: String,
    /// GPU device memory (not host RAM): 4G, 512M, 1.5G (with its unit, at least 16M) or NN% of the device
    #[arg(long, value_name = "SIZE|PCT%", allow_hyphen_values = true, help_heading = crate::commands::run::GPU_SLICE)]
    pub mem: String,
    /// Share of the GPU's busy time, percent (1-100), for all the partition's workloads together
    #[arg(long, value_name = "PCT", default_value_t = 100, value_parser = crate::args::compute_pct, allow_negative_numbers = true, help_heading = crate::commands::run::GPU_SLICE)]
    pub compute: u32,
    /// How the compute share is applied: strict or fair [default: the config's [compute] policy, else strict]
    #[arg(long, value_name = "POLICY", value_enum, help_heading = crate::commands::run::GPU_SLICE)]
    pub compute_policy: Option<ComputePolicy>,
    /// Allow the GPU's memory to be over-committed; through sudo, only if the config's [policy] grants it
    #[arg(long, help_heading = crate::commands::run::GPU_SLICE)]
    pub oversubscribe: bool,
    /// The user whose workloads may use it (and write its counters) [default: root only]
    #[arg(long, value_name = "USER", conflicts_with = "group", help_heading = ACCESS)]
    pub user: Option<String>,
    /// The group whose members' workloads may use it
    #[arg(long, value_name = "GROUP", help_heading = ACCESS)]
    pub group: Option<String>,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("change").args(["mem", "compute", "compute_policy"]).required(true).multiple(true)))]
pub struct UpdateArgs {
    /// Partition name
    #[arg(add = crate::args::partition_candidates())]
    pub name: String,
    /// New GPU device memory (not host RAM): 4G, 512M, 1.5G (with its unit, at least 16M) or NN% of the device (a raise must fit beside the others; a cut must leave what its workloads use)
    #[arg(long, value_name = "SIZE|PCT%", allow_hyphen_values = true)]
    pub mem: Option<String>,
    /// New share of the GPU's compute, percent (1-100)
    #[arg(long, value_name = "PCT", value_parser = crate::args::compute_pct, allow_negative_numbers = true)]
    pub compute: Option<u32>,
    /// New policy: strict or fair
    #[arg(long, value_name = "POLICY", value_enum)]
    pub compute_policy: Option<ComputePolicy>,
    /// Print what changed as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct RemoveArgs {
    /// Partition name
    #[arg(add = crate::args::partition_candidates())]
    pub name: String,
}

pub fn run(ctx: &Context, args: &PartitionArgs) -> Result<()> {
    match &args.command {
        PartitionCommand::Create(a) => create(ctx, a),
        PartitionCommand::List(a) => list(ctx, a.json),
        PartitionCommand::Update(a) => update(ctx, a),
        PartitionCommand::Remove(a) => remove(ctx, a),
    }
}

fn create(ctx: &Context, args: &CreateArgs) -> Result<()> {
    if !valid_name(&args.name) {
        vgpu_store::usage!("invalid partition name {:?}: use letters, digits, '-', '_' and '.' (at most 64)", args.name);
    }
    let mem = MemSpec::parse(&args.mem).map_err(|e| UsageError::new(format!("--mem: {e}")))?;
    let sudo_uid = std::env::var("SUDO_UID").ok();
    let caller = vgpu_store::identity::sudo_caller(sudo_uid.as_deref()).map_err(|e| UsageError::new(e.to_string()))?;
    if args.oversubscribe {
        vgpu_host::policy::check_oversubscribe(&ctx.config.policy, caller.as_ref()).map_err(|e| UsageError::new(e.to_string()))?;
    }
    let Some(gpus) = ctx.gpu_identities()? else {
        anyhow::bail!("no NVIDIA driver found (libnvidia-ml.so.1); use --simulate to try vgpu without a GPU");
    };
    let devices: Vec<AdmissionGpu> = gpus
        .into_iter()
        .map(|g| AdmissionGpu { index: g.index, uuid: g.uuid, name: g.name, memory: g.memory_total })
        .collect();
    let device = admission::find_device(&devices, &args.gpu).map_err(|e| UsageError::new(format!("--gpu: {e}")))?;
    // Through sudo, within the caller's [policy] max_mem.
    let cap = vgpu_host::policy::mem_cap(&ctx.config.policy, caller.as_ref());
    let bytes = vgpu_host::policy::MemCap::slice(cap.as_ref(), Some(mem), 0, device.index, device.memory).map_err(|e| UsageError::new(e.to_string()))?;
    vgpu_store::access::check_partition_owner(args.user.as_deref(), args.group.as_deref()).map_err(|e| UsageError::new(e.to_string()))?;

    let store = Store::new(&ctx.state_dir, &ctx.lib_dir);
    let lock = store.lock()?;
    vgpu_host::lifecycle::reconcile_store(&store, &lock);
    let mut parts = Partitions::load(&store.partitions_path())?;
    if parts.get(&args.name).is_some() {
        vgpu_store::usage!("partition {:?} already exists", args.name);
    }
    let (workloads, damaged) = store.workloads();
    if !args.oversubscribe {
        // A damaged record's reservation is unknown: its GPUs admit nothing more.
        admission::check_not_blocked(device, &vgpu_store::state::damaged::damaged_records(&damaged))
            .and_then(|()| admission::check_fits(device, bytes, &workloads, &parts.partitions))
            .map_err(anyhow::Error::msg)?;
    }
    parts.partitions.push(Partition {
        name: args.name.clone(),
        gpu_index: device.index,
        gpu_uuid: device.uuid.clone(),
        mem_bytes: bytes,
        compute_pct: args.compute,
        compute_policy: args.compute_policy.unwrap_or(ctx.config.compute.policy),
        created_unix_ms: vgpu_store::clock::now_ms(),
        user: args.user.clone(),
        group: args.group.clone(),
    });
    parts.save(&store.partitions_path())?;
    let policy = args.compute_policy.unwrap_or(ctx.config.compute.policy);
    println!("created partition {}: {} of GPU {} ({}), compute {}% {policy}", args.name, format_size(bytes), device.index, device.name, args.compute);
    Ok(())
}

/// One partition as `partition list --json` prints it (not its on-disk form).
#[derive(Serialize)]
struct Listed<'a> {
    name: &'a str,
    gpu_index: u32,
    gpu_uuid: &'a str,
    memory_quota_bytes: u64,
    compute_pct: u32,
    compute_policy: ComputePolicy,
    created_unix_ms: u64,
    /// Who may use it: a user, or a group's members; both null: root only.
    user: Option<&'a str>,
    group: Option<&'a str>,
    /// The workloads running in it.
    workloads: Vec<WorkloadRef>,
    #[serde(skip)]
    partition: &'a Partition,
}

#[derive(Serialize)]
struct ListedAll<'a> {
    partitions: &'a [Listed<'a>],
}

fn list(ctx: &Context, json: bool) -> Result<()> {
    let store = Store::new(&ctx.state_dir, &ctx.lib_dir);
    let parts = Partitions::load(&store.partitions_path())?;
    let (workloads, _) = store.workloads();
    let listed: Vec<Listed> = parts
        .partitions
        .iter()
        .map(|p| Listed {
            name: &p.name,
            gpu_index: p.gpu_index,
            gpu_uuid: &p.gpu_uuid,
            memory_quota_bytes: p.mem_bytes,
            compute_pct: p.compute_pct,
            compute_policy: p.compute_policy,
            created_unix_ms: p.created_unix_ms,
            user: p.user.as_deref(),
            group: p.group.as_deref(),
            workloads: workloads
                .iter()
                .filter(|w| w.partition.as_deref() == Some(p.name.as_str()))
                .map(|w| WorkloadRef { id: w.id.clone(), name: w.name.clone() })
                .collect(),
            partition: p,
        })
        .collect();
    if json {
        return print_json(&ListedAll { partitions: &listed });
    }
    if listed.is_empty() {
        println!("No partitions.");
        return Ok(());
    }
    let mut t = table(["NAME", "GPU", "UUID", "MEMORY", "COMPUTE", "FOR", "WORKLOADS"]);
    for l in &listed {
        let p = l.partition;
        t.add_row([
            p.name.clone(),
            p.gpu_index.to_string(),
            p.gpu_uuid.clone(),
            format_size(p.mem_bytes),
            format!("{}% {}", p.compute_pct, p.compute_policy),
            match (&p.user, &p.group) {
                (Some(user), _) => user.clone(),
                (None, Some(group)) => format!("%{group}"),
                (None, None) => "root".into(),
            },
            if l.workloads.is_empty() { "—".into() } else { l.workloads.iter().map(|w| w.id.as_str()).collect::<Vec<_>>().join(", ") },
        ]);
    }
    println!("{t}");
    Ok(())
}

/// What `partition update --json` prints.
#[derive(Serialize)]
struct Updated {
    name: String,
    #[serde(rename = "memory_quota_bytes")]
    mem_bytes: u64,
    #[serde(rename = "previous_memory_quota_bytes")]
    previous_mem_bytes: u64,
    compute_pct: u32,
    previous_compute_pct: u32,
    compute_policy: ComputePolicy,
    previous_compute_policy: ComputePolicy,
    /// Whether the partition's vGPU exists (it has been used), so the change took effect live.
    live: bool,
    /// The workloads running in it now.
    workloads: Vec<WorkloadRef>,
}

fn update(ctx: &Context, args: &UpdateArgs) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        anyhow::bail!("vgpu partition update must run as root (through sudo): it changes the limits of running workloads");
    }
    let mem = args.mem.as_deref().map(MemSpec::parse).transpose().map_err(|e| UsageError::new(format!("--mem: {e}")))?;
    let devices = match mem {
        Some(_) => crate::commands::update::admission_devices(ctx)?,
        None => Vec::new(),
    };
    let store = Store::new(&ctx.state_dir, &ctx.lib_dir);
    let lock = store.lock()?;
    vgpu_host::lifecycle::reconcile_store(&store, &lock);
    let mut parts = Partitions::load(&store.partitions_path())?;
    let Some(pos) = parts.partitions.iter().position(|p| p.name == args.name) else {
        vgpu_store::usage!("no partition {:?} (see `vgpu partition list`)", args.name);
    };
    let before = parts.partitions[pos].clone();
    // Open the live file first: a damaged one stops the update before anything changed.
    let usage_path = store.vgpu_dir(&before.vgpu_id()).join(vgpu_abi::layout::USAGE_FILE);
    let usage = if usage_path.exists() {
        Some(vgpu_abi::usage::UsageFile::open(&usage_path).with_context(|| format!("partition {:?}", args.name))?)
    } else {
        None
    };
    if let Some(usage) = &usage {
        if !usage.limits_writable() {
            anyhow::bail!("{}: only root can change a vGPU's limits", usage.path().display());
        }
    }
    let (workloads, damaged) = store.workloads();
    // A raise goes through admission beside every other reservation on the GPU; a cut must
    // leave what the partition's workloads use. Checked before anything is written.
    let quota = match mem {
        Some(spec) => {
            let damaged = vgpu_store::state::damaged::damaged_records(&damaged);
            Some(vgpu_store::resize::plan_partition(&before, spec, &devices, &workloads, &parts.partitions, &damaged, usage.as_ref()).map_err(vgpu_store::resize::ResizeError::into_cli)?)
        }
        None => None,
    };
    let quotas: Vec<vgpu_store::resize::QuotaChange> = quota.into_iter().collect();
    // partitions.json never reserves less than the limits file allows (crash safety without
    // an intent): a raise is saved first, a cut after the limits file took it.
    if let Some(q) = quotas.first().filter(|q| q.mem_bytes > q.previous_mem_bytes) {
        let mut raised = parts.clone();
        raised.partitions[pos].mem_bytes = q.mem_bytes;
        raised.save(&store.partitions_path())?;
    }
    if let Some(usage) = &usage {
        if let Err(e) = vgpu_store::resize::apply(&format!("partition {}", before.name), usage, &quotas) {
            if quotas.iter().any(|q| q.mem_bytes > q.previous_mem_bytes) {
                if let Err(undo) = parts.save(&store.partitions_path()) {
                    tracing::warn!("could not put back partition {}'s memory in partitions.json: {undo}", before.name);
                }
            }
            return Err(e.into_cli());
        }
    }
    let after = {
        let p = &mut parts.partitions[pos];
        p.compute_pct = args.compute.unwrap_or(p.compute_pct);
        p.compute_policy = args.compute_policy.unwrap_or(p.compute_policy);
        if let Some(q) = quotas.first() {
            p.mem_bytes = q.mem_bytes;
        }
        p.clone()
    };
    if let Err(e) = parts.save(&store.partitions_path()) {
        if let Some(usage) = &usage {
            vgpu_store::resize::undo(usage, &quotas);
        }
        return Err(e.into());
    }
    if let Some(usage) = &usage {
        if args.compute.is_some() || args.compute_policy.is_some() {
            vgpu_store::compute::apply_live(usage, None, LiveChange { compute_pct: args.compute, policy: args.compute_policy })?;
        }
    }
    let mut ids = Vec::new();
    for mut w in workloads.into_iter().filter(|w| w.partition.as_deref() == Some(args.name.as_str())) {
        for g in &mut w.gpus {
            g.compute_pct = after.compute_pct;
            g.mem_bytes = after.mem_bytes;
        }
        w.compute_policy = after.compute_policy;
        store.write_workload(&w)?;
        ids.push(WorkloadRef { id: w.id, name: w.name });
    }
    drop(lock);
    let updated = Updated {
        name: after.name.clone(),
        mem_bytes: after.mem_bytes,
        previous_mem_bytes: before.mem_bytes,
        compute_pct: after.compute_pct,
        previous_compute_pct: before.compute_pct,
        compute_policy: after.compute_policy,
        previous_compute_policy: before.compute_policy,
        live: usage.is_some(),
        workloads: ids,
    };
    if args.json {
        return print_json(&updated);
    }
    let mut changes = Vec::new();
    if mem.is_some() {
        changes.push(format!("memory on GPU {} {} → {}", after.gpu_index, format_size(updated.previous_mem_bytes), format_size(updated.mem_bytes)));
    }
    if args.compute.is_some() || args.compute_policy.is_some() {
        changes.push(format!(
            "compute {}% {} (was {}% {})",
            updated.compute_pct, updated.compute_policy, updated.previous_compute_pct, updated.previous_compute_policy
        ));
    }
    println!(
        "updated partition {}: {}{}",
        updated.name,
        changes.join("; "),
        match updated.workloads.len() {
            0 => String::new(),
            n => format!("; {n} running workload(s) follow at their next allocation or launch"),
        }
    );
    Ok(())
}

fn remove(ctx: &Context, args: &RemoveArgs) -> Result<()> {
    let store = Store::new(&ctx.state_dir, &ctx.lib_dir);
    let lock = store.lock()?;
    vgpu_host::lifecycle::reconcile_store(&store, &lock);
    let mut parts = Partitions::load(&store.partitions_path())?;
    let Some(pos) = parts.partitions.iter().position(|p| p.name == args.name) else {
        vgpu_store::usage!("no partition {:?} (see `vgpu partition list`)", args.name);
    };
    let (workloads, _) = store.workloads();
    let users: Vec<String> = workloads.iter().filter(|w| w.partition.as_deref() == Some(args.name.as_str())).map(|w| format!("{} ({})", w.name, w.id)).collect();
    if !users.is_empty() {
        anyhow::bail!("partition {:?} is in use by {}", args.name, users.join(", "));
    }
    let removed = parts.partitions.remove(pos);
    parts.save(&store.partitions_path())?;
    vgpu_abi::board::release_vgpu(&store.vgpu_dir(&removed.vgpu_id()));
    let _ = std::fs::remove_dir_all(store.vgpu_dir(&removed.vgpu_id()));
    println!("removed partition {}", args.name);
    Ok(())
}
