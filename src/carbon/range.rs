//! Stage 1 for a workload about to start: how many GPUs `vgpu run --gpus MIN-MAX` gets.

use anyhow::Result;

use crate::carbon::host;
use crate::carbon::planner::{self, PlanRequest};
use crate::carbon::workload::PlannedWorkload;
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
    let limited = config.source.is_some() && config.budget_g_per_hour.is_some();
    let (intensity, budget) = if limited {
        (host::intensity_now(ctx, chrono::Utc::now(), true)?.intensity, config.budget_g_per_hour)
    } else {
        (0.0, None)
    };
    let mut workloads = host::workloads(ctx, &devices);
    let mut new = PlannedWorkload::range("new workload", min, max);
    if let Some(s) = sensitivity {
        new = new.with_sensitivity(s);
    }
    workloads.push(new);
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
        let why = if limited {
            format!("the carbon budget of {} gCO2/h at {intensity:.0} gCO2/kWh allows {}", budget.unwrap_or_default(), gpus.len())
        } else {
            format!("only {} GPU(s) are not held by other workloads", gpus.len())
        };
        anyhow::bail!("--gpus {min}-{max}: {why}");
    }
    Ok(gpus)
}
