//! `vgpu carbon …`: the grid's carbon intensity, the clock plan for a carbon budget,
//! applying and undoing it; the energy and emissions of each workload from the history.

use anyhow::{Context as _, Result};
use chrono::Utc;
use clap::{Args, Subcommand};
use serde::Serialize;

use vgpu_carbon::account::GroupBy;

use vgpu_carbon::account::Report;

use vgpu_carbon::account::RowKind;
use vgpu_carbon::apply;
use vgpu_carbon::apply::AppliedStore;
use vgpu_carbon::apply::CarbonGpu;
use vgpu_carbon::apply::GpuOutcome;
use vgpu_carbon::apply::APPLIED_FILE;
use vgpu_carbon::config::check_intensity;
use vgpu_carbon::config::MAX_INTENSITY;
use vgpu_carbon::budget::HorizonFigures;
use vgpu_carbon::budget::Period;
use vgpu_carbon::budget::SpentFrom;
use vgpu_host::carbon::host;
use vgpu_carbon::intensity::Forecast;
use vgpu_carbon::intensity::Intensity;
use vgpu_carbon::intensity::Status;
use vgpu_carbon::log;
use vgpu_carbon::log::Action;
use vgpu_carbon::log::Decision;
use vgpu_carbon::log::LOG_FILE;
use vgpu_carbon::planner::ClockPlan;
use vgpu_host::carbon::profile;
use vgpu_host::context::Context;
use vgpu_store::error::UsageError;
use vgpu_gpu::Nvml;
use crate::output::print_json;
use crate::output::table;

#[derive(Debug, Args)]
pub struct CarbonArgs {
    #[command(subcommand)]
    pub command: CarbonCommand,
}

#[derive(Debug, Subcommand)]
pub enum CarbonCommand {
    /// The grid's carbon intensity now, from the configured source
    Intensity(IntensityArgs),
    /// The clock plan for the carbon budget; changes nothing
    Plan(PlanArgs),
    /// Apply the plan: cap clocks (or power limits) through NVML and log the decision
    Apply(PlanArgs),
    /// Undo the caps: default clocks and power limits
    Reset(ResetArgs),
    /// Measure a GPU's power and speed at several locked clocks and fit the planner's model
    ///
    /// Runs a calibration load (an FMA-loop kernel through the CUDA driver API) with the GPU's
    /// clocks locked at each of K clocks spread over its supported range, S seconds each, and
    /// measures power (NVML's energy counter) and throughput. Fits
    /// P(f) = P_idle + (P_max − P_idle)·(f/f_max)^γ and the speed curve
    /// s(f) = (1 − σ) + σ·f/f_max, and stores the fit in the history database
    /// (/var/lib/vgpu/history.db, table power_models) for `vgpu carbon plan` and `apply`: for
    /// this GPU, and for GPUs of the same name without a profile of their own ([carbon]
    /// power_idle_w, power_max_w and gamma still win). The clocks are restored afterwards
    /// (vgpu's carbon cap locked again, else unlocked), also on error, Ctrl-C, SIGTERM and
    /// SIGHUP; after a SIGKILL, `vgpu carbon apply` or `vgpu carbon reset` restores them. A GPU
    /// with compute processes is refused unless --force. Needs root. Takes about
    /// K·(S + 0.2) + 1 seconds (15 s by default).
    Profile(ProfileArgs),
    /// Energy (kWh) and emissions (gCO2) per workload from the history: each GPU's measured energy split by GPU time, idle shown apart
    Report(ReportArgs),
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Start of the window: RFC 3339, a date (YYYY-MM-DD, local midnight) or a duration ago (24h, 7d) [default: 24 hours before --until]
    #[arg(long, value_name = "T")]
    pub since: Option<String>,
    /// End of the window, as --since [default: now]
    #[arg(long, value_name = "T")]
    pub until: Option<String>,
    /// Group the workloads' energy by workload, user, service or GPU
    #[arg(long, value_enum, default_value_t = GroupBy::Workload)]
    pub by: GroupBy,
    /// Print JSON instead of a table
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,
    /// Print CSV (one header line) instead of a table
    #[arg(long)]
    pub csv: bool,
}

#[derive(Debug, Args)]
pub struct IntensityArgs {
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
    /// Show the forecast for the next 48 hours (each figure's start and value) instead of
    /// the value now
    #[arg(long)]
    pub forecast: bool,
    /// Use this intensity (gCO2/kWh) instead of asking the configured source
    #[arg(long, value_name = "G", allow_negative_numbers = true)]
    pub intensity: Option<f64>,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
    /// Use this intensity (gCO2/kWh) instead of asking the configured source
    #[arg(long, value_name = "G", allow_negative_numbers = true)]
    pub intensity: Option<f64>,
    /// Carbon budget for all GPUs, gCO2 per hour [default: the config's budget_g_per_hour];
    /// the config's budget_g_per_day and budget_g_per_month apply too (the tightest binds)
    #[arg(long, value_name = "G_PER_H", allow_negative_numbers = true)]
    pub budget: Option<f64>,
}

