//! The compute audit (pure): does a vGPU use more of a GPU than its compute share, by the
//! driver's count, while the shim's ledger says it is within it? Then its work reaches the
//! GPU around the shim (a process that cleared `LD_PRELOAD`, a static link), and only an
//! audit from outside the process can hold it.
//!
//! Per vGPU and GPU, every round:
//!
//! - the **driver's share** is the sum of NVML's SM utilization of the vGPU's processes
//!   (the processes in its workloads' cgroups) since the previous round, at most 100;
//! - the **ledger's share** is what the shim measured over its last window (none: idle);
//! - it **bypasses** when the driver's share is above P + tolerance while the ledger's is
//!   not (a ledger that is over too is the shim's own business: `fair` lending, or shares
//!   that do not fit). Only a share below 100 % can be bypassed.
//!
//! A bypass that lasts a whole `window` is acted on by the policy: [`Action::Report`] once,
//! [`Action::Kill`] of the offenders, or [`Action::Throttle`]: the caller duty-cycles the
//! vGPU's workloads' cgroup freezers so that they run a fraction `run` of the time. While
//! throttled, `run` follows the driver's share by integral control ([`next_run`]) so that
//! it converges to P, and the vGPU's demand is judged as the driver's share ÷ `run` (what it
//! would use if let run). Throttling ends ([`Action::Release`]) once that demand has been
//! within for a whole window; if instead the driver's share stays above P + tolerance for a
//! whole window of throttling, throttling did not bring it down (kernels queued before each
//! freeze keep the GPU busy) and the offenders are killed ([`Action::Kill`], `escalated`).
//! Every change of phase needs a whole window of the new condition, so a vGPU near its
//! limit does not flap.
//!
//! **Outside the vGPU.** A GPU that is not one of the vGPU's, where its processes run
//! kernels anyway (they unset `CUDA_VISIBLE_DEVICES` and bypass the shim), is judged with a
//! share of 0 and no tolerance: any utilization there for a whole `window` is acted on, and
//! as nothing can be throttled down to 0, `throttle` kills there as `kill` does (`report`
//! still only reports).
//!
//! **Offenders** are the processes with a positive driver share that the shim does not
//! account for: no per-process file of the shim, or one whose charged GPU time (its
//! `compute_ns` on that GPU) has not grown for a window. When every process is accounted
//! for (the tenant's own ledger was tampered with), every process using the GPU is.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use vgpu_abi::process::ProcessId;

use vgpu_host::config::watch::ComputePolicy;

/// The lowest fraction of each period a throttled vGPU is let run.
pub const MIN_RUN: f64 = 0.05;
/// Gain of the integral control of `run`: each round closes half the gap between the
/// driver's share and the target (for a vGPU that would use the whole GPU).
pub const GAIN: f64 = 0.5;

/// One process of a vGPU on one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessCompute {
    pub process: ProcessId,
    /// NVML's SM utilization of it since the previous round, percent (0: no sample).
    pub driver_pct: u32,
    /// GPU time the shim charged to it on this GPU (its per-process file); None: no file.
    pub shim_ns: Option<u64>,
}

/// One vGPU on one GPU of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VgpuCompute {
    pub vgpu: String,
    pub gpu_index: u32,
    pub gpu_uuid: String,
    /// Its compute share there, percent (100: unlimited; 0 outside the vGPU).
    pub share_pct: u32,
    /// Whether the GPU is one of the vGPU's (outside it the share is 0, whatever
    /// `share_pct` says, and no tolerance applies).
    pub in_vgpu: bool,
    /// The share its ledger measured over the shim's last window, ppm; None: idle.
    pub ledger_ppm: Option<u64>,
    pub processes: Vec<ProcessCompute>,
}

impl VgpuCompute {
    /// The driver's share: its processes' utilization summed, at most 100.
    pub fn driver_pct(&self) -> u32 {
        self.processes.iter().map(|p| p.driver_pct).fold(0u32, u32::saturating_add).min(100)
    }

