//! `vgpu update ID… [--mem SIZE|PCT%] [--compute PCT] [--compute-policy POLICY]
//! [--priority P]`: change running workloads' limits live.
//!
//! Under the store lock, every workload named is checked and its vGPU's usage file opened
//! before anything is written, so a bad ID, a damaged file or a refused GPU changes
//! nothing: a memory raise goes through admission, a cut below what is in use is refused
//! (`crate::resize`). Then the quotas are written into the vGPU's limits file (read by the
//! shim at every allocation and memory query), the share, policy and priority beside them
//! (re-read on every launch), and everything into the workload's record, where `vgpu ps`
//! shows it; a pool allocation takes the new priority and the pool settles.

use anyhow::{Context as _, Result};
use clap::Args;
use serde::Serialize;
use vgpu_abi::layout::USAGE_FILE;
use vgpu_abi::size::format_size;
use vgpu_abi::usage::UsageFile;

use crate::admission::{AdmissionGpu, MemSpec};
use crate::compute::{ComputePolicy, LiveChange};
use crate::context::Context;
use crate::error::UsageError;
use crate::output::print_json;
use crate::pool::Priority;
use crate::resize::{self, QuotaChange, ResizeError};
use crate::state::{Partitions, Store, Workload, WorkloadState};

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("change").args(["mem", "compute", "compute_policy", "priority"]).required(true).multiple(true)))]
pub struct UpdateArgs {
    /// Workloads, by id (a unique prefix is enough) or name
    #[arg(required = true, value_name = "ID")]
    pub ids: Vec<String>,
    /// New device memory on each of its GPUs: 4G, 512M, 1.5G or NN% of the device (a raise must fit beside the others; a cut must leave what is in use)
    #[arg(long, value_name = "SIZE|PCT%", allow_hyphen_values = true)]
    pub mem: Option<String>,
    /// New share of each of its GPUs' compute, percent (1-100)
    #[arg(long, value_name = "PCT", value_parser = clap::value_parser!(u32).range(1..=100), allow_negative_numbers = true)]
    pub compute: Option<u32>,
    /// New policy: strict (never above the share) or fair (a floor; idle GPU time is shared out)
    #[arg(long, value_name = "POLICY", value_enum)]
    pub compute_policy: Option<ComputePolicy>,
    /// New priority, 0-100 (higher is served first and may preempt in the pool); through sudo, at most the config's [policy] max_priority
    #[arg(long, value_name = "P", allow_hyphen_values = true)]
    pub priority: Option<String>,
    /// Print what changed as JSON
    #[arg(long)]
    pub json: bool,
}

/// One workload's change, as `--json` prints it.
#[derive(Debug, Serialize)]
struct Updated {
    id: String,
    name: String,
    compute_policy: ComputePolicy,
    previous_compute_policy: ComputePolicy,
    priority: i32,
    previous_priority: i32,
    gpus: Vec<UpdatedGpu>,
}

#[derive(Debug, Serialize)]
struct UpdatedGpu {
    index: u32,
    uuid: String,
    compute_pct: u32,
    previous_compute_pct: u32,
    mem_bytes: u64,
    previous_mem_bytes: u64,
}

/// A workload to change, checked: its open usage file and its planned quota changes.
struct Target {
    workload: Workload,
    /// None for a waiting workload (only its priority changes).
    usage: Option<UsageFile>,
    quotas: Vec<QuotaChange>,
}

