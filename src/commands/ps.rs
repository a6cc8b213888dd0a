//! `vgpu ps`: workloads, their quotas and what they use.

use anyhow::Result;
use clap::Args;
use serde::Serialize;
use vgpu_abi::size::format_size;
use vgpu_abi::layout::USAGE_FILE;
use vgpu_abi::usage::UsageFile;

use crate::cgroup::{Cgroup, Layout};
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
}

#[derive(Debug, Serialize)]
struct ProcRow {
    pid: u32,
    mem_used: Vec<u64>,
    mem_peak: Vec<u64>,
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
    let mut t = table(["ID", "NAME", "USER", "GPU", "MEM used/quota", "COMPUTE", "PIDS", "STATE", "AGE", "COMMAND"]);
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
            r.pids.len().to_string(),
            state,
            humantime::format_duration(std::time::Duration::from_secs(r.age_seconds)).to_string(),
            r.command.join(" "),
        ]);
        for p in r.processes.iter().flatten() {
            let mem: Vec<String> = p.mem_used.iter().zip(&p.mem_peak).map(|(u, pk)| format!("{} (peak {})", format_size(*u), format_size(*pk))).collect();
            t.add_row([String::new(), format!("  pid {}", p.pid), String::new(), String::new(), mem.join("\n"), String::new(), String::new(), String::new(), String::new(), String::new()]);
        }
    }
    println!("{t}");
    Ok(())
}

fn compute_cell(r: &Row) -> String {
    let mut shares: Vec<String> = r.gpus.iter().map(|g| format!("{}%", g.compute_pct)).collect();
    if let Some(blocks) = r.pool_blocks {
        shares.push(format!("{blocks} blocks"));
    }
    if shares.is_empty() {
        "—".into()
    } else {
        shares.join("\n")
    }
}

fn row(store: &Store, layout: Option<&Layout>, w: &Workload, all: bool) -> Row {
    let usage = UsageFile::open(&store.vgpu_dir(&w.vgpu).join(USAGE_FILE)).ok();
    let devices = usage.as_ref().map(|u| u.devices()).unwrap_or_default();
    let gpus = w
        .gpus
        .iter()
        .map(|g| GpuRow {
            index: g.index,
            uuid: g.uuid.clone(),
            mem_used: devices.iter().find(|d| d.uuid == g.uuid).map(|d| d.used_bytes),
            mem_quota: g.mem_bytes,
            compute_pct: g.compute_pct,
        })
        .collect();
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
            .map(|p| ProcRow { pid: p.pid, mem_used: p.used_bytes, mem_peak: p.peak_bytes })
            .collect()
    });
    let age = crate::commands::run::now_ms().saturating_sub(w.created_unix_ms) / 1000;
    Row {
        id: w.id.clone(),
        name: w.name.clone(),
        user: w.user.name.clone(),
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
