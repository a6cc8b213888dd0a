//! Stage 1 for a workload about to start: how many GPUs `vgpu run --gpus MIN-MAX` gets.

use anyhow::Result;

use crate::carbon::host;
use vgpu_carbon::model::GpuModel;
use vgpu_carbon::model::Tunables;
use vgpu_carbon::planner;
use vgpu_carbon::planner::ClockPlan;
use vgpu_carbon::planner::PlanError;
use vgpu_carbon::planner::PlanRequest;
use vgpu_carbon::workload::GpuDemand;
use vgpu_carbon::workload::PlannedWorkload;
use crate::context::Context;
use vgpu_store::error::UsageError;

/// Stage 1 for a workload about to start with `vgpu run --gpus MIN-MAX`: how many GPUs
/// (and which, by NVML index) it gets under the carbon budget at the current intensity.
/// Without a configured source and budget there is no carbon limit: it gets up to MAX of
/// the GPUs no other workload holds. Fewer than MIN → an error that says why.
pub fn gpus_for_range(ctx: &Context, min: usize, max: usize, sensitivity: Option<f64>) -> Result<Vec<u32>> {
    let nvml = host::open_nvml(ctx)?;
    let devices = host::devices(ctx, &nvml)?;
    let config = &ctx.config.carbon;
    let budgets = host::Budgets::of(config, None);
    let limited = config.source.is_some() && budgets.any();
    let now = host::now(ctx)?;
    let found = if limited { Some(host::intensity_now(ctx, now, true)?) } else { None };
    let intensity = found.as_ref().map_or(0.0, |i| i.intensity);
    let workloads = host::workloads(ctx, &devices);
    let asked = if min == max { format!("--gpus {min}") } else { format!("--gpus {min}-{max}") };
    // A count the host cannot have is the caller's mistake, whoever runs what.
    if devices.len() < min {
        return Err(UsageError::new(format!("{asked}: this host has {} GPU(s) (see `vgpu devices`)", devices.len())).into());
    }
    let holders = holders(&workloads);
    let mut new = PlannedWorkload::range("new workload", min, max);
    if let Some(s) = sensitivity {
        new = new.with_sensitivity(s);
    }
    // A daily or monthly budget: the rate allotted now with the new workload among the
    // others (the remembered forecast: the timer's apply refreshes it).
    let budget = match &found {
        Some(found) => {
            let mut with_new = workloads.clone();
            with_new.push(new.clone());
            let allotted = host::allot_budgets(ctx, &with_new, &devices, found, budgets, now, false, false)?;
            for note in &allotted.notes {
                tracing::debug!("stage 1: {note}");
            }
            allotted.rate
        }
        None => None,
    };
    let models: Vec<_> = devices.iter().map(|d| d.model.clone()).collect();
    let start = Start { gpus: &models, running: &workloads, intensity, budget_g_per_hour: budget, tunables: host::tunables(config)? };
    let (gpus, plan) = place(&start, new).map_err(|e| UsageError::new(e.to_string()))?;
    tracing::debug!(
        "stage 1 for --gpus {min}-{max}: {:?}; {:.1} gCO2/h predicted; {}",
        plan.workloads.last().map(|w| &w.gpus),
        plan.predicted_g_per_hour,
        plan.notes.join("; ")
    );
    if !plan.budget_met {
        tracing::warn!("the carbon budget cannot be met even at the lowest clocks; starting with the minimum of {min} GPU(s)");
    }
    if gpus.len() < min {
        let why = if limited && devices.len() - holders.held >= min {
            format!(
                "the carbon budget of {} gCO2/h at {intensity:.0} gCO2/kWh allows {} of the {} GPU(s) no other workload holds",
                budget.unwrap_or_default(),
                gpus.len(),
                devices.len() - holders.held
            )
        } else {
            format!("this host has {} GPU(s) and {} of them are held by other workloads: {}", devices.len(), holders.held, holders.names.join(", "))
        };
        anyhow::bail!("{asked}: {why}");
    }
    Ok(gpus)
}

