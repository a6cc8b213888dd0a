//! The load of a service's replicas, sampled once per round by the runner
//! ([`super::runner`]) for the scaler ([`super::scale`]): for each replica
//!
//! - **cpu**: the CPU time its cgroup used since the previous sample ÷ (the time between
//!   the samples × the CPUs it may use: its `--cpus`, else the host's CPUs);
//! - **mem**: the host memory its cgroup holds ÷ its `--memory` limit (unknown without one);
//! - **gpu**: its vGPU's measured compute share ÷ its compute share (the highest over its
//!   GPUs), from the shim's usage file as `vgpu ps` reads it; 0 when it launched nothing
//!   lately, unknown when the usage file cannot be read.
//!
//! A value that cannot be read is `None` ("unknown"), never 0: the scaler averages over the
//! replicas with a known value.

use std::collections::HashMap;
use std::time::Instant;

use vgpu_cgroups::Cgroup;

use vgpu_cgroups::Layout;
use vgpu_store::state::Store;
use vgpu_store::state::Workload;

use super::scale::Load;

/// A replica's limits that the utilizations are relative to (from its service definition).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Limits {
    /// `--cpus`; None: all of the host's.
    pub cpus: Option<f64>,
    /// `--memory`, bytes; None: no limit, so no memory utilization.
    pub memory: Option<u64>,
}

/// The CPU counters read at the previous sample, per workload id.
#[derive(Debug, Default)]
pub struct Sampler {
    cpu: HashMap<String, (Instant, u64)>,
}

impl Sampler {
    /// One replica's load now. Its first sample has no CPU figure (no interval yet).
    pub fn sample(&mut self, store: &Store, layout: Option<&Layout>, w: &Workload, limits: Limits, now: Instant) -> Load {
        let stats = layout.and_then(|l| Cgroup::open_at(l, &w.cgroup_home, &w.cgroup).ok()).and_then(|c| c.stats().ok());
        let cpu = stats.and_then(|s| s.cpu_usage_ns).and_then(|used| {
            let before = self.cpu.insert(w.id.clone(), (now, used));
            let (then, used_then) = before?;
            cpu_utilization(used.checked_sub(used_then)?, now.saturating_duration_since(then).as_nanos() as f64, limits.cpus.unwrap_or_else(host_cpus))
        });
        let mem = stats.and_then(|s| s.memory_bytes).and_then(|used| mem_utilization(used, limits.memory?));
        let row = vgpu_host::listing::row(store, None, w, false);
        let gpu = if row.usage_readable { row.gpus.iter().map(|g| gpu_utilization(g.compute_measured_pct, g.compute_pct)).reduce(f64::max) } else { None };
        Load { cpu, mem, gpu }
    }

    /// Forget the counters of workloads that are gone (`alive`: the ids still running).
    pub fn retain(&mut self, alive: &[&str]) {
        self.cpu.retain(|id, _| alive.contains(&id.as_str()));
    }
}

/// CPU time used (`used_ns`) over `elapsed_ns` on `cpus` CPUs; None over no time.
pub fn cpu_utilization(used_ns: u64, elapsed_ns: f64, cpus: f64) -> Option<f64> {
    (elapsed_ns > 0.0 && cpus > 0.0).then(|| used_ns as f64 / (elapsed_ns * cpus))
}

/// Memory held over the limit.
pub fn mem_utilization(used: u64, limit: u64) -> Option<f64> {
    (limit > 0).then(|| used as f64 / limit as f64)
}

/// The measured share (percent of the GPU; None: nothing launched lately, so 0) over the
/// target share (percent).
pub fn gpu_utilization(measured_pct: Option<f64>, share_pct: u32) -> f64 {
    measured_pct.unwrap_or(0.0) / f64::from(share_pct.max(1))
}

/// The CPUs this process may run on (its affinity), else the online ones.
pub fn host_cpus() -> f64 {
    std::thread::available_parallelism().map(|n| n.get() as f64).unwrap_or(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_is_the_share_of_the_cpus_it_may_use() {
        // 0.2 CPU-seconds over one second with --cpus 0.2: fully used.
        assert_eq!(cpu_utilization(200_000_000, 1e9, 0.2), Some(1.0));
        // Half a CPU-second over one second on 2 CPUs.
        assert_eq!(cpu_utilization(500_000_000, 1e9, 2.0), Some(0.25));
        assert_eq!(cpu_utilization(1, 0.0, 1.0), None);
    }

    #[test]
    fn memory_is_usage_over_the_limit() {
        assert_eq!(mem_utilization(3 << 20, 4 << 20), Some(0.75));
        assert_eq!(mem_utilization(1, 0), None);
    }

    #[test]
    fn gpu_is_the_measured_share_over_the_target_share() {
        assert_eq!(gpu_utilization(Some(30.0), 60), 0.5);
        assert_eq!(gpu_utilization(None, 50), 0.0);
        assert_eq!(gpu_utilization(Some(100.0), 100), 1.0);
    }
}
