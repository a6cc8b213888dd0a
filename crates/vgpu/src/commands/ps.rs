//! `vgpu ps`: workloads, their quotas and what they use.

use std::collections::HashSet;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use serde::Serialize;
use vgpu_abi::size::format_size;

use vgpu_carbon::account::format_energy;
use vgpu_host::context::Context;
use vgpu_history::query::Ended;
use vgpu_history::query::Reader;
use vgpu_host::listing::driver::Driver;
use vgpu_host::listing::driver::UnmanagedRow;
use vgpu_host::listing::workloads;
use vgpu_host::listing::workloads::Listing;
use vgpu_host::listing::workloads::Options;
use vgpu_host::listing::MemSource;
use vgpu_host::listing::Row;
use crate::output::refresh;
use crate::output::table;
use vgpu_store::state::Store;

#[derive(Debug, Args)]
pub struct PsArgs {
    /// Also list every process of each workload (the shim's per-process files; the driver's figures where those cannot be read), and the workloads that ended in the last 24 hours with their energy and CO2 (from the history vgpu watch records)
    #[arg(short, long)]
    pub all: bool,
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
    /// With --json: add "unmanaged": [...], the processes in no vGPU on the workloads' GPUs (the table always shows them)
    #[arg(long)]
    pub unmanaged: bool,
    /// Refresh every SECONDS [default: 2, at least 0.1] until interrupted: in place on a terminal, else one table (with --json one JSON line) per refresh
    #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = refresh::DEFAULT_SECONDS, value_parser = refresh::parse_interval)]
    pub watch: Option<Duration>,
}

/// `ps --json`: `{"schema": N, "workloads": [...]}`, with `--unmanaged` also `"unmanaged"`,
/// with `-a` also `"ended"`.
#[derive(Serialize)]
struct Listed<'a> {
    workloads: &'a [Row],
    #[serde(skip_serializing_if = "Option::is_none")]
    unmanaged: Option<&'a [UnmanagedRow]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ended: Option<&'a [Ended]>,
}

/// `ps -a`'s history: workloads that ended in the last [`ENDED_SPAN_MS`], at most
/// [`ENDED_MAX`].
const ENDED_SPAN_MS: i64 = 24 * 3600 * 1000;
const ENDED_MAX: usize = 20;

/// The recently ended workloads with their energy, from the history and the ends `vgpu run`
/// left for the watch that it has not recorded yet (none when there is no history; a
/// history that cannot be read is a warning, not a failed `ps`).
fn ended(ctx: &Context, store: &Store) -> Vec<Ended> {
    let since = i64::try_from(vgpu_store::clock::now_ms()).unwrap_or(i64::MAX) - ENDED_SPAN_MS;
    let (left, unreadable) = vgpu_store::state::ended::pending(store);
    for e in unreadable {
        tracing::debug!("{e}");
    }
    let left: Vec<_> = left.into_iter().map(|found| found.note).collect();
    let idle = vgpu_host::carbon::report::idle_defaults(ctx);
    match Reader::open(&ctx.lib_dir).and_then(|r| r.map(|r| r.ended_since_with(since, ENDED_MAX, &idle, &left)).transpose()) {
        Ok(Some(found)) => found,
        Ok(None) => vgpu_history::query::ended_left(&left, since, ENDED_MAX),
        Err(e) => {
            tracing::warn!("the history: {e}");
            Vec::new()
        }
    }
}

pub fn run(ctx: &Context, args: &PsArgs) -> Result<()> {
    let store = Store::new(&ctx.state_dir, &ctx.lib_dir);
    let driver = Driver::new(ctx);
    // The table always says what else runs on the workloads' GPUs; JSON when asked.
    let options = Options { processes: args.all, unmanaged: args.unmanaged || !args.json };
    // Each damaged record is reported once, however many refreshes list it.
    let mut reported = HashSet::new();
    let frame = |pretty: bool| -> Result<String> {
        let listing = workloads::list(&store, &driver, options)?;
        for err in &listing.damaged {
            let line = err.to_string();
            if reported.insert(line.clone()) {
                tracing::warn!("{line}");
            }
        }
        let ended = if args.all { Some(ended(ctx, &store)) } else { None };
        render(&listing, ended.as_deref(), args, pretty)
    };
    refresh::once_or_every(args.watch, args.json, "vgpu ps", frame)
}

