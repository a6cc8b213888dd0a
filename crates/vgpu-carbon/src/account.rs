//! Carbon accounting (`vgpu carbon report`): who used the energy the GPUs measured, and what
//! it emitted. Pure: the history's rows in, the attribution out.
//!
//! For each GPU interval (a `gpu_samples` row) clipped to the window:
//!
//! * its energy `E` (millijoules) is clipped pro rata: with `F(t) = ⌊E·(t − t0)/(t1 − t0)⌋`
//!   the part in `[c0, c1)` is `F(c1) − F(c0)`, so the parts of one interval in adjacent
//!   windows add up to `E` exactly;
//! * idle energy is `min(E, ⌊P_idle·dt⌋)` (W × ms = mJ), `P_idle` the GPU's idle power
//!   ([`IdlePower`]: its measured power model, the planner's model (configured, or from the
//!   driver's power limit), or else its lowest observed power in the window);
//! * the rest, the active energy, is split by GPU time: each workload's `workload_gpu_time`
//!   rows on the GPU count pro rata by their overlap with the interval (`busy × overlap /
//!   row length`); the denominator is the larger of the workloads' sum and the GPU's own busy
//!   time (`gpu_samples.busy_ms`, clipped alike) when known, and the difference goes to
//!   "unattributed" (processes in no vGPU). No workload GPU time: all of it is unattributed.
//!   The split is in integer millijoules by largest remainder (ties: workloads in ID order,
//!   then unattributed), so per GPU `idle + unattributed + Σ workloads = Σ clipped E`
//!   exactly;
//! * each part's emissions are its energy × the intensity in force at the clipped interval's
//!   midpoint: the latest reading (or fallback) at or before it; before the first, the first.
//!   No intensity at all: emissions are unknown (`None`) and a note says so.

use std::collections::BTreeMap;

use serde::Serialize;

/// Millijoules in a kilowatt-hour.
pub const MJ_PER_KWH: f64 = 3.6e9;

/// Fixed-point scale of GPU time inside one interval (ms × SCALE), so pro-rata overlaps
/// stay integers.
const SCALE: u128 = 1_000_000;

/// Energy for people: `0.012 kWh`, below a watt-hour `0.4 Wh`.
pub fn format_energy(mj: u64) -> String {
    let kwh = mj as f64 / MJ_PER_KWH;
    if kwh >= 0.001 {
        format!("{kwh:.3} kWh")
    } else {
        format!("{:.1} Wh", kwh * 1000.0)
    }
}

/// One `gpu_samples` row.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSample {
    pub t0_ms: i64,
    pub t1_ms: i64,
    pub gpu_uuid: String,
    pub gpu_index: i64,
    pub gpu_name: Option<String>,
    pub energy_mj: u64,
    pub busy_ms: Option<u64>,
}

/// One `workload_gpu_time` row.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuTime {
    pub t0_ms: i64,
    pub t1_ms: i64,
    pub workload_id: String,
    pub gpu_uuid: String,
    pub busy_ms: u64,
}

/// One `intensity` row of kind reading or fallback.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IntensityPoint {
    pub ts_ms: i64,
    pub g_per_kwh: f64,
}

/// Where a GPU's idle power comes from.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IdleSource {
    /// `vgpu carbon profile`'s fit (`power_models`).
    Measured,
    /// `[carbon] power_idle_w`, or 15 % of `power_max_w` (the planner's model, configured).
    Configured,
    /// 15 % of the GPU's default power limit (the planner's default model), from the driver.
    PowerLimit,
    /// The GPU's lowest average power over an interval of the window.
    LowestObserved,
}

/// A GPU's idle power as the accounting used it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct IdlePower {
    pub watts: f64,
    pub source: IdleSource,
}

/// `[since, until)`, milliseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub since_ms: i64,
    pub until_ms: i64,
}

/// What the energy went to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Party {
    Workload(String),
    Unattributed,
    Idle,
}

/// One party's part on one GPU over the window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Part {
    pub energy_mj: u64,
    /// GPU time in the window, ms (workloads only).
    pub gpu_time_ms: f64,
    /// `None`: no intensity known.
    pub g_co2: Option<f64>,
}

/// One GPU's accounting.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuAccount {
    pub uuid: String,
    pub index: i64,
    pub name: Option<String>,
    /// Σ clipped measured energy.
    pub energy_mj: u64,
    pub idle: IdlePower,
    pub parts: BTreeMap<Party, Part>,
}

