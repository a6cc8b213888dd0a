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
    Ok(intensity::resolve(&not_read, &policy, now)?)
}

/// The environment variable that fixes "now" for the carbon commands, RFC 3339; read only
/// under the simulated driver (`--simulate`): for tests, which must plan at a chosen time of
/// a forecast. Never on a real host.
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
        if let Err(e) = record_forecast(ctx, &found) {
            tracing::info!("the forecast is not recorded in the history: {e}");
        }
    }
    Ok(found)
}

fn record_forecast(ctx: &Context, found: &Forecast) -> Result<(), crate::history::db::HistoryError> {
    let mut conn = crate::history::db::open_rw(&ctx.lib_dir)?;
    let points: Vec<(i64, f64)> = found.readings.iter().map(|r| (r.timestamp.timestamp_millis(), r.g_per_kwh)).collect();
    let path = crate::history::db::path_in(&ctx.lib_dir);
    crate::history::spent::record_forecast(&mut conn, &path, &points, &found.source, found.fetched_at.timestamp_millis())
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
    Ok(intensity::resolve(source.as_ref(), &policy, now)?)
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
