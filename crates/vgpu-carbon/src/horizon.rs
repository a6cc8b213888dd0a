//! The horizon budget planner (issue 16, item 4): a budget of grams for a whole day or
//! month, allotted across the forecast's slots: more where the grid is clean, less where it is
//! dirty, never planning more than what is left of the budget. Pure: no I/O, no clock.
//!
//! Re-run at every tick with what has actually been spent so far (`spent_g`, measured) and
//! the latest forecast, so a wrong forecast is corrected as the horizon goes by. Its output
//! for the current slot, [`Allotment::g_per_hour_now`], is the per-hour budget handed to
//! [`planner::plan`](super::planner::plan) with the intensity now.
//!
//! How:
//!
//! * The two-stage planner's plan for a budget is a prefix of one fixed sequence of steps
//!   (SPEC 1.3): its *ladder*. Each prefix k has a draw W_k (watts) and a throughput B_k:
//!   Σ over workloads of `S(n)·s(f)/work`, the share of each one's remaining work done per
//!   hour (work done in a clean hour is work not left for a dirty one). The workloads are
//!   assumed to stay as they are now over the horizon; the re-plan at every tick catches
//!   arrivals and departures.
//! * Lagrangian water-filling: for a price λ per gram, every slot s takes the prefix that
//!   maximises `hours_s·B_k − λ·grams_s(W_k)`, over the upper concave hull of the ladder
//!   (the other prefixes are never the best for any λ), within the per-hour cap when one is
//!   configured. λ is bisected so that the planned grams fit in the remaining budget (or
//!   λ = 0, every slot at its maximum, when that fits); the slots indifferent at the λ found
//!   then take their higher choice, cleanest first, while it fits, and the next one the
//!   longest prefix that fits. More budget never gives a slot fewer watts. Every slot is
//!   priced at its own intensity (the current one at the intensity now, measured; the others
//!   at their forecast), so clean hours get more watts and dirty ones fewer.
//! * GPU counts are for a workload's life, clocks for a tick: the current slot is planned at
//!   least every GPU stage 1 hands to starting workloads (at the lowest clock, which costs
//!   little), when the budget and the per-hour cap can hold that; otherwise the lowest plan.
//! * Never over the budget: every future slot is planned at least the *floor* — every GPU
//!   busy at its lowest clock (workloads may arrive) — and `forecast_margin` times the
//!   floor's grams is kept back, for a forecast that turns out too low. If what is left of
//!   the budget cannot hold the current slot at its lowest clocks, the floor later and that
//!   margin, the allotment is infeasible: lowest clocks and a note with the figures. As long
//!   as the actual intensities stay within the margin above the forecast, a horizon that
//!   is feasible at one tick stays within its budget to its end (each tick spends at most
//!   what is left over the floor of the rest and its margin).
//! * The power model is a model: the current slot's plan keeps back `power_margin` of its
//!   grams ([`DEFAULT_POWER_MARGIN`]), for GPUs that draw that much more than predicted;
//!   the next tick's re-plan gives it back with what was really spent. Without it the last
//!   tick of a horizon whose budget binds planned exactly what was left, with no margin
//!   after it, and a model a fraction of a percent low (a profile's fit from ±1 %
//!   measurements) ended the day a gram or two over, unreported: what real
//!   marginal-intensity data with hours at 0 g/kWh showed (issue 31), since there the
//!   budget binds at the day's end.

use chrono::{DateTime, Utc};
use serde::Serialize;
use thiserror::Error;

use super::model::{clock_factor, gpu_factor, GpuModel, Tunables};
use super::planner::{plan, ClockPlan, PlanError, PlanRequest, Step};
use super::workload::PlannedWorkload;

/// The forecast's error a plan absorbs unless configured otherwise: the actual intensity may
/// be this share above the forecast (at the lowest clocks) without the budget being exceeded.
pub const DEFAULT_FORECAST_MARGIN: f64 = 0.2;

