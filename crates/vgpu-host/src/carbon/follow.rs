//! Clocks that follow the work: when a workload starts or ends, the carbon plan is made
//! again and applied at once, so that a job does not run at an idle GPU's lowest clock
//! until the next `vgpu carbon apply` (the timer stays, for changes of the intensity).
//!
//! * **Only while carbon capping is in force**: a budget in the config
//!   (`[carbon] budget_g_per_hour`, `budget_g_per_day` or `budget_g_per_month`; a daily or
//!   monthly one re-allotted with the remembered forecast) and caps vgpu has applied (`carbon-applied.json` lists
//!   some; `vgpu carbon reset` empties it). Otherwise nothing is done, and NVML is not even
//!   opened.
//! * **Bounded**: the intensity source by its `timeout`, falling back to the remembered
//!   reading (`intensity/cache.rs`) and then to `fallback`, as `carbon apply` does; the store
//!   lock and the applier's lock by their deadlines. The intensity is read before the store
//!   lock is taken where this module takes it ([`replan_now`]); where the caller holds it
//!   (reconcile, [`replan`]) the source is not asked at all: the remembered reading or the
//!   fallback stands in, so no other command waits on the network for the lock.
//! * **Never in the way**: a failure is a warning in the [`Report`]; the workload starts and
//!   ends all the same.
//! * **Logged**: every decision goes to the decision log with its reason
//!   (`workload started ID`, `workload ended ID`).
//!
//! Called from `launch` (before the workload's first process is spawned, and after its
//! teardown) and from reconcile (a dead supervisor's workload cleaned up). Reconcile has no
//! [`Context`]: `main` [`install`]s the command's settings once for it.

use std::fmt;
use std::sync::OnceLock;

use anyhow::Result;
use chrono::Utc;

use vgpu_carbon::apply::{self, AppliedStore, APPLIED_FILE};
use super::host;
use vgpu_carbon::intensity::Intensity;
use vgpu_carbon::log::{self, Decision, LOG_FILE};
use crate::context::Context;
use vgpu_store::state::Store;
use vgpu_store::state::StoreLock;

/// Why the plan is made again: the reason logged with the decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change(String);

impl Change {
    pub fn started(id: &str) -> Change {
        Change(format!("workload started {id}"))
    }

    pub fn ended(ids: &[&str]) -> Change {
        match ids {
            [one] => Change(format!("workload ended {one}")),
            many => Change(format!("workloads ended {}", many.join(", "))),
        }
    }
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What re-planning did.
#[derive(Debug, Default)]
pub struct Report {
    /// The decision applied and logged; `None`: nothing was applied (carbon capping not in
    /// force, or a failure named in `warnings`).
    pub decision: Option<Decision>,
    /// What went wrong or deserves attention, one line each.
    pub warnings: Vec<String>,
}

impl Report {
    fn failed(change: &Change, error: impl fmt::Display) -> Report {
        Report { decision: None, warnings: vec![format!("carbon: clocks not re-planned after {change}: {error}")] }
    }

