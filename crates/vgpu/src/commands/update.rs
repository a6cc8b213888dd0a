//! `vgpu update ID… [--mem SIZE|PCT%] [--compute PCT] [--compute-policy POLICY]
//! [--turn DURATION] [--priority P] [--tflops N] [--wait[=DURATION]]`: change running workloads' limits live.
//!
//! Under the store lock, every workload named is checked and its vGPU's usage file opened
//! before anything is written, so a bad ID, a damaged file or a refused GPU changes
//! nothing: a memory raise goes through admission, a cut below what is in use is refused
//! (`vgpu_store::resize`). Then the quotas are written into the vGPU's limits file (read by the
//! shim at every allocation and memory query), the share, policy and priority beside them
//! (re-read on every launch), and everything into the workload's record, where `vgpu ps`
//! shows it; a pool allocation takes the new priority and the pool settles.
//!
//! `--tflops` resizes a pool workload's blocks on the devices it runs on
//! ([`vgpu_pool::Pool::resize`]), planned with the other checks, so memory is decided
//! before anyone is frozen; the plan is then carried out like a request's (preempting or
//! settling), and its new compute share per GPU (its blocks there / the GPU's blocks) is
//! written live. With `--wait`, a change that the host refuses for now (a cut below what is
//! in use, a raise that does not fit, blocks held by others) is tried again, each try a
//! whole one under the store lock, until it can be made.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use clap::Args;
use serde::Serialize;
use vgpu_abi::layout::USAGE_FILE;
use vgpu_abi::size::format_size;
use vgpu_abi::usage::UsageFile;

use vgpu_store::admission::AdmissionGpu;

use vgpu_store::admission::MemSpec;
use vgpu_store::compute::ComputePolicy;
use vgpu_store::compute::LiveChange;
use vgpu_host::context::Context;
use vgpu_store::error::UsageError;
use crate::output::print_json;
use vgpu_pool::Plan;
use vgpu_pool::Pool;
use vgpu_pool::PoolError;
use vgpu_pool::Priority;
use vgpu_host::pool_effects::pool_error;
use vgpu_store::resize;
use vgpu_store::resize::QuotaChange;
use vgpu_store::resize::ResizeError;
use vgpu_store::state::Partitions;
use vgpu_store::state::Store;
use vgpu_store::state::Workload;
use vgpu_store::state::WorkloadState;

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("change").args(["mem", "compute", "compute_policy", "turn", "priority", "tflops"]).required(true).multiple(true)))]
pub struct UpdateArgs {
    /// Workloads, by id (a unique prefix is enough) or name; through sudo, only ones that run as the caller
    #[arg(required = true, value_name = "ID", add = crate::args::workload_candidates())]
    pub ids: Vec<String>,
    /// New GPU device memory on each of its GPUs (not host RAM): 4G, 512M, 1.5G (with its unit, at least 16M) or NN% of the device (a raise must fit beside the others; a cut must leave what is in use)
    #[arg(long, value_name = "SIZE|PCT%", allow_hyphen_values = true, help_heading = crate::commands::run::GPU_SLICE)]
    pub mem: Option<String>,
    /// New share of each of its GPUs' compute, percent (1-100; 30 or 30%)
    #[arg(long, value_name = "PCT", value_parser = crate::args::compute_pct, allow_negative_numbers = true, help_heading = crate::commands::run::GPU_SLICE)]
    pub compute: Option<u32>,
    /// New policy: strict (never above the share) or fair (a floor; idle GPU time is shared out)
    #[arg(long, value_name = "POLICY", value_enum, help_heading = crate::commands::run::GPU_SLICE)]
    pub compute_policy: Option<ComputePolicy>,
    /// New longest turn on a GPU while a vGPU of higher priority is active there (1ms-15ms, as for `vgpu run --turn`; docs/turns.md)
    #[arg(long, value_name = "DURATION", value_parser = crate::commands::run::turn_bound, help_heading = crate::commands::run::GPU_SLICE)]
    pub turn: Option<u32>,
    /// New priority, 0-100 (higher is served first and may preempt in the pool); through sudo, at most the config's [policy] max_priority
    #[arg(long, value_name = "P", allow_hyphen_values = true, help_heading = crate::commands::run::COMPUTE_POOL)]
    pub priority: Option<String>,
    /// New compute from the pool, in TFLOPS (whole blocks), for a workload started with --tflops: more or fewer blocks on the GPUs it runs on; lower-priority work may be suspended for a raise
    #[arg(long, value_name = "N", allow_negative_numbers = true, conflicts_with = "compute", help_heading = crate::commands::run::COMPUTE_POOL)]
    pub tflops: Option<String>,
    /// Wait (up to DURATION, e.g. --wait=10m; default forever) until the change can be made instead of refusing: a memory cut below what is in use, a raise that does not fit, TFLOPS held by others
    #[arg(long, value_name = "DURATION", num_args = 0..=1, require_equals = true, default_missing_value = "forever")]
    pub wait: Option<String>,
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
    /// `--turn`: the longest turn beside a higher priority, µs (0: none), now and before.
    #[serde(skip_serializing_if = "Option::is_none")]
    turn_max_us: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    previous_turn_max_us: Option<u32>,
    /// Pool workloads: TFLOPS (and blocks) held, now and before.
    #[serde(skip_serializing_if = "Option::is_none")]
    tflops: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    previous_tflops: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    blocks: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    previous_blocks: Option<u64>,
    gpus: Vec<UpdatedGpu>,
    /// What the pool change did to others (suspended, resumed, started), for the line.
    #[serde(skip)]
    others: Vec<String>,
}

