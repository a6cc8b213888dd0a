//! Unit and property tests of the planner (the properties the issue lists).

use proptest::prelude::*;

use super::*;
use crate::model::GpuModel;
use crate::model::Tunables;
use crate::workload::PlannedWorkload;

/// An H100-like GPU: 345–1980 MHz in 15 MHz steps, 100–700 W.
fn h100(index: u32) -> GpuModel {
    GpuModel::new(index, (345..=1980).step_by(15).collect(), 100.0, 700.0, 2.0).unwrap()
}

/// A small GPU with a short ladder, for hand-checked numbers.
fn small(index: u32) -> GpuModel {
    GpuModel::new(index, vec![500, 1000, 1500, 2000], 50.0, 250.0, 2.0).unwrap()
}

fn request<'a>(
    gpus: &'a [GpuModel],
    workloads: &'a [PlannedWorkload],
    intensity: f64,
    budget: Option<f64>,
) -> PlanRequest<'a> {
    PlanRequest { gpus, workloads, intensity, budget_g_per_hour: budget, tunables: Tunables::default() }
}

fn clocks(plan: &ClockPlan) -> Vec<u32> {
    plan.gpus.iter().map(|g| g.clock_mhz).collect()
}

#[test]
fn unlimited_budget_runs_everything_at_maximum_and_idle_gpus_at_minimum() {
    let gpus = [small(0), small(1), small(2)];
    let work = [PlannedWorkload::fixed("a", vec![0]), PlannedWorkload::fixed("b", vec![2])];
    let plan = plan(&request(&gpus, &work, 300.0, None)).unwrap();
    assert_eq!(clocks(&plan), vec![2000, 500, 2000]);
    assert!(plan.budget_met);
    assert_eq!(plan.predicted_power_w, 250.0 + 50.0 + 250.0);
    assert_eq!(plan.predicted_g_per_hour, 550.0 * 0.3);
    assert_eq!(plan.gpus[1].workload, None);
    assert_eq!(plan.gpus[0].workload.as_deref(), Some("a"));
}

#[test]
fn zero_intensity_means_no_limit() {
    let gpus = [small(0)];
    let work = [PlannedWorkload::fixed("a", vec![0])];
    let plan = plan(&request(&gpus, &work, 0.0, Some(0.0))).unwrap();
    assert_eq!(clocks(&plan), vec![2000]);
    assert_eq!(plan.predicted_g_per_hour, 0.0);
}

#[test]
fn budget_below_the_lowest_clocks_is_reported_and_lowest_clocks_planned() {
    let gpus = [small(0), small(1)];
    let work = [PlannedWorkload::fixed("a", vec![0, 1])];
    // Lowest clocks: 2 × P(500) = 2 × (50 + 200/16) = 125 W = 50 g/h at 400 g/kWh.
    let plan = plan(&request(&gpus, &work, 400.0, Some(49.0))).unwrap();
    assert!(!plan.budget_met);
    assert_eq!(clocks(&plan), vec![500, 500]);
    assert!(plan.notes[0].contains("cannot be met"), "{:?}", plan.notes);
    assert!(plan.steps.is_empty());
}

#[test]
fn budget_stops_the_raise_at_the_first_step_that_does_not_fit() {
    let gpus = [small(0)];
    let work = [PlannedWorkload::fixed("a", vec![0])];
    // P: 500 → 62.5 W, 1000 → 100 W, 1500 → 162.5 W, 2000 → 250 W. At 1000 g/kWh, g/h = W.
    for (budget, want) in [(62.5, 500), (99.9, 500), (100.0, 1000), (200.0, 1500), (250.0, 2000)] {
        let plan = plan(&request(&gpus, &work, 1000.0, Some(budget))).unwrap();
        assert_eq!(clocks(&plan), vec![want], "budget {budget}");
        assert!(plan.predicted_g_per_hour <= budget);
    }
}

#[test]
fn delta_f_steps_by_at_least_that_much() {
    let gpus = [h100(0)];
    let work = [PlannedWorkload::fixed("a", vec![0])];
    let mut req = request(&gpus, &work, 100.0, None);
    req.tunables.delta_f_mhz = Some(100);
    let plan = plan(&req).unwrap();
    let path: Vec<u32> = std::iter::successors(Some(345), |&f| gpus[0].step_up(f, Some(100))).collect();
    assert_eq!(path[1], 450);
    assert_eq!(plan.steps.len(), path.len() - 1);
    assert_eq!(clocks(&plan), vec![1980]);
}

