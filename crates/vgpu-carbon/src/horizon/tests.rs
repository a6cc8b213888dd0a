//! Unit and property tests of the horizon planner (the properties issue 16 lists).

use chrono::{TimeZone, Utc};
use proptest::prelude::*;

use super::*;
use crate::planner::ClockPlan;

/// An H100-like GPU: 345–1980 MHz in 15 MHz steps, 100–700 W.
fn h100(index: u32) -> GpuModel {
    GpuModel::new(index, (345..=1980).step_by(15).collect(), 100.0, 700.0, 2.0).unwrap()
}

/// A small GPU with a short ladder: 50 W idle, P(500) = 62.5 W, 250 W at 2000 MHz.
fn small(index: u32) -> GpuModel {
    GpuModel::new(index, vec![500, 1000, 1500, 2000], 50.0, 250.0, 2.0).unwrap()
}

/// Contiguous slots of `hours` each, from a fixed instant, at these intensities.
fn slots(hours: f64, intensities: &[f64]) -> Vec<Slot> {
    let t0 = Utc.with_ymd_and_hms(2026, 1, 15, 0, 0, 0).unwrap();
    intensities
        .iter()
        .enumerate()
        .map(|(i, &g)| Slot {
            start: t0 + chrono::Duration::milliseconds((i as f64 * hours * 3_600_000.0) as i64),
            hours,
            g_per_kwh: g,
        })
        .collect()
}

fn request<'a>(
    gpus: &'a [GpuModel],
    workloads: &'a [PlannedWorkload],
    slots: &'a [Slot],
    budget_g: f64,
    spent_g: f64,
) -> HorizonRequest<'a> {
    HorizonRequest {
        gpus,
        workloads,
        tunables: Tunables::default(),
        budget_g,
        spent_g,
        slots,
        rate_cap_g_per_hour: None,
        forecast_margin: 0.0,
        power_margin: 0.0,
    }
}

/// The plan `planner::plan` makes now with the allotment's per-hour budget.
fn plan_now(req: &HorizonRequest<'_>, a: &Allotment) -> ClockPlan {
    plan(&PlanRequest {
        gpus: req.gpus,
        workloads: req.workloads,
        intensity: req.slots[0].g_per_kwh,
        budget_g_per_hour: Some(a.g_per_hour_now),
        tunables: req.tunables,
    })
    .unwrap()
}

fn clocks(plan: &ClockPlan) -> Vec<u32> {
    plan.gpus.iter().map(|g| g.clock_mhz).collect()
}

#[test]
fn loose_budget_runs_everything_at_maximum() {
    let gpus = [small(0), small(1)];
    let work = [PlannedWorkload::fixed("a", vec![0, 1])];
    let s = slots(1.0, &[400.0, 200.0, 300.0]);
    let req = request(&gpus, &work, &s, 1e6, 0.0);
    let a = allot(&req).unwrap();
    assert!(a.feasible);
    assert_eq!(a.per_slot_w, vec![500.0, 500.0, 500.0]);
    assert_eq!(clocks(&plan_now(&req, &a)), vec![2000, 2000]);
    assert!((a.planned_g - 500.0 * (0.4 + 0.2 + 0.3)).abs() < 1e-9);
    assert_eq!(a.remaining_g, 1e6);
}

#[test]
fn zero_remaining_budget_is_infeasible_and_runs_lowest_clocks() {
    let gpus = [small(0), small(1)];
    let work = [PlannedWorkload::fixed("a", vec![0])];
    let s = slots(1.0, &[400.0, 200.0]);
    let req = request(&gpus, &work, &s, 1000.0, 1000.0);
    let a = allot(&req).unwrap();
    assert!(!a.feasible);
    assert_eq!(a.remaining_g, 0.0);
    assert_eq!(a.g_per_hour_now, 0.0);
    assert_eq!(clocks(&plan_now(&req, &a)), vec![500, 500]);
    // Now: 62.5 + 50 W at 400 g/kWh; later the floor, both GPUs busy at 500 MHz, at 200.
    assert!((a.min_needed_g - (112.5 * 0.4 + 125.0 * 0.2)).abs() < 1e-9);
    assert_eq!(a.planned_g, a.min_needed_g);
    assert!(a.notes[0].contains("cannot be kept"), "{:?}", a.notes);
    // Overspent: infeasible too, never an error.
    let a = allot(&request(&gpus, &work, &s, 1000.0, 1500.0)).unwrap();
    assert!(!a.feasible);
    assert_eq!(a.remaining_g, -500.0);
}