#[derive(Debug, Serialize)]
struct UpdatedGpu {
    #[serde(rename = "gpu_index")]
    index: u32,
    #[serde(rename = "gpu_uuid")]
    uuid: String,
    compute_pct: u32,
    previous_compute_pct: u32,
    #[serde(rename = "memory_quota_bytes")]
    mem_bytes: u64,
    #[serde(rename = "previous_memory_quota_bytes")]
    previous_mem_bytes: u64,
}

/// `update --json`: `{"schema": N, "workloads": [...]}`.
#[derive(Debug, Serialize)]
struct UpdatedAll<'a> {
    workloads: &'a [Updated],
}

/// A workload to change, checked: its open usage file and its planned quota changes.
struct Target {
    workload: Workload,
    /// None for a waiting workload (only its priority changes).
    usage: Option<UsageFile>,
    quotas: Vec<QuotaChange>,
}

/// What the command line asks, parsed and checked once, before any try.
struct Asked {
    mem: Option<MemSpec>,
    priority: Option<Priority>,
    /// `--tflops` in blocks, and the block size.
    blocks: Option<u64>,
    block_tflops: f64,
    /// `--wait`: None no; Some(None) forever; Some(Some(d)) up to d.
    wait: Option<Option<Duration>>,
    /// A sudo caller's `[policy] max_mem`: `--mem` above it is refused.
    mem_cap: Option<vgpu_host::policy::MemCap>,
}

pub fn run(ctx: &Context, args: &UpdateArgs) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        anyhow::bail!("vgpu update must run as root (through sudo): it changes the limits of running workloads");
    }
    let mem = args.mem.as_deref().map(MemSpec::parse).transpose().map_err(|e| UsageError::new(format!("--mem: {e}")))?;
    let sudo_uid = std::env::var("SUDO_UID").ok();
    let caller = vgpu_store::identity::sudo_caller(sudo_uid.as_deref()).map_err(|e| UsageError::new(e.to_string()))?;
    let mem_cap = vgpu_host::policy::mem_cap(&ctx.config.policy, caller.as_ref());
    let priority = match args.priority.as_deref() {
        None => None,
        Some(text) => {
            let asked = text.parse::<Priority>().map_err(pool_error)?;
            // Through sudo, only as high as [policy] grants the caller, as for `vgpu run`.
            Some(vgpu_host::policy::check_run(&ctx.config.policy, caller.as_ref(), Some(asked), false).map_err(|e| UsageError::new(e.to_string()))?)
        }
    };
    let block_tflops = ctx.config.pool.block_tflops;
    let blocks = match args.tflops.as_deref() {
        None => None,
        Some(text) => {
            let tflops = vgpu_pool::parse_tflops(text).map_err(pool_error)?;
            if args.ids.len() > 1 {
                vgpu_store::usage!("--tflops changes one workload at a time (its blocks, and whom they preempt, are its own)");
            }
            Some(vgpu_pool::blocks_for(tflops, block_tflops).map_err(pool_error)?)
        }
    };
    let wait = crate::commands::wait_limit(args.wait.as_deref())?;
    let asked = Asked { mem, priority, blocks, block_tflops, wait, mem_cap };
    let devices = match mem {
        Some(_) => admission_devices(ctx)?,
        None => Vec::new(),
    };
    let store = Store::new(&ctx.state_dir, &ctx.lib_dir);

    let out = match asked.wait {
        None => attempt(args, &asked, &store, &devices)?,
        Some(limit) => wait_until_done(args, &asked, &store, &devices, limit)?,
    };
    if args.json {
        return print_json(&UpdatedAll { workloads: &out });
    }
    for u in &out {
        println!("updated {} ({}): {}", u.name, u.id, describe(u, &asked, args));
    }
    Ok(())
}

