//! The scaling decision: a pure function of the samples and of the recommendations made so
//! far (no I/O, no clock: the runner passes the time). The rule, as Kubernetes' Horizontal
//! Pod Autoscaler computes it:
//!
//! - a signal's value is the mean over the replicas that have one (unknown ones are left out);
//! - its recommendation is `ceil(current × value ÷ target)`, or `current` when
//!   `|value ÷ target − 1| ≤ 0.1` (the tolerance band); the service's is the highest over its
//!   signals (`current` when none has a value), clamped to MIN..MAX;
//! - scale-up acts when every recommendation of the last `window` was above `current` and
//!   the scaler has seen at least one window of them;
//! - scale-down acts when every recommendation of the last `cooldown` was below `current`
//!   and the scaler has seen at least one cooldown of them;
//! - either moves ONE replica per decision; a `current` outside MIN..MAX (the definition
//!   changed) goes straight to the bound.
//!
//! Up and down can never both hold (the newest recommendation is in both windows), so no two
//! conflicting steps; more load never gives fewer replicas (every step above is monotone in
//! the recommendation, which is monotone in the values).

use std::collections::VecDeque;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::def::{Signal, Target};

/// The tolerance band: no change while the value is within 10% of the target.
pub const TOLERANCE: f64 = 0.1;

/// One replica's utilizations (1.0 = 100%); None = unknown (not sampled yet, no limit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Load {
    pub cpu: Option<f64>,
    pub mem: Option<f64>,
    pub gpu: Option<f64>,
}

impl Load {
    pub fn get(&self, signal: Signal) -> Option<f64> {
        let v = match signal {
            Signal::Cpu => self.cpu,
            Signal::Mem => self.mem,
            Signal::Gpu => self.gpu,
        };
        // A broken sample (negative, NaN, infinite) is an unknown one.
        v.filter(|v| v.is_finite() && *v >= 0.0)
    }
}

/// One signal's input to a decision.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SignalValue {
    pub signal: Signal,
    /// The mean utilization over the replicas that have one (1.0 = 100%).
    pub value: f64,
    pub target: f64,
    /// How many replicas had a value.
    pub replicas: u32,
    /// This signal's recommendation, before clamping.
    pub recommended: u32,
}

/// One decision and its inputs (what `service show` lists).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub at_unix_ms: u64,
    /// Replicas when deciding.
    pub current: u32,
    /// The recommendation of this sample, clamped to MIN..MAX.
    pub recommended: u32,
    /// What the service should have now: `current`, one step from it, or a bound.
    pub desired: u32,
    pub values: Vec<SignalValue>,
    /// Why, in words: "cpu 0.93 > 0.70: 2 → 3", "within tolerance", "cooldown: …".
    pub reason: String,
}