#[derive(Debug, Args)]
pub struct ResetArgs {
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ProfileArgs {
    /// The GPU to profile (NVML index)
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub gpu: u32,
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
    /// How many clocks to measure (3–32)
    #[arg(long, value_name = "K", default_value_t = vgpu_host::carbon::profile::DEFAULT_CLOCKS)]
    pub clocks: usize,
    /// Seconds of load at each clock (at most 60)
    #[arg(long, value_name = "S", default_value_t = vgpu_host::carbon::profile::DEFAULT_SECONDS)]
    pub seconds: f64,
    /// Profile even though processes use the GPU (they disturb the measure, and it them)
    #[arg(long)]
    pub force: bool,
}

pub fn run(ctx: &Context, args: &CarbonArgs) -> Result<()> {
    let config = &ctx.config.carbon;
    config.validate().map_err(|e| UsageError::new(e.to_string()))?;
    match &args.command {
        CarbonCommand::Intensity(a) => show_intensity(ctx, a),
        CarbonCommand::Plan(a) => show_plan(ctx, a),
        CarbonCommand::Apply(a) => apply(ctx, a),
        CarbonCommand::Reset(a) => reset(ctx, a),
        CarbonCommand::Profile(a) => profile(ctx, a),
        CarbonCommand::Report(a) => show_report(ctx, a),
    }
}

/// The intensity to plan with: `--intensity`, else the source with its fallbacks.
fn current_intensity(ctx: &Context, given: Option<f64>, remember: bool) -> Result<Intensity> {
    let now = host::now(ctx)?;
    if let Some(value) = given {
        let value = check_intensity("--intensity", value).map_err(|_| {
            UsageError::new(format!("--intensity must be a carbon intensity from 0 to {MAX_INTENSITY} gCO2/kWh, got {value}"))
        })?;
        return Ok(Intensity::overridden(value, now));
    }
    host::intensity_now(ctx, now, remember)
}

/// The budgets: `--budget` (per hour) or the config's per-hour one, and the config's daily
/// and monthly ones; none at all is a usage error.
fn budgets(ctx: &Context, given: Option<f64>) -> Result<host::Budgets> {
    if let Some(b) = given {
        if !(b.is_finite() && b >= 0.0) {
            return Err(UsageError::new(format!("--budget must be a non-negative number of gCO2/h, got {b}")).into());
        }
    }
    let budgets = host::Budgets::of(&ctx.config.carbon, given);
    if !budgets.any() {
        return Err(UsageError::new(
            "no carbon budget: pass --budget G_PER_H or set [carbon] budget_g_per_hour, budget_g_per_day or budget_g_per_month",
        )
        .into());
    }
    Ok(budgets)
}

/// What `carbon apply` says when there is no budget, naming the config file to set it in.
fn no_budget_note(ctx: &Context) -> String {
    let path = ctx.origin.config.clone().unwrap_or_else(|| vgpu_host::config::DEFAULT_CONFIG_PATH.into());
    format!(
        "no carbon budget configured ([carbon] budget_g_per_hour, budget_g_per_day or budget_g_per_month in {}): nothing to do",
        path.display()
    )
}

/// NVML for a command that only looks (`plan`): as [`host::open_nvml`] for root, and making
/// nothing for anyone else (who could not).
fn open_nvml_to_look(ctx: &Context) -> Result<Nvml> {
    if vgpu_store::read_only::is_root() {
        host::open_nvml(ctx)
    } else {
        ctx.nvml_read_only()?.context(host::NO_DRIVER)
    }
}

/// The plan for every budget at `now`; `remember` (apply): cache and record the forecast.
fn make_plan(ctx: &Context, devices: &[CarbonGpu], intensity: &Intensity, budgets: host::Budgets, remember: bool) -> Result<host::BudgetPlan> {
    let now = host::now(ctx)?;
    host::plan_budgets(ctx, &host::workloads_learned(ctx, devices), devices, intensity, budgets, now, true, remember)
}

fn show_intensity(ctx: &Context, args: &IntensityArgs) -> Result<()> {
    // Root remembers a good reading for `apply`'s bad days; anyone else only looks (the
    // library directory is root's).
    let found = current_intensity(ctx, args.intensity, vgpu_store::read_only::is_root())?;
    if args.forecast {
        return show_forecast(ctx, &found, args.json);
    }
    if args.json {
        return print_json(&IntensityView::of(&found));
    }
    let mut t = table(["INTENSITY", "SOURCE", "TIMESTAMP", "AGE", "NOTE"]);
    t.add_row([
        format!("{:.0} gCO2/kWh", found.intensity),
        format!("{}{}", found.source, status_suffix(found.status)),
        found.timestamp.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        humantime::format_duration(std::time::Duration::from_secs(found.age_seconds.unsigned_abs())).to_string(),
        found.note.clone().unwrap_or_default(),
    ]);
    println!("{t}");
    Ok(())
}

/// How far ahead `carbon intensity --forecast` looks: what the UK API serves.
const FORECAST_HOURS: i64 = 48;

fn show_forecast(ctx: &Context, current: &Intensity, json: bool) -> Result<()> {
    let now = host::now(ctx)?;
    let until = now + chrono::Duration::hours(FORECAST_HOURS);
    let found = host::forecast(ctx, now, until, current, vgpu_store::read_only::is_root())?;
    if let Some(note) = &found.note {
        tracing::warn!("{note}");
    }
    if json {
        return print_json(&ForecastView::of(&found));
    }
    println!("forecast: {}{}, fetched {}", found.source, status_suffix(found.status), found.fetched_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
    let mut t = table(["FROM", "INTENSITY"]);
    for r in &found.readings {
        t.add_row([r.timestamp.to_rfc3339_opts(chrono::SecondsFormat::Secs, true), format!("{:.0} gCO2/kWh", r.g_per_kwh)]);
    }
    println!("{t}");
    if let Some(note) = &found.note {
        println!("note: {note}");
    }
    Ok(())
}

fn show_report(ctx: &Context, args: &ReportArgs) -> Result<()> {
    use vgpu_host::carbon::report;
    let window = report::window(args.since.as_deref(), args.until.as_deref(), Utc::now()).map_err(|e| UsageError::new(e.to_string()))?;
    let found = report::build(&ctx.lib_dir, &report::idle_defaults(ctx), window, args.by).context("reading the history")?;
    let none = found.is_none();
    let report = found.unwrap_or_else(|| report::empty(&ctx.lib_dir, window, args.by));
    if args.json {
        return print_json(&report);
    }
    if args.csv {
        // The CSV stays a table; what it cannot say goes to stderr.
        for note in &report.notes {
            vgpu_host::notice!("note: {note}");
        }
        print!("{}", report_csv(&report));
        return Ok(());
    }
    if none || report.gpus.is_empty() {
        // The one line: why there is nothing (no history, or nothing in it for the window).
        println!("{}", report.notes.join("; "));
        return Ok(());
    }
    print!("{}", report_text(&report));
    Ok(())
}

/// The report as a table: a title line, the rows, a TOTAL row, the notes.
fn report_text(r: &Report) -> String {
    let at = |ms: i64| {
        chrono::DateTime::from_timestamp_millis(ms).map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)).unwrap_or_default()
    };
    let mut out = format!("carbon report {} – {}, by {}\n", at(r.since_unix_ms), at(r.until_unix_ms), by_name(r.by));
    let mut header: Vec<&str> = match r.by {
        GroupBy::Workload => vec!["WORKLOAD", "NAME", "USER"],
        GroupBy::User => vec!["USER"],
        GroupBy::Service => vec!["SERVICE"],
        GroupBy::Gpu => vec!["GPU", "NAME"],
    };
    let lead = header.len();
    header.extend(["GPUS", "GPU-TIME", "ENERGY(kWh)", "CO2(g)", "SHARE"]);
    let mut t = table(header);
    let co2 = |g: Option<f64>| g.map(|g| format!("{g:.2}")).unwrap_or_else(|| "?".into());
    for row in &r.rows {
        let mut cells = vec![row.key.clone()];
        if row.kind == RowKind::Group {
            match r.by {
                GroupBy::Workload => {
                    cells.push(row.name.clone().unwrap_or_default());
                    cells.push(row.user.clone().unwrap_or_default());
                }
                GroupBy::Gpu => cells.push(row.name.clone().unwrap_or_default()),
                GroupBy::User | GroupBy::Service => {}
            }
        }
        cells.resize(lead, String::new());
        let gpus: Vec<String> = row.gpu_indexes.iter().map(i64::to_string).collect();
        let gpu_time = if row.kind == RowKind::Group {
            humantime::format_duration(std::time::Duration::from_secs(row.gpu_time_ms / 1000)).to_string()
        } else {
            String::new()
        };
        cells.extend([gpus.join(","), gpu_time, format!("{:.6}", row.energy_kwh), co2(row.g_co2), format!("{:.1}%", row.share_pct)]);
        t.add_row(cells);
    }
    let mut total = vec!["TOTAL".to_string()];
    total.resize(lead + 2, String::new());
    let share = if r.total_energy_mj > 0 { "100.0%" } else { "" };
    total.extend([format!("{:.6}", r.total_energy_kwh), co2(r.total_g_co2), share.to_string()]);
    t.add_row(total);
    out.push_str(&format!("{t}\n"));
    for note in &r.notes {
        out.push_str(&format!("note: {note}\n"));
    }
    out
}