/// `--wait`: try until the change is made, the store lock released between tries. A
/// refusal the host may lift (memory in use or held by others, blocks held by others) is
/// waited out; any other error ends it. SIGINT or SIGTERM while waiting ends it too, with
/// nothing changed (a try under way finishes first: it changes all or nothing).
fn wait_until_done(args: &UpdateArgs, asked: &Asked, store: &Store, devices: &[AdmissionGpu], limit: Option<Duration>) -> Result<Vec<Updated>> {
    const POLL: Duration = Duration::from_millis(200);
    let signalled = Arc::new(AtomicUsize::new(0));
    for sig in [libc::SIGINT, libc::SIGTERM] {
        signal_hook::flag::register_usize(sig, Arc::clone(&signalled), sig as usize).context("installing the signal handlers for --wait")?;
    }
    let interrupted = || -> Result<()> {
        let sig = signalled.load(Ordering::SeqCst);
        if sig == 0 {
            return Ok(());
        }
        vgpu_host::notice!("interrupted while waiting; nothing was changed");
        // Die of the signal, as without the handler (the caller sees how it ended).
        let sig = i32::try_from(sig).unwrap_or(libc::SIGTERM);
        signal_hook::low_level::emulate_default_handler(sig).context("re-raising the signal")?;
        anyhow::bail!("interrupted while waiting; nothing was changed")
    };
    let started = Instant::now();
    let mut announced = false;
    loop {
        interrupted()?;
        match attempt(args, asked, store, devices) {
            Ok(out) => return Ok(out),
            Err(e) => {
                let Some(reason) = wait_reason(&e) else {
                    return Err(e);
                };
                if !announced {
                    vgpu_host::notice!("waiting: {reason}…");
                    announced = true;
                }
                if let Some(limit) = limit {
                    if started.elapsed() >= limit {
                        anyhow::bail!("timed out after {} waiting ({reason}); nothing was changed", humantime::format_duration(limit));
                    }
                }
            }
        }
        let until = Instant::now() + POLL;
        while Instant::now() < until && signalled.load(Ordering::SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Why a refused try may succeed later (the line `--wait` prints), or None if it cannot.
fn wait_reason(e: &anyhow::Error) -> Option<String> {
    if let Some(r) = e.downcast_ref::<ResizeError>() {
        return match r {
            ResizeError::BelowUse { what, gpu, asked, used } => Some(format!(
                "{what}: {} in use on GPU {gpu}, above the new {}",
                format_size(*used),
                format_size(*asked)
            )),
            ResizeError::Refused { what, reason } => Some(format!("{what}: {reason}")),
            _ => None,
        };
    }
    match e.downcast_ref::<PoolError>() {
        Some(PoolError::NoRoom { requested, free, holders }) => {
            let held: Vec<String> = holders.iter().map(|h| format!("{} ({}, priority {}, {} blocks)", h.name, h.id, h.priority, h.blocks)).collect();
            let held = if held.is_empty() { String::new() } else { format!(", the rest held by {}", held.join(", ")) };
            Some(format!("{requested} more blocks, {free} free on its devices{held}"))
        }
        _ => None,
    }
}

/// One try, under the store lock: everything checked, then all of it done, or nothing.
fn attempt(args: &UpdateArgs, asked: &Asked, store: &Store, devices: &[AdmissionGpu]) -> Result<Vec<Updated>> {
    let Asked { mem, priority, blocks, block_tflops, .. } = *asked;
    let lock = store.lock()?;
    vgpu_host::lifecycle::reconcile_store(store, &lock);
    let (workloads, damaged) = store.workloads();
    let damaged = vgpu_store::state::damaged::damaged_records(&damaged);
    let partitions = match mem {
        Some(_) => Partitions::load(&store.partitions_path())?.partitions,
        None => Vec::new(),
    };

    // Check everything and open every usage file first: nothing is written unless all can be.
    // `view` is the workloads as they will be, so two raises on one GPU are admitted together.
    let mut view = workloads.clone();
    let mut targets: Vec<Target> = Vec::new();
    for query in &args.ids {
        let w = vgpu_host::lifecycle::find(&workloads, query)?;
        if targets.iter().any(|t| t.workload.id == w.id) {
            continue;
        }
        // Through sudo, the caller's own workloads only; checked before anything is written.
        crate::commands::check_owned(&[w], "update")?;
        if let Some(spec) = mem {
            for g in &w.gpus {
                vgpu_host::policy::MemCap::slice(asked.mem_cap.as_ref(), Some(spec), g.mem_bytes, g.index, g.device_bytes)
                    .map_err(|e| UsageError::new(e.to_string()))?;
            }
        }
        if let Some(p) = &w.partition {
            vgpu_store::usage!(
                "{} ({}) runs in partition {p:?}, whose workloads share its memory, compute and priority: use `vgpu partition update {p} …`",
                w.name,
                w.id
            );
        }
        if args.compute.is_some() && w.pool_blocks.is_some() {
            vgpu_store::usage!(
                "{} ({}) holds compute pool blocks: its share is its blocks on each GPU (--tflops); only --compute-policy can change",
                w.name,
                w.id
            );
        }
        if blocks.is_some() && w.pool_blocks.is_none() && w.state != WorkloadState::Waiting {
            vgpu_store::usage!(
                "{} ({}) holds no compute pool blocks (it was not started with --tflops): change its share with --compute",
                w.name,
                w.id
            );
        }
        let limits_only = mem.is_none() && args.compute.is_none() && args.compute_policy.is_none() && args.turn.is_none();
        // A waiting workload has no vGPU yet: only its priority (its place in the pool's
        // queue) can change. One whose pool blocks are all on declared devices has none
        // either: its priority and its blocks can.
        let waiting = w.state == WorkloadState::Waiting;
        if waiting || w.gpus.is_empty() {
            if !limits_only || (waiting && blocks.is_some()) {
                vgpu_store::usage!("{} ({}) has no GPU yet (it is {}): update it once it runs", w.name, w.id, w.state.as_str());
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
            Some(spec) => resize::plan_workload(w, spec, devices, &view, &partitions, &damaged, &usage).map_err(ResizeError::into_cli)?,
            None => Vec::new(),
        };
        if let Some(planned) = view.iter_mut().find(|o| o.id == w.id) {
            for (g, q) in planned.gpus.iter_mut().zip(&quotas) {
                g.mem_bytes = q.mem_bytes;
            }
        }
        targets.push(Target { workload: w.clone(), usage: Some(usage), quotas });
    }

    // The blocks, planned with the rest (one target: checked in `run`): the new priority
    // counts, and nobody is frozen before the memory was decided above.
    let resize_plan = match (blocks, targets.first()) {
        (Some(blocks), Some(t)) => Some(plan_blocks(store, &t.workload, blocks, priority)?),
        _ => None,
    };

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
    let undo_quotas = |targets: &[Target]| {
        for done in targets {
            if let Some(u) = &done.usage {
                resize::undo(u, &done.quotas);
            }
        }
    };
    if result.is_ok() {
        for (n, t) in targets.iter().enumerate() {
            let Some(usage) = &t.usage else { continue };
            if let Err(e) = resize::apply(&resize::workload_name(&t.workload), usage, &t.quotas) {
                undo_quotas(&targets[..n]);
                result = Err(e.into_cli());
                break;
            }
        }
    }
    // Then the blocks: freezing whom the plan preempts (all or none), thawing whom it
    // resumes, recording it. Refused there, the quotas go back too.
    let mut resized: Option<Resized> = None;
    if let (Ok(()), Some((mut pool, plan, previous))) = (&result, resize_plan) {
        let others = others_of(&plan);
        match vgpu_host::pool_effects::execute(store, &lock, &mut pool, plan) {
            Ok(_) => resized = Some(Resized { pool, previous, others }),
            Err(e) => {
                undo_quotas(&targets);
                result = Err(e);
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
        // The resized workload's new share of each GPU: its blocks there / the GPU's blocks.
        let shares: Vec<(String, u32)> = match &resized {
            Some(r) => r.pool.gpu_shares(&w.id).iter().filter_map(|s| Some((s.device.uuid()?.to_string(), u32::from(s.compute_percent())))).collect(),
            None => Vec::new(),
        };
        let mut turns = (None, None);
        if let Some(usage) = &usage {
            if let Some(us) = args.turn {
                for uuid in &uuids {
                    if let Some(i) = usage.find_device_str(uuid) {
                        let before = u32::try_from(usage.turn_max_ns(i) / 1000).unwrap_or(u32::MAX);
                        turns = (Some(us), turns.1.or(Some(before)));
                        usage.set_turn_max_us(i, us).with_context(|| format!("{}", usage.path().display()))?;
                    }
                }
            }
            if change.compute_pct.is_some() || change.policy.is_some() {
                vgpu_store::compute::apply_live(usage, Some(&uuids), change)?;
            }
            for (uuid, pct) in &shares {
                vgpu_store::compute::apply_live(usage, Some(&[uuid.as_str()]), LiveChange { compute_pct: Some(*pct), policy: None })?;
            }
            if let Some(p) = priority {
                for uuid in &uuids {
                    if let Some(i) = usage.find_device_str(uuid) {
                        usage.set_priority(i, vgpu_store::compute::abi_priority(p.get())).with_context(|| format!("{}", usage.path().display()))?;
                    }
                }
            }
        }
        if let Some(p) = priority {
            w.priority = p.get();
            // A pool workload holds blocks, or waits for them (no blocks recorded yet).
            if w.pool_blocks.is_some() || w.state == WorkloadState::Waiting {
                pool_changed |= set_pool_priority(store, &w.id, p)?;
            }
        }
        for g in &mut w.gpus {
            if let Some(pct) = args.compute {
                g.compute_pct = pct;
            }
            if let Some((_, pct)) = shares.iter().find(|(u, _)| *u == g.uuid) {
                g.compute_pct = *pct;
            }
            if let Some(q) = quotas.iter().find(|q| q.uuid == g.uuid) {
                g.mem_bytes = q.mem_bytes;
            }
        }
        let mut others = Vec::new();
        let mut pool_figures = (None, None);
        if let Some(r) = &resized {
            let held = r.pool.allocation(&w.id).map(|a| a.held());
            w.pool_blocks = held.or(w.pool_blocks);
            pool_figures = (Some(r.previous), w.pool_blocks);
            others = r.others.clone();
        }
        w.compute_policy = args.compute_policy.unwrap_or(w.compute_policy);
        store.write_workload(&w)?;
        let tflops = |b: Option<u64>| b.map(|b| round_tflops(b as f64 * block_tflops));
        out.push(Updated {
            id: w.id.clone(),
            name: w.name.clone(),
            compute_policy: w.compute_policy,
            previous_compute_policy: before.compute_policy,
            priority: w.priority,
            previous_priority: before.priority,
            turn_max_us: turns.0,
            previous_turn_max_us: turns.1,
            tflops: tflops(pool_figures.1),
            previous_tflops: tflops(pool_figures.0),
            blocks: pool_figures.1,
            previous_blocks: pool_figures.0,
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
            others,
        });
    }
    if pool_changed {
        // A new priority may preempt, or be preempted, like a new request.
        vgpu_host::pool_effects::settle(store, &lock)?;
    }
    drop(lock);
    Ok(out)
}

/// A pool resize carried out: the pool as recorded, the blocks held before, and what it did
/// to others.
struct Resized {
    pool: Pool,
    previous: u64,
    others: Vec<String>,
}

/// Plan workload `w`'s resize to `blocks` (with its new `priority`, if any): the pool it
/// was planned on, the plan, and the blocks held before. Refused: nothing changed.
fn plan_blocks(store: &Store, w: &Workload, blocks: u64, priority: Option<Priority>) -> Result<(Pool, Plan, u64)> {
    let what = resize::workload_name(w);
    let mut pool = vgpu_host::pool_effects::load(store)?.with_context(|| format!("{what}: there is no pool state"))?;
    let previous = pool.allocation(&w.id).with_context(|| format!("{what} has no entry in the compute pool state"))?.held();
    if let Some(p) = priority {
        pool.set_priority(&w.id, p);
    }
    let plan = vgpu_host::pool_effects::plan_fitting(store, |held| pool.resize_without(&w.id, blocks, held))?.map_err(|e| {
        let usage = e.is_usage();
        let change = if blocks > previous { "raise" } else { "lower" };
        let e = anyhow::Error::new(e).context(format!("cannot {change} {what} from {previous} to {blocks} blocks"));
        if usage {
            UsageError::new(format!("{e:#}")).into()
        } else {
            e
        }
    })?;
    Ok((pool, plan, previous))
}

/// What a pool plan does to workloads other than the one resized, for the line.
fn others_of(plan: &Plan) -> Vec<String> {
    plan.suspend()
        .iter()
        .map(|s| format!("suspended {} ({}) to make room", s.name, s.id))
        .chain(plan.resume().iter().map(|r| format!("resumed {} ({})", r.name, r.id)))
        .chain(plan.start().iter().map(|r| format!("started {} ({})", r.name, r.id)))
        .collect()
}

/// TFLOPS as people read them: at most two decimals (blocks of 0.1 TFLOPS add up unevenly).
fn round_tflops(t: f64) -> f64 {
    (t * 100.0).round() / 100.0
}

/// The line's account of one workload's change.
fn describe(u: &Updated, asked: &Asked, args: &UpdateArgs) -> String {
    let mut parts = Vec::new();
    if let (Some(before), Some(now)) = (u.previous_tflops, u.tflops) {
        let shares: Vec<String> = u
            .gpus
            .iter()
            .map(|g| format!("GPU {} compute {}% → {}%", g.index, g.previous_compute_pct, g.compute_pct))
            .collect();
        let shares = if shares.is_empty() { String::new() } else { format!(" ({})", shares.join(", ")) };
        parts.push(format!("{before} → {now} TFLOPS{shares}"));
    }
    if asked.mem.is_some() {
        parts.extend(
            u.gpus
                .iter()
                .map(|g| format!("memory on GPU {} {} → {}", g.index, format_size(g.previous_mem_bytes), format_size(g.mem_bytes))),
        );
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
    if let (Some(now), Some(before)) = (u.turn_max_us, u.previous_turn_max_us) {
        let text = |us: u32| if us == 0 { "none".to_string() } else { format!("{}ms", f64::from(us) / 1000.0) };
        parts.push(format!("turn beside a higher priority {} → {}", text(before), text(now)));
    }
    if asked.priority.is_some() {
        parts.push(format!("priority {} → {}", u.previous_priority, u.priority));
    }
    parts.extend(u.others.iter().cloned());
    parts.join("; ")
}

/// The GPUs as admission sees them (the watch's list, or NVML: `Context::gpu_identities`).
pub(crate) fn admission_devices(ctx: &Context) -> Result<Vec<AdmissionGpu>> {
    let Some(gpus) = ctx.gpu_identities()? else {
        anyhow::bail!("no NVIDIA driver found (libnvidia-ml.so.1); use --simulate to try vgpu without a GPU");
    };
    Ok(gpus
        .into_iter()
        .map(|g| AdmissionGpu { index: g.index, uuid: g.uuid, name: g.name, memory: g.memory_total })
        .collect())
}

/// Give workload `id`'s pool allocation the new priority; whether it has one.
fn set_pool_priority(store: &Store, id: &str, priority: Priority) -> Result<bool> {
    let Some(mut pool) = vgpu_host::pool_effects::load(store)? else {
        return Ok(false);
    };
    if !pool.set_priority(id, priority) {
        return Ok(false);
    }
    vgpu_host::pool_effects::save(store, &pool)?;
    Ok(true)
}