#[test]
fn one_slot_spends_what_is_left_and_no_more() {
    let gpus = [small(0), small(1)];
    let work = [PlannedWorkload::fixed("a", vec![0]), PlannedWorkload::fixed("b", vec![1])];
    let s = slots(0.5, &[400.0]);
    // Lowest: 125 W × 0.5 h × 0.4 = 25 g; full: 500 W → 100 g.
    for left in [25.0, 30.0, 50.0, 70.0, 99.0, 100.0, 150.0] {
        let req = request(&gpus, &work, &s, 200.0, 200.0 - left);
        let a = allot(&req).unwrap();
        assert!(a.feasible, "{left}");
        let p = plan_now(&req, &a);
        let emitted = p.predicted_power_w * 0.5 * 0.4;
        assert!(emitted <= left + 1e-9, "{left}: {emitted}");
        assert!((emitted - a.planned_g).abs() < 1e-9, "{left}: {emitted} vs {}", a.planned_g);
        if left >= 100.0 {
            assert_eq!(clocks(&p), vec![2000, 2000]);
        }
    }
    let a = allot(&request(&gpus, &work, &s, 200.0, 176.0)).unwrap();
    assert!(!a.feasible);
}

#[test]
fn no_workloads_means_idle_power_now_and_the_floor_later() {
    let gpus = [small(0), small(1)];
    let s = slots(1.0, &[400.0, 100.0]);
    let req = request(&gpus, &[], &s, 1000.0, 0.0);
    let a = allot(&req).unwrap();
    assert!(a.feasible);
    assert_eq!(a.per_slot_w, vec![100.0, 125.0]);
    assert!((a.planned_g - (100.0 * 0.4 + 125.0 * 0.1)).abs() < 1e-9);
    assert_eq!(clocks(&plan_now(&req, &a)), vec![500, 500]);
    // Just under the idle draw now plus the floor later: infeasible.
    let a = allot(&request(&gpus, &[], &s, 52.0, 0.0)).unwrap();
    assert!(!a.feasible);
}

#[test]
fn the_rate_cap_binds_in_every_slot() {
    let gpus = [small(0), small(1)];
    let work = [PlannedWorkload::fixed("a", vec![0, 1])];
    let s = slots(1.0, &[400.0, 100.0, 400.0]);
    let mut req = request(&gpus, &work, &s, 1e6, 0.0);
    req.rate_cap_g_per_hour = Some(100.0);
    let a = allot(&req).unwrap();
    assert!(a.feasible);
    for (g, slot) in a.per_slot.iter().zip(&s) {
        assert!(*g <= 100.0 + 1e-9, "{:?}", a.per_slot);
        assert!(*g > 0.0, "{slot:?}");
    }
    // At 100 g/kWh the cap allows 1000 W: full clocks.
    assert_eq!(a.per_slot_w[1], 500.0);
    assert!(a.g_per_hour_now <= 100.0);
    assert!(a.notes.iter().any(|n| n.contains("per-hour cap of 100 g/h binds")), "{:?}", a.notes);
    let p = plan_now(&req, &a);
    assert!(p.predicted_g_per_hour <= 100.0 + 1e-9);
    assert!(p.budget_met);
    // Without the cap the same budget runs at full clocks now.
    req.rate_cap_g_per_hour = None;
    let a = allot(&req).unwrap();
    assert_eq!(a.per_slot_w[0], 500.0);
    assert!(a.notes.is_empty(), "{:?}", a.notes);
    // A cap that does not bind now says nothing.
    req.rate_cap_g_per_hour = Some(1000.0);
    let a = allot(&req).unwrap();
    assert_eq!(a.per_slot_w[0], 500.0);
    assert!(a.notes.is_empty(), "{:?}", a.notes);
}