fn by_name(by: GroupBy) -> &'static str {
    match by {
        GroupBy::Workload => "workload",
        GroupBy::User => "user",
        GroupBy::Service => "service",
        GroupBy::Gpu => "gpu",
    }
}

/// The report as CSV: one header line, a line per row, a `total` line.
fn report_csv(r: &Report) -> String {
    let mut out = String::from("kind,key,name,user,gpus,gpu_time_ms,energy_mj,energy_kwh,g_co2,share_pct\n");
    let g = |g: Option<f64>| g.map(|g| g.to_string()).unwrap_or_default();
    for row in &r.rows {
        let kind = match row.kind {
            RowKind::Group => by_name(r.by),
            RowKind::Idle => "idle",
            RowKind::Unattributed => "unattributed",
        };
        let gpus: Vec<String> = row.gpu_indexes.iter().map(i64::to_string).collect();
        let fields = [
            kind.to_string(),
            row.key.clone(),
            row.name.clone().unwrap_or_default(),
            row.user.clone().unwrap_or_default(),
            gpus.join(" "),
            row.gpu_time_ms.to_string(),
            row.energy_mj.to_string(),
            row.energy_kwh.to_string(),
            g(row.g_co2),
            row.share_pct.to_string(),
        ];
        out.push_str(&csv_line(&fields));
    }
    let total = ["total".to_string(), String::new(), String::new(), String::new(), String::new(), String::new(), r.total_energy_mj.to_string(), r.total_energy_kwh.to_string(), g(r.total_g_co2), String::new()];
    out.push_str(&csv_line(&total));
    out
}

