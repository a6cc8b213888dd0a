//! The memory audit (pure): does a vGPU's processes really hold more device memory than its
//! quota, by the driver's count? The shim's own figures are the tenant's to write (its usage
//! file is theirs), so they only pick whom to blame and explain; the verdict rests on NVML.
//!
//! A process that uses a GPU holds a CUDA context there that the shim does not count (a few
//! hundred MiB), so each process NVML lists on a GPU of the vGPU is allowed what one context
//! takes on that GPU (`context_bytes`: measured by the watch, see `gpu::context`), and never
//! more than it holds: the allowance is the contexts' memory, not room a process can fill.
//! On a GPU outside the vGPU the quota is 0 and there is no allowance: any memory there is
//! a breach. A vGPU over for at least `grace` is in breach; its offenders are the processes
//! that hold more than the shim counted for them plus one context: those that escaped it.
//! When none did (the shim's counter was tampered with), every process holding memory is.

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
    /// What one CUDA context takes on this GPU: each process's allowance (ignored outside
    /// the vGPU).
    pub context_bytes: u64,
    pub processes: Vec<ProcessMemory>,
}

impl VgpuMemory {
    /// What its processes are allowed beyond the quota: one context each, at most what
    /// each holds; nothing on a GPU outside the vGPU.
    pub fn allowance(&self) -> u64 {
        if !self.in_vgpu {
            return 0;
        }
        self.processes.iter().map(|p| p.driver_bytes.min(self.context_bytes)).fold(0u64, u64::saturating_add)
    }

    /// Each process's own allowance: one context (none outside the vGPU).
    fn per_process(&self) -> u64 {
        if self.in_vgpu {
            self.context_bytes
        } else {
            0
        }
    }
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
    pub fn observe(&mut self, now: Instant, vgpus: &[VgpuMemory], grace: Duration) -> Vec<Breach> {
        let mut breaches = Vec::new();
        let mut seen = Vec::new();
        for v in vgpus {
            let key = (v.vgpu.clone(), v.gpu_uuid.clone());
            let Some(mut breach) = over(v) else { continue };
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

/// The breach, if `v` holds more than its quota plus the allowance (reason not set yet).
fn over(v: &VgpuMemory) -> Option<Breach> {
    let holding: Vec<&ProcessMemory> = v.processes.iter().filter(|p| p.driver_bytes > 0).collect();
    let held: u64 = holding.iter().map(|p| p.driver_bytes).fold(0u64, u64::saturating_add);
    let limit = v.quota.saturating_add(v.allowance());
    if held <= limit {
        return None;
    }
    let counted: u64 = holding.iter().map(|p| p.shim_bytes.unwrap_or(0)).fold(0u64, u64::saturating_add);
    let context = v.per_process();
    let escaped: Vec<ProcessId> = holding
        .iter()
        .filter(|p| p.driver_bytes > p.shim_bytes.unwrap_or(0).saturating_add(context))
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
        with_context(quota, 512 * MIB, procs)
    }

    fn with_context(quota: u64, context_bytes: u64, procs: &[(u32, u64, Option<u64>)]) -> VgpuMemory {
        VgpuMemory {
            vgpu: "v".into(),
            gpu_index: 0,
            gpu_uuid: "GPU-0".into(),
            quota,
            in_vgpu: true,
            context_bytes,
            processes: procs.iter().map(|&(p, d, s)| ProcessMemory { process: pid(p), driver_bytes: d, shim_bytes: s }).collect(),
        }
    }

    #[test]
    fn an_escaped_process_is_blamed_after_the_grace() {
        let mut audit = MemoryAudit::default();
        let t0 = Instant::now();
        let v = vgpu(GIB, &[(1, 512 * MIB, Some(400 * MIB)), (2, 6 * GIB, None)]);
        let grace = Duration::from_millis(500);
        assert!(audit.observe(t0, std::slice::from_ref(&v), grace).is_empty(), "within the grace");
        assert_eq!(audit.next_verdict(grace), Some(t0 + grace));
        let b = audit.observe(t0 + grace, std::slice::from_ref(&v), grace);
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].offenders, vec![pid(2)], "the shim-counted process is not blamed");
        assert_eq!(b[0].reason, "over memory quota on GPU 0: 6.50 GiB of 1 GiB, 6.11 GiB not counted by the shim");
    }

    #[test]
    fn the_allowance_covers_contexts_and_the_grace_restarts_after_a_dip() {
        let mut audit = MemoryAudit::default();
        let t0 = Instant::now();
        let within = vgpu(GIB, &[(1, GIB + 500 * MIB, Some(GIB)), (2, 500 * MIB, Some(0))]);
        assert!(audit.observe(t0, std::slice::from_ref(&within), Duration::ZERO).is_empty());
        let over = vgpu(GIB, &[(1, 3 * GIB, Some(GIB))]);
        let g = Duration::from_secs(1);
        assert!(audit.observe(t0, std::slice::from_ref(&over), g).is_empty());
        assert!(audit.observe(t0 + g / 2, std::slice::from_ref(&within), g).is_empty(), "back within");
        assert!(audit.observe(t0 + g, std::slice::from_ref(&over), g).is_empty(), "a new grace started");
        assert_eq!(audit.observe(t0 + 2 * g, std::slice::from_ref(&over), g).len(), 1);
    }