#[test]
fn cleaner_slots_get_more_and_a_changed_forecast_is_followed() {
    let gpus = [h100(0), h100(1), h100(2), h100(3)];
    let work = [PlannedWorkload::fixed("a", vec![0, 1]), PlannedWorkload::fixed("b", vec![2]).with_sensitivity(0.5)];
    let forecast = [300.0, 100.0, 300.0, 500.0, 300.0];
    let s = slots(1.0, &forecast);
    // Between the lowest and the full plan: the budget binds.
    let a = allot(&request(&gpus, &work, &s, 2000.0, 0.0)).unwrap();
    assert!(a.feasible);
    assert!(a.planned_g <= 2000.0 + 1e-9 && a.planned_g > 1900.0, "{}", a.planned_g);
    assert!(a.per_slot_w[1] > a.per_slot_w[0], "{:?}", a.per_slot_w);
    assert!(a.per_slot_w[3] < a.per_slot_w[2], "{:?}", a.per_slot_w);

    // Slot 2 becomes cleaner: it gets more watts; slot 4 dirtier: fewer.
    let mut changed = forecast;
    changed[2] = 150.0;
    changed[4] = 450.0;
    let s2 = slots(1.0, &changed);
    let b = allot(&request(&gpus, &work, &s2, 2000.0, 0.0)).unwrap();
    assert!(b.per_slot_w[2] > a.per_slot_w[2], "{:?} then {:?}", a.per_slot_w, b.per_slot_w);
    assert!(b.per_slot_w[4] < a.per_slot_w[4], "{:?} then {:?}", a.per_slot_w, b.per_slot_w);
}

#[test]
fn a_starting_workload_gets_its_gpus_even_in_a_dirty_slot() {
    let gpus = [h100(0), h100(1), h100(2), h100(3)];
    let work = [PlannedWorkload::range("new", 1, 4)];
    // Dirty now, clean later: the clocks wait for the clean hours, the GPU count cannot.
    let s = slots(1.0, &[600.0, 50.0, 50.0, 50.0]);
    // Now at 600 g/kWh: one GPU at 345 MHz and three idle 251 g, every GPU at 345 MHz 284 g;
    // later the floor (4 × 118 W) 71 g, full clocks 420 g.
    let req = request(&gpus, &work, &s, 700.0, 0.0);
    let a = allot(&req).unwrap();
    assert!(a.feasible, "{a:?}");
    let p = plan_now(&req, &a);
    assert_eq!(p.workloads[0].gpus, vec![0, 1, 2, 3], "{a:?}");
    assert_eq!(p.workloads[0].clock_mhz, Some(345));
    assert!(p.predicted_power_w * 0.6 <= a.per_slot[0] + 1e-9);
    // A budget that cannot hold the GPUs now: the lowest plan, one GPU.
    let tight = request(&gpus, &work, &s, 340.0, 0.0);
    let a = allot(&tight).unwrap();
    assert!(a.feasible, "{a:?}");
    assert_eq!(plan_now(&tight, &a).workloads[0].gpus, vec![0]);
}

#[test]
fn bad_requests_are_refused() {
    let gpus = [small(0)];
    let s = slots(1.0, &[100.0, 100.0]);
    assert_eq!(allot(&request(&gpus, &[], &[], 1.0, 0.0)), Err(HorizonError::NoSlots));
    assert_eq!(allot(&request(&gpus, &[], &s, -1.0, 0.0)), Err(HorizonError::BadBudget(-1.0)));
    assert!(matches!(allot(&request(&gpus, &[], &s, 1.0, f64::NAN)), Err(HorizonError::BadSpent(_))));
    let mut gap = s.clone();
    gap[1].start += chrono::Duration::minutes(5);
    assert!(matches!(allot(&request(&gpus, &[], &gap, 1.0, 0.0)), Err(HorizonError::NotContiguous { index: 1, .. })));
    let mut bad = s.clone();
    bad[0].hours = 0.0;
    assert!(matches!(allot(&request(&gpus, &[], &bad, 1.0, 0.0)), Err(HorizonError::BadSlot { index: 0, .. })));
    let work = [PlannedWorkload::fixed("a", vec![7])];
    assert!(matches!(allot(&request(&gpus, &work, &s, 1.0, 0.0)), Err(HorizonError::Plan(_))));
}