/// One CSV line (RFC 4180): a field with a comma, quote, CR or LF is quoted, its quotes
/// doubled.
fn csv_line(fields: &[String]) -> String {
    let quoted: Vec<String> = fields
        .iter()
        .map(|f| if f.contains([',', '"', '\n', '\r']) { format!("\"{}\"", f.replace('"', "\"\"")) } else { f.clone() })
        .collect();
    format!("{}\n", quoted.join(","))
}

fn status_suffix(status: Status) -> &'static str {
    match status {
        Status::Fresh | Status::Override => "",
        Status::Cached => " (remembered)",
        Status::Fallback => "",
    }
}

fn show_plan(ctx: &Context, args: &PlanArgs) -> Result<()> {
    let budgets = budgets(ctx, args.budget)?;
    let nvml = open_nvml_to_look(ctx)?;
    let devices = host::devices(ctx, &nvml)?;
    let intensity = current_intensity(ctx, args.intensity, false)?;
    let host::BudgetPlan { plan, horizons } = make_plan(ctx, &devices, &intensity, budgets, false)?;
    if args.json {
        return print_json(&PlanView::of(&plan, &intensity, &horizons, &devices));
    }
    println!("{}", summary(&plan, &intensity));
    if !horizons.is_empty() {
        println!("{}", horizon_table(&horizons));
    }
    let mut t = table(["GPU", "WORKLOAD", "CLOCK", "POWER", "gCO2/h", "POWER MODEL"]);
    for gpu in &plan.gpus {
        t.add_row([
            gpu.index.to_string(),
            gpu.workload.clone().unwrap_or_else(|| "— (idle)".into()),
            format!("{} MHz ({}–{})", gpu.clock_mhz, gpu.min_clock_mhz, gpu.max_clock_mhz),
            format!("{:.0} W", gpu.power_w),
            format!("{:.1}", gpu.g_per_hour),
            model_of(&devices, gpu.index),
        ]);
    }
    println!("{t}");
    for note in &plan.notes {
        println!("note: {note}");
    }
    Ok(())
}

/// The daily and monthly budgets: what is left of them and what is allotted to now.
fn horizon_table(horizons: &[HorizonFigures]) -> comfy_table::Table {
    let mut t = table(["BUDGET", "UNTIL", "gCO2", "SPENT", "REMAINING", "PLANNED", "ALLOTTED NOW"]);
    for h in horizons {
        let spent = match h.spent_from {
            SpentFrom::History => format!("{:.0}", h.spent_g),
            SpentFrom::Plans => format!("{:.0} (plans)", h.spent_g),
        };
        t.add_row([
            format!("{}{}", h.period.adjective(), if h.feasible { "" } else { " — cannot be kept" }),
            h.end.with_timezone(&chrono::Local).format("%Y-%m-%d %H:%M %Z").to_string(),
            format!("{:.0}", h.budget_g),
            spent,
            format!("{:.0}", h.remaining_g),
            format!("{:.0}", h.planned_g),
            format!("{:.1} gCO2/h", h.allotted_g_per_hour_now),
        ]);
    }
    t
}

/// Which power model GPU `index` was planned with, in words.
fn model_of(devices: &[CarbonGpu], index: u32) -> String {
    devices.iter().find(|d| d.state.index == index).map_or_else(|| "default".into(), |d| d.model_source.to_string())
}

fn summary(plan: &ClockPlan, intensity: &Intensity) -> String {
    format!(
        "intensity {:.0} gCO2/kWh ({}), budget {:.1} gCO2/h, predicted {:.1} gCO2/h{}",
        plan.intensity,
        intensity.source,
        plan.budget_g_per_hour.unwrap_or(f64::INFINITY),
        plan.predicted_g_per_hour,
        if plan.budget_met { "" } else { " — the budget cannot be met" }
    )
}