/// How much more than the power model the GPUs may draw without a horizon's budget being
/// exceeded unreported: this share of the current slot's planned grams is kept back. A profile
/// (`vgpu carbon profile`) fits to measurements within about ±1 %; the default model's
/// maximum is the board's power limit, which the GPUs do not exceed.
pub const DEFAULT_POWER_MARGIN: f64 = 0.02;

/// Slots must follow each other to this many seconds.
const CONTIGUITY_TOLERANCE_S: f64 = 1.0;

/// One slot of the intensity forecast.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Slot {
    pub start: DateTime<Utc>,
    /// Its length (the first slot, now, may be partial).
    pub hours: f64,
    /// gCO2/kWh: for the first slot, the intensity now (measured); then the forecast.
    pub g_per_kwh: f64,
}

/// Everything the horizon planner looks at.
#[derive(Debug, Clone)]
pub struct HorizonRequest<'a> {
    pub gpus: &'a [GpuModel],
    pub workloads: &'a [PlannedWorkload],
    pub tunables: Tunables,
    /// gCO2 for the whole horizon (day or month).
    pub budget_g: f64,
    /// gCO2 already emitted in this horizon (measured).
    pub spent_g: f64,
    /// From now to the horizon's end, contiguous, never empty.
    pub slots: &'a [Slot],
    /// The per-hour budget (gCO2/h) when one is configured too.
    pub rate_cap_g_per_hour: Option<f64>,
    /// Share (≥ 0) by which the actual intensity of a future slot may exceed its forecast;
    /// [`DEFAULT_FORECAST_MARGIN`] unless configured.
    pub forecast_margin: f64,
    /// Share (≥ 0) by which the GPUs' actual draw may exceed the power model's prediction in
    /// the current slot (kept back on its plan); [`DEFAULT_POWER_MARGIN`] unless configured.
    pub power_margin: f64,
}

/// The horizon's budget as allotted to its slots.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Allotment {
    /// The per-hour budget to hand to `planner::plan` for the current slot (with the
    /// intensity now): it yields the allotted plan (0 when infeasible: lowest clocks).
    pub g_per_hour_now: f64,
    /// `budget_g − spent_g`.
    pub remaining_g: f64,
    /// What the allotment plans to emit over the remaining slots (future slots at their
    /// forecast), the margin kept back included.
    pub planned_g: f64,
    /// The least the remaining slots can be planned to emit: now at the lowest clocks, the
    /// future slots at the floor (every GPU busy at its lowest clock), with the margin.
    pub min_needed_g: f64,
    /// False: the budget cannot be kept even at the lowest clocks (lowest clocks planned).
    pub feasible: bool,
    pub notes: Vec<String>,
    /// gCO2/h allotted to each slot.
    pub per_slot: Vec<f64>,
    /// Watts planned for each slot.
    pub per_slot_w: Vec<f64>,
}