    /// Log it: the warnings as warnings, the clocks set at `info`.
    pub fn log(&self) {
        for line in &self.warnings {
            tracing::warn!("{line}");
        }
        if let Some(decision) = &self.decision {
            let clocks: Vec<String> = decision
                .gpus
                .iter()
                .map(|g| format!("GPU {} {}/{} MHz", g.index, g.clock_mhz, g.max_clock_mhz))
                .collect();
            tracing::info!("carbon: {}: {}", decision.reason.as_deref().unwrap_or("re-planned"), clocks.join(", "));
        }
    }
}

/// Whether carbon capping is in force: a budget in the config, and caps vgpu has applied.
/// Reads one small file; no NVML.
pub fn active(ctx: &Context) -> bool {
    let config = &ctx.config.carbon;
    config.has_budget()
        && config.validate().is_ok()
        && !AppliedStore::new(ctx.state_path(APPLIED_FILE)).load().is_empty()
}

/// Re-plan and apply after `change`, taking the store lock for it (bounded by its
/// deadline); the intensity is read first, outside the lock.
pub fn replan_now(ctx: &Context, store: &Store, change: &Change) -> Report {
    if !active(ctx) {
        return Report::default();
    }
    let intensity = match host::resolve_intensity(ctx, Utc::now(), true) {
        Ok(found) => found,
        Err(e) => return Report::failed(change, format!("{e:#}")),
    };
    let lock = match store.lock() {
        Ok(lock) => lock,
        Err(e) => return Report::failed(change, e),
    };
    apply_now(ctx, store, &lock, &intensity, change)
}

/// Re-plan and apply after `change`, with the store lock held by the caller: with the
/// remembered intensity (or the fallback), never asking the source under the lock.
pub fn replan(ctx: &Context, store: &Store, lock: &StoreLock, change: &Change) -> Report {
    if !active(ctx) {
        return Report::default();
    }
    match host::remembered_intensity(ctx, Utc::now()) {
        Ok(intensity) => apply_now(ctx, store, lock, &intensity, change),
        Err(e) => Report::failed(change, format!("{e:#}")),
    }
}

/// The settings [`after_reconcile`] uses; set once per process by `main`.
static SETTINGS: OnceLock<Context> = OnceLock::new();

/// Remember this command's settings for re-planning from reconcile (which is called from
/// many places, none of which passes a [`Context`]). The first call wins: a `vgpu watch`
/// that reloads its config on SIGHUP re-plans from reconcile with the settings it started
/// with (its `vgpu run`s and the timer use their own).
pub fn install(ctx: &Context) {
    let _ = SETTINGS.set(ctx.clone());
}

/// Reconcile cleaned up `ended` (their supervisors died): re-plan, with the store lock held.
/// Nothing when no settings were [`install`]ed (unit tests).
pub fn after_reconcile(store: &Store, lock: &StoreLock, ended: &[&str]) -> Report {
    match SETTINGS.get() {
        Some(ctx) if !ended.is_empty() => replan(ctx, store, lock, &Change::ended(ended)),
        _ => Report::default(),
    }
}

/// Plan for the workloads in `store` now and apply; the store lock is held.
fn apply_now(ctx: &Context, store: &Store, _held: &StoreLock, intensity: &Intensity, change: &Change) -> Report {
    match try_apply(ctx, store, intensity, change) {
        Ok(report) => report,
        Err(e) => Report::failed(change, format!("{e:#}")),
    }
}

fn try_apply(ctx: &Context, store: &Store, intensity: &Intensity, change: &Change) -> Result<Report> {
    let budgets = host::Budgets::of(&ctx.config.carbon, None);
    if !budgets.any() {
        return Ok(Report::default());
    }
    let mut warnings = Vec::new();
    if let Some(note) = &intensity.note {
        warnings.push(format!("carbon: {note}"));
    }
    let nvml = host::open_nvml(ctx)?;
    let devices = host::devices(ctx, &nvml)?;
    let workloads = host::workloads_in(store, &devices);
    // The forecast as remembered (the timer's apply refreshes it): never the network here.
    let host::BudgetPlan { plan, horizons } = host::plan_budgets(ctx, &workloads, &devices, intensity, budgets, host::now(ctx)?, false, false)?;
    let applied = AppliedStore::new(ctx.state_path(APPLIED_FILE));
    let (outcomes, save_error) = apply::apply_plan(&nvml, &devices, &plan, &applied)?;
    for gpu in &outcomes {
        if let Some(e) = &gpu.error {
            warnings.push(format!("carbon: GPU {}: {e} (after {change})", gpu.index));
        }
    }
    if let Some(e) = save_error {
        warnings.push(format!("carbon: {e}: the next apply will write the caps again"));
    }
    let mut decision = Decision::applied(&plan, intensity, outcomes, Some(change.to_string()));
    decision.horizons = horizons;
    if ctx.simulate {
        decision.time = host::now(ctx)?; // VGPU_NOW, as `carbon apply` logs it
    }
    let rotation = ctx.config.carbon.log_rotation().unwrap_or_default();
    if let Err(e) = log::append(&ctx.lib_path(LOG_FILE), &decision, rotation) {
        warnings.push(format!("carbon: the caps are set but the decision was not logged: {e}"));
    }
    vgpu_history::best_effort(&ctx.lib_dir, &ctx.config.history, "the clock decision", |h| h.record_decision(&decision));
    Ok(Report { decision: Some(decision), warnings })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_name_the_workloads() {
        assert_eq!(Change::started("ab12").to_string(), "workload started ab12");
        assert_eq!(Change::ended(&["ab12"]).to_string(), "workload ended ab12");
        assert_eq!(Change::ended(&["a", "b"]).to_string(), "workloads ended a, b");
    }

    #[test]
    fn without_a_budget_nothing_is_done() {
        let dir = tempfile::tempdir().unwrap();
        let config = crate::config::Config::parse("").unwrap();
        let origin = crate::context::Origin {
            state_dir: Some(dir.path().join("run")),
            lib_dir: Some(dir.path().join("lib")),
            ..Default::default()
        };
        let ctx = Context::new(config, origin);
        // Caps recorded, but no budget: not in force.
        let applied = AppliedStore::new(ctx.state_path(APPLIED_FILE));
        applied
            .save(&[apply::Applied { uuid: "GPU-x".into(), cap: apply::Cap::Uncapped, locking_unsupported: false }])
            .unwrap();
        assert!(!active(&ctx));
        let store = Store::new(&ctx.state_dir, &ctx.lib_dir);
        let report = replan_now(&ctx, &store, &Change::started("x"));
        assert!(report.decision.is_none() && report.warnings.is_empty(), "{report:?}");
        assert!(!ctx.lib_path(LOG_FILE).exists());
    }
}