    #[test]
    fn a_tampered_counter_blames_every_holder() {
        // The shim counted everything per process, but the shared counter was reset, so it
        // let them past the quota: nobody escaped, all are over together.
        let mut audit = MemoryAudit::default();
        let v = vgpu(GIB, &[(1, 2 * GIB, Some(2 * GIB)), (2, 2 * GIB, Some(2 * GIB))]);
        let b = audit.observe(Instant::now(), &[VgpuMemory { context_bytes: 0, ..v }], Duration::ZERO);
        assert_eq!(b[0].offenders, vec![pid(1), pid(2)]);
        assert!(b[0].reason.contains("0 B not counted by the shim (its counter was changed?)"), "{}", b[0].reason);
    }

    #[test]
    fn memory_on_a_gpu_outside_the_vgpu() {
        let mut v = vgpu(0, &[(1, GIB, None)]);
        v.in_vgpu = false;
        v.gpu_index = 1;
        let b = MemoryAudit::default().observe(Instant::now(), &[v], Duration::ZERO);
        assert_eq!(b[0].reason, "uses GPU 1 outside its vGPU: 1 GiB held there, not counted by the shim");
    }

    /// Issue 24, item 2: twelve processes that bypass the shim and hold 500 MiB each in a
    /// 1 GiB vGPU. Under the old rule (512 MiB per process holding memory) they were
    /// within; with one measured context each (300 MiB here, all of which each holds) the
    /// 500 MiB each allocated beyond it are over the quota, and every one of them is blamed.
    #[test]
    fn memory_split_over_processes_is_over_the_quota() {
        let procs: Vec<(u32, u64, Option<u64>)> = (1..=12).map(|p| (p, 300 * MIB + 500 * MIB, None)).collect();
        let v = with_context(GIB, 300 * MIB, &procs);
        assert_eq!(v.allowance(), 12 * 300 * MIB);
        let b = MemoryAudit::default().observe(Instant::now(), &[v], Duration::ZERO);
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].offenders.len(), 12, "{:?}", b[0].offenders);
        // A process holding less than a context is allowed what it holds, no more.
        let small = with_context(GIB, 300 * MIB, &[(1, GIB, Some(GIB)), (2, 10 * MIB, None)]);
        assert_eq!(small.allowance(), 300 * MIB + 10 * MIB);
    }

    #[test]
    fn no_allowance_outside_the_vgpu() {
        // Four processes under one context each on a GPU the vGPU does not include.
        let mut v = with_context(0, 512 * MIB, &[(1, 500 * MIB, None), (2, 500 * MIB, None), (3, 500 * MIB, None), (4, 500 * MIB, None)]);
        v.in_vgpu = false;
        v.gpu_index = 1;
        assert_eq!(v.allowance(), 0);
        let b = MemoryAudit::default().observe(Instant::now(), &[v], Duration::ZERO);
        assert_eq!(b[0].offenders.len(), 4);
        assert_eq!(b[0].reason, "uses GPU 1 outside its vGPU: 1.95 GiB held there, not counted by the shim");
    }

    proptest! {
        /// A vGPU is judged over exactly when the driver's total passes quota + allowance,
        /// the allowance is never more than one context per process NVML lists (nor more
        /// than those processes hold, nor anything outside the vGPU), and every offender
        /// holds memory and is one of its processes.
        #[test]
        fn verdicts_follow_the_driver(quota in 0u64..8 * GIB, context in 0u64..GIB, in_vgpu in any::<bool>(),
                                      procs in proptest::collection::vec((0u64..4 * GIB, proptest::option::of(0u64..4 * GIB)), 0..6)) {
            let procs: Vec<(u32, u64, Option<u64>)> = procs.into_iter().enumerate().map(|(i, (d, s))| (i as u32 + 1, d, s)).collect();
            let v = VgpuMemory { in_vgpu, ..with_context(quota, context, &procs) };
            let listed = procs.len() as u64;
            let held: u64 = procs.iter().map(|p| p.1).sum();
            let allowance = v.allowance();
            prop_assert!(allowance <= context * listed, "at most one context per process");
            prop_assert!(allowance <= held, "never more than they hold");
            prop_assert!(in_vgpu || allowance == 0, "none outside the vGPU");
            let b = MemoryAudit::default().observe(Instant::now(), std::slice::from_ref(&v), Duration::ZERO);
            prop_assert_eq!(!b.is_empty(), held > quota + allowance);
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
