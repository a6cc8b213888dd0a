//! `vgpu ps`: workloads, their quotas and what they use.

use anyhow::Result;
use clap::Args;
use serde::Serialize;
use vgpu_abi::size::format_size;
use vgpu_abi::layout::USAGE_FILE;
use vgpu_abi::usage::UsageFile;

use crate::cgroup::{Cgroup, Layout};
use crate::compute::ComputePolicy;
use crate::context::Context;
use crate::output::{print_json, table};
use crate::state::{Store, Workload};

#[derive(Debug, Args)]
pub struct PsArgs {
    /// Also list every process of each workload (from the shim's per-process files)
    #[arg(short, long)]
    pub all: bool,
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct Row {
    id: String,
    name: String,
    user: String,
    gpus: Vec<GpuRow>,
    partition: Option<String>,
    /// Target compute share per GPU, percent (the highest of its GPUs' when they differ;
    /// `gpus[].compute_pct` has each). None: no GPU yet.
    compute_pct: Option<u32>,
    compute_policy: ComputePolicy,
    /// Share of one GPU's time the vGPU used over the last ~1 s window, percent (the
    /// highest of its GPUs'); null when idle or unknown. A partition's figure is the whole
    /// partition's.
    compute_measured_pct: Option<f64>,
    /// GPU time charged to the vGPU, summed over its GPUs, ns.
    gpu_time_ns: u64,
    priority: i32,
    pool_blocks: Option<u64>,
    pids: Vec<u32>,
    state: String,
    suspended_reason: Option<String>,
    age_seconds: u64,
    command: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    processes: Option<Vec<ProcRow>>,
}

#[derive(Debug, Serialize)]
struct GpuRow {
    index: u32,
    uuid: String,
    mem_used: Option<u64>,
    mem_quota: u64,
    compute_pct: u32,
    compute_measured_pct: Option<f64>,
    gpu_time_ns: u64,
    /// Time the vGPU's launching threads waited for its compute budget on this GPU, ns.
    throttled_ns: u64,
}

#[derive(Debug, Serialize)]
struct ProcRow {
    pid: u32,
    mem_used: Vec<u64>,
    mem_peak: Vec<u64>,
    /// GPU time charged to this process, per device of the vGPU, ns.
    gpu_time_ns: Vec<u64>,
}

pub fn run(ctx: &Context, args: &PsArgs) -> Result<()> {
    let store = Store::new(&ctx.state_dir, &ctx.lib_dir);
    let damaged = {
        let lock = store.lock()?;
        crate::lifecycle::reconcile(&store, &lock).damaged
    };
    for err in &damaged {
        eprintln!("vgpu: warning: {err}");
    }
    let (workloads, _) = store.workloads();
    let layout = Layout::detect();
    let rows: Vec<Row> = workloads.iter().map(|w| row(&store, layout.as_ref(), w, args.all)).collect();
    if args.json {
        return print_json(&rows);
    }
    if rows.is_empty() {
        println!("No workloads running.");
        return Ok(());
    }
    let mut t = table(["ID", "NAME", "USER", "GPU", "MEM used/quota", "COMPUTE", "MEASURED", "PIDS", "STATE", "AGE", "COMMAND"]);
    for r in &rows {
        let gpus: Vec<String> = r.gpus.iter().map(|g| g.index.to_string()).collect();
        let mem: Vec<String> = r
            .gpus
            .iter()
            .map(|g| format!("{} / {}", g.mem_used.map(format_size).unwrap_or_else(|| "?".into()), format_size(g.mem_quota)))
            .collect();
        let state = match &r.suspended_reason {
            Some(why) => format!("{} ({why})", r.state),
            None => r.state.clone(),
        };
        let name = match &r.partition {
            Some(p) => format!("{} [{p}]", r.name),
            None => r.name.clone(),
        };
        t.add_row([
            r.id.clone(),
            name,
            r.user.clone(),
            gpus.join(","),
            mem.join("\n"),
            compute_cell(r),
            measured_cell(r),
            r.pids.len().to_string(),
            state,
            humantime::format_duration(std::time::Duration::from_secs(r.age_seconds)).to_string(),
            r.command.join(" "),
        ]);
        for p in r.processes.iter().flatten() {
            let mem: Vec<String> = p.mem_used.iter().zip(&p.mem_peak).map(|(u, pk)| format!("{} (peak {})", format_size(*u), format_size(*pk))).collect();
            let gpu_time: Vec<String> = p.gpu_time_ns.iter().map(|ns| format!("{:.3}s gpu", *ns as f64 / 1e9)).collect();
            t.add_row([
                String::new(),
                format!("  pid {}", p.pid),
                String::new(),
                String::new(),
                mem.join("\n"),
                gpu_time.join("\n"),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
            ]);
        }
    }
    println!("{t}");
    Ok(())
}

/// Target share and policy per GPU: `30% strict`.
fn compute_cell(r: &Row) -> String {
    let mut shares: Vec<String> = r.gpus.iter().map(|g| format!("{}% {}", g.compute_pct, r.compute_policy)).collect();
    if let Some(blocks) = r.pool_blocks {
        shares.push(format!("{blocks} blocks"));
    }
    if shares.is_empty() {
        "—".into()
    } else {
        shares.join("\n")
    }
}

/// Measured share per GPU over the last window: `28%`, `-` when idle.
fn measured_cell(r: &Row) -> String {
    let cells: Vec<String> = r.gpus.iter().map(|g| g.compute_measured_pct.map(|p| format!("{p:.0}%")).unwrap_or_else(|| "-".into())).collect();
    if cells.is_empty() {
        "-".into()
    } else {
        cells.join("\n")
    }
}

/// Parts per million → percent with one decimal.
fn ppm_to_pct(ppm: u64) -> f64 {
    (ppm as f64 / 1000.0).round() / 10.0
}

fn row(store: &Store, layout: Option<&Layout>, w: &Workload, all: bool) -> Row {
    let usage = UsageFile::open(&store.vgpu_dir(&w.vgpu).join(USAGE_FILE)).ok();
    let devices = usage.as_ref().map(|u| u.devices()).unwrap_or_default();
    // The usage file is what the shim enforces; the record is the fallback.
    let gpus: Vec<GpuRow> = w
        .gpus
        .iter()
        .map(|g| {
            let live = devices.iter().find(|d| d.uuid == g.uuid);
            GpuRow {
                index: g.index,
                uuid: g.uuid.clone(),
                mem_used: live.map(|d| d.used_bytes),
                mem_quota: g.mem_bytes,
                compute_pct: live.map(|d| d.compute_pct).unwrap_or(g.compute_pct),
                compute_measured_pct: live.and_then(|d| d.measured_share_ppm).map(ppm_to_pct),
                gpu_time_ns: live.map(|d| d.charged_ns).unwrap_or(0),
                throttled_ns: live.map(|d| d.throttled_ns).unwrap_or(0),
            }
        })
        .collect();
    let compute_policy = w
        .gpus
        .first()
        .and_then(|g| devices.iter().find(|d| d.uuid == g.uuid))
        .map(|d| ComputePolicy::from_abi(d.policy))
        .unwrap_or(w.compute_policy);
    let pids: Vec<u32> = layout
        .and_then(|l| Cgroup::open(l, &w.cgroup).ok())
        .and_then(|c| c.pids().ok())
        .map(|p| p.into_iter().map(|p| p as u32).collect())
        .unwrap_or_default();
    let processes = all.then(|| {
        usage
            .as_ref()
            .map(|u| u.processes())
            .unwrap_or_default()
            .into_iter()
            .filter(|p| p.alive && pids.contains(&p.pid))
            .map(|p| ProcRow { pid: p.pid, mem_used: p.used_bytes, mem_peak: p.peak_bytes, gpu_time_ns: p.compute_ns })
            .collect()
    });
    let age = crate::commands::run::now_ms().saturating_sub(w.created_unix_ms) / 1000;
    Row {
        id: w.id.clone(),
        name: w.name.clone(),
        user: w.user.name.clone(),
        compute_pct: gpus.iter().map(|g| g.compute_pct).max(),
        compute_policy,
        compute_measured_pct: gpus.iter().filter_map(|g| g.compute_measured_pct).reduce(f64::max),
        gpu_time_ns: gpus.iter().map(|g| g.gpu_time_ns).sum(),
        gpus,
        partition: w.partition.clone(),
        priority: w.priority,
        pool_blocks: w.pool_blocks,
        pids,
        state: w.state.as_str().to_string(),
        suspended_reason: w.suspended_reason.clone(),
        age_seconds: age,
        command: w.command.clone(),
        processes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measured_share_is_a_percent_with_one_decimal() {
        assert_eq!(ppm_to_pct(280_000), 28.0);
        assert_eq!(ppm_to_pct(1_000_000), 100.0);
        assert_eq!(ppm_to_pct(123_456), 12.3);
        assert_eq!(ppm_to_pct(0), 0.0);
    }
}