/// The whole window's accounting.
#[derive(Debug, Clone, PartialEq)]
pub struct Accounting {
    pub window: Window,
    /// By GPU UUID.
    pub gpus: BTreeMap<String, GpuAccount>,
    /// Whether any intensity was known (else every `g_co2` is `None`).
    pub emissions_known: bool,
    pub notes: Vec<String>,
}

/// The note of an accounting without any intensity.
pub const NO_INTENSITY: &str = "no carbon intensity recorded (is [carbon] source set and vgpu watch running?): emissions unknown";

/// The note of a window in which no GPU's energy was recorded: a report of zeros is not a
/// host that used none.
pub const NO_SAMPLES: &str = "nothing recorded in this window: no GPU energy samples in the history (vgpu watch records them every interval; is it running?)";

impl Accounting {
    /// Add the accounting of another window (adjacent, not overlapping) to this one: the
    /// same as accounting both windows at once, but where an interval crosses from one to
    /// the other (each part is clipped pro rata; the energy still adds up exactly).
    pub fn merge(&mut self, other: Accounting) {
        let later = other.window.since_ms >= self.window.since_ms;
        self.window = Window {
            since_ms: self.window.since_ms.min(other.window.since_ms),
            until_ms: self.window.until_ms.max(other.window.until_ms),
        };
        self.emissions_known |= other.emissions_known;
        for note in other.notes {
            if !self.notes.contains(&note) {
                self.notes.push(note);
            }
        }
        for (uuid, gpu) in other.gpus {
            let Some(mine) = self.gpus.get_mut(&uuid) else {
                self.gpus.insert(uuid, gpu);
                continue;
            };
            mine.energy_mj += gpu.energy_mj;
            if later {
                mine.index = gpu.index;
                mine.name = gpu.name.or(mine.name.take());
            }
            for (party, part) in gpu.parts {
                let sum = mine.parts.entry(party).or_default();
                sum.energy_mj += part.energy_mj;
                sum.gpu_time_ms += part.gpu_time_ms;
                if let Some(g) = part.g_co2 {
                    *sum.g_co2.get_or_insert(0.0) += g;
                }
            }
        }
    }
}

/// The history of a window, as read from the database.
#[derive(Debug, Clone, Default)]
pub struct History {
    pub samples: Vec<GpuSample>,
    pub gpu_time: Vec<GpuTime>,
    /// Any order; equal times: the later one in the list wins.
    pub intensity: Vec<IntensityPoint>,
    /// Idle power per GPU UUID; a GPU without one falls back to its lowest observed power.
    pub idle_w: BTreeMap<String, IdlePower>,
}

/// The step function of intensity over time (the report's and the spent budget's,
/// `history::spent`).
pub struct Steps(Vec<IntensityPoint>);

impl Steps {
    pub fn new(mut points: Vec<IntensityPoint>) -> Steps {
        points.retain(|p| p.g_per_kwh.is_finite() && p.g_per_kwh >= 0.0);
        // Stable: of equal times the later in the list stays last, and wins below.
        points.sort_by_key(|p| p.ts_ms);
        Steps(points)
    }

    /// The latest figure at or before `t`; before the first, the first.
    fn at(&self, t: i64) -> Option<f64> {
        self.in_force(t).or_else(|| self.0.first().map(|p| p.g_per_kwh))
    }

    /// The latest figure at or before `t`; `None` before the first.
    pub fn in_force(&self, t: i64) -> Option<f64> {
        let n = self.0.partition_point(|p| p.ts_ms <= t);
        n.checked_sub(1).map(|i| self.0[i].g_per_kwh)
    }
}

fn overlap(a0: i64, a1: i64, b0: i64, b1: i64) -> i64 {
    (a1.min(b1) - a0.max(b0)).max(0)
}

/// `⌊e·num/den⌋` without overflow (den > 0, num ≤ den).
fn pro_rata(e: u64, num: i64, den: i64) -> u64 {
    (u128::from(e) * num.max(0) as u128 / den as u128) as u64
}

/// Split `total` among `weights` in proportion, in integers, by largest remainder; ties go
/// to the earlier weight. The parts add up to `total` exactly (all zero when every weight is).
pub fn split(total: u64, weights: &[u128]) -> Vec<u64> {
    let sum: u128 = weights.iter().sum();
    if sum == 0 {
        return vec![0; weights.len()];
    }
    let exact: Vec<(u128, u128)> = weights.iter().map(|&w| (u128::from(total) * w / sum, u128::from(total) * w % sum)).collect();
    let mut parts: Vec<u64> = exact.iter().map(|&(q, _)| q as u64).collect();
    let mut left = total - parts.iter().sum::<u64>();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| exact[b].1.cmp(&exact[a].1).then(a.cmp(&b)));
    for i in order {
        if left == 0 {
            break;
        }
        parts[i] += 1;
        left -= 1;
    }
    parts
}

