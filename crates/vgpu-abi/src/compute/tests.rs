use super::*;
use proptest::prelude::*;

fn c(share: u64, priority: u32, policy: Policy, hungry: bool, usage: u64) -> Competitor {
    Competitor {
        share_ppm: share,
        priority,
        policy,
        hungry,
        usage_ppm: usage,
    }
}

/// A closed loop: one vGPU launching kernels of `durations` (cycled) back to back on an
/// otherwise idle GPU, admitted by [`wait_ns`] and charged with [`next_tat`] when each
/// finishes. Returns the (start, end) of every kernel.
fn run_loop(share: u64, durations: &[u64], horizon: u64) -> Vec<(u64, u64)> {
    let mut tat = 0u64;
    let mut now = 1_000_000_000u64;
    let mut out = Vec::new();
    let mut i = 0;
    while now < 1_000_000_000 + horizon {
        let d = durations[i % durations.len()];
        i += 1;
        now += wait_ns(tat, 0, share, now);
        let end = now + d;
        out.push((now, end));
        now = end;
        tat = next_tat(tat, d, share, now);
    }
    out
}

fn busy_in(runs: &[(u64, u64)], a: u64, b: u64) -> u64 {
    runs.iter().map(|&(s, e)| e.min(b).saturating_sub(s.max(a))).sum()
}

#[test]
fn long_run_rate_is_the_share() {
    for pct in [10u32, 20, 30, 50, 70, 90] {
        for d in [20_000u64, 1_000_000, 50_000_000] {
            let share = pct_to_ppm(pct);
            let horizon = 20_000_000_000;
            let runs = run_loop(share, &[d], horizon);
            let end = runs.last().unwrap().1;
            let rate = busy_in(&runs, runs[0].0, end) as f64 / (end - runs[0].0) as f64;
            assert!(
                (rate - pct as f64 / 100.0).abs() < 0.01,
                "{pct}% with {d} ns kernels ran at {rate}"
            );
        }
    }
}

#[test]
fn a_huge_kernel_owes_its_idle_time() {
    // One 2 s kernel at 25 %: the next may start only 8 s after the first started.
    let runs = run_loop(pct_to_ppm(25), &[2_000_000_000], 9_000_000_000);
    assert!(runs.len() >= 2);
    let gap = runs[1].0 - runs[0].0;
    assert!((8_000_000_000 - BURST_NS..=8_000_000_000).contains(&gap), "{gap}");
}

#[test]
fn policy_codes_round_trip() {
    for p in Policy::ALL {
        assert_eq!(Policy::from_code(p.code()), p);
        assert_eq!(Policy::parse(p.name()), Some(p));
    }
    assert_eq!(Policy::from_code(77), Policy::Strict, "unknown codes are strict");
    assert_eq!(Policy::parse("greedy"), None);
}

#[test]
fn window_publishes_the_share() {
    let ledger = ComputeLedger::default();
    let t0 = 5_000_000_000;
    charge(&ledger, 0, PPM, t0);
    charge(&ledger, 300_000_000, PPM, t0 + 500_000_000);
    assert_eq!(recent_share_ppm(&ledger, t0 + 500_000_000), None);
    charge(&ledger, 0, PPM, t0 + WINDOW_NS);
    assert_eq!(recent_share_ppm(&ledger, t0 + WINDOW_NS), Some(300_000));
    assert_eq!(recent_share_ppm(&ledger, t0 + WINDOW_NS + SHARE_FRESH_NS + 1), None, "stale");
    assert_eq!(ledger.charged_ns.load(Ordering::Relaxed), 300_000_000);
}