fn apply(ctx: &Context, args: &PlanArgs) -> Result<()> {
    // The shipped config has no budget and the timer may be enabled all the same: nothing
    // to do is not a failure.
    if args.budget.is_none() && !ctx.config.carbon.has_budget() {
        vgpu_host::notice!("{}", no_budget_note(ctx));
        return Ok(());
    }
    let budgets = budgets(ctx, args.budget)?;
    let nvml = host::open_nvml(ctx)?;
    let devices = host::devices(ctx, &nvml)?;
    let intensity = current_intensity(ctx, args.intensity, true)?;
    let host::BudgetPlan { plan, horizons } = make_plan(ctx, &devices, &intensity, budgets, true)?;
    let store = AppliedStore::new(ctx.state_path(APPLIED_FILE));
    let (outcomes, save_error) = apply::apply_plan(&nvml, &devices, &plan, &store)?;
    let mut decision = Decision::applied(&plan, &intensity, outcomes, None);
    decision.horizons = horizons;
    // Logged at the time planned for: now, or VGPU_NOW under the simulated driver (so that
    // the spent figure assumed from the log counts it at that time).
    if ctx.simulate {
        decision.time = host::now(ctx)?;
    }
    for h in decision.horizons.iter().filter(|h| !h.feasible) {
        tracing::warn!(
            "the {} budget of {:.0} gCO2 cannot be kept: {:.0} g spent, and even the lowest clocks need {:.0} g more; lowest clocks applied",
            h.period.adjective(),
            h.budget_g,
            h.spent_g,
            h.min_needed_g
        );
    }
    if !plan.budget_met && decision.horizons.iter().all(|h| h.feasible) {
        tracing::warn!("the budget of {:.1} gCO2/h cannot be met: even the lowest clocks predict {:.1} gCO2/h; lowest clocks applied", plan.budget_g_per_hour.unwrap_or(0.0), plan.predicted_g_per_hour);
    }
    report(ctx, &decision, args.json, save_error, Some(summary(&plan, &intensity)))
}

fn reset(ctx: &Context, args: &ResetArgs) -> Result<()> {
    let nvml = host::open_nvml(ctx)?;
    let devices = host::devices(ctx, &nvml)?;
    let store = AppliedStore::new(ctx.state_path(APPLIED_FILE));
    let (outcomes, save_error) = apply::reset_all(&nvml, &devices, &store)?;
    let decision = Decision {
        time: Utc::now(),
        action: Action::Reset,
        intensity: None,
        intensity_source: None,
        budget_g_per_hour: None,
        predicted_g_per_hour: None,
        budget_met: None,
        notes: Vec::new(),
        gpus: outcomes,
        reason: None,
        horizons: Vec::new(),
    };
    report(ctx, &decision, args.json, save_error, None)
}

fn profile(ctx: &Context, args: &ProfileArgs) -> Result<()> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    anyhow::ensure!(vgpu_store::read_only::is_root(), "vgpu carbon profile locks the GPU's clocks: run it as root (e.g. with sudo)");
    let nvml = host::open_nvml(ctx)?;
    let cuda = ctx.driver_library_dir()?.map(|dir| dir.join(vgpu_host::paths::CUDA_SONAME));
    let store = AppliedStore::new(ctx.state_path(APPLIED_FILE));
    let signalled = Arc::new(AtomicUsize::new(0));
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        signal_hook::flag::register_usize(sig, Arc::clone(&signalled), sig as usize).context("installing the signal handlers")?;
    }
    let options = profile::Options { gpu: args.gpu, clocks: args.clocks, seconds: args.seconds, force: args.force };
    let result = profile::profile(&nvml, cuda.as_deref(), &store, &options, &|| signalled.load(Ordering::SeqCst) != 0);
    let report = match result {
        Ok(report) => report,
        Err(e @ (profile::ProfileError::BadClocks(_) | profile::ProfileError::BadSeconds(_))) => {
            return Err(UsageError::new(e.to_string()).into());
        }
        Err(e @ profile::ProfileError::Interrupted) => {
            let sig = i32::try_from(signalled.load(Ordering::SeqCst)).unwrap_or(libc::SIGTERM);
            vgpu_host::notice!("interrupted: the clocks are restored, nothing was stored");
            // Die of the signal, as without the handler (the caller sees how it ended).
            signal_hook::low_level::emulate_default_handler(sig).context("re-raising the signal")?;
            return Err(e.into());
        }
        Err(e) => return Err(e.into()),
    };
    let path = vgpu_history::db::path_in(&ctx.lib_dir);
    let conn = vgpu_history::db::open_rw(&ctx.lib_dir).context("opening the history database to store the fit")?;
    profile::save(&conn, &path, &report).context("storing the fit")?;
    for note in &report.notes {
        tracing::warn!("GPU {}: {note}", report.gpu_index);
    }
    if args.json {
        return print_json(&ProfileView::of(&report));
    }
    println!(
        "GPU {} ({}, {}): idle {:.1} W; {} s of load at each clock",
        report.gpu_index, report.gpu_name, report.gpu_uuid, report.idle_power_w, report.seconds_per_clock
    );
    let top = report.speed.throughput_at_max.max(f64::MIN_POSITIVE);
    let mut t = table(["CLOCK", "POWER", "FITTED", "KERNELS/S", "SPEED"]);
    for p in &report.points {
        let x = f64::from(p.clock_mhz) / f64::from(report.max_clock_mhz);
        t.add_row([
            format!("{} MHz", p.clock_mhz),
            format!("{:.1} W", p.power_w),
            format!("{:.1} W", report.power.at(x)),
            format!("{:.1}", p.throughput),
            format!("{:.3}", p.throughput / top),
        ]);
    }
    println!("{t}");
    println!(
        "fit: P_idle {:.1} W, P_max {:.1} W, γ {:.2} (rms error {:.1} W); speed σ {:.2}",
        report.power.idle_w, report.power.max_w, report.power.gamma, report.power.rms_error_w, report.speed.sigma
    );
    println!(
        "stored in {}: the model of this GPU, and of every \"{}\" without a profile of its own",
        path.display(),
        report.gpu_name
    );
    Ok(())
}

