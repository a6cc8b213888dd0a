//! What one `vgpu watch` round adds to the history, computed from what the round saw: a pure
//! function ([`build`]) of the previous readings, this round's [`Snapshot`], the workloads'
//! records and their vGPUs' compute ledgers.
//!
//! * A GPU's energy is the delta of NVML's total-energy counter since the previous reading
//!   ('counter'); a counter that went backwards (the driver reloaded) or is missing gives
//!   power × duration ('power', the power at the end). Its busy time is the device
//!   utilization × duration.
//! * A workload's GPU time on a GPU is the delta of its vGPU's ledger (`charged_ns`) where the
//!   vGPU has a compute limit, is the workload's alone, and the ledger advanced ('ledger');
//!   else the sum of NVML's SM utilization of its processes there × duration ('nvml'). Either
//!   is capped at the duration. Zero is not recorded.
//! * The first round after a start continues from the database's last reading of each GPU
//!   when it is at most [`MAX_BRIDGE`] old, so that a restarted watch loses no energy;
//!   workload GPU time is recorded only between two rounds of the same watch (the ledger and
//!   NVML's process samples of a gap are not known), so the gap's energy reads as idle.

use std::collections::HashMap;
use std::time::Duration;

use vgpu_gpu::snapshot::Owner;

use vgpu_gpu::snapshot::Snapshot;
use vgpu_store::state::Workload;

/// The longest gap between a previous watch's last reading and a new watch's first that is
/// bridged (recorded as one interval); a longer one is left out of the history.
pub const MAX_BRIDGE: Duration = Duration::from_secs(600);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnergySource {
    Counter,
    Power,
}

impl EnergySource {
    pub fn as_str(self) -> &'static str {
        match self {
            EnergySource::Counter => "counter",
            EnergySource::Power => "power",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeSource {
    Ledger,
    Nvml,
}

impl TimeSource {
    pub fn as_str(self) -> &'static str {
        match self {
            TimeSource::Ledger => "ledger",
            TimeSource::Nvml => "nvml",
        }
    }
}

/// One gpu_samples row.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuRow {
    pub t0_ms: u64,
    pub t1_ms: u64,
    pub gpu_uuid: String,
    pub gpu_index: u32,
    pub gpu_name: String,
    pub energy_mj: u64,
    pub energy_source: EnergySource,
    pub busy_ms: Option<u64>,
    pub sm_clock_mhz: Option<u32>,
    pub power_w: Option<f64>,
    /// NVML's counter at t1, for the next watch to continue from.
    pub energy_counter_mj: Option<u64>,
}

/// One workload_gpu_time row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadRow {
    pub t0_ms: u64,
    pub t1_ms: u64,
    pub workload_id: String,
    pub gpu_uuid: String,
    pub busy_ms: u64,
    pub source: TimeSource,
}

/// One round's rows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tick {
    pub gpus: Vec<GpuRow>,
    pub workloads: Vec<WorkloadRow>,
}

impl Tick {
    /// Add the next round's rows (whose intervals start where these end) to these: one
    /// longer interval per GPU and per workload on a GPU, so that the history can be written
    /// less often than the watch's rounds (`[history] interval`) or after a failed write.
    /// Energy and busy time add up; clock, power and counter are the latest; a GPU
    /// interval with any part from power × duration is 'power', a workload interval with any
    /// part from NVML is 'nvml'. A row that does not continue one here is kept as it is.
    pub fn absorb(&mut self, next: Tick) {
        for r in next.gpus {
            match self.gpus.iter_mut().find(|o| o.gpu_uuid == r.gpu_uuid && o.t1_ms == r.t0_ms) {
                Some(o) => {
                    o.t1_ms = r.t1_ms;
                    o.energy_mj += r.energy_mj;
                    if r.energy_source == EnergySource::Power {
                        o.energy_source = EnergySource::Power;
                    }
                    o.busy_ms = o.busy_ms.zip(r.busy_ms).map(|(a, b)| a + b);
                    (o.gpu_index, o.sm_clock_mhz, o.power_w, o.energy_counter_mj) = (r.gpu_index, r.sm_clock_mhz, r.power_w, r.energy_counter_mj);
                }
                None => self.gpus.push(r),
            }
        }
        for r in next.workloads {
            match self.workloads.iter_mut().find(|o| o.workload_id == r.workload_id && o.gpu_uuid == r.gpu_uuid && o.t1_ms == r.t0_ms) {
                Some(o) => {
                    o.t1_ms = r.t1_ms;
                    o.busy_ms += r.busy_ms;
                    if r.source == TimeSource::Nvml {
                        o.source = TimeSource::Nvml;
                    }
                }
                None => self.workloads.push(r),
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.gpus.is_empty() && self.workloads.is_empty()
    }
}

/// A GPU's previous reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastGpu {
    pub t_ms: u64,
    pub counter_mj: Option<u64>,
}

/// What the recorder carries from one round to the next.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Previous {
    /// Per GPU UUID: the previous round's reading.
    pub gpus: HashMap<String, LastGpu>,
    /// Per GPU UUID: the last reading a previous watch recorded (bridged if recent enough).
    pub restored: HashMap<String, LastGpu>,
    /// Per (vGPU, GPU UUID): the ledger's `charged_ns` at the previous round.
    pub ledgers: HashMap<(String, String), u64>,
    /// The previous round's time (None: this is the watch's first).
    pub t_ms: Option<u64>,
}