/// Attribute the window's measured energy (see the module's documentation).
pub fn account(history: &History, window: Window) -> Accounting {
    let steps = Steps::new(history.intensity.clone());
    let emissions_known = !steps.0.is_empty();
    let mut notes = Vec::new();
    if !emissions_known {
        notes.push(NO_INTENSITY.to_string());
    }
    let clipped = |t0: i64, t1: i64| (t0.max(window.since_ms), t1.min(window.until_ms));

    // Samples in the window, by GPU, in time order.
    let mut by_gpu: BTreeMap<&str, Vec<&GpuSample>> = BTreeMap::new();
    for s in &history.samples {
        let (c0, c1) = clipped(s.t0_ms, s.t1_ms);
        if s.t1_ms > s.t0_ms && c1 > c0 {
            by_gpu.entry(&s.gpu_uuid).or_default().push(s);
        }
    }
    let mut time_by_gpu: BTreeMap<&str, Vec<&GpuTime>> = BTreeMap::new();
    for g in &history.gpu_time {
        if g.t1_ms > g.t0_ms {
            time_by_gpu.entry(&g.gpu_uuid).or_default().push(g);
        }
    }

    let mut gpus = BTreeMap::new();
    for (uuid, mut samples) in by_gpu {
        samples.sort_by_key(|s| (s.t1_ms, s.t0_ms));
        let idle = match history.idle_w.get(uuid) {
            Some(idle) => *idle,
            None => {
                let lowest = samples
                    .iter()
                    .map(|s| s.energy_mj as f64 / (s.t1_ms - s.t0_ms) as f64)
                    .fold(f64::INFINITY, f64::min);
                IdlePower { watts: if lowest.is_finite() { lowest } else { 0.0 }, source: IdleSource::LowestObserved }
            }
        };
        if idle.source == IdleSource::LowestObserved {
            notes.push(format!(
                "GPU {} ({uuid}) has no power model (run `vgpu carbon profile`, or set [carbon] power_idle_w): idle power taken as its lowest observed, {:.1} W",
                samples[samples.len() - 1].gpu_index,
                idle.watts
            ));
        }
        let last = samples[samples.len() - 1];
        let mut account = GpuAccount {
            uuid: uuid.to_string(),
            index: last.gpu_index,
            name: last.gpu_name.clone(),
            energy_mj: 0,
            idle,
            parts: BTreeMap::new(),
        };
        // GPU-time rows by end; a row overlapping [c0, c1) ends after c0 and, being at most
        // `longest` long, before c1 + longest: only those are looked at.
        let mut times = time_by_gpu.remove(uuid).unwrap_or_default();
        times.sort_by_key(|g| g.t1_ms);
        let longest = times.iter().map(|g| g.t1_ms - g.t0_ms).max().unwrap_or(0);
        for s in samples {
            let (c0, c1) = clipped(s.t0_ms, s.t1_ms);
            let dt = s.t1_ms - s.t0_ms;
            let energy = pro_rata(s.energy_mj, c1 - s.t0_ms, dt) - pro_rata(s.energy_mj, c0 - s.t0_ms, dt);
            account.energy_mj += energy;
            let idle_cap = (idle.watts.max(0.0) * (c1 - c0) as f64).floor();
            let idle_mj = if idle_cap >= energy as f64 { energy } else { idle_cap as u64 };
            let active = energy - idle_mj;

            // Each workload's GPU time inside [c0, c1), scaled.
            let mut busy: BTreeMap<&str, u128> = BTreeMap::new();
            let first = times.partition_point(|g| g.t1_ms <= c0);
            for g in times[first..].iter().take_while(|g| g.t1_ms < c1.saturating_add(longest)) {
                let ov = overlap(g.t0_ms, g.t1_ms, c0, c1);
                if ov > 0 {
                    let w = u128::from(g.busy_ms) * ov as u128 * SCALE / (g.t1_ms - g.t0_ms) as u128;
                    *busy.entry(&g.workload_id).or_default() += w;
                }
            }
            let workloads_busy: u128 = busy.values().sum();
            let gpu_busy = s.busy_ms.map_or(0, |b| u128::from(b) * (c1 - c0) as u128 * SCALE / dt as u128);
            let mut weights: Vec<u128> = busy.values().copied().collect();
            // With no workload time at all, the whole active energy is unattributed.
            let other = if workloads_busy == 0 { 1 } else { gpu_busy.saturating_sub(workloads_busy) };
            weights.push(other);
            let shares = split(active, &weights);

            let intensity = steps.at(c0 + (c1 - c0) / 2);
            let mut add = |party: Party, mj: u64, busy_scaled: u128| {
                let part = account.parts.entry(party).or_default();
                part.energy_mj += mj;
                part.gpu_time_ms += busy_scaled as f64 / SCALE as f64;
                if let Some(i) = intensity {
                    *part.g_co2.get_or_insert(0.0) += mj as f64 / MJ_PER_KWH * i;
                }
            };
            add(Party::Idle, idle_mj, 0);
            for ((id, &b), &mj) in busy.iter().zip(&shares) {
                add(Party::Workload((*id).to_string()), mj, b);
            }
            add(Party::Unattributed, shares[shares.len() - 1], 0);
        }
        gpus.insert(uuid.to_string(), account);
    }
    Accounting { window, gpus, emissions_known, notes }
}