fn render(listing: &Listing, ended: Option<&[Ended]>, args: &PsArgs, pretty: bool) -> Result<String> {
    if args.json {
        let unmanaged = listing.unmanaged.as_deref().filter(|_| args.unmanaged);
        return Ok(vgpu_json::to_text(&Listed { workloads: &listing.rows, unmanaged, ended }, pretty)?);
    }
    let mut out = Vec::new();
    if listing.rows.is_empty() {
        out.push("No workloads running.".to_string());
    } else {
        out.push(workload_table(&listing.rows).to_string());
    }
    let from_driver = listing.rows.iter().any(|r| r.gpus.iter().any(|g| g.mem_used_source == Some(MemSource::Driver)));
    if from_driver {
        out.push("* from the driver (NVML): the workload's own processes; its vGPU's counters are its user's".into());
    }
    if let Some(unmanaged) = listing.unmanaged.as_deref().filter(|u| !u.is_empty()) {
        out.push(format!("{} process(es) on these GPUs are in no vGPU:", unmanaged.len()));
        out.push(unmanaged_table(unmanaged).to_string());
    }
    if let Some(ended) = ended.filter(|e| !e.is_empty()) {
        out.push("Ended in the last 24 hours:".into());
        out.push(ended_table(ended).to_string());
    }
    Ok(out.join("\n"))
}

fn ended_table(ended: &[Ended]) -> comfy_table::Table {
    let mut t = table(["ID", "NAME", "USER", "GPU", "ENDED", "OUTCOME", "GPU-TIME", "ENERGY", "CO2"]);
    let now = i64::try_from(vgpu_store::clock::now_ms()).unwrap_or(i64::MAX);
    for e in ended {
        let gpus: Vec<String> = e.gpu_indexes.iter().map(i64::to_string).collect();
        let ago = e.ended_unix_ms.map(|t| Duration::from_secs(u64::try_from(now.saturating_sub(t) / 1000).unwrap_or(0)));
        t.add_row([
            e.id.clone(),
            e.name.clone().unwrap_or_default(),
            e.user.clone().unwrap_or_default(),
            gpus.join(","),
            ago.map(|d| format!("{} ago", humantime::format_duration(d))).unwrap_or_default(),
            e.outcome.clone().unwrap_or_default(),
            humantime::format_duration(Duration::from_secs(e.gpu_time_ms / 1000)).to_string(),
            e.energy_mj.map(format_energy).unwrap_or_else(|| "—".into()),
            e.g_co2.map(|g| format!("{g:.1} g")).unwrap_or_else(|| "—".into()),
        ]);
    }
    t
}

fn workload_table(rows: &[Row]) -> comfy_table::Table {
    let mut t = table(["ID", "NAME", "USER", "GPU", "MEM used/quota", "COMPUTE", "MEASURED", "PIDS", "STATE", "AGE", "COMMAND"]);
    for r in rows {
        let gpus: Vec<String> = r.gpus.iter().map(|g| g.index.to_string()).collect();
        let mem: Vec<String> = r
            .gpus
            .iter()
            .map(|g| {
                let used = g.mem_used.map(format_size).unwrap_or_else(|| "?".into());
                let mark = if g.mem_used_source == Some(MemSource::Driver) { "*" } else { "" };
                format!("{used}{mark} / {}", format_size(g.mem_quota))
            })
            .collect();
        let mut state = match (&r.enforcement, &r.suspended_why) {
            (Some(e), _) => format!("{}: {}", e.action.as_str(), e.reason),
            (None, Some(why)) => match r.suspended_memory {
                Some(place) => format!("{} ({why}; memory on {place})", r.state),
                None => format!("{} ({why})", r.state),
            },
            (None, None) => r.state.clone(),
        };
        if !r.supervisor_alive {
            state.push_str(", supervisor gone");
        }
        let mut name = match &r.partition {
            Some(p) => format!("{} [{p}]", r.name),
            None => r.name.clone(),
        };
        if let Some(s) = &r.service {
            name.push_str(&format!(" ({}/{})", s.name, s.replica));
        }
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
            humantime::format_duration(Duration::from_secs(vgpu_store::clock::now_ms().saturating_sub(r.created_unix_ms) / 1000)).to_string(),
            r.command.join(" "),
        ]);
        for p in r.processes.iter().flatten() {
            let (mem, gpu_time): (Vec<String>, Vec<String>) = match p.source {
                MemSource::Shim => (
                    p.mem_used.iter().zip(&p.mem_peak).map(|(u, pk)| format!("{} (peak {})", format_size(*u), format_size(*pk))).collect(),
                    p.gpu_time_ns.iter().map(|ns| format!("{:.3}s gpu", *ns as f64 / 1e9)).collect(),
                ),
                MemSource::Driver => (p.mem_used.iter().map(|u| format!("{}*", format_size(*u))).collect(), Vec::new()),
            };
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
    t
}

fn unmanaged_table(unmanaged: &[UnmanagedRow]) -> comfy_table::Table {
    let mut t = table(["GPU", "PID", "USER", "MEMORY", "COMMAND"]);
    for u in unmanaged {
        let p = &u.process;
        t.add_row([
            p.gpu_index.to_string(),
            p.pid.to_string(),
            u.user.clone().unwrap_or_else(|| "?".into()),
            p.memory_bytes.map(format_size).unwrap_or_else(|| "?".into()),
            p.command.clone().unwrap_or_else(|| "?".into()),
        ]);
    }
    t
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