/// One device of a vGPU's usage file: its compute limit and ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ledger {
    pub vgpu: String,
    pub gpu_uuid: String,
    /// 1..=100; 100: no limit.
    pub compute_pct: u32,
    pub charged_ns: u64,
}

/// This round's rows and what the next round starts from.
pub fn build(prev: &Previous, snapshot: &Snapshot, workloads: &[Workload], ledgers: &[Ledger]) -> (Tick, Previous) {
    let t1 = snapshot.taken_unix_ms;
    let mut tick = Tick::default();
    let mut next = Previous { t_ms: Some(t1), ..Previous::default() };
    for g in &snapshot.gpus {
        next.gpus.insert(g.uuid.clone(), LastGpu { t_ms: t1, counter_mj: g.energy_mj });
        let last = match (prev.gpus.get(&g.uuid), prev.restored.get(&g.uuid)) {
            (Some(last), _) => *last,
            (None, Some(last)) if t1.saturating_sub(last.t_ms) <= MAX_BRIDGE.as_millis() as u64 => *last,
            _ => continue,
        };
        if t1 <= last.t_ms {
            continue; // the clock stepped back: nothing to say about this interval
        }
        let dt = t1 - last.t_ms;
        let (energy_mj, energy_source) = match (last.counter_mj, g.energy_mj) {
            (Some(before), Some(now)) if now >= before => (now - before, EnergySource::Counter),
            _ => match g.power_w.filter(|w| w.is_finite() && *w >= 0.0) {
                // W × ms = mJ.
                Some(w) => ((w * dt as f64).round() as u64, EnergySource::Power),
                None => continue,
            },
        };
        tick.gpus.push(GpuRow {
            t0_ms: last.t_ms,
            t1_ms: t1,
            gpu_uuid: g.uuid.clone(),
            gpu_index: g.index,
            gpu_name: g.name.clone(),
            energy_mj,
            energy_source,
            busy_ms: g.utilization_pct.map(|u| share(u64::from(u.min(100)), dt)),
            sm_clock_mhz: g.sm_clock_mhz,
            power_w: g.power_w,
            energy_counter_mj: g.energy_mj,
        });
    }
    for l in ledgers {
        next.ledgers.insert((l.vgpu.clone(), l.gpu_uuid.clone()), l.charged_ns);
    }
    let Some(t0) = prev.t_ms.filter(|t0| *t0 < t1) else { return (tick, next) };
    let dt = t1 - t0;
    for w in workloads {
        let alone = workloads.iter().filter(|o| o.vgpu == w.vgpu).count() == 1;
        for g in &snapshot.gpus {
            let mine: Vec<_> = g.processes.iter().filter(|p| matches!(&p.owner, Owner::Workload(c) if *c == w.cgroup)).collect();
            if mine.is_empty() && !w.gpus.iter().any(|wg| wg.uuid == g.uuid) {
                continue;
            }
            let ledger = ledgers.iter().find(|l| l.vgpu == w.vgpu && l.gpu_uuid == g.uuid).filter(|l| alone && l.compute_pct < 100);
            let advanced = ledger.and_then(|l| {
                let before = *prev.ledgers.get(&(l.vgpu.clone(), l.gpu_uuid.clone()))?;
                (l.charged_ns > before).then(|| l.charged_ns - before)
            });
            let (busy_ms, source) = match advanced {
                Some(ns) => ((ns / 1_000_000).min(dt), TimeSource::Ledger),
                None => {
                    let pct: u64 = mine.iter().map(|p| u64::from(p.sm_util_pct.unwrap_or(0))).sum();
                    (share(pct, dt).min(dt), TimeSource::Nvml)
                }
            };
            if busy_ms > 0 {
                tick.workloads.push(WorkloadRow {
                    t0_ms: t0,
                    t1_ms: t1,
                    workload_id: w.id.clone(),
                    gpu_uuid: g.uuid.clone(),
                    busy_ms,
                    source,
                });
            }
        }
    }
    (tick, next)
}

/// `pct` % of `dt` ms.
fn share(pct: u64, dt: u64) -> u64 {
    pct.saturating_mul(dt) / 100
}

#[cfg(test)]
mod tests;