#[derive(Debug, Error, PartialEq)]
pub enum HorizonError {
    #[error("the horizon has no slot")]
    NoSlots,
    #[error("forecast slot {index}: needs a positive length and a non-negative intensity, got {hours} h at {g_per_kwh} gCO2/kWh")]
    BadSlot { index: usize, hours: f64, g_per_kwh: f64 },
    #[error("forecast slot {index} starts at {start}, not where the slot before it ends ({expected})")]
    NotContiguous { index: usize, start: DateTime<Utc>, expected: DateTime<Utc> },
    #[error("horizon budget must be a non-negative number of gCO2, got {0}")]
    BadBudget(f64),
    #[error("emissions spent must be a non-negative number of gCO2, got {0}")]
    BadSpent(f64),
    #[error("per-hour cap must be a non-negative number of gCO2/h, got {0}")]
    BadRateCap(f64),
    #[error("forecast margin must be a non-negative share, got {0}")]
    BadMargin(f64),
    #[error("power margin must be a non-negative share, got {0}")]
    BadPowerMargin(f64),
    #[error(transparent)]
    Plan(#[from] PlanError),
}

/// The planner's ladder: the prefixes of its step sequence on the upper concave hull.
#[derive(Debug)]
struct Ladder {
    /// Draw after each prefix (index = number of steps), watts.
    prefix_w: Vec<f64>,
    /// How many steps at the start are stage 1's (GPUs handed to starting workloads).
    placing: usize,
    /// Hull vertices: (watts, benefit, prefix length), watts and benefit increasing.
    hull: Vec<(f64, f64, usize)>,
}

impl Ladder {
    fn new(req: &HorizonRequest<'_>) -> Result<Ladder, PlanError> {
        let at = |budget| PlanRequest {
            gpus: req.gpus,
            workloads: req.workloads,
            intensity: 1000.0,
            budget_g_per_hour: budget,
            tunables: req.tunables,
        };
        // At 1000 g/kWh a budget in g/h is one in watts.
        let lowest = plan(&at(Some(0.0)))?;
        let full = plan(&at(None))?;
        let mut jobs = Throughput::start(req, &lowest);
        let mut prefix_w = vec![lowest.predicted_power_w];
        let mut points = vec![(lowest.predicted_power_w, 0.0, 0)];
        let (mut w, mut b) = (lowest.predicted_power_w, 0.0);
        for (k, step) in full.steps.iter().enumerate() {
            w += step.added_w;
            b += jobs.apply(step);
            prefix_w.push(w);
            points.push((w, b, k + 1));
        }
        let placing = full.steps.iter().take_while(|step| step.stage == 1).count();
        Ok(Ladder { prefix_w, placing, hull: upper_hull(&points) })
    }
}

/// The workloads' throughput along the planner's steps: the value a slot buys with its
/// watts. Σ over workloads of `S(n)·s(f) / work` (the share of each one's remaining work done
/// per hour): work done in a clean hour is work not left for a dirty one.
struct Throughput<'a> {
    req: &'a HorizonRequest<'a>,
    /// Per workload: GPU count, clock, the GPU whose ladder it follows.
    jobs: Vec<(usize, u32, Option<usize>)>,
}

impl<'a> Throughput<'a> {
    fn start(req: &'a HorizonRequest<'a>, lowest: &ClockPlan) -> Throughput<'a> {
        let jobs = lowest
            .workloads
            .iter()
            .map(|w| {
                let first = w.gpus.first().and_then(|&i| req.gpus.iter().position(|g| g.index == i));
                (w.gpus.len(), w.clock_mhz.unwrap_or(0), first)
            })
            .collect();
        Throughput { req, jobs }
    }

    fn rate(&self, j: usize, n: usize, clock: u32) -> f64 {
        let (Some(g), Some(w)) = (self.jobs[j].2, self.req.workloads.get(j)) else { return 0.0 };
        let sensitivity = w.freq_sensitivity.unwrap_or(self.req.tunables.freq_sensitivity);
        gpu_factor(n, self.req.tunables.scaling_efficiency)
            * clock_factor(sensitivity, clock, self.req.gpus[g].max_clock())
            / w.work
    }

    /// Apply one step (stage 1: one more GPU, stage 2: one clock step); the throughput gained.
    fn apply(&mut self, step: &Step) -> f64 {
        let j = step.workload;
        let Some(&(n, clock, first)) = self.jobs.get(j) else { return 0.0 };
        let Some(g) = first else { return 0.0 };
        let (n2, clock2) = match step.stage {
            1 => (n + 1, clock),
            _ => (n, self.req.gpus[g].step_up(clock, self.req.tunables.delta_f_mhz).unwrap_or(clock)),
        };
        self.jobs[j] = (n2, clock2, first);
        self.rate(j, n2, clock2) - self.rate(j, n, clock)
    }
}

/// The upper concave hull of `points` (watts ascending) from the first point to the first one
/// with the highest benefit.
fn upper_hull(points: &[(f64, f64, usize)]) -> Vec<(f64, f64, usize)> {
    let best = points.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    let end = points.iter().position(|p| p.1 >= best).unwrap_or(0);
    let mut hull: Vec<(f64, f64, usize)> = Vec::new();
    for &p in &points[..=end] {
        if let Some(&last) = hull.last() {
            if p.0 <= last.0 {
                // Same draw (a step that adds no watts): keep the higher benefit.
                if p.1 <= last.1 {
                    continue;
                }
                hull.pop();
            } else if p.1 <= last.1 {
                // More draw for no more benefit: dominated.
                continue;
            }
        }
        while hull.len() >= 2 {
            let (a, b) = (hull[hull.len() - 2], hull[hull.len() - 1]);
            // b lies on or under the chord a→p: not on the upper hull.
            if (b.1 - a.1) * (p.0 - a.0) <= (p.1 - a.1) * (b.0 - a.0) {
                hull.pop();
            } else {
                break;
            }
        }
        hull.push(p);
    }
    hull
}