#[test]
fn sensitive_workloads_are_raised_first() {
    let gpus = [small(0), small(1)];
    let work =
        [PlannedWorkload::fixed("memory-bound", vec![0]).with_sensitivity(0.2), PlannedWorkload::fixed("compute-bound", vec![1])];
    // Room for one step above the lowest clocks (125 W) but not two.
    let plan = plan(&request(&gpus, &work, 1000.0, Some(125.0 + 40.0))).unwrap();
    assert_eq!(clocks(&plan), vec![500, 1000]);
}

#[test]
fn insensitive_workloads_are_raised_last() {
    let gpus = [small(0), small(1)];
    let work = [PlannedWorkload::fixed("io", vec![0]).with_sensitivity(0.0), PlannedWorkload::fixed("cpu", vec![1])];
    let plan = plan(&request(&gpus, &work, 1000.0, Some(250.0 + 62.5))).unwrap();
    assert_eq!(clocks(&plan), vec![500, 2000]);
    let unlimited = super::plan(&request(&gpus, &work, 1000.0, None)).unwrap();
    assert_eq!(clocks(&unlimited), vec![2000, 2000]);
}

#[test]
fn stage1_gives_mins_then_spare_gpus_by_benefit_within_max() {
    let gpus: Vec<GpuModel> = (0..6).map(h100).collect();
    let work = [
        PlannedWorkload::fixed("running", vec![0]),
        PlannedWorkload::range("wide", 1, 8),
        PlannedWorkload::range("narrow", 2, 2),
        PlannedWorkload::range("short", 1, 4).with_work(0.25),
    ];
    let plan = plan(&request(&gpus, &work, 200.0, None)).unwrap();
    let counts: Vec<usize> = plan.workloads.iter().map(|w| w.gpus.len()).collect();
    // Mins: running 1, wide 1, narrow 2, short 1 → one spare GPU, which goes where it cuts
    // the average completion time most: the long workload "wide", not the short one.
    assert_eq!(counts, vec![1, 2, 2, 1]);
    assert_eq!(plan.workloads[1].gpus, vec![1, 5]);
    assert_eq!(plan.workloads[2].gpus, vec![2, 3]);
    assert!(plan.gpus.iter().all(|g| g.workload.is_some()));
    assert!(plan.steps.iter().filter(|s| s.stage == 1).all(|s| s.workload == 1));
}

#[test]
fn stage1_stops_at_each_workloads_max_and_leaves_the_rest_idle() {
    let gpus: Vec<GpuModel> = (0..5).map(small).collect();
    let work = [PlannedWorkload::range("a", 1, 2), PlannedWorkload::range("b", 1, 1)];
    let plan = plan(&request(&gpus, &work, 200.0, None)).unwrap();
    assert_eq!(plan.workloads[0].gpus, vec![0, 2]);
    assert_eq!(plan.workloads[1].gpus, vec![1]);
    assert_eq!(clocks(&plan), vec![2000, 2000, 2000, 500, 500]);
}

#[test]
fn stage1_budget_limit_leaves_gpus_unassigned_at_lowest_clocks() {
    let gpus: Vec<GpuModel> = (0..4).map(small).collect();
    let work = [PlannedWorkload::range("a", 1, 4)];
    // Lowest: 1 × 62.5 + 3 × 50 = 212.5 W; each extra GPU adds 12.5 W.
    let plan = plan(&request(&gpus, &work, 1000.0, Some(230.0))).unwrap();
    assert_eq!(plan.workloads[0].gpus, vec![0, 1]);
    assert_eq!(clocks(&plan), vec![500; 4]);
    assert!(plan.budget_met);
    assert!(plan.notes[0].contains("unassigned"), "{:?}", plan.notes);
    assert!(plan.predicted_g_per_hour <= 230.0);
}

