//! [`Metrics`] rendered with `prometheus-client`: the OpenMetrics text it writes (served to
//! scrapers that ask for it), and the same figures in the classic Prometheus text format
//! (0.0.4: served to everybody else, and what node_exporter's textfile collector reads).
//! Names are `vgpu_…` in base units (bytes, seconds, watts, joules, hertz, ratios 0–1); the
//! the user guide's "Metrics" section (docs/enforcer.md) lists them.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64};

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::TypedMetric;
use prometheus_client::registry::Registry;

use super::enforcements::Enforcements;
use super::model::Metrics;
use vgpu_carbon::apply::Cap;

/// Content types of the two renderings.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Every state a workload record can have (`vgpu_workload_state` has one series each).
const WORKLOAD_STATES: [&str; 4] = ["waiting", "starting", "running", "suspended"];

/// One round's figures in both formats.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exposition {
    pub openmetrics: String,
    pub text: String,
}

type Ratio = Gauge<f64, AtomicU64>;
type Int = Gauge<i64, AtomicI64>;
type Bytes = Gauge<u64, AtomicU64>;
type Total = Counter<f64, AtomicU64>;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct GpuLabels {
    gpu: String,
    uuid: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct GpuInfoLabels {
    gpu: String,
    uuid: String,
    name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct WorkloadLabels {
    id: String,
    name: String,
    user: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct WorkloadInfoLabels {
    id: String,
    name: String,
    user: String,
    partition: String,
    compute_policy: String,
    /// The Slurm job id and step of a step's workload (empty for others): joined on `id`,
    /// every workload metric is a job's.
    slurm_job: String,
    slurm_step: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct WorkloadStateLabels {
    id: String,
    name: String,
    user: String,
    state: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct WorkloadActionLabels {
    id: String,
    name: String,
    user: String,
    action: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct WorkloadGpuLabels {
    id: String,
    name: String,
    user: String,
    gpu: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ServiceReplicasLabels {
    service: String,
    kind: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ServiceSignalLabels {
    service: String,
    signal: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PriorityLabels {
    priority: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct SourceLabels {
    source: String,
    status: String,
}

/// Register a family under `name` and hand back a handle to fill it.
fn family<S, M>(registry: &mut Registry, name: &str, help: &str) -> Family<S, M>
where
    S: Clone + std::hash::Hash + Eq + EncodeLabelSet + std::fmt::Debug + Send + Sync + 'static,
    M: EncodeMetric + TypedMetric + Default + std::fmt::Debug + Send + Sync + 'static,
{
    let f = Family::<S, M>::default();
    registry.register(name, help, f.clone());
    f
}

/// Register a metric without labels.
fn single<M>(registry: &mut Registry, name: &str, help: &str) -> M
where
    M: EncodeMetric + Default + Clone + std::fmt::Debug + Send + Sync + 'static,
{
    let m = M::default();
    registry.register(name, help, m.clone());
    m
}

fn mhz_to_hz(mhz: u32) -> f64 {
    f64::from(mhz) * 1e6
}

/// Render one round's figures and the enforcement counters.
pub fn render(m: &Metrics, enforcements: &Enforcements) -> Result<Exposition, std::fmt::Error> {
    let mut r = Registry::default();
    gpus(&mut r, m);
    workloads(&mut r, m);
    r.register(
        "vgpu_enforcements",
        "Processes and workloads vgpu watch acted on (report, throttle, kill, end), by the audit that found them (memory, compute, unmanaged)",
        enforcements.family().clone(),
    );
    r.register(
        "vgpu_history_write_failures",
        "Rounds vgpu watch could not write to history.db, by kind of failure (disk-full, busy, damaged, open, sqlite)",
        enforcements.history_family().clone(),
    );
    pool(&mut r, m);
    carbon(&mut r, m);
    services(&mut r, m);
    let round: Ratio = single(&mut r, "vgpu_watch_last_round_timestamp_seconds", "When vgpu watch last gathered these figures");
    round.set(m.collected_unix_ms as f64 / 1000.0);
    let mut openmetrics = String::new();
    prometheus_client::encoding::text::encode(&mut openmetrics, &r)?;
    let text = to_prometheus_text(&openmetrics);
    Ok(Exposition { openmetrics, text })
}

fn gpus(r: &mut Registry, m: &Metrics) {
    let info: Family<GpuInfoLabels, Int> = family(r, "vgpu_gpu_info", "A GPU NVML lists (value 1), with its model name");
    let mem_total: Family<GpuLabels, Bytes> = family(r, "vgpu_gpu_memory_total_bytes", "Device memory of the GPU");
    let mem_used: Family<GpuLabels, Bytes> = family(r, "vgpu_gpu_memory_used_bytes", "Device memory in use on the GPU, as NVML reports it");
    let util: Family<GpuLabels, Ratio> = family(r, "vgpu_gpu_utilization_ratio", "Share of the driver's last sample period the GPU was busy");
    let power: Family<GpuLabels, Ratio> = family(r, "vgpu_gpu_power_watts", "Power draw of the GPU");
    let energy: Family<GpuLabels, Total> = family(r, "vgpu_gpu_energy_joules", "Energy the GPU used since the driver loaded");
    let clock: Family<GpuLabels, Ratio> = family(r, "vgpu_gpu_sm_clock_hertz", "SM clock of the GPU now");
    let clock_max: Family<GpuLabels, Ratio> = family(r, "vgpu_gpu_sm_clock_max_hertz", "Highest SM clock of the GPU");
    let capped: Family<GpuLabels, Int> =
        family(r, "vgpu_gpu_capped", "1 while vgpu carbon apply holds the GPU below its maximum (locked clocks or a power limit), else 0");
    let clock_cap: Family<GpuLabels, Ratio> =
        family(r, "vgpu_gpu_clock_cap_hertz", "Highest SM clock vgpu carbon apply locked the GPU to (absent when not locked)");
    let power_cap: Family<GpuLabels, Ratio> =
        family(r, "vgpu_gpu_power_cap_watts", "Power limit vgpu carbon apply set on the GPU (absent when none)");
    let procs: Family<GpuLabels, Int> = family(r, "vgpu_gpu_processes", "Processes NVML lists on the GPU");
    let unmanaged: Family<GpuLabels, Int> = family(r, "vgpu_gpu_unmanaged_processes", "Processes on the GPU that are in no vGPU");
    for g in &m.gpus {
        let l = GpuLabels { gpu: g.index.to_string(), uuid: g.uuid.clone() };
        info.get_or_create(&GpuInfoLabels { gpu: l.gpu.clone(), uuid: l.uuid.clone(), name: g.name.clone() }).set(1);
        mem_total.get_or_create(&l).set(g.memory_total_bytes);
        mem_used.get_or_create(&l).set(g.memory_used_bytes);
        if let Some(pct) = g.utilization_pct {
            util.get_or_create(&l).set(f64::from(pct) / 100.0);
        }
        if let Some(w) = g.power_w {
            power.get_or_create(&l).set(w);
        }
        if let Some(mj) = g.energy_mj {
            energy.get_or_create(&l).inc_by(mj as f64 / 1000.0);
        }
        if let Some(mhz) = g.sm_clock_mhz {
            clock.get_or_create(&l).set(mhz_to_hz(mhz));
        }
        if let Some(mhz) = g.sm_clock_max_mhz {
            clock_max.get_or_create(&l).set(mhz_to_hz(mhz));
        }
        let held = match g.cap {
            Some(Cap::LockedClocks { max_mhz, .. }) => {
                clock_cap.get_or_create(&l).set(mhz_to_hz(max_mhz));
                true
            }
            Some(Cap::PowerLimit { mw }) => {
                power_cap.get_or_create(&l).set(f64::from(mw) / 1000.0);
                true
            }
            Some(Cap::Uncapped) | None => false,
        };
        capped.get_or_create(&l).set(i64::from(held));
        procs.get_or_create(&l).set(g.processes as i64);
        unmanaged.get_or_create(&l).set(g.unmanaged_processes as i64);
    }
}

fn workloads(r: &mut Registry, m: &Metrics) {
    let info: Family<WorkloadInfoLabels, Int> =
        family(r, "vgpu_workload_info", "A workload vgpu runs (value 1), with its partition (empty: none), compute policy and Slurm job and step (empty: not a Slurm step)");
    let state: Family<WorkloadStateLabels, Int> =
        family(r, "vgpu_workload_state", "1 for the workload's state (waiting, starting, running, suspended), 0 for the others");
    let priority: Family<WorkloadLabels, Int> = family(r, "vgpu_workload_priority", "The workload's priority (0-100)");
    let processes: Family<WorkloadLabels, Int> = family(r, "vgpu_workload_processes", "Processes in the workload's cgroup");
    let blocks: Family<WorkloadLabels, Int> = family(r, "vgpu_workload_pool_blocks", "Compute pool blocks the workload asked for (--tflops)");
    let enforced: Family<WorkloadActionLabels, Int> = family(
        r,
        "vgpu_workload_enforcement",
        "1 while the workload's record says vgpu watch killed processes of it, ended it or throttled it (action: killed, ended, throttled)",
    );
    let quota: Family<WorkloadGpuLabels, Bytes> = family(r, "vgpu_workload_memory_quota_bytes", "The vGPU's device memory quota on the GPU");
    let used: Family<WorkloadGpuLabels, Bytes> =
        family(r, "vgpu_workload_memory_used_bytes", "Device memory the vGPU's processes hold on the GPU, as the shim counts it");
    let peak: Family<WorkloadGpuLabels, Bytes> =
        family(r, "vgpu_workload_memory_peak_bytes", "The most device memory the vGPU held on the GPU at once, as the shim counts it");
    let driver: Family<WorkloadGpuLabels, Bytes> = family(
        r,
        "vgpu_workload_memory_driver_bytes",
        "Device memory NVML reports for the workload's processes on the GPU (includes CUDA contexts, which the shim does not count)",
    );
    let target: Family<WorkloadGpuLabels, Ratio> =
        family(r, "vgpu_workload_compute_share_target_ratio", "The vGPU's compute share of the GPU (1 = unlimited)");
    let measured: Family<WorkloadGpuLabels, Ratio> = family(
        r,
        "vgpu_workload_compute_share_measured_ratio",
        "Share of the GPU's time the vGPU used over its last one-second window (absent when idle)",
    );
    let gpu_time: Family<WorkloadGpuLabels, Total> = family(r, "vgpu_workload_gpu_time_seconds", "GPU time charged to the vGPU on the GPU");
    let throttled: Family<WorkloadGpuLabels, Total> =
        family(r, "vgpu_workload_compute_throttled_seconds", "Time the vGPU's launches waited for its compute share on the GPU");
    let turns: Family<WorkloadGpuLabels, Total> =
        family(r, "vgpu_workload_compute_turns", "Turns the vGPU took on the GPU while other vGPUs had work there");
    let turn_wait: Family<WorkloadGpuLabels, Total> =
        family(r, "vgpu_workload_compute_turn_wait_seconds", "Time the vGPU's launches waited for a turn on the GPU");
    let avoided: Family<WorkloadGpuLabels, Total> =
        family(r, "vgpu_workload_compute_switches_avoided", "Context switches of the GPU the vGPU's turns avoided");
    for w in &m.workloads {
        let l = WorkloadLabels { id: w.id.clone(), name: w.name.clone(), user: w.user.clone() };
        info.get_or_create(&WorkloadInfoLabels {
            id: l.id.clone(),
            name: l.name.clone(),
            user: l.user.clone(),
            partition: w.partition.clone().unwrap_or_default(),
            compute_policy: w.compute_policy.clone(),
            slurm_job: w.slurm.as_ref().map(|(job, _)| job.to_string()).unwrap_or_default(),
            slurm_step: w.slurm.as_ref().map(|(_, step)| step.clone()).unwrap_or_default(),
        })
        .set(1);
        let mut states: Vec<&str> = WORKLOAD_STATES.to_vec();
        if !states.contains(&w.state.as_str()) {
            states.push(&w.state);
        }
        for s in states {
            let labels = WorkloadStateLabels { id: l.id.clone(), name: l.name.clone(), user: l.user.clone(), state: s.to_string() };
            state.get_or_create(&labels).set(i64::from(s == w.state));
        }
        priority.get_or_create(&l).set(i64::from(w.priority));
        processes.get_or_create(&l).set(w.processes as i64);
        if let Some(b) = w.pool_blocks {
            blocks.get_or_create(&l).set(i64::try_from(b).unwrap_or(i64::MAX));
        }
        if let Some(action) = &w.enforcement {
            let labels = WorkloadActionLabels { id: l.id.clone(), name: l.name.clone(), user: l.user.clone(), action: action.clone() };
            enforced.get_or_create(&labels).set(1);
        }
        for g in &w.gpus {
            let gl = WorkloadGpuLabels { id: l.id.clone(), name: l.name.clone(), user: l.user.clone(), gpu: g.index.to_string() };
            quota.get_or_create(&gl).set(g.memory_quota_bytes);
            if let Some(b) = g.memory_used_bytes {
                used.get_or_create(&gl).set(b);
            }
            if let Some(b) = g.memory_peak_bytes {
                peak.get_or_create(&gl).set(b);
            }
            if let Some(b) = g.memory_driver_bytes {
                driver.get_or_create(&gl).set(b);
            }
            target.get_or_create(&gl).set(f64::from(g.compute_target_pct) / 100.0);
            if let Some(pct) = g.compute_measured_pct {
                measured.get_or_create(&gl).set(pct / 100.0);
            }
            gpu_time.get_or_create(&gl).inc_by(g.gpu_time_ns as f64 / 1e9);
            throttled.get_or_create(&gl).inc_by(g.throttled_ns as f64 / 1e9);
            turns.get_or_create(&gl).inc_by(g.turns_taken as f64);
            turn_wait.get_or_create(&gl).inc_by(g.turn_wait_ns as f64 / 1e9);
            avoided.get_or_create(&gl).inc_by(g.switches_avoided as f64);
        }
    }
}

fn services(r: &mut Registry, m: &Metrics) {
    let replicas: Family<ServiceReplicasLabels, Int> =
        family(r, "vgpu_service_replicas", "Replicas of a service vgpu watch runs: kind=desired (what it keeps) and kind=actual (running)");
    let signal: Family<ServiceSignalLabels, Ratio> =
        family(r, "vgpu_service_signal_ratio", "A scaling signal of a service at its last decision: the mean utilization over its replicas (1 = 100%)");
    let target: Family<ServiceSignalLabels, Ratio> =
        family(r, "vgpu_service_signal_target_ratio", "The utilization a service is scaled to keep for the signal");
    for s in &m.services {
        for (kind, n) in [("desired", s.desired), ("actual", s.actual)] {
            replicas.get_or_create(&ServiceReplicasLabels { service: s.name.clone(), kind: kind.into() }).set(i64::from(n));
        }
        for (name, value, goal) in &s.signals {
            let l = ServiceSignalLabels { service: s.name.clone(), signal: name.clone() };
            signal.get_or_create(&l).set(*value);
            target.get_or_create(&l).set(*goal);
        }
    }
}

fn pool(r: &mut Registry, m: &Metrics) {
    let Some(p) = &m.pool else { return };
    let block: Ratio = single(r, "vgpu_pool_block_tflops", "TFLOPS of one compute pool block");
    block.set(p.block_tflops);
    let total: Int = single(r, "vgpu_pool_blocks", "Blocks of the compute pool, all devices");
    total.set(i64::try_from(p.total_blocks).unwrap_or(i64::MAX));
    let used: Int = single(r, "vgpu_pool_used_blocks", "Blocks of the compute pool held by running workloads");
    used.set(i64::try_from(p.used_blocks).unwrap_or(i64::MAX));
    let by_priority: Family<PriorityLabels, Int> =
        family(r, "vgpu_pool_priority_used_blocks", "Blocks of the compute pool held by running workloads of this priority");
    for (prio, blocks) in &p.used_by_priority {
        by_priority.get_or_create(&PriorityLabels { priority: prio.to_string() }).set(i64::try_from(*blocks).unwrap_or(i64::MAX));
    }
    let workloads: Family<StateLabels, Int> =
        family(r, "vgpu_pool_workloads", "Workloads the compute pool knows, by state (running, suspended, waiting)");
    for (state, n) in &p.workloads_by_state {
        workloads.get_or_create(&StateLabels { state: state.clone() }).set(i64::try_from(*n).unwrap_or(i64::MAX));
    }
}

fn carbon(r: &mut Registry, m: &Metrics) {
    let c = &m.carbon;
    if let Some(i) = &c.intensity {
        let g: Family<SourceLabels, Ratio> = family(
            r,
            "vgpu_carbon_intensity_grams_per_kwh",
            "The grid's carbon intensity in gCO2/kWh, as vgpu carbon would plan with it (status: fresh, cached, fallback)",
        );
        g.get_or_create(&SourceLabels { source: i.source.clone(), status: i.status.clone() }).set(i.g_per_kwh);
        let t: Ratio = single(r, "vgpu_carbon_intensity_timestamp_seconds", "The time the carbon intensity value is for, as its source dates it");
        t.set(i.timestamp_unix_s as f64);
    }
    if let Some(b) = c.budget_g_per_hour {
        let g: Ratio = single(r, "vgpu_carbon_budget_grams_per_hour", "The carbon budget for all GPUs of the host, gCO2 per hour ([carbon] budget_g_per_hour)");
        g.set(b);
    }
    if let Some(rate) = c.emission_rate_g_per_hour {
        let g: Ratio = single(
            r,
            "vgpu_carbon_emission_rate_grams_per_hour",
            "Predicted emission rate of the host's GPUs now: their power draw times the carbon intensity, gCO2 per hour",
        );
        g.set(rate);
    }
}

/// OpenMetrics text as `prometheus-client` writes it → the classic Prometheus text format:
/// no `# EOF` or `# UNIT` lines, and a counter's family named like its samples
/// (`x_total`; OpenMetrics names the family `x`).
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut help: Option<(&str, &str)> = None;
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            if let Some((name, text)) = help.take() {
                let _ = writeln!(out, "# HELP {name} {text}");
            }
            help = Some(rest.split_once(' ').unwrap_or((rest, "")));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let (name, kind) = match kind {
                "counter" => (format!("{name}_total"), "counter"),
                "gauge" | "histogram" | "summary" => (name.to_string(), kind),
                _ => (name.to_string(), "untyped"),
            };
            if let Some((help_name, text)) = help.take() {
                let help_name = if help_name == rest.split(' ').next().unwrap_or_default() { name.as_str() } else { help_name };
                let _ = writeln!(out, "# HELP {help_name} {text}");
            }
            let _ = writeln!(out, "# TYPE {name} {kind}");
            continue;
        }
        if let Some((name, text)) = help.take() {
            let _ = writeln!(out, "# HELP {name} {text}");
        }
        out.push_str(line);
        out.push('\n');
    }
    if let Some((name, text)) = help {
        let _ = writeln!(out, "# HELP {name} {text}");
    }
    out
}

#[cfg(test)]
mod tests;