/// How `carbon report` groups workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupBy {
    #[default]
    Workload,
    User,
    Service,
    Gpu,
}

/// What the history knows of a workload (the `workloads` table).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkloadInfo {
    pub name: Option<String>,
    pub user: Option<String>,
    pub service: Option<String>,
}

/// What a report row is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RowKind {
    /// A workload, user, service or GPU (as grouped).
    Group,
    Idle,
    Unattributed,
}

/// One row of the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReportRow {
    pub kind: RowKind,
    /// The group's key: workload ID, user, service, or GPU UUID; "idle"/"unattributed".
    pub key: String,
    /// Workload: its name; GPU: its index and name; else none.
    pub name: Option<String>,
    /// Workload: its user.
    pub user: Option<String>,
    /// GPU indexes the row's energy was used on.
    pub gpu_indexes: Vec<i64>,
    pub gpu_time_ms: u64,
    pub energy_mj: u64,
    pub energy_kwh: f64,
    pub g_co2: Option<f64>,
    /// Share of the total measured energy, percent.
    pub share_pct: f64,
}

/// The report: the groups (by energy, largest first), then idle and unattributed, and the
/// total (= the GPUs' measured energy in the window).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub since_unix_ms: i64,
    pub until_unix_ms: i64,
    pub by: GroupBy,
    pub rows: Vec<ReportRow>,
    pub total_energy_mj: u64,
    pub total_energy_kwh: f64,
    pub total_g_co2: Option<f64>,
    pub gpus: Vec<ReportGpu>,
    pub notes: Vec<String>,
}

/// Each GPU's measured energy and the idle power used for it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReportGpu {
    pub index: i64,
    pub uuid: String,
    pub name: Option<String>,
    pub energy_mj: u64,
    pub idle_w: f64,
    pub idle_source: IdleSource,
}

#[derive(Default)]
struct Sum {
    energy_mj: u64,
    gpu_time_ms: f64,
    g_co2: Option<f64>,
    gpus: Vec<i64>,
    name: Option<String>,
    user: Option<String>,
}

impl Sum {
    fn add(&mut self, part: &Part, gpu: i64) {
        self.energy_mj += part.energy_mj;
        self.gpu_time_ms += part.gpu_time_ms;
        if let Some(g) = part.g_co2 {
            *self.g_co2.get_or_insert(0.0) += g;
        }
        if !self.gpus.contains(&gpu) {
            self.gpus.push(gpu);
            self.gpus.sort_unstable();
        }
    }
}

