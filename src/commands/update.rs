//! `vgpu update ID… [--compute PCT] [--compute-policy POLICY]`: change running workloads'
//! compute share live.
//!
//! Under the store lock, every workload named is checked and its vGPU's usage file opened
//! before anything is written, so a bad ID or a damaged file changes nothing. Then each
//! device's share (and policy) is written into the usage file, where the shim re-reads it
//! on every launch, and into the workload's record, where `vgpu ps` shows it.

use anyhow::{Context as _, Result};
use clap::Args;
use serde::Serialize;
use vgpu_abi::layout::USAGE_FILE;
use vgpu_abi::usage::UsageFile;

use crate::compute::{ComputePolicy, LiveChange};
use crate::context::Context;
use crate::output::print_json;
use crate::state::{Store, Workload, WorkloadState};

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("change").args(["compute", "compute_policy"]).required(true).multiple(true)))]
pub struct UpdateArgs {
    /// Workloads, by id (a unique prefix is enough) or name
    #[arg(required = true, value_name = "ID")]
    pub ids: Vec<String>,
    /// New share of each of its GPUs' compute, percent (1-100)
    #[arg(long, value_name = "PCT", value_parser = clap::value_parser!(u32).range(1..=100), allow_negative_numbers = true)]
    pub compute: Option<u32>,
    /// New policy: strict (never above the share) or fair (a floor; idle GPU time is shared out)
    #[arg(long, value_name = "POLICY", value_enum)]
    pub compute_policy: Option<ComputePolicy>,
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
    gpus: Vec<UpdatedGpu>,
}

#[derive(Debug, Serialize)]
struct UpdatedGpu {
    index: u32,
    uuid: String,
    compute_pct: u32,
    previous_compute_pct: u32,
}

pub fn run(ctx: &Context, args: &UpdateArgs) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        anyhow::bail!("vgpu update must run as root (through sudo): it changes the share of running workloads");
    }
    let store = Store::new(&ctx.state_dir, &ctx.lib_dir);
    let lock = store.lock()?;
    crate::lifecycle::reconcile_store(&store, &lock);
    let (workloads, _) = store.workloads();

    // Check everything and open every usage file first: nothing is written unless all can be.
    let mut targets: Vec<(Workload, UsageFile)> = Vec::new();
    for query in &args.ids {
        let w = crate::lifecycle::find(&workloads, query)?;
        if targets.iter().any(|(t, _)| t.id == w.id) {
            continue;
        }
        if let Some(p) = &w.partition {
            crate::usage!(
                "{} ({}) runs in partition {p:?}, whose workloads share one share: use `vgpu partition update {p} …`",
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
        if w.state == WorkloadState::Waiting || w.gpus.is_empty() {
            crate::usage!("{} ({}) has no GPU yet (it is {}): update it once it runs", w.name, w.id, w.state.as_str());
        }
        let path = store.vgpu_dir(&w.vgpu).join(USAGE_FILE);
        let usage = UsageFile::open(&path).with_context(|| format!("workload {} ({})", w.name, w.id))?;
        for g in &w.gpus {
            if usage.find_device_str(&g.uuid).is_none() {
                anyhow::bail!("workload {} ({}): {} has no device {}", w.name, w.id, path.display(), g.uuid);
            }
        }
        targets.push((w.clone(), usage));
    }

    let change = LiveChange { compute_pct: args.compute, policy: args.compute_policy };
    let mut out = Vec::new();
    for (mut w, usage) in targets {
        let before = w.clone();
        let uuids: Vec<&str> = before.gpus.iter().map(|g| g.uuid.as_str()).collect();
        crate::compute::apply_live(&usage, Some(&uuids), change)?;
        if let Some(pct) = args.compute {
            for g in &mut w.gpus {
                g.compute_pct = pct;
            }
        }
        w.compute_policy = args.compute_policy.unwrap_or(w.compute_policy);
        store.write_workload(&w)?;
        out.push(Updated {
            id: w.id.clone(),
            name: w.name.clone(),
            compute_policy: w.compute_policy,
            previous_compute_policy: before.compute_policy,
            gpus: w
                .gpus
                .iter()
                .zip(&before.gpus)
                .map(|(g, b)| UpdatedGpu { index: g.index, uuid: g.uuid.clone(), compute_pct: g.compute_pct, previous_compute_pct: b.compute_pct })
                .collect(),
        });
    }
    drop(lock);

    if args.json {
        return print_json(&out);
    }
    for u in &out {
        let shares = |f: fn(&UpdatedGpu) -> u32| u.gpus.iter().map(|g| format!("{}%", f(g))).collect::<Vec<_>>().join(",");
        println!(
            "updated {} ({}): compute {} {} (was {} {})",
            u.name,
            u.id,
            shares(|g| g.compute_pct),
            u.compute_policy,
            shares(|g| g.previous_compute_pct),
            u.previous_compute_policy
        );
    }
    Ok(())
}