#[test]
fn a_workload_whose_min_does_not_fit_is_not_placed() {
    let gpus = [small(0), small(1)];
    let work = [PlannedWorkload::fixed("a", vec![1]), PlannedWorkload::range("b", 2, 4)];
    let plan = plan(&request(&gpus, &work, 100.0, None)).unwrap();
    assert!(plan.workloads[1].gpus.is_empty());
    assert_eq!(plan.workloads[1].clock_mhz, None);
    assert!(plan.notes.iter().any(|n| n.contains("workload b not placed")), "{:?}", plan.notes);
}

#[test]
fn bad_requests_are_refused() {
    let gpus = [small(0)];
    let cases: Vec<(Vec<PlannedWorkload>, f64, Option<f64>, &str)> = vec![
        (vec![PlannedWorkload::fixed("a", vec![3])], 1.0, None, "no GPU 3"),
        (vec![PlannedWorkload::fixed("a", vec![0]), PlannedWorkload::fixed("b", vec![0])], 1.0, None, "already held by workload a"),
        (vec![PlannedWorkload::range("a", 0, 2)], 1.0, None, "invalid GPU range 0-2"),
        (vec![PlannedWorkload::range("a", 3, 2)], 1.0, None, "invalid GPU range 3-2"),
        (vec![PlannedWorkload::fixed("a", vec![0]).with_sensitivity(2.0)], 1.0, None, "sensitivity"),
        (vec![PlannedWorkload::fixed("a", vec![0]).with_work(0.0)], 1.0, None, "work"),
        (vec![], -1.0, None, "intensity"),
        (vec![], f64::NAN, None, "intensity"),
        (vec![], 1.0, Some(-3.0), "budget"),
    ];
    for (work, intensity, budget, want) in cases {
        let err = plan(&request(&gpus, &work, intensity, budget)).unwrap_err().to_string();
        assert!(err.contains(want), "{err} (wanted {want})");
    }
}

#[test]
fn heterogeneous_gpus_of_one_workload_snap_down_to_their_own_clocks() {
    let a = GpuModel::new(0, vec![600, 1200, 1800], 50.0, 300.0, 2.0).unwrap();
    let b = GpuModel::new(1, vec![500, 1000, 1500, 2000], 50.0, 300.0, 2.0).unwrap();
    let gpus = [a, b];
    let work = [PlannedWorkload::fixed("a", vec![0, 1])];
    let plan = plan(&request(&gpus, &work, 100.0, None)).unwrap();
    assert_eq!(clocks(&plan), vec![1800, 1500]);
}

// ---- properties ----

/// A GPU ladder: (min clock, step, count, idle W, extra W up to max, γ).
fn gpu_strategy() -> impl Strategy<Value = (u32, u32, usize, f64, f64, f64)> {
    (200u32..700, prop_oneof![Just(15u32), 30u32..120], 1usize..40, 10.0..150.0f64, 20.0..600.0f64, 1.0..3.0f64)
}

fn make_gpus(n: usize, spec: (u32, u32, usize, f64, f64, f64), jitter: &[(u32, f64)]) -> Vec<GpuModel> {
    let (min, step, count, idle, extra, gamma) = spec;
    (0..n)
        .map(|i| {
            let (shift, more) = jitter.get(i).copied().unwrap_or((0, 0.0));
            let clocks = (0..count as u32).map(|k| min + shift + k * step).collect();
            GpuModel::new(i as u32, clocks, idle, idle + extra + more, gamma).unwrap()
        })
        .collect()
}

/// Workloads over `n` GPUs: each GPU is left free (2 in 5), held by a one-GPU fixed workload,
/// or part of a two-GPU one; plus range workloads. Half the time only range workloads, so
/// that stage 1 has GPUs to hand out.
fn workloads_strategy(n: usize) -> impl Strategy<Value = Vec<PlannedWorkload>> {
    let fixed = proptest::collection::vec((0u8..5, proptest::option::of(0.0..=1.0f64), 0.2..5.0f64), n);
    let ranges =
        proptest::collection::vec((1usize..3, 0usize..4, proptest::option::of(0.0..=1.0f64), 0.2..5.0f64), 0..4);
    (fixed, ranges, any::<bool>()).prop_map(move |(fixed, ranges, ranges_only)| {
        let mut out = Vec::new();
        let mut g = 0;
        while g < fixed.len() && !ranges_only {
            let (kind, sens, work) = fixed[g];
            match kind {
                0 | 1 => g += 1,
                3 if g + 1 < fixed.len() => {
                    out.push(PlannedWorkload {
                        freq_sensitivity: sens,
                        ..PlannedWorkload::fixed(format!("f{g}"), vec![g as u32, g as u32 + 1]).with_work(work)
                    });
                    g += 2;
                }
                _ => {
                    out.push(PlannedWorkload {
                        freq_sensitivity: sens,
                        ..PlannedWorkload::fixed(format!("f{g}"), vec![g as u32]).with_work(work)
                    });
                    g += 1;
                }
            }
        }
        for (i, (min, extra, sens, work)) in ranges.into_iter().enumerate() {
            out.push(PlannedWorkload {
                freq_sensitivity: sens,
                ..PlannedWorkload::range(format!("r{i}"), min, min + extra).with_work(work)
            });
        }
        out
    })
}