    /// The ledger's share, percent (0 when idle).
    pub fn ledger_pct(&self) -> f64 {
        self.ledger_ppm.unwrap_or(0) as f64 / 10_000.0
    }
}

/// How the audit judges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub policy: ComputePolicy,
    /// Percentage points above the share before it counts as over.
    pub tolerance_pct: u32,
    /// How long a condition must last before the phase changes.
    pub window: Duration,
    /// How long throttling needs to take hold: the driver's share of a round that began
    /// sooner after throttling started does not move `run`.
    pub settle: Duration,
}

/// What to do about one vGPU on one GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Action {
    /// Duty-cycle its workloads' freezers so that they run `run` (0..=1) of each period,
    /// every round while it lasts; `start` on the first.
    Throttle { run: f64, start: bool },
    /// Stop throttling.
    Release,
    /// Terminate the offenders, every round while it stays over; `first` on the first,
    /// `escalated` when throttling did not bring it down.
    Kill { first: bool, escalated: bool },
    /// Say so (once, when the bypass has lasted a window under `report`).
    Report,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub vgpu: String,
    pub gpu_index: u32,
    pub gpu_uuid: String,
    pub action: Action,
    pub driver_pct: u32,
    pub share_pct: u32,
    pub ledger_pct: f64,
    /// The processes the shim does not account for (see the module's documentation).
    pub offenders: Vec<ProcessId>,
    /// One line for the record, `ps` and the log.
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq)]
enum Phase {
    Within { over_since: Option<Instant> },
    Throttled { run: f64, since: Instant, over_since: Option<Instant>, within_since: Option<Instant> },
    Killed { within_since: Option<Instant>, reason: String, escalated: bool },
    Reported { within_since: Option<Instant> },
}

/// What the audit remembers between rounds.
#[derive(Debug, Default)]
pub struct ComputeAudit {
    phases: HashMap<(String, String), Phase>,
    /// Per process and GPU: the shim's charged time last seen, and when it last grew.
    growth: HashMap<(ProcessId, String), (u64, Option<Instant>)>,
    last_round: Option<Instant>,
}

impl ComputeAudit {
    /// Judge one round's figures (taken over the time since the previous round).
    pub fn observe(&mut self, now: Instant, vgpus: &[VgpuCompute], s: &Settings) -> Vec<Verdict> {
        let previous = self.last_round.replace(now);
        let mut verdicts = Vec::new();
        let mut seen = HashSet::new();
        let mut seen_processes = HashSet::new();
        for v in vgpus {
            let key = (v.vgpu.clone(), v.gpu_uuid.clone());
            seen.insert(key.clone());
            let offenders = self.offenders(now, v, s.window, &mut seen_processes);
            let phase = self.phases.remove(&key).unwrap_or(Phase::Within { over_since: None });
            let (next, action) = step(phase, now, previous, v, s);
            if !matches!(next, Phase::Within { over_since: None }) {
                self.phases.insert(key, next.clone());
            }
            if let Some((action, reason)) = action {
                verdicts.push(Verdict {
                    vgpu: v.vgpu.clone(),
                    gpu_index: v.gpu_index,
                    gpu_uuid: v.gpu_uuid.clone(),
                    action,
                    driver_pct: v.driver_pct(),
                    share_pct: v.share_pct,
                    ledger_pct: v.ledger_pct(),
                    offenders: offenders.clone(),
                    reason,
                });
            }
        }
        self.phases.retain(|k, _| seen.contains(k));
        self.growth.retain(|k, _| seen_processes.contains(k));
        verdicts
    }

    /// Whether a vGPU is being throttled on a GPU.
    pub fn is_throttled(&self, vgpu: &str, gpu_uuid: &str) -> bool {
        matches!(self.phases.get(&(vgpu.to_string(), gpu_uuid.to_string())), Some(Phase::Throttled { .. }))
    }