/// The policy and the recommendation history of one service.
#[derive(Debug, Clone)]
pub struct Scaler {
    min: u32,
    max: u32,
    targets: Vec<Target>,
    window_ms: u64,
    cooldown_ms: u64,
    /// When the first decision was asked for.
    since_ms: Option<u64>,
    /// (at, clamped recommendation), oldest first, as far back as the longer of the windows.
    history: VecDeque<(u64, u32)>,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Scaler {
    pub fn new(
        min: u32,
        max: u32,
        targets: &[Target],
        window: Duration,
        cooldown: Duration,
    ) -> Scaler {
        Scaler {
            min,
            max: max.max(min),
            targets: targets.to_vec(),
            window_ms: ms(window),
            cooldown_ms: ms(cooldown),
            since_ms: None,
            history: VecDeque::new(),
        }
    }

    /// One decision (the runner calls it once per interval) from each replica's load.
    pub fn decide(&mut self, now_unix_ms: u64, current: u32, loads: &[Load]) -> Decision {
        let (min, max) = (self.min, self.max);
        let mut values = Vec::new();
        let mut why_signal = String::new();
        let mut raw: Option<u32> = None;
        for t in &self.targets {
            let known: Vec<f64> = loads.iter().filter_map(|l| l.get(t.signal)).collect();
            if known.is_empty() {
                continue;
            }
            let value = known.iter().sum::<f64>() / known.len() as f64;
            let ratio = value / t.target;
            let rec = if (ratio - 1.0).abs() <= TOLERANCE {
                current
            } else {
                let wanted = (f64::from(current) * ratio).ceil();
                if wanted >= f64::from(u32::MAX) {
                    u32::MAX
                } else {
                    wanted as u32
                }
            };
            values.push(SignalValue {
                signal: t.signal,
                value,
                target: t.target,
                replicas: known.len() as u32,
                recommended: rec,
            });
            if raw.is_none_or(|r| rec > r) {
                raw = Some(rec);
                why_signal = format!("{} {value:.2} vs target {:.2}", t.signal, t.target);
            }
        }
        let recommended = raw.unwrap_or(current).clamp(min, max);
        let since = *self.since_ms.get_or_insert(now_unix_ms);
        self.history.push_back((now_unix_ms, recommended));
        let keep = self.window_ms.max(self.cooldown_ms);
        while self
            .history
            .front()
            .is_some_and(|(at, _)| now_unix_ms.saturating_sub(*at) > keep)
        {
            self.history.pop_front();
        }
        let decision = |desired: u32, reason: String| Decision {
            at_unix_ms: now_unix_ms,
            current,
            recommended,
            desired,
            values: values.clone(),
            reason,
        };

        if current < min {
            return decision(min, format!("below min {min}: {current} → {min}"));
        }
        if current > max {
            return decision(max, format!("above max {max}: {current} → {max}"));
        }
        if raw.is_none() {
            let reason = if self.targets.is_empty() {
                "no scaling signals"
            } else {
                "no samples yet"
            };
            return decision(current, reason.into());
        }
        let within = |span: u64| {
            self.history
                .iter()
                .filter(move |(at, _)| now_unix_ms.saturating_sub(*at) <= span)
                .map(|(_, r)| *r)
        };
        if recommended > current {
            let lowest = within(self.window_ms).min().unwrap_or(recommended);
            let clamped = if recommended == max && raw.is_some_and(|r| r > max) {
                format!(" (clamped to max {max})")
            } else {
                String::new()
            };
            if now_unix_ms.saturating_sub(since) < self.window_ms {
                let at = since.saturating_add(self.window_ms);
                return decision(current, format!("{why_signal}: wants {recommended}{clamped}; scale-up after the first window (at {at} ms)"));
            }
            if lowest > current {
                return decision(
                    current + 1,
                    format!(
                        "{why_signal}: wants {recommended}{clamped}: {current} → {}",
                        current + 1
                    ),
                );
            }
            return decision(
                current,
                format!("{why_signal}: wants {recommended}{clamped}, not for a whole window yet"),
            );
        }
        if recommended < current {
            let highest = within(self.cooldown_ms).max().unwrap_or(recommended);
            let clamped = if recommended == min && raw.is_some_and(|r| r < min) {
                format!(" (clamped to min {min})")
            } else {
                String::new()
            };
            if now_unix_ms.saturating_sub(since) < self.cooldown_ms || highest >= current {
                let since_higher = self
                    .history
                    .iter()
                    .rev()
                    .find(|(_, r)| *r >= current)
                    .map(|(at, _)| *at)
                    .unwrap_or(since);
                let until = since_higher.saturating_add(self.cooldown_ms);
                return decision(current, format!("{why_signal}: cooldown: wants {recommended}{clamped}, holding {current} until {until} ms"));
            }
            return decision(
                current - 1,
                format!(
                    "{why_signal}: wants {recommended}{clamped}: {current} → {}",
                    current - 1
                ),
            );
        }
        let reason = match raw {
            Some(r) if r > max => format!("{why_signal}: wants {r}, clamped to max {max}"),
            Some(r) if r < min => format!("{why_signal}: wants {r}, clamped to min {min}"),
            _ if values.iter().all(|v| v.recommended == current) => "within tolerance".to_string(),
            _ => format!("{why_signal}: {current} is right"),
        };
        decision(current, reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: u64 = 1000;

    fn cpu(v: f64) -> Load {
        Load {
            cpu: Some(v),
            ..Load::default()
        }
    }

    fn scaler(min: u32, max: u32) -> Scaler {
        Scaler::new(
            min,
            max,
            &[Target {
                signal: Signal::Cpu,
                target: 0.5,
            }],
            Duration::from_secs(60),
            Duration::from_secs(120),
        )
    }

    #[test]
    fn scales_up_one_step_after_one_window() {
        let mut s = scaler(1, 4);
        // 2 replicas at 100% of a 50% target: wants 4.
        let d = s.decide(0, 2, &[cpu(1.0), cpu(1.0)]);
        assert_eq!((d.recommended, d.desired), (4, 2), "{}", d.reason);
        assert!(d.reason.contains("first window"), "{}", d.reason);
        let d = s.decide(60 * S, 2, &[cpu(1.0), cpu(1.0)]);
        assert_eq!(d.desired, 3, "{}", d.reason);
        assert_eq!(
            d.values,
            vec![SignalValue {
                signal: Signal::Cpu,
                value: 1.0,
                target: 0.5,
                replicas: 2,
                recommended: 4
            }]
        );
    }

    #[test]
    fn clamps_to_max_and_says_so() {
        let mut s = scaler(1, 3);
        s.decide(0, 3, &[cpu(1.0); 3]);
        let d = s.decide(60 * S, 3, &[cpu(1.0); 3]);
        assert_eq!((d.recommended, d.desired), (3, 3), "{}", d.reason);
        assert!(
            d.reason.contains("wants 6, clamped to max 3"),
            "{}",
            d.reason
        );
        let mut s = scaler(1, 3);
        s.decide(0, 2, &[cpu(1.0); 2]);
        let d = s.decide(60 * S, 2, &[cpu(1.0); 2]);
        assert!(d.reason.contains("clamped to max 3"), "{}", d.reason);
    }

    #[test]
    fn within_tolerance_nothing_changes() {
        let mut s = scaler(1, 8);
        for i in 0..10 {
            let d = s.decide(i * 60 * S, 4, &[cpu(0.54), cpu(0.52), cpu(0.47), cpu(0.51)]);
            assert_eq!(d.desired, 4);
            assert_eq!(d.reason, "within tolerance");
        }
    }

    #[test]
    fn scales_down_only_after_a_cooldown_of_lower_desire() {
        let mut s = scaler(1, 4);
        assert_eq!(s.decide(0, 4, &[cpu(0.5); 4]).desired, 4);
        // Idle from 10 s on: the recommendation of 0 s (4) holds it until 120 s.
        for t in [10, 60, 120] {
            let d = s.decide(t * S, 4, &[cpu(0.1); 4]);
            assert_eq!(d.desired, 4, "at {t}s: {}", d.reason);
            assert!(d.reason.contains("cooldown"), "{}", d.reason);
        }
        let d = s.decide(121 * S, 4, &[cpu(0.1); 4]);
        assert_eq!(d.desired, 3, "{}", d.reason);
        // One busy sample resets the cooldown.
        assert_eq!(s.decide(122 * S, 3, &[cpu(0.9); 3]).desired, 3);
        assert_eq!(s.decide(200 * S, 3, &[cpu(0.1); 3]).desired, 3);
        assert_eq!(s.decide(243 * S, 3, &[cpu(0.1); 3]).desired, 2);
    }

    #[test]
    fn unknown_values_are_left_out_and_no_values_change_nothing() {
        let mut s = scaler(1, 4);
        let d = s.decide(0, 2, &[Load::default(), Load::default()]);
        assert_eq!((d.desired, d.reason.as_str()), (2, "no samples yet"));
        let d = s.decide(S, 2, &[cpu(f64::NAN), cpu(0.5)]);
        assert_eq!(d.values[0].replicas, 1);
        let mut none = Scaler::new(1, 4, &[], Duration::from_secs(1), Duration::from_secs(1));
        assert_eq!(none.decide(0, 9, &[]).desired, 4);
    }

    fn load_strategy() -> impl Strategy<Value = Load> {
        (
            proptest::option::of(0.0f64..3.0),
            proptest::option::of(0.0f64..3.0),
            proptest::option::of(0.0f64..3.0),
        )
            .prop_map(|(cpu, mem, gpu)| Load { cpu, mem, gpu })
    }

    /// A scaler on cpu and mem with some decisions behind it, and the replica count then.
    fn history_strategy() -> impl Strategy<Value = (Scaler, u32, u64)> {
        (
            0u32..6,
            1u32..10,
            1u64..200,
            1u64..300,
            0.05f64..1.0,
            proptest::collection::vec(
                (
                    1u64..100,
                    0u32..12,
                    proptest::collection::vec(load_strategy(), 0..6),
                ),
                0..12,
            ),
        )
            .prop_map(|(min, span, window_s, cooldown_s, target, steps)| {
                let max = min + span;
                let targets = [
                    Target {
                        signal: Signal::Cpu,
                        target,
                    },
                    Target {
                        signal: Signal::Mem,
                        target: (target * 1.3).min(1.0),
                    },
                ];
                let mut s = Scaler::new(
                    min,
                    max,
                    &targets,
                    Duration::from_secs(window_s),
                    Duration::from_secs(cooldown_s),
                );
                let mut now = 1_000_000;
                let mut current = min;
                for (dt, cur, loads) in steps {
                    now += dt * S;
                    current = cur;
                    current = s.decide(now, current, &loads).desired;
                }
                (s, current, now)
            })
    }

    proptest! {
        #[test]
        fn never_outside_min_max((mut s, _, now) in history_strategy(), current in 0u32..20, loads in proptest::collection::vec(load_strategy(), 0..8)) {
            let d = s.decide(now + S, current, &loads);
            prop_assert!(d.desired >= s.min && d.desired <= s.max, "{:?}", d);
        }

        #[test]
        fn at_most_one_step_inside_the_range((mut s, current, now) in history_strategy(), loads in proptest::collection::vec(load_strategy(), 0..8)) {
            let d = s.decide(now + S, current, &loads);
            prop_assert!(d.desired.abs_diff(current) <= 1, "{:?}", d);
        }

        #[test]
        fn monotone_in_load((s, current, now) in history_strategy(), loads in proptest::collection::vec(load_strategy(), 1..8), extra in 0.0f64..2.0, which in 0usize..8) {
            let mut more = loads.clone();
            let i = which % more.len();
            // Known values only: an unknown value is left out of the mean, so giving one a
            // figure (0 + a small extra) can lower the mean: that is not "more load".
            more[i].cpu = more[i].cpu.map(|c| c + extra);
            more[i].mem = more[i].mem.map(|m| m + extra);
            let lower = s.clone().decide(now + S, current, &loads);
            let higher = s.clone().decide(now + S, current, &more);
            prop_assert!(higher.desired >= lower.desired, "{:?}\n{:?}", lower, higher);
        }

        #[test]
        fn inside_the_tolerance_band_nothing_changes((mut s, current, now) in history_strategy(), offsets in proptest::collection::vec(-0.099f64..0.099, 1..8)) {
            // Every signal's mean within 10% of its target (some replicas' values unknown is fine).
            let cpu_t = s.targets[0].target;
            let mem_t = s.targets[1].target;
            let mean_off = offsets.iter().sum::<f64>() / offsets.len() as f64;
            let loads: Vec<Load> = offsets.iter().map(|o| Load { cpu: Some(cpu_t * (1.0 + o)), mem: Some(mem_t * (1.0 + mean_off)), gpu: None }).collect();
            let d = s.decide(now + S, current, &loads);
            prop_assert_eq!(d.desired, current, "{:?}", d);
        }

        #[test]
        fn no_scale_down_within_a_cooldown_of_a_higher_recommendation(
            (mut s, current, now) in history_strategy(),
            busy in proptest::collection::vec(load_strategy(), 1..8),
            idle_steps in proptest::collection::vec((1u64..60, proptest::collection::vec(load_strategy(), 0..8)), 1..10),
        ) {
            // A recommendation at or above `current` at `now`...
            let first = s.decide(now, current, &busy);
            prop_assume!(first.recommended >= current && first.desired == current);
            let mut t = now;
            for (dt, loads) in idle_steps {
                t += dt * S;
                let d = s.decide(t, current, &loads);
                // ...holds it for the cooldown whatever comes next.
                if t - now <= s.cooldown_ms {
                    prop_assert!(d.desired >= current, "{:?}", d);
                }
            }
        }
    }
}
