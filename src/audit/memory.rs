//! The memory audit (pure): does a vGPU's processes really hold more device memory than its
//! quota, by the driver's count? The shim's own figures are the tenant's to write (its usage
//! file is theirs), so they only pick whom to blame and explain; the verdict rests on NVML.
//!
//! A process holds a CUDA context the shim does not count (about 500 MiB on an H100), so
//! each process holding memory is allowed `allowance` beyond the quota. A vGPU over that
//! for at least `grace` is in breach; its offenders are the processes that hold more than
//! the shim counted for them (plus the allowance): those that escaped it. When none did
//! (the shim's counter was tampered with), every process holding memory is.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use vgpu_abi::process::ProcessId;
use vgpu_abi::size::format_size;

/// One process of a vGPU on one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessMemory {
    pub process: ProcessId,
    /// What the driver says it holds.
    pub driver_bytes: u64,
    /// What the shim counted for it (its per-process file); None: no file (no shim).
    pub shim_bytes: Option<u64>,
}

/// One vGPU on one GPU: its quota there and its processes' memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VgpuMemory {
    pub vgpu: String,
    pub gpu_index: u32,
    pub gpu_uuid: String,
    /// 0 on a GPU that is not part of the vGPU (its processes reached it anyway).
    pub quota: u64,
    /// Whether the GPU is one of the vGPU's.
    pub in_vgpu: bool,
    pub processes: Vec<ProcessMemory>,
}

/// A vGPU over its quota on one GPU for longer than the grace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Breach {
    pub vgpu: String,
    pub gpu_index: u32,
    pub gpu_uuid: String,
    pub held: u64,
    pub quota: u64,
    /// Held beyond what the shim counted for these processes.
    pub uncounted: u64,
    pub offenders: Vec<ProcessId>,
    /// One line for the record, `ps` and the log.
    pub reason: String,
}

/// What the audit remembers between rounds: since when each vGPU has been over, per GPU.
#[derive(Debug, Default)]
pub struct MemoryAudit {
    over_since: HashMap<(String, String), Instant>,
}

impl MemoryAudit {
    /// Judge one round's figures. Every vGPU in breach is returned at every round it stays
    /// in breach (the caller does not signal a process twice).
    pub fn observe(&mut self, now: Instant, vgpus: &[VgpuMemory], allowance: u64, grace: Duration) -> Vec<Breach> {
        let mut breaches = Vec::new();
        let mut seen = Vec::new();
        for v in vgpus {
            let key = (v.vgpu.clone(), v.gpu_uuid.clone());
            let Some(mut breach) = over(v, allowance) else { continue };
            seen.push(key.clone());
            let since = *self.over_since.entry(key).or_insert(now);
            if now.saturating_duration_since(since) >= grace {
                breach.reason = reason(v, &breach);
                breaches.push(breach);
            }
        }
        self.over_since.retain(|k, _| seen.contains(k));
        breaches
    }
}

impl MemoryAudit {
    /// When the first vGPU now over its quota reaches the end of its grace: a round then
    /// judges it without waiting for the next interval.
    pub fn next_verdict(&self, grace: Duration) -> Option<Instant> {
        self.over_since.values().map(|since| *since + grace).min()
    }
}

/// The breach, if `v` holds more than its quota plus the allowances (reason not set yet).
fn over(v: &VgpuMemory, allowance: u64) -> Option<Breach> {
    let holding: Vec<&ProcessMemory> = v.processes.iter().filter(|p| p.driver_bytes > 0).collect();
    let held: u64 = holding.iter().map(|p| p.driver_bytes).sum();
    let limit = v.quota.saturating_add(allowance.saturating_mul(holding.len() as u64));
    if held <= limit {
        return None;
    }
    let counted: u64 = holding.iter().map(|p| p.shim_bytes.unwrap_or(0)).sum();
    let escaped: Vec<ProcessId> = holding
        .iter()
        .filter(|p| p.driver_bytes > p.shim_bytes.unwrap_or(0).saturating_add(allowance))
        .map(|p| p.process)
        .collect();
    let offenders = if escaped.is_empty() { holding.iter().map(|p| p.process).collect() } else { escaped };
    Some(Breach {
        vgpu: v.vgpu.clone(),
        gpu_index: v.gpu_index,
        gpu_uuid: v.gpu_uuid.clone(),
        held,
        quota: v.quota,
        uncounted: held.saturating_sub(counted),
        offenders,
        reason: String::new(),
    })
}