    fn offenders(&mut self, now: Instant, v: &VgpuCompute, window: Duration, seen: &mut HashSet<(ProcessId, String)>) -> Vec<ProcessId> {
        let mut using = Vec::new();
        let mut unseen = Vec::new();
        for p in &v.processes {
            let key = (p.process, v.gpu_uuid.clone());
            let accounted = match p.shim_ns {
                None => false,
                Some(ns) => {
                    seen.insert(key.clone());
                    let first = if ns > 0 { Some(now) } else { None };
                    let entry = self.growth.entry(key).or_insert((ns, first));
                    if ns > entry.0 {
                        *entry = (ns, Some(now));
                    }
                    entry.1.is_some_and(|grew| now.saturating_duration_since(grew) < window)
                }
            };
            if p.driver_pct > 0 {
                using.push(p.process);
                if !accounted {
                    unseen.push(p.process);
                }
            }
        }
        if unseen.is_empty() {
            using
        } else {
            unseen
        }
    }
}

/// The fraction of each period to let a vGPU run when throttling starts: what brings a
/// driver's share of `driver_pct` down to `share_pct` if its use scales with the time it runs.
pub fn initial_run(share_pct: u32, driver_pct: u32) -> f64 {
    (f64::from(share_pct) / f64::from(driver_pct.max(1))).clamp(MIN_RUN, 1.0)
}

/// Integral control: the next `run` after a round that measured `driver_pct` at `run`.
pub fn next_run(run: f64, driver_pct: u32, share_pct: u32) -> f64 {
    (run + GAIN * (f64::from(share_pct) - f64::from(driver_pct)) / 100.0).clamp(MIN_RUN, 1.0)
}

fn since(start: Option<Instant>, now: Instant) -> Option<Instant> {
    Some(start.unwrap_or(now))
}

fn lasted(start: Option<Instant>, now: Instant, window: Duration) -> bool {
    start.is_some_and(|t| now.saturating_duration_since(t) >= window)
}

fn figures(v: &VgpuCompute, driver_pct: u32) -> String {
    if !v.in_vgpu {
        return format!("uses GPU {} outside its vGPU: {driver_pct}% by the driver", v.gpu_index);
    }
    format!("GPU {} at {driver_pct}% by the driver, share {}%, the shim sees {:.0}%", v.gpu_index, v.share_pct, v.ledger_pct())
}