/// One slot as the water-filling sees it.
struct SlotCost {
    /// Grams per watt planned in the slot: hours × priced intensity / 1000.
    g_per_w: f64,
    hours: f64,
    /// The least watts planned (the lowest plan now, the floor later).
    floor_w: f64,
    /// Hull vertices allowed by the per-hour cap (at least the first).
    vertices: usize,
}

impl SlotCost {
    /// Watts planned in the slot for a plan drawing `w`.
    fn watts(&self, w: f64) -> f64 {
        w.max(self.floor_w)
    }
    fn grams(&self, w: f64) -> f64 {
        self.watts(w) * self.g_per_w
    }
}

fn validate(req: &HorizonRequest<'_>) -> Result<(), HorizonError> {
    if req.slots.is_empty() {
        return Err(HorizonError::NoSlots);
    }
    for (index, s) in req.slots.iter().enumerate() {
        if !(s.hours.is_finite() && s.hours > 0.0 && s.g_per_kwh.is_finite() && s.g_per_kwh >= 0.0) {
            return Err(HorizonError::BadSlot { index, hours: s.hours, g_per_kwh: s.g_per_kwh });
        }
        if index > 0 {
            let before = &req.slots[index - 1];
            let expected = before.start + chrono::Duration::milliseconds((before.hours * 3_600_000.0).round() as i64);
            if ((s.start - expected).num_milliseconds() as f64).abs() > CONTIGUITY_TOLERANCE_S * 1000.0 {
                return Err(HorizonError::NotContiguous { index, start: s.start, expected });
            }
        }
    }
    if !(req.budget_g.is_finite() && req.budget_g >= 0.0) {
        return Err(HorizonError::BadBudget(req.budget_g));
    }
    if !(req.spent_g.is_finite() && req.spent_g >= 0.0) {
        return Err(HorizonError::BadSpent(req.spent_g));
    }
    if let Some(cap) = req.rate_cap_g_per_hour {
        if !(cap.is_finite() && cap >= 0.0) {
            return Err(HorizonError::BadRateCap(cap));
        }
    }
    if !(req.forecast_margin.is_finite() && req.forecast_margin >= 0.0) {
        return Err(HorizonError::BadMargin(req.forecast_margin));
    }
    if !(req.power_margin.is_finite() && req.power_margin >= 0.0) {
        return Err(HorizonError::BadPowerMargin(req.power_margin));
    }
    Ok(())
}

