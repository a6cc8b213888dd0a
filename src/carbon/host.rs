//! What the planner plans with on this host: its GPUs (through NVML), the workloads on them
//! (the store's records, and everything else the driver sees), the model's tunables and the
//! grid's intensity now.

use anyhow::{Context as _, Result};
use chrono::{DateTime, Utc};

use crate::carbon::apply::{self, CarbonGpu};
use crate::carbon::planner::{self, ClockPlan, PlanRequest};
use crate::carbon::config::CarbonConfig;
use crate::carbon::intensity::cache::{Cache, CACHE_FILE, FORECAST_FILE};
use crate::carbon::intensity::{self, Forecast, Intensity, Policy, Status};
use crate::carbon::budget::{self, HorizonFigures, Period, SpentFrom};
use crate::carbon::horizon::{self, HorizonRequest};
use crate::carbon::log::{self, LOG_FILE};
use crate::history::store::IntensityKind;
use crate::carbon::model::Tunables;
use crate::carbon::workload::{current, Recorded, PlannedWorkload};
use crate::context::Context;
use crate::error::UsageError;
use crate::gpu::Nvml;
use crate::state::{Store, WorkloadState};

/// The configured source's remembered reading (within `max_age`), else its `fallback`,
/// without reading the source: for a re-plan made with the store lock held, which must not
/// keep every other command waiting on the network (the lock's own wait, 5 s by default, is
/// shorter than a source's default timeout, 10 s).
pub fn remembered_intensity(ctx: &Context, now: DateTime<Utc>) -> Result<Intensity> {
    let config = &ctx.config.carbon;
    let source = intensity::from_config(config).map_err(|e| UsageError::new(e.to_string()))?;
    let not_read = intensity::NotRead(source.describe());
    let cache = Cache::new(ctx.lib_path(CACHE_FILE));
    let policy = Policy { cache: &cache, max_age: config.max_age()?, fallback: config.fallback, remember: false };
    let found = intensity::resolve(&not_read, &policy, now)?;
    record_intensity(ctx, &found, now);
    Ok(found)
}

/// The intensity a decision is made with, in the history (best effort).
fn record_intensity(ctx: &Context, found: &Intensity, now: DateTime<Utc>) {
    let now_ms = now.timestamp_millis().max(0) as u64;
    crate::history::best_effort(&ctx.lib_dir, &ctx.config.history, "the carbon intensity", |h| h.record_resolved(found, now_ms));
}

/// The environment variable that fixes "now" for the carbon commands (the time planned
/// for, and the logged decisions' time), RFC 3339; read only under the simulated driver
/// (`--simulate`): for tests, which must plan at a chosen time of a forecast. Never on a
/// real host.
pub const NOW_VAR: &str = "VGPU_NOW";

/// The time the carbon commands plan for: now, or [`NOW_VAR`] under the simulated driver.
pub fn now(ctx: &Context) -> Result<DateTime<Utc>> {
    if !ctx.simulate {
        return Ok(Utc::now());
    }
    match std::env::var(NOW_VAR) {
        Ok(text) => intensity::parse_timestamp(&text)
            .ok_or_else(|| UsageError::new(format!("{NOW_VAR}={text:?} is not a time like 2024-05-01T12:00:00Z")).into()),
        Err(_) => Ok(Utc::now()),
    }
}

/// The configured source's forecast for [now, until), with its fallbacks (the remembered
/// forecast, then flat at `current`); `remember` (root): cache a fresh one and record it in
/// the history database (best effort: a failure is logged at `info`).
pub fn forecast(ctx: &Context, now: DateTime<Utc>, until: DateTime<Utc>, current: &Intensity, remember: bool) -> Result<Forecast> {
    let config = &ctx.config.carbon;
    let cache = Cache::new(ctx.lib_path(FORECAST_FILE));
    let policy = Policy { cache: &cache, max_age: config.max_age()?, fallback: config.fallback, remember };
    let found = if current.status == Status::Override {
        Forecast::flat(current, now, None)
    } else {
        let source = intensity::from_config(config).map_err(|e| UsageError::new(e.to_string()))?;
        intensity::resolve_forecast(source.as_ref(), &policy, now, until, current)
    };
    if remember && found.status == Status::Fresh {
        crate::history::best_effort(&ctx.lib_dir, &ctx.config.history, "the forecast", |h| {
            let fetched_ms = found.fetched_at.timestamp_millis().max(0) as u64;
            for r in &found.readings {
                let ts_ms = r.timestamp.timestamp_millis().max(0) as u64;
                h.record_intensity(IntensityKind::Forecast, ts_ms, r.g_per_kwh, &found.source, fetched_ms)?;
            }
            Ok(())
        });
    }
    Ok(found)
}