/// Print what happened, log it, and turn failures into one error line.
fn report(
    ctx: &Context,
    decision: &Decision,
    json: bool,
    save_error: Option<apply::ApplyError>,
    headline: Option<String>,
) -> Result<()> {
    if json {
        print_json(&DecisionView::of(decision))?;
    } else {
        if let Some(line) = headline {
            println!("{line}");
        }
        println!("{}", outcome_table(&decision.gpus));
    }
    for gpu in &decision.gpus {
        for note in &gpu.notes {
            tracing::warn!("GPU {}: {note}", gpu.index);
        }
    }
    if let Some(e) = save_error {
        tracing::warn!("{e}: the next apply will write the caps again");
    }
    // run() validated the config: the rotation settings are good.
    let rotation = ctx.config.carbon.log_rotation().unwrap_or_default();
    let logged = log::append(&ctx.lib_path(LOG_FILE), decision, rotation);
    vgpu_history::best_effort(&ctx.lib_dir, &ctx.config.history, "the clock decision", |h| h.record_decision(decision));
    let action = match decision.action {
        Action::Apply => "carbon apply",
        Action::Reset => "carbon reset",
    };
    let failed = failures(action, &decision.gpus);
    match (failed, logged) {
        (None, Ok(())) => Ok(()),
        (None, Err(e)) => Err(e).context("the caps are set but the decision was not logged"),
        (Some(failed), Ok(())) => Err(anyhow::anyhow!(failed)),
        (Some(failed), Err(e)) => Err(anyhow::anyhow!("{failed}; the decision was not logged: {e}")),
    }
}

fn outcome_table(gpus: &[GpuOutcome]) -> comfy_table::Table {
    let mut t = table(["GPU", "WORKLOAD", "CLOCK", "RESULT"]);
    for gpu in gpus {
        let result = match (&gpu.error, gpu.writes.is_empty()) {
            (Some(e), _) => format!("failed: {e}"),
            (None, true) => "unchanged".to_string(),
            (None, false) => gpu.writes.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
        };
        t.add_row([
            gpu.index.to_string(),
            gpu.workload.clone().unwrap_or_else(|| "—".into()),
            format!("{} / {} MHz", gpu.clock_mhz, gpu.max_clock_mhz),
            result,
        ]);
    }
    t
}

/// One line for every failed GPU, grouped by reason: "GPU 0, 1: NVML refused: …".
fn failures(action: &str, gpus: &[GpuOutcome]) -> Option<String> {
    let mut groups: Vec<(&str, Vec<u32>)> = Vec::new();
    for gpu in gpus {
        let Some(e) = gpu.error.as_deref() else {
            continue;
        };
        match groups.iter_mut().find(|(reason, _)| *reason == e) {
            Some((_, list)) => list.push(gpu.index),
            None => groups.push((e, vec![gpu.index])),
        }
    }
    if groups.is_empty() {
        return None;
    }
    let parts: Vec<String> = groups
        .into_iter()
        .map(|(reason, list)| {
            let list: Vec<String> = list.iter().map(u32::to_string).collect();
            let noun = if list.len() == 1 { "GPU" } else { "GPUs" };
            format!("{noun} {}: {reason}", list.join(", "))
        })
        .collect();
    Some(format!(
        "{action} failed on {} of {} GPUs: {}",
        gpus.iter().filter(|g| g.error.is_some()).count(),
        gpus.len(),
        parts.join("; ")
    ))
}

// The `--json` documents, in the vocabulary of every vgpu listing (`vgpu_json`):
// carbon.jsonl keeps the log's own form ([`Decision`]).

/// `carbon intensity --json`, and the `intensity_source` of the others.
#[derive(Serialize)]
struct IntensityView<'a> {
    intensity_g_per_kwh: f64,
    source: &'a str,
    status: &'a Status,
    /// The time the value is for.
    timestamp_unix_ms: i64,
    /// Why a remembered or fallback value is used.
    note: Option<&'a str>,
}