/// Allot what is left of the horizon's budget to its slots.
pub fn allot(req: &HorizonRequest<'_>) -> Result<Allotment, HorizonError> {
    validate(req)?;
    let ladder = Ladder::new(req)?;
    let hull = &ladder.hull;
    let busy_floor_w: f64 = req.gpus.iter().map(|g| g.power_w(g.min_clock())).sum();
    let mut costs: Vec<SlotCost> = req
        .slots
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let cap_w = match req.rate_cap_g_per_hour {
                Some(cap) if s.g_per_kwh > 0.0 => cap * 1000.0 / s.g_per_kwh,
                _ => f64::INFINITY,
            };
            let vertices = hull.iter().take_while(|v| v.0 <= cap_w).count().max(1);
            SlotCost {
                g_per_w: s.hours * s.g_per_kwh / 1000.0,
                hours: s.hours,
                floor_w: if i == 0 { 0.0 } else { busy_floor_w },
                vertices,
            }
        })
        .collect();
    // Kept back for the forecast's error: the margin on the future slots' floor.
    let forecast_margin_g: f64 = costs.iter().skip(1).map(|c| c.floor_w * c.g_per_w * req.forecast_margin).sum();
    let remaining_g = req.budget_g - req.spent_g;
    // Choices are prefix lengths of the ladder.
    let lowest: Vec<usize> = vec![hull[0].2; costs.len()];
    let total = |costs: &[SlotCost], choice: &[usize]| -> f64 {
        costs.iter().zip(choice).map(|(c, &k)| c.grams(ladder.prefix_w[k])).sum()
    };
    // Kept back for the power model's error in the current slot, the one spent now: the
    // margin on what it is planned to emit. Given back at the next tick's re-plan, when what
    // was really spent is measured; each future slot's is kept back when it is the current one.
    let power_g = |costs: &[SlotCost], choice: &[usize]| req.power_margin * costs[0].grams(ladder.prefix_w[choice[0]]);
    let kept_back = |costs: &[SlotCost], choice: &[usize]| forecast_margin_g + power_g(costs, choice);
    let min_needed_g = total(&costs, &lowest) + kept_back(&costs, &lowest);
    let horizon_h: f64 = req.slots.iter().map(|s| s.hours).sum();
    let mut notes = Vec::new();
    // A relative tolerance: the sums above are not exact.
    let feasible = remaining_g >= min_needed_g - 1e-9 * min_needed_g.abs().max(1.0);
    // A GPU count is kept for the workload's life, while a clock is re-planned every tick, and
    // a GPU at its lowest clock costs little: the current slot gets at least every GPU stage 1
    // would hand out, when the budget (and the per-hour cap) can hold that.
    let placing_w = ladder.prefix_w[ladder.placing];
    let mut placed = false;
    if feasible && ladder.placing > 0 {
        let cap_ok = match req.rate_cap_g_per_hour {
            Some(cap) => placing_w * req.slots[0].g_per_kwh / 1000.0 <= cap,
            None => true,
        };
        costs[0].floor_w = placing_w;
        placed = cap_ok && remaining_g - kept_back(&costs, &lowest) >= total(&costs, &lowest);
        if !placed {
            costs[0].floor_w = 0.0;
        }
    }
    let choice = if !feasible {
        notes.push(format!(
            "the horizon budget of {:.0} g cannot be kept: {:.0} g spent, {:.0} g left, and the lowest clocks need {:.0} g over the remaining {:.1} h; running at the lowest clocks",
            req.budget_g, req.spent_g, remaining_g, min_needed_g, horizon_h
        ));
        lowest
    } else {
        // The power margin of the current slot's plan depends on the plan: fill with the
        // lowest plan's kept back; when the plan found and its margin do not fit, fill again
        // with that plan's margin kept back (less to fill plans no more now, so it fits).
        let first = water_fill(&ladder, &costs, remaining_g - kept_back(&costs, &lowest));
        if total(&costs, &first) + kept_back(&costs, &first) <= remaining_g {
            first
        } else {
            water_fill(&ladder, &costs, remaining_g - kept_back(&costs, &first))
        }
    };
    let per_slot_w: Vec<f64> = costs.iter().zip(&choice).map(|(c, &k)| c.watts(ladder.prefix_w[k])).collect();
    let per_slot: Vec<f64> =
        costs.iter().zip(&per_slot_w).map(|(c, &w)| w * c.g_per_w / c.hours).collect();
    let g_per_hour_now = if feasible {
        // Halfway to the next step: planner::plan stops exactly at the chosen prefix.
        let k = if placed { choice[0].max(ladder.placing) } else { choice[0] };
        let w = match ladder.prefix_w.get(k + 1) {
            Some(&next) => (ladder.prefix_w[k] + next) / 2.0,
            None => ladder.prefix_w[k] * (1.0 + 1e-6) + 1e-6,
        };
        let rate = w * req.slots[0].g_per_kwh / 1000.0;
        // The cap binds when it left out plans the allotment would otherwise have reached.
        let allowed = costs[0].vertices;
        if let (Some(cap), true) = (req.rate_cap_g_per_hour, allowed < hull.len() && k >= hull[allowed - 1].2) {
            notes.push(format!("the per-hour cap of {cap:.0} g/h binds now"));
        }
        req.rate_cap_g_per_hour.map_or(rate, |cap| rate.min(cap))
    } else {
        0.0
    };
    Ok(Allotment {
        g_per_hour_now,
        remaining_g,
        planned_g: total(&costs, &choice) + kept_back(&costs, &choice),
        min_needed_g,
        feasible,
        notes,
        per_slot,
        per_slot_w,
    })
}

