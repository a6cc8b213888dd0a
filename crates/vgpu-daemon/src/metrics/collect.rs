//! Gather one round's [`Metrics`] from what the watch already has: the NVML snapshot, the
//! workload records with their live usage (through [`vgpu_host::listing::row`], exactly what
//! `vgpu ps --json` prints), the pool file, the caps `vgpu carbon apply` remembers, and the
//! latest carbon intensity.

use std::collections::BTreeMap;

use vgpu_gpu::snapshot::Owner;

use vgpu_gpu::snapshot::Snapshot;
use vgpu_carbon::apply::Applied;
use vgpu_carbon::intensity::Intensity;
use vgpu_carbon::intensity::Status;
use vgpu_cgroups::Layout;
use vgpu_pool::inventory::Inventory;
use vgpu_pool::inventory::NvmlGpu;
use vgpu_pool::Pool;
use vgpu_pool::PoolConfig;
use vgpu_store::state::Store;

use super::model::{
    emission_rate, CarbonMetrics, GpuMetrics, IntensityMetrics, Metrics, PoolMetrics, WorkloadGpuMetrics, WorkloadMetrics,
};
use super::MetricsError;

/// What one round is gathered from.
pub struct Sources<'a> {
    pub store: &'a Store,
    pub layout: Option<&'a Layout>,
    /// None: no driver, or NVML failed this round.
    pub snapshot: Option<&'a Snapshot>,
    pub pool_config: &'a PoolConfig,
    /// The caps `vgpu carbon apply` set (`carbon-applied.json`).
    pub applied: &'a [Applied],
    pub intensity: Option<&'a Intensity>,
    pub budget_g_per_hour: Option<f64>,
    pub now_unix_ms: u64,
    /// The services the watch runs, as its runner counts them.
    pub services: &'a [super::model::ServiceMetrics],
}

/// The figures, and what had to be left out and why.
pub fn collect(s: &Sources<'_>) -> (Metrics, Vec<MetricsError>) {
    let mut problems = Vec::new();
    let gpus = s.snapshot.map(|snap| gpus(snap, s.applied)).unwrap_or_default();
    let pool = match pool(s) {
        Ok(pool) => Some(pool),
        Err(e) => {
            problems.push(e);
            None
        }
    };
    let intensity = s.intensity.map(|i| IntensityMetrics {
        g_per_kwh: i.intensity,
        source: i.source.clone(),
        status: status_name(i.status).to_string(),
        timestamp_unix_s: i.timestamp.timestamp(),
    });
    let powers: Vec<f64> = gpus.iter().filter_map(|g| g.power_w).collect();
    let emission_rate_g_per_hour = match &intensity {
        Some(i) if !powers.is_empty() => Some(emission_rate(powers.iter().sum(), i.g_per_kwh)),
        _ => None,
    };
    let metrics = Metrics {
        collected_unix_ms: s.now_unix_ms,
        gpus,
        workloads: workloads(s),
        pool,
        carbon: CarbonMetrics { intensity, budget_g_per_hour: s.budget_g_per_hour, emission_rate_g_per_hour },
        services: s.services.to_vec(),
    };
    (metrics, problems)
}

fn status_name(status: Status) -> &'static str {
    match status {
        Status::Fresh => "fresh",
        Status::Cached => "cached",
        Status::Fallback => "fallback",
        Status::Override => "override",
    }
}

fn gpus(snapshot: &Snapshot, applied: &[Applied]) -> Vec<GpuMetrics> {
    snapshot
        .gpus
        .iter()
        .map(|g| GpuMetrics {
            index: g.index,
            uuid: g.uuid.clone(),
            name: g.name.clone(),
            memory_total_bytes: g.memory_total,
            memory_used_bytes: g.memory_used,
            utilization_pct: g.utilization_pct,
            power_w: g.power_w,
            energy_mj: g.energy_mj,
            sm_clock_mhz: g.sm_clock_mhz,
            sm_clock_max_mhz: g.sm_clock_max_mhz,
            cap: applied.iter().find(|a| a.uuid == g.uuid).map(|a| a.cap),
            processes: g.processes.len() as u64,
            unmanaged_processes: g.processes.iter().filter(|p| p.owner == Owner::Unmanaged).count() as u64,
        })
        .collect()
}

/// Every readable workload record, as `vgpu ps --json` lists it (damaged records are the
/// reconcile's to report).
fn workloads(s: &Sources<'_>) -> Vec<WorkloadMetrics> {
    let (records, _damaged) = s.store.workloads();
    records
        .iter()
        .map(|w| {
            let row = vgpu_host::listing::row(s.store, s.layout, w, false);
            let gpus = row
                .gpus
                .iter()
                .map(|g| WorkloadGpuMetrics {
                    index: g.index,
                    memory_quota_bytes: g.mem_quota,
                    memory_used_bytes: g.mem_used,
                    memory_peak_bytes: g.mem_peak,
                    memory_driver_bytes: s.snapshot.map(|snap| {
                        snap.processes_of(&w.cgroup).filter(|(gpu, _)| gpu.uuid == g.uuid).filter_map(|(_, p)| p.memory_bytes).sum()
                    }),
                    compute_target_pct: g.compute_pct,
                    compute_measured_pct: g.compute_measured_pct,
                    gpu_time_ns: g.gpu_time_ns,
                    throttled_ns: g.throttled_ns,
                    turns_taken: g.turns_taken,
                    turn_wait_ns: g.turn_wait_ns,
                    switches_avoided: g.switches_avoided,
                })
                .collect();
            WorkloadMetrics {
                id: row.id,
                name: row.name,
                user: row.user,
                partition: row.partition,
                compute_policy: row.compute_policy.to_string(),
                state: row.state,
                priority: row.priority,
                pool_blocks: row.pool_blocks,
                processes: row.pids.len() as u64,
                enforcement: row.enforcement.map(|e| e.action.as_str().to_string()),
                slurm: row.slurm.map(|s| (s.job, s.step)),
                gpus,
            }
        })
        .collect()
}

/// The stored pool, or — before any workload used it — the pool this host's devices make.
fn pool(s: &Sources<'_>) -> Result<PoolMetrics, MetricsError> {
    let pool = match vgpu_host::pool_effects::read(s.store) {
        Ok(Some(pool)) => pool,
        Ok(None) => {
            let nvml: Vec<NvmlGpu> = s
                .snapshot
                .map(|snap| snap.gpus.iter().map(|g| NvmlGpu { index: g.index, uuid: g.uuid.clone(), name: g.name.clone() }).collect())
                .unwrap_or_default();
            let inventory = Inventory::build(&nvml, s.pool_config).map_err(|e| MetricsError::Pool(e.to_string()))?;
            Pool::new(inventory)
        }
        Err(e) => return Err(MetricsError::Pool(e.to_string())),
    };
    let view = pool.view();
    let mut by_priority: BTreeMap<i32, u64> = BTreeMap::new();
    let mut by_state: BTreeMap<String, u64> = BTreeMap::new();
    for a in &view.allocations {
        let held: u64 = a.ranges.iter().map(|[first, last]| last - first + 1).sum();
        if held > 0 {
            *by_priority.entry(a.priority).or_default() += held;
        }
        *by_state.entry(a.state.to_string()).or_default() += 1;
    }
    Ok(PoolMetrics {
        block_tflops: view.block_tflops,
        total_blocks: view.total_blocks,
        used_blocks: view.used_blocks,
        used_by_priority: by_priority.into_iter().collect(),
        workloads_by_state: by_state.into_iter().collect(),
    })
}