impl<'a> IntensityView<'a> {
    fn of(i: &'a Intensity) -> Self {
        IntensityView {
            intensity_g_per_kwh: i.intensity,
            source: &i.source,
            status: &i.status,
            timestamp_unix_ms: i.timestamp.timestamp_millis(),
            note: i.note.as_deref(),
        }
    }
}

/// `carbon intensity --forecast --json`.
#[derive(Serialize)]
struct ForecastView<'a> {
    source: &'a str,
    status: &'a Status,
    fetched_unix_ms: i64,
    /// Each figure from its start until the next one's (the last to the end).
    slots: Vec<ForecastSlotView>,
    note: Option<&'a str>,
}

#[derive(Serialize)]
struct ForecastSlotView {
    start_unix_ms: i64,
    intensity_g_per_kwh: f64,
}

impl<'a> ForecastView<'a> {
    fn of(f: &'a Forecast) -> Self {
        ForecastView {
            source: &f.source,
            status: &f.status,
            fetched_unix_ms: f.fetched_at.timestamp_millis(),
            slots: f
                .readings
                .iter()
                .map(|r| ForecastSlotView { start_unix_ms: r.timestamp.timestamp_millis(), intensity_g_per_kwh: r.g_per_kwh })
                .collect(),
            note: f.note.as_deref(),
        }
    }
}

/// `carbon plan --json`.
#[derive(Serialize)]
struct PlanView<'a> {
    intensity_g_per_kwh: f64,
    budget_g_per_hour: Option<f64>,
    predicted_g_per_hour: f64,
    predicted_power_w: f64,
    budget_met: bool,
    notes: &'a [String],
    gpus: Vec<GpuPlanView<'a>>,
    workloads: Vec<WorkloadPlanView<'a>>,
    intensity_source: IntensityView<'a>,
    /// The daily and monthly budgets (empty: a per-hour budget only).
    horizons: Vec<HorizonView>,
}

/// A daily or monthly budget's figures, in `carbon plan|apply --json`.
#[derive(Serialize)]
struct HorizonView {
    period: Period,
    start_unix_ms: i64,
    end_unix_ms: i64,
    budget_g: f64,
    spent_g: f64,
    spent_from: SpentFrom,
    remaining_g: f64,
    planned_g: f64,
    min_needed_g: f64,
    allotted_g_per_hour_now: f64,
    feasible: bool,
}

impl HorizonView {
    fn of(h: &HorizonFigures) -> Self {
        HorizonView {
            period: h.period,
            start_unix_ms: h.start.timestamp_millis(),
            end_unix_ms: h.end.timestamp_millis(),
            budget_g: h.budget_g,
            spent_g: h.spent_g,
            spent_from: h.spent_from,
            remaining_g: h.remaining_g,
            planned_g: h.planned_g,
            min_needed_g: h.min_needed_g,
            allotted_g_per_hour_now: h.allotted_g_per_hour_now,
            feasible: h.feasible,
        }
    }
}

#[derive(Serialize)]
struct GpuPlanView<'a> {
    gpu_index: u32,
    /// The workload on it (its name; `pid N` for a process outside vgpu); null: idle.
    workload_name: Option<&'a str>,
    clock_mhz: u32,
    min_clock_mhz: u32,
    max_clock_mhz: u32,
    power_w: f64,
    g_per_hour: f64,
    /// The power model it was planned with: "default", "config", or "measured DAY on GPU-…".
    power_model: String,
    /// `default`, `config` or `measured`.
    power_model_source: &'static str,
}

#[derive(Serialize)]
struct WorkloadPlanView<'a> {
    /// Its name (`pid N` for a process outside vgpu): what the planner knows it by.
    name: &'a str,
    /// Empty: not placed.
    gpu_indexes: &'a [u32],
    clock_mhz: Option<u32>,
    /// Modelled completion time, in the planner's units of work per throughput.
    completion_time: Option<f64>,
}

impl<'a> PlanView<'a> {
    fn of(plan: &'a ClockPlan, intensity: &'a Intensity, horizons: &[HorizonFigures], devices: &[CarbonGpu]) -> Self {
        PlanView {
            intensity_g_per_kwh: plan.intensity,
            budget_g_per_hour: plan.budget_g_per_hour,
            predicted_g_per_hour: plan.predicted_g_per_hour,
            predicted_power_w: plan.predicted_power_w,
            budget_met: plan.budget_met,
            notes: &plan.notes,
            gpus: plan
                .gpus
                .iter()
                .map(|g| GpuPlanView {
                    gpu_index: g.index,
                    workload_name: g.workload.as_deref(),
                    clock_mhz: g.clock_mhz,
                    min_clock_mhz: g.min_clock_mhz,
                    max_clock_mhz: g.max_clock_mhz,
                    power_w: g.power_w,
                    g_per_hour: g.g_per_hour,
                    power_model: model_of(devices, g.index),
                    power_model_source: match devices.iter().find(|d| d.state.index == g.index).map(|d| &d.model_source) {
                        Some(apply::ModelSource::Measured { .. }) => "measured",
                        Some(apply::ModelSource::Config) => "config",
                        _ => "default",
                    },
                })
                .collect(),
            workloads: plan
                .workloads
                .iter()
                .map(|w| WorkloadPlanView { name: &w.id, gpu_indexes: &w.gpus, clock_mhz: w.clock_mhz, completion_time: w.completion_time })
                .collect(),
            intensity_source: IntensityView::of(intensity),
            horizons: horizons.iter().map(HorizonView::of).collect(),
        }
    }
}

