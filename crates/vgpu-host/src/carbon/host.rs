//! What the planner plans with on this host: its GPUs (through NVML), the workloads on them
//! (the store's records, and everything else the driver sees), the model's tunables and the
//! grid's intensity now.

use anyhow::{Context as _, Result};
use chrono::{DateTime, Utc};

use vgpu_carbon::apply;

use vgpu_carbon::apply::CarbonGpu;

use vgpu_carbon::apply::ModelSource;
use vgpu_carbon::planner;
use vgpu_carbon::planner::ClockPlan;
use vgpu_carbon::planner::PlanRequest;
use vgpu_carbon::config::CarbonConfig;
use vgpu_carbon::intensity::cache::Cache;
use vgpu_carbon::intensity::cache::CACHE_FILE;
use vgpu_carbon::intensity::cache::FORECAST_FILE;
use vgpu_carbon::intensity;
use vgpu_carbon::intensity::Forecast;
use vgpu_carbon::intensity::Intensity;
use vgpu_carbon::intensity::Policy;
use vgpu_carbon::intensity::Status;
use vgpu_carbon::budget;
use vgpu_carbon::budget::HorizonFigures;
use vgpu_carbon::budget::Period;
use vgpu_carbon::budget::SpentFrom;
use vgpu_carbon::horizon;
use vgpu_carbon::horizon::HorizonRequest;
use vgpu_carbon::log;
use vgpu_carbon::log::LOG_FILE;
use vgpu_history::store::IntensityKind;
use vgpu_carbon::model::GpuModel;
use vgpu_carbon::model::Tunables;
use crate::carbon::profile;
use crate::carbon::sensitivity;
use vgpu_carbon::workload::current;
use vgpu_carbon::workload::Recorded;
use vgpu_carbon::workload::PlannedWorkload;
use crate::context::Context;
use vgpu_store::error::UsageError;
use vgpu_gpu::Nvml;
use vgpu_store::state::Store;
use vgpu_store::state::WorkloadState;

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
    vgpu_history::best_effort(&ctx.lib_dir, &ctx.config.history, "the carbon intensity", |h| h.record_resolved(found, now_ms));
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
        vgpu_history::best_effort(&ctx.lib_dir, &ctx.config.history, "the forecast", |h| {
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
    use vgpu_history::db;
    use vgpu_history::spent;
    let why = match vgpu_history::reader::open_ro(&ctx.lib_dir) {
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
/// over its horizon by the forecast ([`vgpu_carbon::horizon::allot`]) with what was spent so far;
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
            power_margin: horizon::DEFAULT_POWER_MARGIN,
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

/// The GPUs, as the planner models them: each with its measured power model where
/// `vgpu carbon profile` made one ([`use_measured`]).
pub fn devices(ctx: &Context, nvml: &Nvml) -> Result<Vec<CarbonGpu>> {
    let config = &ctx.config.carbon;
    let mut devices = apply::read_devices(nvml, config, &tunables(config)?).context("reading the GPUs")?;
    anyhow::ensure!(!devices.is_empty(), "the NVIDIA driver reports no GPUs");
    match vgpu_history::reader::open_ro(&ctx.lib_dir) {
        Ok(Some(conn)) => use_measured(&conn, config, &mut devices),
        Ok(None) => {}
        Err(e) => tracing::warn!("the measured power models are not used: {e}"),
    }
    Ok(devices)
}

/// Give each GPU its measured power model, in this order: `[carbon]` `power_idle_w`,
/// `power_max_w` and `gamma` where set; else the GPU's own `vgpu carbon profile` fit; else
/// the newest fit of a GPU of the same name; else the defaults.
pub fn use_measured(conn: &rusqlite::Connection, config: &CarbonConfig, devices: &mut [CarbonGpu]) {
    for dev in devices.iter_mut() {
        let found = match profile::find(conn, &dev.state.uuid, &dev.name) {
            Ok(Some(m)) => m,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!("GPU {}: the measured power model is not used: {e}", dev.state.index);
                continue;
            }
        };
        let overrides: Vec<&'static str> = [
            ("power_idle_w", config.power_idle_w.is_some()),
            ("power_max_w", config.power_max_w.is_some()),
            ("gamma", config.gamma.is_some()),
        ]
        .into_iter()
        .filter_map(|(k, set)| set.then_some(k))
        .collect();
        if overrides.len() == 3 {
            continue;
        }
        let max_w = config.power_max_w.unwrap_or(found.max_w);
        let idle_w = config.power_idle_w.unwrap_or(found.idle_w).min(max_w);
        let gamma = config.gamma.unwrap_or(found.gamma);
        match GpuModel::new(dev.state.index, dev.model.clocks_mhz.clone(), idle_w, max_w, gamma) {
            Ok(model) => {
                dev.model = model;
                dev.model_source =
                    ModelSource::Measured { gpu_uuid: found.gpu_uuid, measured_ms: found.measured_ms, overrides };
            }
            Err(e) => tracing::warn!("GPU {}: the measured power model is not used: {e}", dev.state.index),
        }
    }
}

/// The workloads to plan for: those `vgpu run` recorded (running ones, with a live
/// supervisor), and every other GPU with compute processes as one workload.
pub fn workloads(ctx: &Context, devices: &[CarbonGpu]) -> Vec<PlannedWorkload> {
    workloads_in(&Store::new(&ctx.state_dir, &ctx.lib_dir), devices)
}

/// Learn each workload's σ from the history (`vgpu watch`'s records) and store it
/// ([`sensitivity::update`]). Failures are logged, never fatal: planning goes on with what
/// was stored before. Does nothing when there is no history yet.
pub fn learn_sensitivities(lib_dir: &std::path::Path, devices: &[CarbonGpu]) {
    let path = vgpu_history::db::path_in(lib_dir);
    if !path.exists() {
        return;
    }
    let max_clock = |uuid: &str| devices.iter().find(|d| d.state.uuid == uuid).map(|d| d.model.max_clock());
    let learned = vgpu_history::db::open_rw(lib_dir)
        .and_then(|mut conn| sensitivity::update(&mut conn, &path, Utc::now().timestamp_millis(), &max_clock));
    match learned {
        Ok(results) => {
            for (key, result) in results {
                tracing::debug!("frequency sensitivity of {key}: {result:?}");
            }
        }
        Err(e) => tracing::warn!("frequency sensitivities not learned: {e}"),
    }
}

/// [`workloads`], from the records of `store`. A workload without `--freq-sensitivity`
/// gets its learned σ (`workload_sensitivity`, by service, then name, then id), if any.
pub fn workloads_in(store: &Store, devices: &[CarbonGpu]) -> Vec<PlannedWorkload> {
    let history = match vgpu_history::reader::open_ro(&store.lib_dir) {
        Ok(conn) => conn,
        Err(e) => {
            tracing::warn!("learned frequency sensitivities are not used: {e}");
            None
        }
    };
    let learned = |w: &vgpu_store::state::Workload| -> Option<f64> {
        let conn = history.as_ref()?;
        let key = sensitivity::key(w.service.as_ref().map(|s| s.name.as_str()), &w.name, &w.id);
        sensitivity::stored(conn, &key).unwrap_or_else(|e| {
            tracing::warn!("the learned frequency sensitivity of {key} is not used: {e}");
            None
        })
    };
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
            freq_sensitivity: w.freq_sensitivity.or_else(|| learned(w)),
        })
        .collect();
    let gpu_pids: Vec<(u32, Vec<u32>)> = devices.iter().map(|d| (d.state.index, d.pids.clone())).collect();
    current(&recorded, gpu_pids)
}