/// The slots' hull vertices at the price λ per gram: each slot's best within its cap.
fn choose(hull: &[(f64, f64, usize)], costs: &[SlotCost], lambda: f64) -> Vec<usize> {
    costs
        .iter()
        .map(|c| {
            let value = |v: usize| c.hours * hull[v].1 - lambda * c.grams(hull[v].0);
            // Along the hull the value rises, then falls (the benefit is concave in the draw,
            // and flat grams below the floor only make it rise): stop at the first step that
            // does not raise it. Ties go to the lower draw.
            let mut best = 0;
            while best + 1 < c.vertices && value(best + 1) > value(best) {
                best += 1;
            }
            best
        })
        .collect()
}

/// The allotment (a prefix length per slot) that spends at most `available` grams: bisection
/// on the price per gram, then the slots that change their choice at the price found (the
/// ties of the Lagrangian) take their higher choice, cleanest first, while it fits, and the
/// first that does not fit takes the longest prefix between its two choices that does. Both
/// steps keep the allotment monotone: more grams never give a slot fewer watts.
fn water_fill(ladder: &Ladder, costs: &[SlotCost], available: f64) -> Vec<usize> {
    let hull = &ladder.hull;
    let total = |choice: &[usize]| -> f64 { costs.iter().zip(choice).map(|(c, &v)| c.grams(hull[v].0)).sum() };
    let prefixes = |choice: &[usize]| -> Vec<usize> { choice.iter().map(|&v| hull[v].2).collect() };
    let free = choose(hull, costs, 0.0);
    if total(&free) <= available {
        return prefixes(&free);
    }
    // A price high enough that nothing above the lowest plan pays.
    let mut hi = 1e-12;
    let mut at_hi = choose(hull, costs, hi);
    while total(&at_hi) > available && hi < 1e300 {
        hi *= 4.0;
        at_hi = choose(hull, costs, hi);
    }
    if total(&at_hi) > available {
        return prefixes(&vec![0; costs.len()]);
    }
    let (mut lo, mut at_lo) = (0.0, free);
    for _ in 0..200 {
        if hi - lo <= 1e-9 * hi {
            break;
        }
        let mid = 0.5 * (lo + hi);
        let at_mid = choose(hull, costs, mid);
        if total(&at_mid) <= available {
            hi = mid;
            at_hi = at_mid;
        } else {
            lo = mid;
            at_lo = at_mid;
        }
    }
    // Just below the price found the plan does not fit, at it it does: the slots that differ
    // are indifferent at that price; in a fixed order (cleanest, then earliest) they take the
    // higher choice while it fits, and the first that does not fit the longest prefix that does.
    let mut order: Vec<usize> = (0..costs.len()).filter(|&s| at_lo[s] > at_hi[s]).collect();
    order.sort_by(|&a, &b| {
        (costs[a].g_per_w / costs[a].hours).total_cmp(&(costs[b].g_per_w / costs[b].hours)).then(a.cmp(&b))
    });
    let mut left = available - total(&at_hi);
    let mut choice = prefixes(&at_hi);
    for s in order {
        let (from, to) = (hull[at_hi[s]].2, hull[at_lo[s]].2);
        let base = costs[s].grams(ladder.prefix_w[from]);
        let more = |k: usize| costs[s].grams(ladder.prefix_w[k]) - base;
        if more(to) <= left {
            left -= more(to);
            choice[s] = to;
            continue;
        }
        choice[s] = (from..to).rev().find(|&k| more(k) <= left).unwrap_or(from);
        break;
    }
    choice
}

#[cfg(test)]
mod tests;