/// Grams spent in [start, now): measured from the history database when it has GPU samples
/// in the range, else assumed from the decision log (the logged plans kept), with a note
/// saying so. `current_g_per_kwh` prices energy recorded before any intensity.
pub fn spent_since(ctx: &Context, start: DateTime<Utc>, now: DateTime<Utc>, current_g_per_kwh: f64) -> (f64, SpentFrom, Option<String>) {
    use crate::history::{db, spent};
    let why = match db::open_ro(&ctx.lib_dir) {
        Ok(Some(conn)) => {
            let path = db::path_in(&ctx.lib_dir);
            match spent::spent(&conn, &path, start.timestamp_millis(), now.timestamp_millis(), current_g_per_kwh) {
                Ok(found) if found.samples > 0 => {
                    let note = (found.unpriced_kwh > 0.0).then(|| {
                        format!(
                            "{:.3} kWh of the history has no recorded intensity before it: priced at the intensity now ({current_g_per_kwh:.0} gCO2/kWh)",
                            found.unpriced_kwh
                        )
                    });
                    return (found.grams, SpentFrom::History, note);
                }
                Ok(_) => format!("the history has no GPU samples since {} (is vgpu watch running?)", start.to_rfc3339()),
                Err(e) => format!("the history cannot be read ({e})"),
            }
        }
        Ok(None) => "there is no history database (vgpu watch records it)".to_string(),
        Err(e) => format!("the history cannot be read ({e})"),
    };
    let rotation = ctx.config.carbon.log_rotation().unwrap_or_default();
    let grams = match log::read_history(&ctx.lib_path(LOG_FILE), rotation.keep) {
        Ok((decisions, _)) => spent::spent_from_log(&decisions, start, now),
        Err(e) => {
            return (0.0, SpentFrom::Plans, Some(format!("{why}, and the decision log cannot be read ({e}): nothing counted as spent")));
        }
    };
    (grams, SpentFrom::Plans, Some(format!("{why}: the spent figure assumes the logged plans were kept")))
}

/// The budgets to plan for now: the per-hour one (`--budget` or the config's) and the
/// config's daily and monthly ones.
#[derive(Debug, Clone, Copy, Default)]
pub struct Budgets {
    pub per_hour: Option<f64>,
    pub per_day: Option<f64>,
    pub per_month: Option<f64>,
}

impl Budgets {
    pub fn of(config: &CarbonConfig, per_hour: Option<f64>) -> Budgets {
        Budgets { per_hour: per_hour.or(config.budget_g_per_hour), per_day: config.budget_g_per_day, per_month: config.budget_g_per_month }
    }

    pub fn any(&self) -> bool {
        self.per_hour.is_some() || self.per_day.is_some() || self.per_month.is_some()
    }

    fn horizons(&self) -> Vec<(Period, f64)> {
        [(Period::Day, self.per_day), (Period::Month, self.per_month)].into_iter().filter_map(|(p, b)| b.map(|b| (p, b))).collect()
    }
}

/// A plan for every budget: the per-hour one as it is; each daily or monthly one allotted
/// over its horizon by the forecast ([`super::horizon::allot`]) with what was spent so far;
/// the tightest rate binds. A horizon budget that cannot be kept: lowest clocks, the plan's
/// `budget_met` false and a note with the figures.
pub struct BudgetPlan {
    pub plan: ClockPlan,
    pub horizons: Vec<HorizonFigures>,
}

/// The per-hour rate `budgets` allow now: the per-hour budget, and each daily or monthly
/// one's allotment for now (0 when it cannot be kept), the least of them.
pub struct Allotted {
    /// gCO2/h; `None`: no budget at all.
    pub rate: Option<f64>,
    pub horizons: Vec<HorizonFigures>,
    /// The forecast's, the spent figure's and the allotments' notes.
    pub notes: Vec<String>,
}