/// A random fleet (1–4 GPUs, small or H100-like), fixed workloads on some of them, and maybe
/// a starting workload that wants 1–2 or 1–4 of the free ones (stage 1 at every tick).
fn fleet() -> impl Strategy<Value = (Vec<GpuModel>, Vec<PlannedWorkload>)> {
    (1usize..=4, any::<bool>(), proptest::collection::vec((0u8..3, 0.0f64..=1.0), 4), 0usize..3).prop_map(
        |(n, big, owners, starting)| {
            let gpus: Vec<GpuModel> = (0..n as u32).map(|i| if big { h100(i) } else { small(i) }).collect();
            // owner 0: idle; 1: workload w1; 2: workload w2.
            let mut work = Vec::new();
            for w in 1..=2u8 {
                let held: Vec<u32> = (0..n).filter(|&g| owners[g].0 == w).map(|g| g as u32).collect();
                if !held.is_empty() {
                    work.push(PlannedWorkload::fixed(format!("w{w}"), held).with_sensitivity(owners[w as usize].1));
                }
            }
            if starting > 0 {
                work.push(PlannedWorkload::range("new", 1, 2 * starting).with_sensitivity(owners[3].1));
            }
            (gpus, work)
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Tick by tick, with the actual intensity within the margin of the forecast: the grams
    /// emitted never exceed the budget when the lowest clocks fit in it, and whenever the
    /// budget is exceeded some tick reported it infeasible.
    #[test]
    fn simulation_never_exceeds_a_feasible_budget(
        (gpus, work) in fleet(),
        forecast in proptest::collection::vec(20.0f64..600.0, 1..24),
        errors in proptest::collection::vec(-1.0f64..=1.0, 24),
        hours in prop_oneof![Just(0.25), Just(0.5), Just(1.0)],
        margin in prop_oneof![Just(0.0), Just(0.1), Just(0.3)],
        budget_share in 0.0f64..1.3,
    ) {
        let n = forecast.len();
        let actual: Vec<f64> = (0..n).map(|i| forecast[i] * (1.0 + margin * errors[i])).collect();
        // Lowest and full plans' draw with these workloads (fixed over the horizon).
        let draw = |budget| plan(&PlanRequest {
            gpus: &gpus, workloads: &work, intensity: 1000.0, budget_g_per_hour: budget, tunables: Tunables::default(),
        }).unwrap().predicted_power_w;
        let (lowest_w, full_w) = (draw(Some(0.0)), draw(None));
        let lowest_total: f64 = actual.iter().map(|a| lowest_w * a * hours / 1000.0).sum();
        let full_total: f64 = actual.iter().map(|a| full_w * a * hours / 1000.0).sum();
        let budget = lowest_total * 0.9 + budget_share * (full_total - lowest_total * 0.9);
        let mut spent = 0.0;
        let mut reported_infeasible = false;
        for t in 0..n {
            let mut intensities = forecast[t..].to_vec();
            intensities[0] = actual[t];
            let s = slots(hours, &intensities);
            let mut req = request(&gpus, &work, &s, budget, spent);
            req.forecast_margin = margin;
            let a = allot(&req).unwrap();
            prop_assert!(a.feasible || !a.notes.is_empty());
            if a.feasible {
                prop_assert!(a.planned_g <= a.remaining_g + 1e-9 * budget.max(1.0));
            } else {
                reported_infeasible = true;
            }
            let p = plan_now(&req, &a);
            spent += p.predicted_power_w * actual[t] * hours / 1000.0;
        }
        let tolerance = 1e-9 * budget.max(1.0);
        if lowest_total <= budget {
            prop_assert!(spent <= budget + tolerance, "spent {spent} of {budget}");
        }
        if spent > budget + tolerance {
            prop_assert!(reported_infeasible);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// More budget left never gives any slot fewer watts, and a higher intensity now never
    /// gives the current slot more.
    #[test]
    fn allotment_is_monotone(
        (gpus, work) in fleet(),
        forecast in proptest::collection::vec(20.0f64..600.0, 1..12),
        budget in 0.0f64..3000.0,
        more in 0.0f64..1000.0,
        dirtier in 1.0f64..3.0,
    ) {
        let s = slots(1.0, &forecast);
        let a = allot(&request(&gpus, &work, &s, budget, 0.0)).unwrap();
        let b = allot(&request(&gpus, &work, &s, budget + more, 0.0)).unwrap();
        if a.feasible {
            for (x, y) in a.per_slot_w.iter().zip(&b.per_slot_w) {
                prop_assert!(y >= x, "{:?} then {:?}", a.per_slot_w, b.per_slot_w);
            }
        }
        let mut d = forecast.clone();
        d[0] *= dirtier;
        let sd = slots(1.0, &d);
        let c = allot(&request(&gpus, &work, &sd, budget, 0.0)).unwrap();
        prop_assert!(c.per_slot_w[0] <= a.per_slot_w[0] || !a.feasible,
            "{:?} then {:?}", a.per_slot_w, c.per_slot_w);
    }
}

/// Ticks as real marginal-intensity series have them: stretches at exactly 0 g/kWh
/// (curtailment), values held at the series' hard ceiling, and anything between; and each
/// tick's day-ahead forecast: within the margin of the actual, or 0 where the actual is not
/// (a curtailment forecast that did not happen), or positive where the actual is 0.
fn real_ticks(n: std::ops::Range<usize>) -> impl Strategy<Value = Vec<(f64, f64)>> {
    const CEILING: f64 = 900.0;
    proptest::collection::vec((0u8..5, 0.0f64..CEILING, -1.0f64..=1.0, 0u8..8), n).prop_map(|ticks| {
        let mut out = Vec::with_capacity(ticks.len());
        let mut run_zero = false;
        for (kind, value, error, forecast_kind) in ticks {
            // Zero stretches last: a tick at 0 is followed by another at 0 two times in five.
            run_zero = match kind {
                0 => true,
                1 | 2 => run_zero,
                _ => false,
            };
            let actual = match kind {
                _ if run_zero => 0.0,
                3 => CEILING,
                _ => value,
            };
            let forecast = match forecast_kind {
                0 => 0.0,
                1 if actual == 0.0 => value,
                _ => (actual * (1.0 + 0.2 * error)).min(CEILING),
            };
            out.push((actual, forecast));
        }
        out
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Never over a budget unreported (issue 31), replayed tick by tick as `vgpu carbon apply`
    /// runs: the intensity now is measured, the rest of the horizon is the forecast (with
    /// zero stretches, a hard ceiling, forecasts of 0 for non-zero actuals and the reverse),
    /// and the GPUs draw up to the power margin more than the model predicts. Budgets from
    /// the cleanest cap's emissions (every tick at the lowest clocks) up. Whenever the day
    /// ends over its budget, some tick said it was infeasible, before the day ended.
    #[test]
    fn a_budget_is_never_exceeded_unreported(
        (gpus, work) in fleet(),
        ticks in real_ticks(2..24),
        draw_errors in proptest::collection::vec(0.0f64..=1.0, 24),
        hours in prop_oneof![Just(0.25), Just(1.0)],
        budget_share in prop_oneof![Just(0.0), 0.0f64..0.2, 0.0f64..1.2],
    ) {
        let n = ticks.len();
        let draw = |budget| plan(&PlanRequest {
            gpus: &gpus, workloads: &work, intensity: 1000.0, budget_g_per_hour: budget, tunables: Tunables::default(),
        }).unwrap().predicted_power_w;
        let (lowest_w, full_w) = (draw(Some(0.0)), draw(None));
        // The cleanest cap's emissions: every tick at the lowest clocks, as the model says.
        let lowest_total: f64 = ticks.iter().map(|(a, _)| lowest_w * a * hours / 1000.0).sum();
        let full_total: f64 = ticks.iter().map(|(a, _)| full_w * a * hours / 1000.0).sum();
        let budget = lowest_total + budget_share * (full_total - lowest_total);
        let mut spent = 0.0;
        let mut reported_infeasible = false;
        for t in 0..n {
            let intensities: Vec<f64> = (t..n).map(|i| if i == t { ticks[i].0 } else { ticks[i].1 }).collect();
            let s = slots(hours, &intensities);
            let mut req = request(&gpus, &work, &s, budget, spent);
            req.forecast_margin = DEFAULT_FORECAST_MARGIN;
            req.power_margin = DEFAULT_POWER_MARGIN;
            let a = allot(&req).unwrap();
            if !a.feasible {
                reported_infeasible = true;
            }
            let p = plan_now(&req, &a);
            // The hardware: within the power margin above the model.
            let watts = p.predicted_power_w * (1.0 + DEFAULT_POWER_MARGIN * draw_errors[t]);
            spent += watts * ticks[t].0 * hours / 1000.0;
        }
        if spent > budget * (1.0 + 1e-9) + 1e-9 {
            prop_assert!(reported_infeasible, "spent {spent} of {budget}, never reported infeasible; ticks {ticks:?}");
        }
    }
}