pub fn run(ctx: &Context, args: &UpdateArgs) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        anyhow::bail!("vgpu update must run as root (through sudo): it changes the limits of running workloads");
    }
    let mem = args.mem.as_deref().map(MemSpec::parse).transpose().map_err(|e| UsageError::new(format!("--mem: {e}")))?;
    let priority = match args.priority.as_deref() {
        None => None,
        Some(text) => {
            let asked = text.parse::<Priority>().map_err(crate::pool_effects::pool_error)?;
            // Through sudo, only as high as [policy] grants the caller, as for `vgpu run`.
            let sudo_uid = std::env::var("SUDO_UID").ok();
            let caller = crate::identity::sudo_caller(sudo_uid.as_deref()).map_err(|e| UsageError::new(e.to_string()))?;
            Some(crate::policy::check_run(&ctx.config.policy, caller.as_ref(), Some(asked), false).map_err(|e| UsageError::new(e.to_string()))?)
        }
    };
    let devices = match mem {
        Some(_) => admission_devices(ctx)?,
        None => Vec::new(),
    };
    let store = Store::new(&ctx.state_dir, &ctx.lib_dir);
    let lock = store.lock()?;
    crate::lifecycle::reconcile_store(&store, &lock);
    let (workloads, damaged) = store.workloads();
    let damaged = crate::state::damaged::damaged_records(&damaged);
    let partitions = match mem {
        Some(_) => Partitions::load(&store.partitions_path())?.partitions,
        None => Vec::new(),
    };

    // Check everything and open every usage file first: nothing is written unless all can be.
    // `view` is the workloads as they will be, so two raises on one GPU are admitted together.
    let mut view = workloads.clone();
    let mut targets: Vec<Target> = Vec::new();
    for query in &args.ids {
        let w = crate::lifecycle::find(&workloads, query)?;
        if targets.iter().any(|t| t.workload.id == w.id) {
            continue;
        }
        if let Some(p) = &w.partition {
            crate::usage!(
                "{} ({}) runs in partition {p:?}, whose workloads share its memory, compute and priority: use `vgpu partition update {p} …`",
                w.name,
                w.id
            );
        }
        if args.compute.is_some() && w.pool_blocks.is_some() {
            crate::usage!(
                "{} ({}) holds compute pool blocks: its share is its blocks on each GPU (--tflops); only --compute-policy can change",
                w.name,
                w.id
            );
        }
        let limits_only = mem.is_none() && args.compute.is_none() && args.compute_policy.is_none();
        if w.state == WorkloadState::Waiting || w.gpus.is_empty() {
            // A waiting workload has no vGPU yet: only its priority (its place in the pool's queue) can change.
            if !limits_only {
                crate::usage!("{} ({}) has no GPU yet (it is {}): update it once it runs", w.name, w.id, w.state.as_str());
            }
            targets.push(Target { workload: w.clone(), usage: None, quotas: Vec::new() });
            continue;
        }
        let path = store.vgpu_dir(&w.vgpu).join(USAGE_FILE);
        let usage = UsageFile::open(&path).with_context(|| format!("workload {} ({})", w.name, w.id))?;
        for g in &w.gpus {
            if usage.find_device_str(&g.uuid).is_none() {
                anyhow::bail!("workload {} ({}): {} has no device {}", w.name, w.id, path.display(), g.uuid);
            }
        }
        if !usage.limits_writable() {
            anyhow::bail!("{}: only root can change a vGPU's limits", path.display());
        }
        let quotas = match mem {
            Some(spec) => resize::plan_workload(w, spec, &devices, &view, &partitions, &damaged, &usage).map_err(ResizeError::into_cli)?,
            None => Vec::new(),
        };
        if let Some(planned) = view.iter_mut().find(|o| o.id == w.id) {
            for (g, q) in planned.gpus.iter_mut().zip(&quotas) {
                g.mem_bytes = q.mem_bytes;
            }
        }
        targets.push(Target { workload: w.clone(), usage: Some(usage), quotas });
    }

    // Crash safety without an intent: a record never reserves less than its limits file
    // allows. So a raise is recorded first (the larger of the two quotas per GPU), then
    // the quotas are written, all or none (a cut that a reservation overtook undoes them
    // all, and the records go back), then the records get their final figures below.
    let mut raised: Vec<&Workload> = Vec::new();
    let mut result = Ok(());
    for t in targets.iter().filter(|t| t.quotas.iter().any(|q| q.mem_bytes > q.previous_mem_bytes)) {
        let mut w = t.workload.clone();
        for g in &mut w.gpus {
            if let Some(q) = t.quotas.iter().find(|q| q.uuid == g.uuid) {
                g.mem_bytes = q.mem_bytes.max(q.previous_mem_bytes);
            }
        }
        result = store.write_workload(&w).map_err(anyhow::Error::from);
        if result.is_err() {
            break;
        }
        raised.push(&t.workload);
    }
    if result.is_ok() {
        for (n, t) in targets.iter().enumerate() {
            let Some(usage) = &t.usage else { continue };
            if let Err(e) = resize::apply(&resize::workload_name(&t.workload), usage, &t.quotas) {
                for done in &targets[..n] {
                    if let Some(u) = &done.usage {
                        resize::undo(u, &done.quotas);
                    }
                }
                result = Err(e.into_cli());
                break;
            }
        }
    }
    if let Err(e) = result {
        for w in raised {
            if let Err(undo) = store.write_workload(w) {
                tracing::warn!("could not put back the record of {}: {undo}", resize::workload_name(w));
            }
        }
        return Err(e);
    }

    let change = LiveChange { compute_pct: args.compute, policy: args.compute_policy };
    let mut pool_changed = false;
    let mut out = Vec::new();
    for Target { workload: mut w, usage, quotas } in targets {
        let before = w.clone();
        let uuids: Vec<&str> = before.gpus.iter().map(|g| g.uuid.as_str()).collect();
        if let Some(usage) = &usage {
            if change.compute_pct.is_some() || change.policy.is_some() {
                crate::compute::apply_live(usage, Some(&uuids), change)?;
            }
            if let Some(p) = priority {
                for uuid in &uuids {
                    if let Some(i) = usage.find_device_str(uuid) {
                        usage.set_priority(i, crate::compute::abi_priority(p.get())).with_context(|| format!("{}", usage.path().display()))?;
                    }
                }
            }
        }
        if let Some(p) = priority {
            w.priority = p.get();
            // A pool workload holds blocks, or waits for them (no blocks recorded yet).
            if w.pool_blocks.is_some() || w.state == WorkloadState::Waiting {
                pool_changed |= set_pool_priority(&store, &w.id, p)?;
            }
        }
        for g in &mut w.gpus {
            if let Some(pct) = args.compute {
                g.compute_pct = pct;
            }
            if let Some(q) = quotas.iter().find(|q| q.uuid == g.uuid) {
                g.mem_bytes = q.mem_bytes;
            }
        }
        w.compute_policy = args.compute_policy.unwrap_or(w.compute_policy);
        store.write_workload(&w)?;
        out.push(Updated {
            id: w.id.clone(),
            name: w.name.clone(),
            compute_policy: w.compute_policy,
            previous_compute_policy: before.compute_policy,
            priority: w.priority,
            previous_priority: before.priority,
            gpus: w
                .gpus
                .iter()
                .zip(&before.gpus)
                .map(|(g, b)| UpdatedGpu {
                    index: g.index,
                    uuid: g.uuid.clone(),
                    compute_pct: g.compute_pct,
                    previous_compute_pct: b.compute_pct,
                    mem_bytes: g.mem_bytes,
                    previous_mem_bytes: b.mem_bytes,
                })
                .collect(),
        });
    }
    if pool_changed {
        // A new priority may preempt, or be preempted, like a new request.
        crate::pool_effects::settle(&store, &lock)?;
    }
    drop(lock);

    if args.json {
        return print_json(&out);
    }
    for u in &out {
        let mut parts = Vec::new();
        if mem.is_some() {
            parts.extend(u.gpus.iter().map(|g| {
                format!("memory on GPU {} {} → {}", g.index, format_size(g.previous_mem_bytes), format_size(g.mem_bytes))
            }));
        }
        if args.compute.is_some() || args.compute_policy.is_some() {
            let shares = |f: fn(&UpdatedGpu) -> u32| u.gpus.iter().map(|g| format!("{}%", f(g))).collect::<Vec<_>>().join(",");
            parts.push(format!(
                "compute {} {} (was {} {})",
                shares(|g| g.compute_pct),
                u.compute_policy,
                shares(|g| g.previous_compute_pct),
                u.previous_compute_policy
            ));
        }
        if priority.is_some() {
            parts.push(format!("priority {} → {}", u.previous_priority, u.priority));
        }
        println!("updated {} ({}): {}", u.name, u.id, parts.join("; "));
    }
    Ok(())
}

/// The GPUs as admission sees them (NVML).
pub(crate) fn admission_devices(ctx: &Context) -> Result<Vec<AdmissionGpu>> {
    let Some(nvml) = ctx.nvml()? else {
        anyhow::bail!("no NVIDIA driver found (libnvidia-ml.so.1); use --simulate to try vgpu without a GPU");
    };
    Ok(nvml
        .inventory()?
        .into_iter()
        .map(|g| AdmissionGpu { index: g.index, uuid: g.uuid, name: g.name, memory: g.memory_total })
        .collect())
}

/// Give workload `id`'s pool allocation the new priority; whether it has one.
fn set_pool_priority(store: &Store, id: &str, priority: Priority) -> Result<bool> {
    let Some(mut pool) = crate::pool_effects::load(store)? else { return Ok(false) };
    if !pool.set_priority(id, priority) {
        return Ok(false);
    }
    crate::pool_effects::save(store, &pool)?;
    Ok(true)
}