/// Allot `budgets` at `now` for `workloads` (`ask_source`: read the forecast from the
/// source; else the remembered one or flat, as under the store lock; `remember`: cache and
/// record it).
#[allow(clippy::too_many_arguments)]
pub fn allot_budgets(
    ctx: &Context,
    workloads: &[PlannedWorkload],
    devices: &[CarbonGpu],
    intensity: &Intensity,
    budgets: Budgets,
    now: DateTime<Utc>,
    ask_source: bool,
    remember: bool,
) -> Result<Allotted> {
    let horizons = budgets.horizons();
    if horizons.is_empty() {
        return Ok(Allotted { rate: budgets.per_hour, horizons: Vec::new(), notes: Vec::new() });
    }
    let ends: Vec<(DateTime<Utc>, DateTime<Utc>)> = horizons.iter().map(|(p, _)| budget::bounds(*p, now)).collect();
    let until = ends.iter().map(|(_, end)| *end).max().unwrap_or(now);
    let found = if ask_source {
        forecast(ctx, now, until, intensity, remember)?
    } else {
        remembered_forecast(ctx, now, until, intensity)?
    };
    let models: Vec<_> = devices.iter().map(|d| d.model.clone()).collect();
    let tunables = tunables(&ctx.config.carbon)?;
    let mut notes: Vec<String> = found.note.iter().cloned().collect();
    let mut figures = Vec::new();
    let mut rate = budgets.per_hour.unwrap_or(f64::INFINITY);
    for ((period, budget_g), (start, end)) in horizons.into_iter().zip(ends) {
        let slots = budget::slots(&found, intensity.intensity, now, end);
        let (spent_g, spent_from, spent_note) = spent_since(ctx, start, now, intensity.intensity);
        notes.extend(spent_note.map(|n| format!("{} budget: {n}", period.adjective())));
        let request = HorizonRequest {
            gpus: &models,
            workloads,
            tunables,
            budget_g,
            spent_g,
            slots: &slots,
            rate_cap_g_per_hour: budgets.per_hour,
            forecast_margin: horizon::DEFAULT_FORECAST_MARGIN,
        };
        let allotment = horizon::allot(&request).with_context(|| format!("allotting the {} budget", period.adjective()))?;
        notes.extend(allotment.notes.iter().map(|n| format!("{} budget: {n}", period.adjective())));
        rate = rate.min(if allotment.feasible { allotment.g_per_hour_now } else { 0.0 });
        figures.push(HorizonFigures {
            period,
            start,
            end,
            budget_g,
            spent_g,
            spent_from,
            remaining_g: allotment.remaining_g,
            planned_g: allotment.planned_g,
            min_needed_g: allotment.min_needed_g,
            allotted_g_per_hour_now: allotment.g_per_hour_now,
            feasible: allotment.feasible,
        });
    }
    Ok(Allotted { rate: Some(rate), horizons: figures, notes })
}

/// Plan for `budgets` at `now` ([`allot_budgets`], then the planner at the rate allotted).
#[allow(clippy::too_many_arguments)]
pub fn plan_budgets(
    ctx: &Context,
    workloads: &[PlannedWorkload],
    devices: &[CarbonGpu],
    intensity: &Intensity,
    budgets: Budgets,
    now: DateTime<Utc>,
    ask_source: bool,
    remember: bool,
) -> Result<BudgetPlan> {
    let Allotted { rate, horizons, mut notes } =
        allot_budgets(ctx, workloads, devices, intensity, budgets, now, ask_source, remember)?;
    let mut plan = plan_for(ctx, workloads, devices, intensity, rate.context("no carbon budget")?)?;
    if horizons.iter().any(|f| !f.feasible) {
        plan.budget_met = false;
    }
    notes.append(&mut plan.notes);
    plan.notes = notes;
    Ok(BudgetPlan { plan, horizons })
}

/// The remembered forecast (within `max_age`), else flat at `current`, without asking the
/// source: for a re-plan made with the store lock held.
pub fn remembered_forecast(ctx: &Context, now: DateTime<Utc>, until: DateTime<Utc>, current: &Intensity) -> Result<Forecast> {
    let config = &ctx.config.carbon;
    let source = intensity::from_config(config).map_err(|e| UsageError::new(e.to_string()))?;
    let not_read = intensity::NotRead(source.describe());
    let cache = Cache::new(ctx.lib_path(FORECAST_FILE));
    let policy = Policy { cache: &cache, max_age: config.max_age()?, fallback: config.fallback, remember: false };
    Ok(intensity::resolve_forecast(&not_read, &policy, now, until, current))
}

/// What is said when NVML cannot be loaded.
pub const NO_DRIVER: &str = "no NVIDIA driver found (libnvidia-ml.so.1 not loadable); try --simulate";

