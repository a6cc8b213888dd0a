//! Stage 1 for a workload about to start: how many GPUs `vgpu run --gpus MIN-MAX` gets.

use anyhow::Result;

use crate::carbon::host;
use crate::carbon::planner::{self, PlanRequest};
use crate::carbon::workload::{GpuDemand, PlannedWorkload};
use crate::context::Context;
use crate::error::UsageError;

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
    let mut workloads = host::workloads(ctx, &devices);
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
    workloads.push(new);
    // A daily or monthly budget: the rate allotted now with the new workload among the
    // others (the remembered forecast: the timer's apply refreshes it).
    let budget = match &found {
        Some(found) => {
            let allotted = host::allot_budgets(ctx, &workloads, &devices, found, budgets, now, false, false)?;
            for note in &allotted.notes {
                tracing::debug!("stage 1: {note}");
            }
            allotted.rate
        }
        None => None,
    };
    let models: Vec<_> = devices.iter().map(|d| d.model.clone()).collect();
    let request = PlanRequest {
        gpus: &models,
        workloads: &workloads,
        intensity,
        budget_g_per_hour: budget,
        tunables: host::tunables(config)?,
    };
    let plan = planner::plan(&request).map_err(|e| UsageError::new(e.to_string()))?;
    tracing::debug!(
        "stage 1 for --gpus {min}-{max}: {:?}; {:.1} gCO2/h predicted; {}",
        plan.workloads.last().map(|w| &w.gpus),
        plan.predicted_g_per_hour,
        plan.notes.join("; ")
    );
    if !plan.budget_met {
        tracing::warn!("the carbon budget cannot be met even at the lowest clocks; starting with the minimum of {min} GPU(s)");
    }
    let gpus = plan.workloads.last().map(|w| w.gpus.clone()).unwrap_or_default();
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