/// The host's workloads now, for `carbon plan` and `apply`. As root, the learned frequency
/// sensitivities are brought up to date from the history first ([`learn_sensitivities`]);
/// the re-plans of `vgpu run` only read them ([`workloads`]), adding no work to a start.
pub fn workloads_learned(ctx: &Context, devices: &[CarbonGpu]) -> Vec<PlannedWorkload> {
    if vgpu_store::read_only::is_root() {
        learn_sensitivities(&ctx.lib_dir, devices);
    }
    workloads(ctx, devices)
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

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_carbon::apply::DeviceState;
    use vgpu_carbon::fit::Point;
    use vgpu_carbon::fit::PowerFit;
    use vgpu_carbon::fit::SpeedFit;
    use crate::carbon::profile::Report;
    use crate::carbon::profile::Restored;

    fn gpu(index: u32, uuid: &str, name: &str) -> CarbonGpu {
        CarbonGpu {
            state: DeviceState {
                index,
                uuid: uuid.into(),
                persistence: None,
                power_limit_mw: None,
                default_power_limit_mw: None,
                power_limit_range_mw: None,
            },
            model: GpuModel::new(index, vec![345, 1980], 105.0, 700.0, 2.0).unwrap(),
            name: name.into(),
            pids: vec![],
            model_source: ModelSource::Default,
        }
    }

    fn measured(uuid: &str, name: &str) -> Report {
        Report {
            gpu_index: 0,
            gpu_uuid: uuid.into(),
            gpu_name: name.into(),
            measured_ms: 1_795_000_000_000,
            max_clock_mhz: 1980,
            idle_power_w: 60.0,
            energy_source: "counter",
            seconds_per_clock: 2.0,
            points: vec![Point { clock_mhz: 1980, power_w: 690.0, throughput: 1.0 }],
            power: PowerFit { idle_w: 71.0, max_w: 690.0, gamma: 2.6, rms_error_w: 1.0 },
            speed: SpeedFit { sigma: 0.8, throughput_at_max: 1.0 },
            restored: Restored::Unlocked,
            notes: vec![],
        }
    }

    #[test]
    fn measured_models_by_uuid_then_name_and_config_keys_win() {
        let dir = tempfile::tempdir().unwrap();
        let conn = vgpu_history::db::open_rw(dir.path()).unwrap();
        profile::save(&conn, &vgpu_history::db::path_in(dir.path()), &measured("GPU-a", "H100")).unwrap();
        let fresh = || vec![gpu(0, "GPU-a", "H100"), gpu(1, "GPU-b", "H100"), gpu(2, "GPU-c", "A100")];

        let mut devices = fresh();
        use_measured(&conn, &CarbonConfig::default(), &mut devices);
        for d in &devices[..2] {
            assert_eq!((d.model.idle_w, d.model.max_w, d.model.gamma), (71.0, 690.0, 2.6), "{}", d.state.uuid);
            assert!(matches!(&d.model_source, ModelSource::Measured { gpu_uuid, .. } if gpu_uuid == "GPU-a"));
        }
        assert_eq!(devices[1].model_source.to_string(), "measured 2026-11-18 on GPU-a", "GPU-b borrows its model's fit");
        assert_eq!((devices[2].model.idle_w, &devices[2].model_source), (105.0, &ModelSource::Default), "no A100 fit");

        let config = CarbonConfig { power_max_w: Some(650.0), ..CarbonConfig::default() };
        let mut devices = fresh();
        use_measured(&conn, &config, &mut devices);
        assert_eq!((devices[0].model.idle_w, devices[0].model.max_w, devices[0].model.gamma), (71.0, 650.0, 2.6));
        assert_eq!(devices[0].model_source.to_string(), "measured 2026-11-18 on GPU-a ([carbon] power_max_w override)");

        let config = CarbonConfig { power_idle_w: Some(50.0), power_max_w: Some(650.0), gamma: Some(2.0), ..CarbonConfig::default() };
        let mut devices = fresh();
        use_measured(&conn, &config, &mut devices);
        assert_eq!((devices[0].model.idle_w, &devices[0].model_source), (105.0, &ModelSource::Default), "every key set: the config's model, untouched");
    }
}