/// What stage 1 looks at when one workload starts: the host's GPUs, the workloads running
/// on them, and the budget as it stands now.
#[derive(Debug, Clone)]
pub struct Start<'a> {
    pub gpus: &'a [GpuModel],
    /// The running workloads, as the planner sees them (their GPUs fixed).
    pub running: &'a [PlannedWorkload],
    /// gCO2/kWh now.
    pub intensity: f64,
    /// gCO2/h for all GPUs (the per-hour budget, or the horizon's allotment now); `None`:
    /// no carbon limit, the new workload gets up to its MAX of the free GPUs.
    pub budget_g_per_hour: Option<f64>,
    pub tunables: Tunables,
}

/// Stage 1 for one workload about to start (pure): it is planned after the running ones,
/// alone among the starters (`vgpu run` places workloads one at a time, in the order they
/// arrive). Returns the NVML indexes it gets (empty when its MIN does not fit in the free
/// GPUs) and the plan they come from. `vgpu run --gpus MIN-MAX` and `benches/carbon_sim.rs`
/// both place workloads through this function.
pub fn place(start: &Start<'_>, new: PlannedWorkload) -> Result<(Vec<u32>, ClockPlan), PlanError> {
    let mut workloads = start.running.to_vec();
    workloads.push(new);
    let request = PlanRequest {
        gpus: start.gpus,
        workloads: &workloads,
        intensity: start.intensity,
        budget_g_per_hour: start.budget_g_per_hour,
        tunables: start.tunables,
    };
    let plan = planner::plan(&request)?;
    let gpus = plan.workloads.last().map(|w| w.gpus.clone()).unwrap_or_default();
    Ok((gpus, plan))
}

/// The GPUs running workloads hold, as the planner sees them: how many, and who holds
/// which ("train on GPU 0, 1").
struct Holders {
    held: usize,
    names: Vec<String>,
}

fn holders(workloads: &[PlannedWorkload]) -> Holders {
    let mut held: Vec<u32> = Vec::new();
    let mut names = Vec::new();
    for w in workloads {
        if let GpuDemand::Fixed(gpus) = &w.gpus {
            let list: Vec<String> = gpus.iter().map(u32::to_string).collect();
            names.push(format!("{} on GPU {}", w.id, list.join(", ")));
            held.extend(gpus);
        }
    }
    held.sort_unstable();
    held.dedup();
    Holders { held: held.len(), names }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32) -> GpuModel {
        GpuModel::new(index, vec![500, 1000, 1500, 2000], 50.0, 250.0, 2.0).expect("valid model")
    }

    fn placed(gpus: &[GpuModel], running: &[PlannedWorkload], new: PlannedWorkload, budget: Option<f64>) -> Vec<u32> {
        let start = Start { gpus, running, intensity: 300.0, budget_g_per_hour: budget, tunables: Tunables::default() };
        place(&start, new).expect("valid request").0
    }

    /// Workloads start one at a time: with no budget the first gets up to its MAX of the free
    /// GPUs, and the next one only what is left (planned together, stage 1 would have
    /// shared the free GPUs between them).
    #[test]
    fn starters_are_placed_one_at_a_time_in_arrival_order() {
        let gpus: Vec<GpuModel> = (0..4).map(gpu).collect();
        let running = vec![PlannedWorkload::fixed("train", vec![0])];
        let first = placed(&gpus, &running, PlannedWorkload::range("a", 1, 4), None);
        assert_eq!(first, vec![1, 2, 3]);
        let mut running = running;
        running.push(PlannedWorkload::fixed("a", first));
        assert!(placed(&gpus, &running, PlannedWorkload::range("b", 1, 2), None).is_empty());
    }

    /// Under a budget the starter gets what the budget holds at the lowest clock, never fewer
    /// than its MIN when the MIN fits in the free GPUs.
    #[test]
    fn a_budget_limits_the_starter_to_what_it_holds() {
        let gpus: Vec<GpuModel> = (0..4).map(gpu).collect();
        // 4 GPUs idle at 50 W: 200 W; one more busy GPU at its lowest clock adds a little.
        let tight = placed(&gpus, &[], PlannedWorkload::range("a", 1, 4), Some(0.0));
        assert_eq!(tight.len(), 1);
        let loose = placed(&gpus, &[], PlannedWorkload::range("a", 1, 4), Some(1e6));
        assert_eq!(loose, vec![0, 1, 2, 3]);
    }
}