/// Group `accounting` into the report's rows.
pub fn report(accounting: &Accounting, by: GroupBy, workloads: &BTreeMap<String, WorkloadInfo>) -> Report {
    let mut groups: BTreeMap<String, Sum> = BTreeMap::new();
    let (mut idle, mut unattributed) = (Sum::default(), Sum::default());
    let mut total = 0u64;
    let mut gpus = Vec::new();
    for gpu in accounting.gpus.values() {
        total += gpu.energy_mj;
        gpus.push(ReportGpu {
            index: gpu.index,
            uuid: gpu.uuid.clone(),
            name: gpu.name.clone(),
            energy_mj: gpu.energy_mj,
            idle_w: gpu.idle.watts,
            idle_source: gpu.idle.source,
        });
        for (party, part) in &gpu.parts {
            let id = match party {
                Party::Idle => {
                    idle.add(part, gpu.index);
                    continue;
                }
                Party::Unattributed => {
                    unattributed.add(part, gpu.index);
                    continue;
                }
                Party::Workload(id) => id,
            };
            let info = workloads.get(id).cloned().unwrap_or_default();
            let key = match by {
                GroupBy::Workload => id.clone(),
                GroupBy::User => info.user.clone().unwrap_or_else(|| "?".into()),
                GroupBy::Service => info.service.clone().unwrap_or_else(|| "-".into()),
                GroupBy::Gpu => gpu.uuid.clone(),
            };
            let sum = groups.entry(key).or_default();
            sum.add(part, gpu.index);
            match by {
                GroupBy::Workload => {
                    sum.name = info.name;
                    sum.user = info.user;
                }
                GroupBy::Gpu => {
                    sum.name = Some(match &gpu.name {
                        Some(n) => format!("GPU {} ({n})", gpu.index),
                        None => format!("GPU {}", gpu.index),
                    })
                }
                GroupBy::User | GroupBy::Service => {}
            }
        }
    }
    let share = |mj: u64| if total == 0 { 0.0 } else { mj as f64 * 100.0 / total as f64 };
    let row = |kind: RowKind, key: String, s: Sum| ReportRow {
        kind,
        key,
        name: s.name,
        user: s.user,
        gpu_indexes: s.gpus,
        gpu_time_ms: s.gpu_time_ms.round() as u64,
        energy_mj: s.energy_mj,
        energy_kwh: s.energy_mj as f64 / MJ_PER_KWH,
        g_co2: s.g_co2.filter(|_| accounting.emissions_known),
        share_pct: share(s.energy_mj),
    };
    let mut rows: Vec<ReportRow> = groups.into_iter().map(|(k, s)| row(RowKind::Group, k, s)).collect();
    rows.sort_by(|a, b| b.energy_mj.cmp(&a.energy_mj).then_with(|| a.key.cmp(&b.key)));
    if !accounting.gpus.is_empty() {
        rows.push(row(RowKind::Idle, "idle".into(), idle));
        rows.push(row(RowKind::Unattributed, "unattributed".into(), unattributed));
    }
    // Folded from +0.0: an empty float sum is -0.0, which printed as `-0.00` and `-0`.
    let total_g_co2 = accounting.emissions_known.then(|| rows.iter().filter_map(|r| r.g_co2).fold(0.0, |a, b| a + b));
    let mut notes = accounting.notes.clone();
    if accounting.gpus.is_empty() {
        notes.push(NO_SAMPLES.to_string());
    }
    Report {
        since_unix_ms: accounting.window.since_ms,
        until_unix_ms: accounting.window.until_ms,
        by,
        rows,
        total_energy_mj: total,
        total_energy_kwh: total as f64 / MJ_PER_KWH,
        total_g_co2,
        gpus,
        notes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G0: &str = "GPU-0";

    fn sample(t0: i64, t1: i64, energy_mj: u64) -> GpuSample {
        GpuSample { t0_ms: t0, t1_ms: t1, gpu_uuid: G0.into(), gpu_index: 0, gpu_name: None, energy_mj, busy_ms: None }
    }

    fn busy(id: &str, t0: i64, t1: i64, busy_ms: u64) -> GpuTime {
        GpuTime { t0_ms: t0, t1_ms: t1, workload_id: id.into(), gpu_uuid: G0.into(), busy_ms }
    }

    fn idle(watts: f64) -> BTreeMap<String, IdlePower> {
        [(G0.to_string(), IdlePower { watts, source: IdleSource::Measured })].into()
    }

    fn part(a: &Accounting, party: Party) -> &Part {
        &a.gpus[G0].parts[&party]
    }

    #[test]
    fn two_workloads_sharing_a_gpu_three_to_one() {
        // 10 s at 300 W = 3000 J; idle 100 W × 10 s = 1000 J; the 2000 J active split 3:1.
        let history = History {
            samples: vec![sample(0, 10_000, 3_000_000)],
            gpu_time: vec![busy("a", 0, 10_000, 6000), busy("b", 0, 10_000, 2000)],
            intensity: vec![IntensityPoint { ts_ms: -5, g_per_kwh: 360.0 }],
            idle_w: idle(100.0),
        };
        let a = account(&history, Window { since_ms: 0, until_ms: 10_000 });
        assert_eq!(part(&a, Party::Idle).energy_mj, 1_000_000);
        assert_eq!(part(&a, Party::Workload("a".into())).energy_mj, 1_500_000);
        assert_eq!(part(&a, Party::Workload("b".into())).energy_mj, 500_000);
        assert_eq!(part(&a, Party::Unattributed).energy_mj, 0);
        assert_eq!(part(&a, Party::Workload("a".into())).gpu_time_ms, 6000.0);
        // 1.5 kJ = 1/2400 kWh at 360 g/kWh = 0.15 g.
        assert!((part(&a, Party::Workload("a".into())).g_co2.unwrap() - 0.15).abs() < 1e-12);
        assert!(a.notes.is_empty());
    }

    #[test]
    fn gpu_busy_beyond_the_workloads_is_unattributed_and_nothing_recorded_is_too() {
        let mut s = sample(0, 10_000, 3_000_000);
        s.busy_ms = Some(8000);
        let history = History {
            samples: vec![s, sample(10_000, 20_000, 2_000_000)],
            gpu_time: vec![busy("a", 0, 10_000, 2000)],
            intensity: Vec::new(),
            idle_w: idle(100.0),
        };
        let a = account(&history, Window { since_ms: 0, until_ms: 20_000 });
        // First 2000 J active: a 2/8, other 6/8; second 1000 J active, nobody's.
        assert_eq!(part(&a, Party::Workload("a".into())).energy_mj, 500_000);
        assert_eq!(part(&a, Party::Unattributed).energy_mj, 1_500_000 + 1_000_000);
        assert_eq!(part(&a, Party::Idle).energy_mj, 2_000_000);
        assert!(!a.emissions_known);
        assert_eq!(part(&a, Party::Idle).g_co2, None);
        assert!(a.notes[0].contains("emissions unknown"), "{:?}", a.notes);
    }

    #[test]
    fn intensity_changing_mid_window() {
        // Two 1-hour intervals of 1 kWh each (all active, one workload); intensity 100 until
        // 1 h (a reading at 30 min of 100, at 1 h of 400, midpoints 30 min and 90 min).
        let h = 3_600_000;
        let history = History {
            samples: vec![sample(0, h, 3_600_000_000), sample(h, 2 * h, 3_600_000_000)],
            gpu_time: vec![busy("a", 0, 2 * h, 2 * h as u64)],
            intensity: vec![
                IntensityPoint { ts_ms: h / 2, g_per_kwh: 100.0 },
                IntensityPoint { ts_ms: h, g_per_kwh: 400.0 },
                IntensityPoint { ts_ms: 2 * h, g_per_kwh: 9999.0 },
            ],
            idle_w: idle(0.0),
        };
        let a = account(&history, Window { since_ms: 0, until_ms: 2 * h });
        let w = part(&a, Party::Workload("a".into()));
        assert_eq!(w.energy_mj, 7_200_000_000);
        assert!((w.g_co2.unwrap() - 500.0).abs() < 1e-9, "{w:?}");
        // Before the first reading: the first one (100 at 30 min, for the midpoint 15 min).
        let early = account(&history, Window { since_ms: 0, until_ms: h / 2 });
        assert!((part(&early, Party::Workload("a".into())).g_co2.unwrap() - 50.0).abs() < 1e-9);
    }

    #[test]
    fn clipping_at_since_is_pro_rata_and_adjacent_windows_add_up() {
        // 10 s of 1001 mJ, idle 0: from 2.5 s on, ⌊1001⌋ − ⌊1001·0.25⌋ = 1001 − 250 = 751.
        let history = History {
            samples: vec![sample(0, 10_000, 1001)],
            gpu_time: vec![busy("a", 0, 10_000, 10_000)],
            intensity: Vec::new(),
            idle_w: idle(0.0),
        };
        let late = account(&history, Window { since_ms: 2500, until_ms: 20_000 });
        assert_eq!(late.gpus[G0].energy_mj, 751);
        assert_eq!(part(&late, Party::Workload("a".into())).energy_mj, 751);
        assert_eq!(part(&late, Party::Workload("a".into())).gpu_time_ms, 7500.0);
        let early = account(&history, Window { since_ms: -10, until_ms: 2500 });
        assert_eq!(early.gpus[G0].energy_mj + late.gpus[G0].energy_mj, 1001);
        assert!(account(&history, Window { since_ms: 10_000, until_ms: 20_000 }).gpus.is_empty());
    }

    #[test]
    fn lowest_observed_power_when_no_model_and_said() {
        let history = History {
            samples: vec![sample(0, 1000, 50_000), sample(1000, 2000, 200_000)],
            gpu_time: Vec::new(),
            intensity: Vec::new(),
            idle_w: BTreeMap::new(),
        };
        let a = account(&history, Window { since_ms: 0, until_ms: 2000 });
        assert_eq!(a.gpus[G0].idle, IdlePower { watts: 50.0, source: IdleSource::LowestObserved });
        assert_eq!(part(&a, Party::Idle).energy_mj, 100_000);
        assert_eq!(part(&a, Party::Unattributed).energy_mj, 150_000);
        assert!(a.notes.iter().any(|n| n.contains("lowest observed, 50.0 W")), "{:?}", a.notes);
    }

    #[test]
    fn largest_remainder_split_is_exact_and_deterministic() {
        assert_eq!(split(10, &[1, 1, 1]), vec![4, 3, 3]);
        assert_eq!(split(2, &[1, 1, 1]), vec![1, 1, 0]);
        assert_eq!(split(7, &[0, 0]), vec![0, 0]);
        assert_eq!(split(u64::MAX, &[u128::from(u64::MAX), 1]).iter().map(|&x| u128::from(x)).sum::<u128>(), u128::from(u64::MAX));
    }

    #[test]
    fn report_rows_group_and_total() {
        let history = History {
            samples: vec![sample(0, 10_000, 3_000_000)],
            gpu_time: vec![busy("a", 0, 10_000, 6000), busy("b", 0, 10_000, 2000)],
            intensity: vec![IntensityPoint { ts_ms: 0, g_per_kwh: 360.0 }],
            idle_w: idle(100.0),
        };
        let a = account(&history, Window { since_ms: 0, until_ms: 10_000 });
        let info: BTreeMap<String, WorkloadInfo> = [
            ("a".to_string(), WorkloadInfo { name: Some("train".into()), user: Some("alice".into()), service: None }),
            ("b".to_string(), WorkloadInfo { name: Some("eval".into()), user: Some("alice".into()), service: None }),
        ]
        .into();
        let r = report(&a, GroupBy::Workload, &info);
        let keys: Vec<&str> = r.rows.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(keys, ["a", "b", "idle", "unattributed"]);
        assert_eq!(r.rows[0].name.as_deref(), Some("train"));
        assert_eq!(r.rows[0].share_pct, 50.0);
        assert_eq!(r.total_energy_mj, 3_000_000);
        let by_user = report(&a, GroupBy::User, &info);
        assert_eq!(by_user.rows[0].key, "alice");
        assert_eq!(by_user.rows[0].energy_mj, 2_000_000);
        assert!((by_user.total_g_co2.unwrap() - 0.3).abs() < 1e-12);
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        const GPUS: [&str; 3] = ["GPU-a", "GPU-b", "GPU-c"];
        const WORKLOADS: [&str; 4] = ["w1", "w2", "w3", "w4"];

        /// Random histories: per GPU, consecutive intervals of random lengths and energies
        /// (busy known or not); GPU-time rows of random workloads over random spans (not
        /// aligned with the samples, overlapping each other); a random intensity series;
        /// idle power known for some GPUs.
        fn histories() -> impl Strategy<Value = (History, Window, BTreeMap<String, WorkloadInfo>)> {
            let samples = proptest::collection::vec((0usize..3, 1i64..5000, 0u64..5_000_000, proptest::option::of(0u64..6000)), 0..40);
            let times = proptest::collection::vec((0usize..4, 0usize..3, 0i64..40_000, 1i64..8000, 0u64..9000), 0..40);
            let intensity = proptest::collection::vec((-1000i64..40_000, 0.0f64..1000.0), 0..6);
            let idle = proptest::collection::vec(proptest::option::of(0.0f64..1500.0), 3);
            let window = (-1000i64..20_000, 1i64..40_000);
            let users = proptest::collection::vec((0usize..2, 0usize..3), 4);
            (samples, times, intensity, idle, window, users).prop_map(|(samples, times, intensity, idle, (since, len), users)| {
                let mut end = [0i64; 3];
                let samples = samples
                    .into_iter()
                    .map(|(g, dt, energy_mj, busy_ms)| {
                        let t0 = end[g];
                        end[g] += dt;
                        GpuSample {
                            t0_ms: t0,
                            t1_ms: t0 + dt,
                            gpu_uuid: GPUS[g].into(),
                            gpu_index: g as i64,
                            gpu_name: None,
                            energy_mj,
                            busy_ms,
                        }
                    })
                    .collect();
                let gpu_time = times
                    .into_iter()
                    .map(|(w, g, t0, dt, b)| GpuTime { t0_ms: t0, t1_ms: t0 + dt, workload_id: WORKLOADS[w].into(), gpu_uuid: GPUS[g].into(), busy_ms: b })
                    .collect();
                let intensity = intensity.into_iter().map(|(ts_ms, g_per_kwh)| IntensityPoint { ts_ms, g_per_kwh }).collect();
                let idle_w = idle
                    .into_iter()
                    .enumerate()
                    .filter_map(|(g, w)| w.map(|watts| (GPUS[g].to_string(), IdlePower { watts, source: IdleSource::Measured })))
                    .collect();
                let info = users
                    .into_iter()
                    .enumerate()
                    .map(|(w, (u, s))| {
                        let service = (s > 0).then(|| format!("svc{s}"));
                        (WORKLOADS[w].to_string(), WorkloadInfo { name: None, user: Some(format!("user{u}")), service })
                    })
                    .collect();
                (History { samples, gpu_time, intensity, idle_w }, Window { since_ms: since, until_ms: since + len }, info)
            })
        }

        /// Σ energy_mj of the samples of `gpu` inside the window, clipped as documented.
        fn measured(h: &History, w: Window, gpu: &str) -> u64 {
            h.samples
                .iter()
                .filter(|s| s.gpu_uuid == gpu)
                .map(|s| {
                    let (c0, c1) = (s.t0_ms.max(w.since_ms), s.t1_ms.min(w.until_ms));
                    if c1 <= c0 {
                        return 0;
                    }
                    let f = |t: i64| (u128::from(s.energy_mj) * (t - s.t0_ms) as u128 / (s.t1_ms - s.t0_ms) as u128) as u64;
                    f(c1) - f(c0)
                })
                .sum()
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(400))]

            #[test]
            fn totals_equal_the_measured_energy((h, w, info) in histories()) {
                let a = account(&h, w);
                let mut overall = 0u64;
                for gpu in GPUS {
                    let want = measured(&h, w, gpu);
                    overall += want;
                    match a.gpus.get(gpu) {
                        None => prop_assert_eq!(want, 0),
                        Some(acc) => {
                            let parts: u64 = acc.parts.values().map(|p| p.energy_mj).sum();
                            prop_assert_eq!(parts, want, "GPU {}", gpu);
                            prop_assert_eq!(acc.energy_mj, want);
                        }
                    }
                }
                for by in [GroupBy::Workload, GroupBy::User, GroupBy::Service, GroupBy::Gpu] {
                    let r = report(&a, by, &info);
                    prop_assert_eq!(r.total_energy_mj, overall);
                    prop_assert_eq!(r.rows.iter().map(|r| r.energy_mj).sum::<u64>(), overall, "by {:?}", by);
                    if let Some(total) = r.total_g_co2 {
                        let parts: f64 = r.rows.iter().filter_map(|r| r.g_co2).sum();
                        prop_assert!((parts - total).abs() <= 1e-9 * total.max(1.0));
                    }
                }
            }

            /// Accounting a window in two parts and merging them keeps every total exact.
            #[test]
            fn merged_windows_keep_the_totals((h, w, info) in histories(), cut in 0.0f64..1.0) {
                let mid = w.since_ms + ((w.until_ms - w.since_ms) as f64 * cut) as i64;
                let mut a = account(&h, Window { since_ms: w.since_ms, until_ms: mid });
                a.merge(account(&h, Window { since_ms: mid, until_ms: w.until_ms }));
                prop_assert_eq!(a.window, w);
                let mut overall = 0;
                for gpu in GPUS {
                    let want = measured(&h, w, gpu);
                    overall += want;
                    let got = a.gpus.get(gpu).map_or(0, |acc| acc.parts.values().map(|p| p.energy_mj).sum::<u64>());
                    prop_assert_eq!(got, want, "GPU {}", gpu);
                    prop_assert_eq!(a.gpus.get(gpu).map_or(0, |acc| acc.energy_mj), want);
                }
                for by in [GroupBy::Workload, GroupBy::User, GroupBy::Service, GroupBy::Gpu] {
                    prop_assert_eq!(report(&a, by, &info).rows.iter().map(|r| r.energy_mj).sum::<u64>(), overall);
                }
            }

            /// Per GPU interval, a workload's share of the active energy is at most its
            /// share of the workloads' GPU time in it (+1 mJ of rounding).
            #[test]
            fn no_workload_gets_more_than_its_gpu_time_share((h, _w, _info) in histories()) {
                for s in &h.samples {
                    let one = History { samples: vec![s.clone()], ..h.clone() };
                    let window = Window { since_ms: s.t0_ms, until_ms: s.t1_ms };
                    let a = account(&one, window);
                    let Some(acc) = a.gpus.get(&s.gpu_uuid) else { continue };
                    let active: u64 = acc.parts.iter().filter(|(p, _)| **p != Party::Idle).map(|(_, p)| p.energy_mj).sum();
                    let total_time: f64 = acc.parts.values().map(|p| p.gpu_time_ms).sum();
                    for (party, p) in &acc.parts {
                        if let Party::Workload(id) = party {
                            let bound = if total_time > 0.0 { active as f64 * p.gpu_time_ms / total_time } else { 0.0 };
                            prop_assert!(p.energy_mj as f64 <= bound + 1.0 + 1e-6, "{} got {} of {} active, bound {}", id, p.energy_mj, active, bound);
                        }
                    }
                }
            }
        }
    }
}