#[test]
fn splits_and_priorities() {
    // Not oversubscribed: strict keeps the share whatever the others do.
    let all = [c(300_000, 50, Policy::Strict, true, 0), c(700_000, 50, Policy::Strict, true, 0)];
    assert_eq!(allowance_ppm(&all, 0), 300_000);
    assert_eq!(allowance_ppm(&all, 1), 700_000);
    // Fair, alone and hungry: the whole GPU.
    let alone = [c(200_000, 50, Policy::Fair, true, 200_000)];
    assert_eq!(allowance_ppm(&alone, 0), PPM);
    // Fair, both hungry at 30/70: exactly the shares (nothing spare).
    let both = [c(300_000, 50, Policy::Fair, true, 0), c(700_000, 50, Policy::Fair, true, 0)];
    assert_eq!(allowance_ppm(&both, 0), 300_000);
    // Fair 20/30 hungry, 50 light (using 10 %, keeps 20 %): the 30 % spare split 2:3.
    let three = [
        c(200_000, 50, Policy::Fair, true, 0),
        c(300_000, 50, Policy::Fair, true, 0),
        c(500_000, 50, Policy::Fair, false, 100_000),
    ];
    assert_eq!(allowance_ppm(&three, 0), 200_000 + 120_000);
    assert_eq!(allowance_ppm(&three, 1), 300_000 + 180_000);
    // A 70 % tenant held to 50 % by the GPU's queue (not waiting, not light) keeps its
    // floor: the hungry 30 % gets nothing extra.
    let crowded = [c(300_000, 50, Policy::Fair, true, 500_000), c(700_000, 50, Policy::Fair, false, 500_000)];
    assert_eq!(allowance_ppm(&crowded, 0), 300_000);
    // One that has not measured a window yet keeps its whole share.
    let fresh = [c(100_000, 50, Policy::Fair, true, 0), c(900_000, 50, Policy::Fair, false, USAGE_UNKNOWN)];
    assert_eq!(allowance_ppm(&fresh, 0), 100_000);
    // Oversubscribed 60 + 60: the higher priority gets its 60, the lower what is left.
    let over = [c(600_000, 90, Policy::Strict, true, 600_000), c(600_000, 10, Policy::Strict, true, 400_000)];
    assert_eq!(allowance_ppm(&over, 0), 600_000);
    assert_eq!(allowance_ppm(&over, 1), 400_000);
}

fn competitor() -> impl Strategy<Value = Competitor> {
    (1u64..=PPM, 0u32..=100, any::<bool>(), any::<bool>(), 0u64..=PPM).prop_map(|(share, priority, fair, hungry, usage)| {
        c(share, priority, if fair { Policy::Fair } else { Policy::Strict }, hungry, usage)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, .. ProptestConfig::default() })]

    /// Strict: over every window, GPU time used is at most share × window plus one burst
    /// plus the kernel that straddles the window's end.
    #[test]
    fn strict_never_above_the_budget(pct in 1u32..=99, durations in prop::collection::vec(10_000u64..60_000_000, 1..8)) {
        let share = pct_to_ppm(pct);
        let runs = run_loop(share, &durations, 6_000_000_000);
        let longest = *durations.iter().max().unwrap();
        let first = runs[0].0;
        let last = runs.last().unwrap().1;
        for w in [100_000_000u64, 1_000_000_000] {
            let mut a = first;
            while a + w <= last {
                let used = busy_in(&runs, a, a + w);
                let allowed = (u128::from(w) * u128::from(share) / u128::from(PPM)) as u64 + BURST_NS + longest;
                prop_assert!(used <= allowed, "window {w} at {a}: used {used} > {allowed}");
                a += w / 4;
            }
        }
    }

    /// Allowances never exceed the GPU; strict ones never exceed their share; nobody is
    /// starved; when every fair vGPU is hungry and shares fit, the GPU is fully handed out.
    #[test]
    fn allowance_properties(all in prop::collection::vec(competitor(), 1..8)) {
        let total: u64 = all.iter().map(|c| c.share_ppm).sum();
        for (i, me) in all.iter().enumerate() {
            let a = allowance_ppm(&all, i);
            prop_assert!(a <= PPM);
            prop_assert!(a >= (me.share_ppm / STARVATION_FLOOR_DIVISOR).max(1), "starved: {a}");
            if me.policy == Policy::Strict || !me.hungry {
                prop_assert!(a <= me.share_ppm, "strict above share: {a} > {}", me.share_ppm);
            }
            if total <= PPM {
                prop_assert!(a >= me.share_ppm, "a share that fits is guaranteed: {a} < {}", me.share_ppm);
            }
        }
        if total <= PPM && all.iter().all(|c| c.hungry && c.policy == Policy::Fair) {
            let handed: u64 = (0..all.len()).map(|i| allowance_ppm(&all, i)).sum();
            prop_assert!(handed + all.len() as u64 >= PPM && handed <= PPM + all.len() as u64, "work-conserving: {handed}");
        }
    }
}