fn reason(v: &VgpuMemory, b: &Breach) -> String {
    if !v.in_vgpu {
        return format!("uses GPU {} outside its vGPU: {} held there, not counted by the shim", b.gpu_index, format_size(b.held));
    }
    let counted = if b.uncounted >= b.held.saturating_sub(b.quota).max(1) {
        format!("{} not counted by the shim", format_size(b.uncounted))
    } else {
        format!("{} not counted by the shim (its counter was changed?)", format_size(b.uncounted))
    };
    format!("over memory quota on GPU {}: {} of {}, {counted}", b.gpu_index, format_size(b.held), format_size(b.quota))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    fn pid(n: u32) -> ProcessId {
        ProcessId { pid: n, start_time: 7 }
    }

    fn vgpu(quota: u64, procs: &[(u32, u64, Option<u64>)]) -> VgpuMemory {
        VgpuMemory {
            vgpu: "v".into(),
            gpu_index: 0,
            gpu_uuid: "GPU-0".into(),
            quota,
            in_vgpu: true,
            processes: procs.iter().map(|&(p, d, s)| ProcessMemory { process: pid(p), driver_bytes: d, shim_bytes: s }).collect(),
        }
    }

    #[test]
    fn an_escaped_process_is_blamed_after_the_grace() {
        let mut audit = MemoryAudit::default();
        let t0 = Instant::now();
        let v = vgpu(GIB, &[(1, 512 * MIB, Some(400 * MIB)), (2, 6 * GIB, None)]);
        let grace = Duration::from_millis(500);
        assert!(audit.observe(t0, std::slice::from_ref(&v), 512 * MIB, grace).is_empty(), "within the grace");
        assert_eq!(audit.next_verdict(grace), Some(t0 + grace));
        let b = audit.observe(t0 + grace, std::slice::from_ref(&v), 512 * MIB, grace);
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].offenders, vec![pid(2)], "the shim-counted process is not blamed");
        assert_eq!(b[0].reason, "over memory quota on GPU 0: 6.50 GiB of 1 GiB, 6.11 GiB not counted by the shim");
    }

    #[test]
    fn the_allowance_covers_contexts_and_the_grace_restarts_after_a_dip() {
        let mut audit = MemoryAudit::default();
        let t0 = Instant::now();
        let within = vgpu(GIB, &[(1, GIB + 500 * MIB, Some(GIB)), (2, 500 * MIB, Some(0))]);
        assert!(audit.observe(t0, std::slice::from_ref(&within), 512 * MIB, Duration::ZERO).is_empty());
        let over = vgpu(GIB, &[(1, 3 * GIB, Some(GIB))]);
        let g = Duration::from_secs(1);
        assert!(audit.observe(t0, std::slice::from_ref(&over), 512 * MIB, g).is_empty());
        assert!(audit.observe(t0 + g / 2, std::slice::from_ref(&within), 512 * MIB, g).is_empty(), "back within");
        assert!(audit.observe(t0 + g, std::slice::from_ref(&over), 512 * MIB, g).is_empty(), "a new grace started");
        assert_eq!(audit.observe(t0 + 2 * g, std::slice::from_ref(&over), 512 * MIB, g).len(), 1);
    }

    #[test]
    fn a_tampered_counter_blames_every_holder() {
        // The shim counted everything per process, but the shared counter was reset, so it
        // let them past the quota: nobody escaped, all are over together.
        let mut audit = MemoryAudit::default();
        let v = vgpu(GIB, &[(1, 2 * GIB, Some(2 * GIB)), (2, 2 * GIB, Some(2 * GIB))]);
        let b = audit.observe(Instant::now(), &[v], 0, Duration::ZERO);
        assert_eq!(b[0].offenders, vec![pid(1), pid(2)]);
        assert!(b[0].reason.contains("0 B not counted by the shim (its counter was changed?)"), "{}", b[0].reason);
    }

    #[test]
    fn memory_on_a_gpu_outside_the_vgpu() {
        let mut v = vgpu(0, &[(1, GIB, None)]);
        v.in_vgpu = false;
        v.gpu_index = 1;
        let b = MemoryAudit::default().observe(Instant::now(), &[v], 512 * MIB, Duration::ZERO);
        assert_eq!(b[0].reason, "uses GPU 1 outside its vGPU: 1 GiB held there, not counted by the shim");
    }

    proptest! {
        /// A vGPU is judged over exactly when the driver's total passes quota + allowances,
        /// and then every offender holds memory and is one of its processes.
        #[test]
        fn verdicts_follow_the_driver(quota in 0u64..8 * GIB, allowance in 0u64..GIB,
                                      procs in proptest::collection::vec((0u64..4 * GIB, proptest::option::of(0u64..4 * GIB)), 0..6)) {
            let procs: Vec<(u32, u64, Option<u64>)> = procs.into_iter().enumerate().map(|(i, (d, s))| (i as u32 + 1, d, s)).collect();
            let v = vgpu(quota, &procs);
            let holders = procs.iter().filter(|p| p.1 > 0).count() as u64;
            let held: u64 = procs.iter().map(|p| p.1).sum();
            let b = MemoryAudit::default().observe(Instant::now(), std::slice::from_ref(&v), allowance, Duration::ZERO);
            prop_assert_eq!(!b.is_empty(), held > quota + allowance * holders);
            for breach in &b {
                prop_assert!(!breach.offenders.is_empty());
                for o in &breach.offenders {
                    let p = procs.iter().find(|p| p.0 == o.pid).unwrap();
                    prop_assert!(p.1 > 0);
                }
                prop_assert_eq!(breach.held, held);
            }
        }
    }
}