/// `carbon apply|reset --json`.
#[derive(Serialize)]
struct DecisionView<'a> {
    time_unix_ms: i64,
    action: &'a Action,
    intensity_g_per_kwh: Option<f64>,
    intensity_source: Option<IntensityView<'a>>,
    budget_g_per_hour: Option<f64>,
    predicted_g_per_hour: Option<f64>,
    budget_met: Option<bool>,
    notes: &'a [String],
    gpus: Vec<OutcomeView<'a>>,
    /// As in `carbon plan --json`.
    horizons: Vec<HorizonView>,
}

#[derive(Serialize)]
struct OutcomeView<'a> {
    gpu_index: u32,
    gpu_uuid: &'a str,
    /// The workload on it, by name; null: idle.
    workload_name: Option<&'a str>,
    clock_mhz: u32,
    max_clock_mhz: u32,
    power_w: Option<f64>,
    g_per_hour: Option<f64>,
    cap: &'a Option<apply::Cap>,
    writes: &'a [apply::Write],
    notes: &'a [String],
    error: Option<&'a str>,
}

impl<'a> DecisionView<'a> {
    fn of(d: &'a Decision) -> Self {
        DecisionView {
            time_unix_ms: d.time.timestamp_millis(),
            action: &d.action,
            intensity_g_per_kwh: d.intensity,
            intensity_source: d.intensity_source.as_ref().map(IntensityView::of),
            budget_g_per_hour: d.budget_g_per_hour,
            predicted_g_per_hour: d.predicted_g_per_hour,
            budget_met: d.budget_met,
            notes: &d.notes,
            gpus: d
                .gpus
                .iter()
                .map(|g| OutcomeView {
                    gpu_index: g.index,
                    gpu_uuid: &g.uuid,
                    workload_name: g.workload.as_deref(),
                    clock_mhz: g.clock_mhz,
                    max_clock_mhz: g.max_clock_mhz,
                    power_w: g.power_w,
                    g_per_hour: g.g_per_hour,
                    cap: &g.cap,
                    writes: &g.writes,
                    notes: &g.notes,
                    error: g.error.as_deref(),
                })
                .collect(),
            horizons: d.horizons.iter().map(HorizonView::of).collect(),
        }
    }
}

/// `carbon profile --json`.
#[derive(Serialize)]
struct ProfileView<'a> {
    gpu_index: u32,
    gpu_uuid: &'a str,
    gpu_name: &'a str,
    measured_unix_ms: i64,
    max_clock_mhz: u32,
    idle_power_w: f64,
    energy_source: &'a str,
    seconds_per_clock: f64,
    points: Vec<ProfilePointView>,
    fit: ProfileFitView,
    restored: &'a profile::Restored,
    notes: &'a [String],
}

#[derive(Serialize)]
struct ProfilePointView {
    clock_mhz: u32,
    power_w: f64,
    fitted_power_w: f64,
    /// Calibration kernels completed per second.
    throughput_per_s: f64,
}

#[derive(Serialize)]
struct ProfileFitView {
    idle_w: f64,
    max_w: f64,
    gamma: f64,
    rms_error_w: f64,
    speed_sigma: f64,
}

impl<'a> ProfileView<'a> {
    fn of(r: &'a profile::Report) -> Self {
        ProfileView {
            gpu_index: r.gpu_index,
            gpu_uuid: &r.gpu_uuid,
            gpu_name: &r.gpu_name,
            measured_unix_ms: r.measured_ms,
            max_clock_mhz: r.max_clock_mhz,
            idle_power_w: r.idle_power_w,
            energy_source: r.energy_source,
            seconds_per_clock: r.seconds_per_clock,
            points: r
                .points
                .iter()
                .map(|p| ProfilePointView {
                    clock_mhz: p.clock_mhz,
                    power_w: p.power_w,
                    fitted_power_w: r.power.at(f64::from(p.clock_mhz) / f64::from(r.max_clock_mhz)),
                    throughput_per_s: p.throughput,
                })
                .collect(),
            fit: ProfileFitView {
                idle_w: r.power.idle_w,
                max_w: r.power.max_w,
                gamma: r.power.gamma,
                rms_error_w: r.power.rms_error_w,
                speed_sigma: r.speed.sigma,
            },
            restored: &r.restored,
            notes: &r.notes,
        }
    }
}