/// The power and speed model's tunables, from the config (bad ones are usage errors).
pub fn tunables(config: &CarbonConfig) -> Result<Tunables> {
    config.model_defaults().map_err(|e| UsageError::new(e.to_string()).into())
}

/// The intensity from the configured source, with its fallbacks; `remember`: cache a fresh
/// reading.
pub fn intensity_now(ctx: &Context, now: DateTime<Utc>, remember: bool) -> Result<Intensity> {
    let found = resolve_intensity(ctx, now, remember)?;
    if let Some(note) = &found.note {
        tracing::warn!("{note}");
    }
    Ok(found)
}

/// [`intensity_now`] without the warning: why a remembered or fallback value is used is in
/// its `note`.
pub fn resolve_intensity(ctx: &Context, now: DateTime<Utc>, remember: bool) -> Result<Intensity> {
    let config = &ctx.config.carbon;
    let source = intensity::from_config(config).map_err(|e| UsageError::new(e.to_string()))?;
    let cache = Cache::new(ctx.lib_path(CACHE_FILE));
    let policy = Policy { cache: &cache, max_age: config.max_age()?, fallback: config.fallback, remember };
    let found = intensity::resolve(source.as_ref(), &policy, now)?;
    // Commands that only look (`plan`, remember = false) write nothing.
    if remember {
        record_intensity(ctx, &found, now);
    }
    Ok(found)
}

/// NVML, as root may use it.
pub fn open_nvml(ctx: &Context) -> Result<Nvml> {
    ctx.nvml()?.context(NO_DRIVER)
}

/// The GPUs, as the planner models them.
pub fn devices(ctx: &Context, nvml: &Nvml) -> Result<Vec<CarbonGpu>> {
    let config = &ctx.config.carbon;
    let devices = apply::read_devices(nvml, config, &tunables(config)?).context("reading the GPUs")?;
    anyhow::ensure!(!devices.is_empty(), "the NVIDIA driver reports no GPUs");
    Ok(devices)
}

/// The workloads to plan for: those `vgpu run` recorded (running ones, with a live
/// supervisor), and every other GPU with compute processes as one workload.
pub fn workloads(ctx: &Context, devices: &[CarbonGpu]) -> Vec<PlannedWorkload> {
    workloads_in(&Store::new(&ctx.state_dir, &ctx.lib_dir), devices)
}

/// [`workloads`], from the records of `store`.
pub fn workloads_in(store: &Store, devices: &[CarbonGpu]) -> Vec<PlannedWorkload> {
    let (stored, damaged) = store.workloads();
    for e in damaged {
        tracing::warn!("{e}");
    }
    let recorded: Vec<Recorded> = stored
        .iter()
        .filter(|w| matches!(w.state, WorkloadState::Running | WorkloadState::Starting) && w.supervisor_alive())
        .map(|w| Recorded {
            id: if w.name.is_empty() { w.id.clone() } else { w.name.clone() },
            gpus: w.gpus.iter().map(|g| g.index).collect(),
            freq_sensitivity: w.freq_sensitivity,
        })
        .collect();
    let gpu_pids: Vec<(u32, Vec<u32>)> = devices.iter().map(|d| (d.state.index, d.pids.clone())).collect();
    current(&recorded, gpu_pids)
}

/// The clock plan for `budget` (gCO2/h) at `intensity`, for the host's workloads now.
pub fn plan(ctx: &Context, devices: &[CarbonGpu], intensity: &Intensity, budget: f64) -> Result<ClockPlan> {
    plan_for(ctx, &workloads(ctx, devices), devices, intensity, budget)
}

/// The clock plan for `budget` (gCO2/h) at `intensity`, for `workloads`.
pub fn plan_for(
    ctx: &Context,
    workloads: &[PlannedWorkload],
    devices: &[CarbonGpu],
    intensity: &Intensity,
    budget: f64,
) -> Result<ClockPlan> {
    let models: Vec<_> = devices.iter().map(|d| d.model.clone()).collect();
    let request = PlanRequest {
        gpus: &models,
        workloads,
        intensity: intensity.intensity,
        budget_g_per_hour: Some(budget),
        tunables: tunables(&ctx.config.carbon)?,
    };
    let plan = planner::plan(&request).context("planning")?;
    for step in &plan.steps {
        tracing::debug!("stage {} step: workload {} benefit {:.3e}", step.stage, workloads[step.workload].id, step.benefit);
    }
    Ok(plan)
}
