//! The figures `vgpu watch` exports, as plain data: gathered by [`super::collect`], rendered
//! by [`super::exposition`]. Units are the sources' (bytes, percent, MHz, mJ); the rendering
//! converts them to Prometheus base units.

use vgpu_carbon::apply::Cap;

/// Everything one round exports (the enforcement counters live in
/// [`super::Enforcements`]: they count across rounds).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metrics {
    /// When the figures were gathered, ms since the epoch.
    pub collected_unix_ms: u64,
    pub gpus: Vec<GpuMetrics>,
    pub workloads: Vec<WorkloadMetrics>,
    /// None: no pool (its file is damaged, or its devices cannot be counted).
    pub pool: Option<PoolMetrics>,
    pub carbon: CarbonMetrics,
    /// The services the watch runs (not those a `vgpu service run` runs).
    pub services: Vec<ServiceMetrics>,
}

/// One service the watch runs.
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceMetrics {
    pub name: String,
    pub desired: u32,
    /// Replicas running (and not being stopped).
    pub actual: u32,
    /// The last decision's inputs: (signal, mean utilization over the replicas, target).
    pub signals: Vec<(String, f64, f64)>,
}

/// One GPU, as NVML reads it, with the cap `vgpu carbon apply` set on it.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuMetrics {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_total_bytes: u64,
    pub memory_used_bytes: u64,
    pub utilization_pct: Option<u32>,
    pub power_w: Option<f64>,
    /// Since the driver loaded.
    pub energy_mj: Option<u64>,
    pub sm_clock_mhz: Option<u32>,
    pub sm_clock_max_mhz: Option<u32>,
    /// What vgpu last set on it (None: it never set anything).
    pub cap: Option<Cap>,
    /// Processes NVML lists on it, and of those the ones in no vGPU.
    pub processes: u64,
    pub unmanaged_processes: u64,
}

/// One workload, as `vgpu ps --json` lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadMetrics {
    pub id: String,
    pub name: String,
    pub user: String,
    pub partition: Option<String>,
    /// `strict` or `fair`.
    pub compute_policy: String,
    /// `waiting`, `starting`, `running` or `suspended`.
    pub state: String,
    pub priority: i32,
    pub pool_blocks: Option<u64>,
    /// Processes in its cgroup.
    pub processes: u64,
    /// What `vgpu watch` did to it (`killed`, `throttled`), while its record says so.
    pub enforcement: Option<String>,
    /// The Slurm job and step it fences (spank_vgpu.so); None for other workloads.
    pub slurm: Option<(u32, String)>,
    pub gpus: Vec<WorkloadGpuMetrics>,
}

/// One workload on one of its GPUs.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadGpuMetrics {
    pub index: u32,
    pub memory_quota_bytes: u64,
    /// What the shim counts (None: its usage file cannot be read).
    pub memory_used_bytes: Option<u64>,
    pub memory_peak_bytes: Option<u64>,
    /// What NVML says its processes hold on the GPU (None: no snapshot).
    pub memory_driver_bytes: Option<u64>,
    pub compute_target_pct: u32,
    /// None: it launched nothing lately.
    pub compute_measured_pct: Option<f64>,
    pub gpu_time_ns: u64,
    pub throttled_ns: u64,
    /// Turns on the GPU (`vgpu_abi::turn`): taken, time waited for one, switches avoided.
    pub turns_taken: u64,
    pub turn_wait_ns: u64,
    pub switches_avoided: u64,
}

/// The compute pool.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolMetrics {
    pub block_tflops: f64,
    pub total_blocks: u64,
    pub used_blocks: u64,
    /// Blocks held by running workloads, per priority, ascending.
    pub used_by_priority: Vec<(i32, u64)>,
    /// Workloads the pool knows, per state (`running`, `suspended`, `waiting`).
    pub workloads_by_state: Vec<(String, u64)>,
}

/// The carbon budget's figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CarbonMetrics {
    /// None: no `[carbon] source`, or it gave nothing usable yet.
    pub intensity: Option<IntensityMetrics>,
    pub budget_g_per_hour: Option<f64>,
    /// Σ GPU power × intensity; None without an intensity or any power reading.
    pub emission_rate_g_per_hour: Option<f64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct IntensityMetrics {
    pub g_per_kwh: f64,
    /// How `vgpu carbon intensity` names the source.
    pub source: String,
    /// `fresh`, `cached` or `fallback`.
    pub status: String,
    /// The time the value is for, as the source dates it, seconds since the epoch.
    pub timestamp_unix_s: i64,
}

/// Grams per hour from watts and gCO2/kWh.
pub fn emission_rate(power_w: f64, g_per_kwh: f64) -> f64 {
    power_w / 1000.0 * g_per_kwh
}