prop_compose! {
    fn scenario()(n in 1usize..7, spec in gpu_strategy(), hetero in any::<bool>())
        (jitter in proptest::collection::vec((0u32..3, 0.0..100.0f64), if hetero { n } else { 0 }),
         work in workloads_strategy(n), n in Just(n), spec in Just(spec),
         delta in proptest::option::of(1u32..200))
        -> (Vec<GpuModel>, Vec<PlannedWorkload>, Option<u32>)
    {
        let jitter: Vec<(u32, f64)> = jitter.into_iter().map(|(s, w)| (s * 7, w)).collect();
        (make_gpus(n, spec, &jitter), work, delta)
    }
}

fn req_with<'a>(
    gpus: &'a [GpuModel],
    work: &'a [PlannedWorkload],
    delta: Option<u32>,
    intensity: f64,
    budget: Option<f64>,
) -> PlanRequest<'a> {
    let mut req = request(gpus, work, intensity, budget);
    req.tunables.delta_f_mhz = delta;
    req
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// The budget is never exceeded; when it cannot be met, nothing is raised.
    #[test]
    fn budget_is_never_exceeded((gpus, work, delta) in scenario(), intensity in 0.0..1500.0f64, budget in 0.0..3000.0f64) {
        let plan = plan(&req_with(&gpus, &work, delta, intensity, Some(budget))).unwrap();
        if plan.budget_met {
            prop_assert!(plan.predicted_g_per_hour <= budget * (1.0 + 1e-9) + 1e-9,
                "predicted {} > budget {}", plan.predicted_g_per_hour, budget);
        } else {
            prop_assert!(plan.steps.is_empty());
            for w in &plan.workloads {
                if let Some(&first) = w.gpus.first() {
                    prop_assert_eq!(w.clock_mhz, Some(gpus[first as usize].min_clock()));
                }
            }
        }
        let sum: f64 = plan.gpus.iter().map(|g| g.g_per_hour).sum();
        prop_assert!((sum - plan.predicted_g_per_hour).abs() <= 1e-6 * (1.0 + sum));
    }

    /// With an unlimited budget every workload runs at its maximum, every wanted GPU is
    /// given, and idle GPUs sit at their lowest clock.
    #[test]
    fn unlimited_budget_runs_at_maximum((gpus, work, delta) in scenario(), intensity in 0.0..1500.0f64) {
        let plan = plan(&req_with(&gpus, &work, delta, intensity, None)).unwrap();
        prop_assert!(plan.budget_met);
        for (gpu, planned) in gpus.iter().zip(&plan.gpus) {
            match &planned.workload {
                None => prop_assert_eq!(planned.clock_mhz, gpu.min_clock()),
                Some(id) => {
                    let w = plan.workloads.iter().find(|w| &w.id == id).unwrap();
                    let ladder = &gpus[w.gpus[0] as usize];
                    prop_assert_eq!(w.clock_mhz, Some(ladder.max_clock()));
                    prop_assert_eq!(planned.clock_mhz, gpu.snap_down(ladder.max_clock()));
                }
            }
        }
        let free = plan.gpus.iter().filter(|g| g.workload.is_none()).count();
        for (w, p) in work.iter().zip(&plan.workloads) {
            if let GpuDemand::Range { max, .. } = w.gpus {
                if !p.gpus.is_empty() {
                    prop_assert!(p.gpus.len() == max || free == 0, "{} has {} of {max} with {free} free", p.id, p.gpus.len());
                }
            }
        }
    }

    /// A higher intensity never raises any clock (nor adds a GPU to a workload).
    #[test]
    fn higher_intensity_never_raises_a_clock((gpus, work, delta) in scenario(), low in 0.0..1000.0f64, more in 0.0..1000.0f64, budget in 0.0..3000.0f64) {
        let a = plan(&req_with(&gpus, &work, delta, low, Some(budget))).unwrap();
        let b = plan(&req_with(&gpus, &work, delta, low + more, Some(budget))).unwrap();
        for (x, y) in a.gpus.iter().zip(&b.gpus) {
            prop_assert!(y.clock_mhz <= x.clock_mhz, "GPU {}: {} MHz at {} g/kWh but {} MHz at {}", x.index, x.clock_mhz, low, y.clock_mhz, low + more);
        }
        for (x, y) in a.workloads.iter().zip(&b.workloads) {
            prop_assert!(y.gpus.len() <= x.gpus.len());
        }
    }

    /// Every step serves the workload with the highest benefit at that moment.
    #[test]
    fn the_best_gain_per_emission_is_served_first((gpus, work, delta) in scenario(), intensity in 1.0..1000.0f64, budget in proptest::option::of(0.0..3000.0f64)) {
        let plan = plan(&req_with(&gpus, &work, delta, intensity, budget)).unwrap();
        for step in &plan.steps {
            if let Some(other) = step.runner_up {
                prop_assert!(step.benefit >= other, "{step:?}");
            }
        }
        // Within stage 2 a workload's own benefit only falls, so the sequence of benefits
        // never rises: nobody is served after someone who gains less.
        let stage2: Vec<f64> = plan.steps.iter().filter(|s| s.stage == 2).map(|s| s.benefit).collect();
        for pair in stage2.windows(2) {
            prop_assert!(pair[1] <= pair[0] * (1.0 + 1e-9), "{:?}", pair);
        }
    }

    /// Of two workloads on like GPUs that differ only in sensitivity, the one that gains more
    /// per unit of emission never ends at a lower clock.
    #[test]
    fn more_gain_never_gets_a_lower_clock(spec in gpu_strategy(), hi in 0.0..=1.0f64, lo_frac in 0.0..1.0f64, work in 0.2..5.0f64,
                                           intensity in 1.0..1000.0f64, budget in 0.0..1500.0f64, delta in proptest::option::of(1u32..200)) {
        let gpus = make_gpus(3, spec, &[]);
        let jobs = [
            PlannedWorkload::fixed("low", vec![0]).with_sensitivity(hi * lo_frac).with_work(work),
            PlannedWorkload::fixed("high", vec![1]).with_sensitivity(hi).with_work(work),
            PlannedWorkload::fixed("other", vec![2]),
        ];
        let plan = plan(&req_with(&gpus, &jobs, delta, intensity, Some(budget))).unwrap();
        prop_assert!(plan.gpus[1].clock_mhz >= plan.gpus[0].clock_mhz, "{:?}", clocks(&plan));
    }

    /// Two identical workloads end at most one step apart.
    #[test]
    fn identical_workloads_end_within_one_step(spec in gpu_strategy(), sens in proptest::option::of(0.0..=1.0f64), work in 0.2..5.0f64,
                                                 other_sens in 0.0..=1.0f64, intensity in 1.0..1000.0f64, budget in 0.0..2000.0f64,
                                                 delta in proptest::option::of(1u32..200)) {
        let gpus = make_gpus(3, spec, &[]);
        let twin = |id: &str, g: u32| PlannedWorkload { freq_sensitivity: sens, ..PlannedWorkload::fixed(id, vec![g]).with_work(work) };
        let jobs = [twin("a", 0), PlannedWorkload::fixed("c", vec![1]).with_sensitivity(other_sens), twin("b", 2)];
        let plan = plan(&req_with(&gpus, &jobs, delta, intensity, Some(budget))).unwrap();
        let (a, b) = (plan.gpus[0].clock_mhz, plan.gpus[2].clock_mhz);
        let (lo, hi) = (a.min(b), a.max(b));
        prop_assert!(hi == lo || gpus[0].step_up(lo, delta) == Some(hi), "{a} vs {b}");
    }
}