/// One vGPU's phase after one round, and what to do.
fn step(phase: Phase, now: Instant, previous: Option<Instant>, v: &VgpuCompute, s: &Settings) -> (Phase, Option<(Action, String)>) {
    let driver = v.driver_pct();
    // Outside the vGPU: a share of 0, no tolerance, nothing the shim can have measured.
    let limit = if v.in_vgpu { f64::from(v.share_pct + s.tolerance_pct) } else { 0.0 };
    let limited = !v.in_vgpu || v.share_pct < 100;
    let unseen = !v.in_vgpu || v.ledger_pct() <= limit;
    let bypass = limited && f64::from(driver) > limit && unseen;
    let within = |within_since: Option<Instant>| if bypass { None } else { since(within_since, now) };
    match phase {
        Phase::Within { over_since } => {
            let over_since = if bypass { since(over_since, now) } else { None };
            if !lasted(over_since, now, s.window) {
                return (Phase::Within { over_since }, None);
            }
            let unseen_by_shim = if v.in_vgpu { format!("over its compute share unseen by the shim: {}", figures(v, driver)) } else { figures(v, driver) };
            // Nothing can be throttled down to a share of 0: outside the vGPU, throttle kills.
            let policy = if v.in_vgpu || s.policy == ComputePolicy::Report { s.policy } else { ComputePolicy::Kill };
            match policy {
                ComputePolicy::Report => (Phase::Reported { within_since: None }, Some((Action::Report, unseen_by_shim))),
                ComputePolicy::Kill => (
                    Phase::Killed { within_since: None, reason: unseen_by_shim.clone(), escalated: false },
                    Some((Action::Kill { first: true, escalated: false }, unseen_by_shim)),
                ),
                ComputePolicy::Throttle => {
                    let run = initial_run(v.share_pct, driver);
                    let phase = Phase::Throttled { run, since: now, over_since: Some(now), within_since: None };
                    (phase, Some((Action::Throttle { run, start: true }, figures(v, driver))))
                }
            }
        }
        Phase::Throttled { run, since: started, over_since, within_since } => {
            if s.policy != ComputePolicy::Throttle {
                return (Phase::Within { over_since: None }, Some((Action::Release, "[watch] compute is no longer \"throttle\"".into())));
            }
            if !limited {
                return (Phase::Within { over_since: None }, Some((Action::Release, format!("its share on GPU {} is 100% now", v.gpu_index))));
            }
            // Measured wholly while throttled (and taken hold)?
            let settled = previous.is_some_and(|p| p >= started + s.settle);
            let demand = if settled { f64::from(driver) / run } else { f64::from(driver) };
            let within_since = if demand > limit && unseen { None } else { since(within_since, now) };
            if lasted(within_since, now, s.window) {
                let reason = format!("GPU {} back within its share: {driver}% by the driver running {:.0}% of the time, share {}%", v.gpu_index, run * 100.0, v.share_pct);
                return (Phase::Within { over_since: None }, Some((Action::Release, reason)));
            }
            let over_since = if bypass { over_since.or(Some(now)) } else { None };
            if lasted(over_since, now, s.window) {
                let reason = format!("throttling did not bring it down: {} while running {:.0}% of the time", figures(v, driver), run * 100.0);
                let phase = Phase::Killed { within_since: None, reason: reason.clone(), escalated: true };
                return (phase, Some((Action::Kill { first: true, escalated: true }, reason)));
            }
            let run = if settled { next_run(run, driver, v.share_pct) } else { run };
            let phase = Phase::Throttled { run, since: started, over_since, within_since };
            (phase, Some((Action::Throttle { run, start: false }, figures(v, driver))))
        }
        Phase::Killed { within_since, reason, escalated } => {
            if s.policy == ComputePolicy::Report {
                return (Phase::Within { over_since: None }, None);
            }
            let within_since = within(within_since);
            if lasted(within_since, now, s.window) {
                return (Phase::Within { over_since: None }, None);
            }
            let action = bypass.then(|| (Action::Kill { first: false, escalated }, reason.clone()));
            (Phase::Killed { within_since, reason, escalated }, action)
        }
        Phase::Reported { within_since } => {
            let within_since = within(within_since);
            if lasted(within_since, now, s.window) || s.policy != ComputePolicy::Report {
                return (Phase::Within { over_since: None }, None);
            }
            (Phase::Reported { within_since }, None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ROUND: Duration = Duration::from_millis(200);

    fn settings(policy: ComputePolicy) -> Settings {
        Settings { policy, tolerance_pct: 10, window: Duration::from_secs(1), settle: Duration::from_millis(100) }
    }

    fn pid(n: u32) -> ProcessId {
        ProcessId { pid: n, start_time: 7 }
    }

    fn vgpu(share: u32, ledger_pct: Option<u32>, procs: &[(u32, u32, Option<u64>)]) -> VgpuCompute {
        VgpuCompute {
            vgpu: "v".into(),
            gpu_index: 0,
            gpu_uuid: "GPU-0".into(),
            share_pct: share,
            in_vgpu: true,
            ledger_ppm: ledger_pct.map(|p| u64::from(p) * 10_000),
            processes: procs.iter().map(|&(p, d, s)| ProcessCompute { process: pid(p), driver_pct: d, shim_ns: s }).collect(),
        }
    }

    /// Rounds every 200 ms; the figures of round `i` from `f(i, run)`, where `run` is the
    /// fraction the audit asked for last (1 when not throttled), in force since the round
    /// before.
    fn run_rounds(audit: &mut ComputeAudit, s: &Settings, rounds: usize, mut f: impl FnMut(usize, f64) -> VgpuCompute) -> Vec<(usize, Verdict)> {
        let t0 = Instant::now();
        let mut run = 1.0;
        let mut out = Vec::new();
        for i in 0..rounds {
            let v = f(i, run);
            for verdict in audit.observe(t0 + ROUND * i as u32, &[v], s) {
                match verdict.action {
                    Action::Throttle { run: r, .. } => run = r,
                    Action::Release | Action::Kill { .. } => run = 1.0,
                    Action::Report => {}
                }
                out.push((i, verdict));
            }
        }
        out
    }

    #[test]
    fn a_bypass_is_throttled_after_the_window_and_the_throttle_converges() {
        let mut audit = ComputeAudit::default();
        let s = settings(ComputePolicy::Throttle);
        // A process without the shim that would use 97 % of the GPU: 97 % × run when throttled.
        let verdicts = run_rounds(&mut audit, &s, 30, |_, run| vgpu(30, None, &[(1, (97.0 * run).round() as u32, None), (2, 0, Some(5))]));
        let (first, v) = &verdicts[0];
        assert_eq!(*first, 5, "after a whole window (rounds 0–5 over)");
        assert!(matches!(v.action, Action::Throttle { start: true, .. }), "{v:?}");
        assert_eq!(v.reason, "GPU 0 at 97% by the driver, share 30%, the shim sees 0%");
        assert_eq!(v.offenders, vec![pid(1)]);
        let Action::Throttle { run, .. } = verdicts.last().unwrap().1.action else { panic!("{verdicts:?}") };
        assert!((97.0 * run - 30.0).abs() < 2.0, "converged to the share: run {run}");
        assert!(verdicts.iter().all(|(_, v)| matches!(v.action, Action::Throttle { .. })), "no release or kill: {verdicts:?}");
        assert!(audit.is_throttled("v", "GPU-0"));
    }

    #[test]
    fn throttling_that_cannot_bring_it_down_escalates_to_a_kill() {
        let mut audit = ComputeAudit::default();
        let s = settings(ComputePolicy::Throttle);
        // Long kernels: the GPU stays busy whatever the freezer does.
        let verdicts = run_rounds(&mut audit, &s, 20, |_, _| vgpu(30, None, &[(1, 99, None)]));
        let kills: Vec<&(usize, Verdict)> = verdicts.iter().filter(|(_, v)| matches!(v.action, Action::Kill { .. })).collect();
        let (at, kill) = kills[0];
        assert_eq!(*at, 10, "a window after throttling began at round 5");
        assert_eq!(kill.action, Action::Kill { first: true, escalated: true });
        assert!(kill.reason.starts_with("throttling did not bring it down: GPU 0 at 99% by the driver"), "{}", kill.reason);
        assert!(kills[1..].iter().all(|(_, v)| v.action == Action::Kill { first: false, escalated: true } && v.reason == kill.reason));
        assert!(!audit.is_throttled("v", "GPU-0"));
    }

    #[test]
    fn the_policies_report_and_kill() {
        let over = |_: usize, _: f64| vgpu(30, Some(1), &[(1, 90, Some(10)), (2, 10, None)]);
        let mut audit = ComputeAudit::default();
        let reported = run_rounds(&mut audit, &settings(ComputePolicy::Report), 20, over);
        assert_eq!(reported.len(), 1, "once: {reported:?}");
        assert_eq!(reported[0].1.action, Action::Report);
        assert_eq!(reported[0].1.reason, "over its compute share unseen by the shim: GPU 0 at 100% by the driver, share 30%, the shim sees 1%");
        let mut audit = ComputeAudit::default();
        let killed = run_rounds(&mut audit, &settings(ComputePolicy::Kill), 8, over);
        assert_eq!(killed[0].1.action, Action::Kill { first: true, escalated: false });
        // Process 1's shim file charged nothing new for a window: both escaped the shim.
        assert_eq!(killed[0].1.offenders, vec![pid(1), pid(2)]);
    }

    /// Issue 24, item 4: kernels on a GPU outside the vGPU (its processes unset
    /// CUDA_VISIBLE_DEVICES and bypass the shim) are over a share of 0: killed after a
    /// window under `throttle` and `kill` (nothing can be throttled down to 0), reported
    /// under `report`; even a little use, below the tolerance a share gets.
    #[test]
    fn use_of_a_gpu_outside_the_vgpu_is_a_kill() {
        let outside = |_: usize, _: f64| VgpuCompute { in_vgpu: false, share_pct: 0, gpu_index: 1, gpu_uuid: "GPU-1".into(), ..vgpu(0, None, &[(1, 5, None)]) };
        for policy in [ComputePolicy::Throttle, ComputePolicy::Kill] {
            let verdicts = run_rounds(&mut ComputeAudit::default(), &settings(policy), 8, outside);
            let (at, first) = &verdicts[0];
            assert_eq!(*at, 5, "after a whole window: {verdicts:?}");
            assert_eq!(first.action, Action::Kill { first: true, escalated: false });
            assert_eq!(first.reason, "uses GPU 1 outside its vGPU: 5% by the driver");
            assert_eq!(first.offenders, vec![pid(1)]);
            assert!(verdicts.iter().all(|(_, v)| matches!(v.action, Action::Kill { .. })), "{verdicts:?}");
        }
        let reported = run_rounds(&mut ComputeAudit::default(), &settings(ComputePolicy::Report), 8, outside);
        assert_eq!(reported.iter().map(|(_, v)| v.action).collect::<Vec<_>>(), vec![Action::Report]);
        // Idle there (a context, no kernels): nothing to do about compute.
        let idle = |_: usize, _: f64| VgpuCompute { in_vgpu: false, share_pct: 0, ..vgpu(0, None, &[(1, 0, None)]) };
        assert!(run_rounds(&mut ComputeAudit::default(), &settings(ComputePolicy::Kill), 20, idle).is_empty());
    }

    #[test]
    fn a_process_the_shim_keeps_charging_is_not_an_offender() {
        let mut audit = ComputeAudit::default();
        let s = settings(ComputePolicy::Kill);
        let verdicts = run_rounds(&mut audit, &s, 8, |i, _| vgpu(30, Some(25), &[(1, 25, Some(1000 * i as u64 + 1)), (2, 70, None)]));
        assert_eq!(verdicts[0].1.offenders, vec![pid(2)]);
        // Everybody is charged, yet the driver sees 95 %: the ledger was tampered with.
        let mut audit = ComputeAudit::default();
        let verdicts = run_rounds(&mut audit, &s, 8, |i, _| vgpu(30, None, &[(1, 50, Some(1000 * i as u64 + 1)), (2, 45, Some(1000 * i as u64 + 1))]));
        assert_eq!(verdicts[0].1.offenders, vec![pid(1), pid(2)]);
    }

    #[test]
    fn the_shims_own_view_and_an_unlimited_share_are_not_bypasses() {
        let s = settings(ComputePolicy::Throttle);
        // fair lending: the ledger sees it too.
        assert!(run_rounds(&mut ComputeAudit::default(), &s, 20, |_, _| vgpu(30, Some(90), &[(1, 90, Some(1))])).is_empty());
        assert!(run_rounds(&mut ComputeAudit::default(), &s, 20, |_, _| vgpu(100, None, &[(1, 100, None)])).is_empty());
        // Within the tolerance.
        assert!(run_rounds(&mut ComputeAudit::default(), &s, 20, |_, _| vgpu(30, None, &[(1, 40, None)])).is_empty());
    }

    #[test]
    fn a_throttled_vgpu_that_goes_quiet_is_released_once_after_a_window() {
        let mut audit = ComputeAudit::default();
        let s = settings(ComputePolicy::Throttle);
        let verdicts = run_rounds(&mut audit, &s, 30, |i, run| {
            let driver = if i < 12 { (97.0 * run).round() as u32 } else { 0 };
            vgpu(30, None, &[(1, driver, None)])
        });
        let releases: Vec<&(usize, Verdict)> = verdicts.iter().filter(|(_, v)| v.action == Action::Release).collect();
        assert_eq!(releases.len(), 1, "{verdicts:?}");
        assert_eq!(releases[0].0, 17, "a window after it went quiet at round 12");
        assert!(releases[0].1.reason.starts_with("GPU 0 back within its share"), "{}", releases[0].1.reason);
        assert!(verdicts.iter().all(|(i, _)| *i <= 17), "nothing after: {verdicts:?}");
    }

    #[test]
    fn a_share_raised_to_100_or_a_policy_change_releases_at_once() {
        let s = settings(ComputePolicy::Throttle);
        let mut audit = ComputeAudit::default();
        let v = run_rounds(&mut audit, &s, 8, |i, _| vgpu(if i < 7 { 30 } else { 100 }, None, &[(1, 97, None)]));
        assert_eq!(v.last().map(|(i, v)| (*i, v.action)), Some((7, Action::Release)));
        let mut audit = ComputeAudit::default();
        let t0 = Instant::now();
        for i in 0..7 {
            audit.observe(t0 + ROUND * i, &[vgpu(30, None, &[(1, 97, None)])], &s);
        }
        let out = audit.observe(t0 + ROUND * 7, &[vgpu(30, None, &[(1, 97, None)])], &settings(ComputePolicy::Report));
        assert_eq!(out[0].action, Action::Release);
    }

    #[test]
    fn the_window_restarts_after_a_dip() {
        let s = settings(ComputePolicy::Throttle);
        let verdicts = run_rounds(&mut ComputeAudit::default(), &s, 12, |i, _| vgpu(30, None, &[(1, if i == 3 { 20 } else { 97 }, None)]));
        assert_eq!(verdicts[0].0, 9, "over again from round 4: {verdicts:?}");
    }

    proptest! {
        /// Nothing is done to a vGPU before its driver's share has been above share +
        /// tolerance, unseen by the ledger, for a whole window; and whatever is done, the
        /// offenders are its processes that use the GPU.
        #[test]
        fn no_action_without_a_whole_window_of_bypass(
            share in 1u32..=100,
            rounds in proptest::collection::vec((0u32..=100, proptest::option::of(0u32..=100), 0u32..=60), 1..40),
            policy in prop_oneof![Just(ComputePolicy::Report), Just(ComputePolicy::Throttle), Just(ComputePolicy::Kill)],
        ) {
            let s = settings(policy);
            let mut audit = ComputeAudit::default();
            let t0 = Instant::now();
            let mut bypass_since: Option<usize> = None;
            for (i, &(a, ledger, b)) in rounds.iter().enumerate() {
                let v = vgpu(share, ledger, &[(1, a, None), (2, b, Some(5))]);
                let limit = f64::from(share + s.tolerance_pct);
                let bypass = share < 100 && f64::from(v.driver_pct()) > limit && v.ledger_pct() <= limit;
                bypass_since = if bypass { bypass_since.or(Some(i)) } else { None };
                for verdict in audit.observe(t0 + ROUND * i as u32, std::slice::from_ref(&v), &s) {
                    let acts = matches!(verdict.action, Action::Report | Action::Throttle { start: true, .. } | Action::Kill { first: true, escalated: false });
                    if acts {
                        let since = bypass_since.expect("acted without a bypass");
                        prop_assert!(ROUND * (i - since) as u32 >= s.window, "acted at round {i}, bypass since {since}");
                    }
                    prop_assert!(share < 100 || verdict.action == Action::Release);
                    for o in &verdict.offenders {
                        let p = v.processes.iter().find(|p| p.process == *o).expect("one of its processes");
                        prop_assert!(p.driver_pct > 0);
                    }
                }
            }
        }

        /// On a GPU outside the vGPU any use is over: it is acted on after a whole window of
        /// use (however little), never throttled, and any use for a window is acted on.
        #[test]
        fn outside_the_vgpu_any_use_for_a_window_is_acted_on(
            rounds in proptest::collection::vec(0u32..=20, 1..40),
            policy in prop_oneof![Just(ComputePolicy::Report), Just(ComputePolicy::Throttle), Just(ComputePolicy::Kill)],
        ) {
            let s = settings(policy);
            let mut audit = ComputeAudit::default();
            let t0 = Instant::now();
            let mut using_since: Option<usize> = None;
            let mut acted = false;
            for (i, &pct) in rounds.iter().enumerate() {
                let v = VgpuCompute { in_vgpu: false, share_pct: 0, ..vgpu(0, None, &[(1, pct, None)]) };
                using_since = if pct > 0 { using_since.or(Some(i)) } else { None };
                let verdicts = audit.observe(t0 + ROUND * i as u32, std::slice::from_ref(&v), &s);
                for verdict in &verdicts {
                    prop_assert!(!matches!(verdict.action, Action::Throttle { .. } | Action::Release), "{:?}", verdict);
                    prop_assert!(policy != ComputePolicy::Report || verdict.action == Action::Report);
                    if matches!(verdict.action, Action::Report | Action::Kill { first: true, .. }) {
                        let since = using_since.expect("acted without use");
                        prop_assert!(ROUND * (i - since) as u32 >= s.window);
                        acted = true;
                    }
                }
                if let Some(since) = using_since {
                    if ROUND * (i - since) as u32 >= s.window && policy != ComputePolicy::Report {
                        prop_assert!(acted, "used for a window at round {} and nothing done", i);
                    }
                }
            }
        }

        /// Throttling a vGPU whose use scales with the time it runs brings the driver's
        /// share to its share (within 2 points) without escalating, whatever it would use.
        #[test]
        fn the_throttle_converges(share in 5u32..=80, demand_over in 20u32..=100) {
            // Clearly over (the driver's integer percent ÷ run must stay above the limit).
            let demand = (share + demand_over).min(100);
            let s = settings(ComputePolicy::Throttle);
            let mut audit = ComputeAudit::default();
            let verdicts = run_rounds(&mut audit, &s, 60, |_, run| vgpu(share, None, &[(1, (f64::from(demand) * run).round() as u32, None)]));
            prop_assert!(verdicts.iter().all(|(_, v)| matches!(v.action, Action::Throttle { .. })), "{:?}", verdicts);
            let Action::Throttle { run, .. } = verdicts.last().unwrap().1.action else { unreachable!() };
            prop_assert!((MIN_RUN..=1.0).contains(&run));
            prop_assert!((f64::from(demand) * run - f64::from(share)).abs() <= 2.0, "run {} × demand {} vs share {}", run, demand, share);
        }

        /// A vGPU whose figures change every round between over and within never changes
        /// phase more than once per window.
        #[test]
        fn no_flapping(pattern in proptest::collection::vec(any::<bool>(), 10..60)) {
            let s = settings(ComputePolicy::Throttle);
            let mut audit = ComputeAudit::default();
            let verdicts = run_rounds(&mut audit, &s, pattern.len(), |i, _| vgpu(30, None, &[(1, if pattern[i] { 97 } else { 0 }, None)]));
            let changes: Vec<usize> = verdicts.iter().filter(|(_, v)| matches!(v.action, Action::Throttle { start: true, .. } | Action::Release)).map(|(i, _)| *i).collect();
            for pair in changes.windows(2) {
                prop_assert!(ROUND * (pair[1] - pair[0]) as u32 >= s.window, "{:?}", changes);
            }
        }
    }
}
