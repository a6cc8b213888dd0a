//! `vgpu ps`: workloads, their quotas and what they use.

use anyhow::Result;
use clap::Args;
use vgpu_abi::size::format_size;

use crate::cgroup::Layout;
use crate::context::Context;
use crate::output::{print_json, table};
use crate::listing::{row, Row};
use crate::state::Store;

#[derive(Debug, Args)]
pub struct PsArgs {
    /// Also list every process of each workload (from the shim's per-process files)
    #[arg(short, long)]
    pub all: bool,
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
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
        let state = match (&r.enforcement, &r.suspended_reason) {
            (Some(e), _) => format!("{}: {}", e.action.as_str(), e.reason),
            (None, Some(why)) => format!("{} ({why})", r.state),
            (None, None) => r.state.clone(),
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

