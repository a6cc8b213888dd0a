//! The physics of the simulated GPU, as pure functions: which clock it runs at, how long a
//! kernel takes, how busy it was, how much power it draws.
//!
//! * Clock while busy: the highest supported graphics clock not above
//!   `min(locked max, max clock, power-cap clock)`, and never below the lowest supported
//!   clock. The power-cap clock is the one at which the busy power reaches the power limit.
//!   Idle: the locked minimum if clocks are locked, else the lowest supported clock.
//! * Kernel duration: `waves × wave time / s(f)`, `s(f) = (1 − σ) + σ·f/f_max` the speed
//!   at clock `f` (σ = `clock_sensitivity`, default 1: `× f_max / f`), where one wave is one thread block per
//!   SM (`waves = ceil(blocks / sm_count)`) and the wave time is the function's own
//!   (`FAKEGPU_KERNELS`, [`parse_kernel_table`]) or the device's `kernel_wave_us`, capped at
//!   [`MAX_KERNEL_NS`].
//! * Queueing: the device runs one FIFO of every process's work. An item queued now on a
//!   stream starts at [`queue_start`]: `max(now, device queue end, stream ready)`.
//! * Time-slicing: the FIFO's order is kept, and a change of context costs what the
//!   hardware's time-slicer would: an item of context X that queues behind another
//!   context's work starts a `context_switch` after that work (plus a round trip for every
//!   whole `timeslice` X waits behind that context's run), or, when X still has work queued,
//!   its part of one switch per `timeslice` ([`slice_start`]). One context alone, or a
//!   context whose work reaches an idle device, pays nothing.
//! * Utilization: the part of a window covered by the union of kernel intervals
//!   ([`busy_ns`]), future parts excluded.
//! * Power: `P = P_idle + (P_max − P_idle) · u · (f / f_max)^γ`, clamped to the power limit.

use crate::config::DeviceConfig;

/// NVML's utilization sample period (nvml.h: "between 1 second and 1/6 second").
pub const SAMPLE_WINDOW_NS: u64 = 1_000_000_000;

/// No single launch occupies the simulated device for longer than this.
pub const MAX_KERNEL_NS: u64 = crate::duration::MAX_NS;

/// The clock the device runs kernels at, in MHz.
pub fn busy_clock_mhz(dev: &DeviceConfig, locked_max_mhz: Option<u32>, power_limit_mw: u32) -> u32 {
    let mut target = f64::from(dev.max_clock_mhz);
    if let Some(locked) = locked_max_mhz {
        target = target.min(f64::from(locked));
    }
    target = target.min(power_cap_clock_mhz(dev, power_limit_mw));
    snap_down(dev, target)
}

/// The clock when idle, in MHz.
pub fn idle_clock_mhz(dev: &DeviceConfig, locked_min_mhz: Option<u32>) -> u32 {
    match locked_min_mhz {
        Some(min) => snap_down(dev, f64::from(min.min(dev.max_clock_mhz))),
        None => dev.lowest_clock_mhz(),
    }
}

/// The highest clock at which a fully busy device stays within `power_limit_mw`.
fn power_cap_clock_mhz(dev: &DeviceConfig, power_limit_mw: u32) -> f64 {
    let dynamic = f64::from(dev.power_max_mw.saturating_sub(dev.power_idle_mw));
    let headroom = f64::from(power_limit_mw) - f64::from(dev.power_idle_mw);
    if dynamic <= 0.0 || headroom >= dynamic {
        return f64::from(dev.max_clock_mhz);
    }
    if headroom <= 0.0 {
        return 0.0;
    }
    f64::from(dev.max_clock_mhz) * (headroom / dynamic).powf(1.0 / dev.power_exponent)
}

/// The highest supported clock not above `mhz`, or the lowest supported one.
fn snap_down(dev: &DeviceConfig, mhz: f64) -> u32 {
    dev.graphics_clocks
        .iter()
        .copied()
        .find(|&c| f64::from(c) <= mhz + 1e-9)
        .unwrap_or_else(|| dev.lowest_clock_mhz())
}

/// How long a launch of `blocks` thread blocks keeps the device busy at `clock_mhz`, with the
/// device's default wave time (`kernel_wave_us`).
pub fn kernel_duration_ns(dev: &DeviceConfig, blocks: u64, clock_mhz: u32) -> u64 {
    let wave_ns = u64::from(dev.kernel_wave_us).saturating_mul(1000);
    kernel_duration_with_wave_ns(dev, blocks, clock_mhz, wave_ns)
}

/// How long a launch of `blocks` thread blocks of a function whose one wave takes `wave_ns`
/// at the maximum clock keeps the device busy at `clock_mhz`.
pub fn kernel_duration_with_wave_ns(
    dev: &DeviceConfig,
    blocks: u64,
    clock_mhz: u32,
    wave_ns: u64,
) -> u64 {
    let sms = u64::from(dev.sm_count.max(1));
    let waves = blocks.max(1).div_ceil(sms);
    let at_max = waves.saturating_mul(wave_ns);
    // × f_max / ((1 − σ)·f_max + σ·f): with σ = 1 exactly `× f_max / f`, as before σ existed.
    let scaled = at_max as f64 * f64::from(dev.max_clock_mhz) / effective_clock(dev, clock_mhz);
    (scaled as u64).clamp(1, MAX_KERNEL_NS)
}

/// `(1 − σ)·f_max + σ·f` (MHz, positive), σ the device's `clock_sensitivity`: the clock the
/// kernel's speed corresponds to.
fn effective_clock(dev: &DeviceConfig, clock_mhz: u32) -> f64 {
    let sigma = dev.clock_sensitivity;
    (1.0 - sigma) * f64::from(dev.max_clock_mhz.max(1)) + sigma * f64::from(clock_mhz.max(1))
}

/// A kernel's speed at `clock_mhz` relative to the maximum clock:
/// `(1 − σ) + σ·f/f_max`, σ the device's `clock_sensitivity`.
pub fn speed(dev: &DeviceConfig, clock_mhz: u32) -> f64 {
    effective_clock(dev, clock_mhz) / f64::from(dev.max_clock_mhz.max(1))
}

/// Power in mW at utilization `u` (0..=1) and clock `clock_mhz`, clamped to the limit.
pub fn power_mw(dev: &DeviceConfig, utilization: f64, clock_mhz: u32, power_limit_mw: u32) -> u32 {
    let idle = f64::from(dev.power_idle_mw);
    let dynamic = f64::from(dev.power_max_mw.saturating_sub(dev.power_idle_mw));
    let ratio = f64::from(clock_mhz) / f64::from(dev.max_clock_mhz.max(1));
    let p = idle + dynamic * utilization.clamp(0.0, 1.0) * ratio.powf(dev.power_exponent);
    (p.round() as u32).min(power_limit_mw.max(dev.power_idle_mw))
}

/// When an item queued at `now` on a stream that is ready at `stream_ready` starts, on a
/// device whose FIFO drains at `device_busy_until` (all in ns since the epoch).
pub fn queue_start(now: u64, device_busy_until: u64, stream_ready: u64) -> u64 {
    now.max(device_busy_until).max(stream_ready)
}

/// The device's time-slicing parameters (a device's `timeslice` and `context_switch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slicing {
    pub timeslice_ns: u64,
    pub context_switch_ns: u64,
}

impl Slicing {
    pub fn of(dev: &DeviceConfig) -> Slicing {
        Slicing {
            timeslice_ns: dev.timeslice_ns,
            context_switch_ns: dev.context_switch_ns,
        }
    }
}

/// When an item of context `me` (a nonzero id; 0 = no context) lasting `duration` that may
/// start at `floor` starts, on a device whose queue drains at `busy_until` and whose last
/// queued item is context `tail`'s (0: none), in a run of that context's back-to-back work
/// that started at `run_start`; `me`'s own queued work ends at `own_until`.
///
/// Behind another context's queued work (`busy_until > floor`, `tail ≠ me`) the device
/// must switch to `me`:
/// * if `me` has nothing queued (it waited for its work, as a synchronizing program does),
///   `context_switch`, plus a round trip (two more) for every whole `timeslice` that `me`
///   waits behind that run (one that ends exactly at a slice's end is not cut) — what a
///   time-slicer that cut the run to serve `me` would have paid;
/// * if `me` still has work queued, the item would run in one of `me`'s slices: its part of
///   a switch per slice, `context_switch × duration / timeslice` (at most one switch).
///
/// The order of the FIFO is kept, so the cost falls on the context that arrives. Otherwise
/// (the device idle at `floor`, or right behind `me`'s own work, or no context) the item
/// starts at `max(floor, busy_until)`, free: one context alone pays nothing, and a context
/// reaching an idle device has nothing to preempt.
#[allow(clippy::too_many_arguments)]
pub fn slice_start(
    floor: u64,
    busy_until: u64,
    tail: u64,
    run_start: u64,
    me: u64,
    own_until: u64,
    duration: u64,
    s: Slicing,
) -> u64 {
    if busy_until <= floor || tail == 0 || me == 0 || tail == me || s.context_switch_ns == 0 {
        return floor.max(busy_until);
    }
    let switch = s.context_switch_ns;
    let cost = if own_until > floor {
        let part = u128::from(switch) * u128::from(duration) / u128::from(s.timeslice_ns.max(1));
        u64::try_from(part).unwrap_or(u64::MAX).min(switch)
    } else {
        // A run that ends exactly at a slice's end was not cut.
        let waited = (busy_until - floor.max(run_start)).saturating_sub(1);
        let cuts = waited.checked_div(s.timeslice_ns).unwrap_or(0);
        cuts.saturating_mul(2).saturating_add(1).saturating_mul(switch)
    };
    busy_until.saturating_add(cost)
}

/// Nanoseconds of `[from, to)` covered by the union of the intervals `(start, end)`
/// (overlaps counted once; parts outside the window, e.g. in the future, excluded).
pub fn busy_ns(intervals: impl IntoIterator<Item = (u64, u64)>, from: u64, to: u64) -> u64 {
    let mut clipped: Vec<(u64, u64)> = intervals
        .into_iter()
        .map(|(s, e)| (s.max(from), e.min(to)))
        .filter(|(s, e)| e > s)
        .collect();
    clipped.sort_unstable();
    let mut busy = 0;
    let mut covered_to = from;
    for (s, e) in clipped {
        let s = s.max(covered_to);
        if e > s {
            busy += e - s;
            covered_to = e;
        }
    }
    busy
}

/// Nanoseconds of `[from, to)` that the timeline's `(start, end, busy)` say were busy:
/// those busy throughout (`busy ≥ end − start`: the ring's entries) by [`busy_ns`]; a span
/// busy only part of its length (a spill span) for its busy time in proportion to the part
/// of it inside the window; at most the window's length.
pub fn timeline_busy_ns(items: impl IntoIterator<Item = (u64, u64, u64)>, from: u64, to: u64) -> u64 {
    let mut solid = Vec::new();
    let mut partial = 0.0f64;
    for (start, end, busy) in items {
        let length = end.saturating_sub(start);
        if busy >= length {
            solid.push((start, end));
            continue;
        }
        let inside = end.min(to).saturating_sub(start.max(from));
        if inside > 0 {
            partial += busy as f64 * inside as f64 / length as f64;
        }
    }
    let total = busy_ns(solid, from, to).saturating_add(partial.round() as u64);
    total.min(to.saturating_sub(from))
}

/// Fraction of the window `[now − SAMPLE_WINDOW_NS, now]` the timeline's `(start, end,
/// busy)` say was busy (nanoseconds; they may extend into the future).
pub fn utilization(items: impl IntoIterator<Item = (u64, u64, u64)>, now_ns: u64) -> f64 {
    let window_start = now_ns.saturating_sub(SAMPLE_WINDOW_NS);
    let busy = timeline_busy_ns(items, window_start, now_ns);
    (busy as f64 / SAMPLE_WINDOW_NS as f64).clamp(0.0, 1.0)
}

/// `cuEventElapsedTime`: milliseconds from `start_ns` to `end_ns` (negative if the end was
/// stamped first), at the real driver's resolution of about half a microsecond.
pub fn elapsed_ms(start_ns: u64, end_ns: u64) -> f32 {
    const RESOLUTION_NS: i128 = 500;
    let delta = i128::from(end_ns) - i128::from(start_ns);
    let ticks = (delta as f64 / RESOLUTION_NS as f64).round();
    (ticks * RESOLUTION_NS as f64 / 1e6) as f32
}

pub use crate::duration::parse_duration_ns;

/// `FAKEGPU_KERNELS`: `name=DUR[,name=DUR…]`, the time of one wave of each named function at
/// the maximum clock. Empty means none.
pub fn parse_kernel_table(spec: &str) -> Result<Vec<(String, u64)>, String> {
    let mut table: Vec<(String, u64)> = Vec::new();
    for item in spec.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let Some((name, duration)) = item.split_once('=') else {
            return Err(format!("`{item}` is not name=DURATION"));
        };
        let name = name.trim();
        if name.is_empty() {
            return Err(format!("`{item}` has no function name"));
        }
        let ns = parse_duration_ns(duration).map_err(|e| format!("{name}: {e}"))?;
        match table.iter_mut().find(|(n, _)| n == name) {
            Some(entry) => entry.1 = ns,
            None => table.push((name.to_string(), ns)),
        }
    }
    Ok(table)
}

/// GPU temperature in °C: 30 °C idle, rising linearly to 75 °C at maximum power.
pub fn temperature_c(dev: &DeviceConfig, power_mw: u32) -> u32 {
    let span = f64::from(dev.power_max_mw.saturating_sub(dev.power_idle_mw)).max(1.0);
    let above_idle = f64::from(power_mw.saturating_sub(dev.power_idle_mw));
    (30.0 + 45.0 * (above_idle / span).min(1.0)).round() as u32
}

/// Energy in µJ of drawing `power_mw` for `ns` nanoseconds.
pub fn energy_uj(power_mw: u64, ns: u64) -> u64 {
    (u128::from(power_mw) * u128::from(ns) / 1_000_000).min(u128::from(u64::MAX)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::default_config;

    fn h100() -> DeviceConfig {
        default_config().devices.remove(0)
    }

    #[test]
    fn clocks_follow_locks_and_power_cap() {
        let d = h100();
        assert_eq!(busy_clock_mhz(&d, None, 700_000), 1980);
        assert_eq!(busy_clock_mhz(&d, Some(1500), 700_000), 1500);
        assert_eq!(
            busy_clock_mhz(&d, Some(1501), 700_000),
            1500,
            "snaps to a supported clock"
        );
        let capped = busy_clock_mhz(&d, None, 300_000);
        assert!(capped < 1980 && capped > 345, "{capped}");
        let full = power_mw(&d, 1.0, capped, 300_000);
        assert!(full <= 300_000, "{full}");
        assert_eq!(
            busy_clock_mhz(&d, None, 10_000),
            345,
            "never below the lowest clock"
        );
        assert_eq!(idle_clock_mhz(&d, None), 345);
        assert_eq!(idle_clock_mhz(&d, Some(1200)), 1200);
    }

    #[test]
    fn power_model() {
        let d = h100();
        assert_eq!(power_mw(&d, 0.0, 1980, 700_000), 70_000);
        assert_eq!(power_mw(&d, 1.0, 1980, 700_000), 700_000);
        assert_eq!(
            power_mw(&d, 1.0, 1980, 400_000),
            400_000,
            "clamped to the limit"
        );
        let half_clock = power_mw(&d, 1.0, 990, 700_000);
        let expected = 70_000.0 + 630_000.0 * 0.5f64.powf(2.5);
        assert!(
            (f64::from(half_clock) - expected).abs() <= 1.0,
            "{half_clock} vs {expected}"
        );
    }

    #[test]
    fn kernels_slow_down_at_lower_clocks() {
        let d = h100();
        assert_eq!(kernel_duration_ns(&d, 132, 1980), 100_000);
        assert_eq!(kernel_duration_ns(&d, 133, 1980), 200_000);
        assert_eq!(kernel_duration_ns(&d, 1, 990), 200_000);
        assert_eq!(kernel_duration_ns(&d, u64::MAX, 345), MAX_KERNEL_NS);
    }

    #[test]
    fn clock_sensitivity_shapes_the_speed_curve() {
        let mut d = h100();
        d.clock_sensitivity = 0.6;
        // At half clock: speed 0.4 + 0.6·0.5 = 0.7.
        assert_eq!(kernel_duration_ns(&d, 132, 990), (100_000.0 / 0.7) as u64);
        assert_eq!(kernel_duration_ns(&d, 132, 1980), 100_000);
        d.clock_sensitivity = 0.0;
        assert_eq!(kernel_duration_ns(&d, 132, 345), 100_000, "σ 0: the clock does not matter");
        assert!((speed(&d, 345) - 1.0).abs() < 1e-12);
        // σ 1 (the default) is exactly the old `× f_max / f`.
        d.clock_sensitivity = 1.0;
        assert_eq!(kernel_duration_ns(&d, 132, 1500), 132_000);
    }

    #[test]
    fn named_functions_take_their_own_wave_time() {
        let d = h100();
        assert_eq!(kernel_duration_with_wave_ns(&d, 1, 1980, 20_000), 20_000);
        assert_eq!(kernel_duration_with_wave_ns(&d, 264, 1980, 20_000), 40_000);
        assert_eq!(kernel_duration_with_wave_ns(&d, 265, 1980, 20_000), 60_000);
        assert_eq!(kernel_duration_with_wave_ns(&d, 1, 990, 20_000), 40_000);
    }

    #[test]
    fn queueing_and_busy_union() {
        assert_eq!(queue_start(10, 5, 7), 10);
        assert_eq!(queue_start(10, 50, 7), 50);
        assert_eq!(queue_start(10, 50, 70), 70);
    }

    #[test]
    fn slice_start_charges_switches_behind_another_context_only() {
        let s = Slicing { timeslice_ns: 1000, context_switch_ns: 75 };
        let at = |floor, busy, tail, run, me| slice_start(floor, busy, tail, run, me, 0, 100, s);
        // Alone, own run, idle device, no context: free.
        assert_eq!(at(100, 500, 1, 0, 1), 500);
        assert_eq!(at(600, 500, 2, 0, 1), 600);
        assert_eq!(at(100, 500, 2, 0, 0), 500);
        assert_eq!(at(100, 500, 0, 0, 1), 500);
        // Behind another's run shorter than a slice: one switch.
        assert_eq!(at(100, 500, 2, 50, 1), 575);
        // Waiting 2.5 slices behind it: two round trips more.
        assert_eq!(at(100, 2600, 2, 0, 1), 2600 + 5 * 75);
        // The wait counts from when `me` arrived, not from the run's start.
        assert_eq!(at(1700, 2600, 2, 0, 1), 2675);
        // A run that ends exactly at the end of a slice is not cut.
        assert_eq!(at(1000, 2000, 2, 0, 1), 2075);
        // With work of its own still queued: its part of a switch per slice, at most one.
        assert_eq!(slice_start(100, 2600, 2, 0, 1, 2000, 100, s), 2600 + 7);
        assert_eq!(slice_start(100, 2600, 2, 0, 1, 2000, 5000, s), 2600 + 75);
        // Switching off.
        assert_eq!(slice_start(100, 2600, 2, 0, 1, 0, 100, Slicing { context_switch_ns: 0, ..s }), 2600);
        assert_eq!(busy_ns([], 0, 100), 0);
        assert_eq!(busy_ns([(10, 20), (15, 30), (50, 60)], 0, 100), 30);
        assert_eq!(
            busy_ns([(50, 60), (10, 20), (15, 30)], 0, 100),
            30,
            "any order"
        );
        assert_eq!(busy_ns([(0, 1000)], 100, 200), 100, "clipped to the window");
        assert_eq!(busy_ns([(150, 1000)], 100, 200), 50, "future excluded");
        assert_eq!(busy_ns([(10, 20), (10, 20)], 0, 100), 10, "duplicates once");
        // Spill spans: busy in proportion to the part inside the window, added to the
        // ring's union, never more than the window.
        assert_eq!(timeline_busy_ns([(0, 100, 50)], 0, 100), 50);
        assert_eq!(timeline_busy_ns([(0, 200, 100)], 0, 100), 50, "half of it is in the window");
        assert_eq!(timeline_busy_ns([(0, 100, 50), (0, 100, 50), (10, 20, 10)], 0, 100), 100, "capped");
        assert_eq!(timeline_busy_ns([(10, 20, 10), (10, 20, 10)], 0, 100), 10, "solid ones as a union");
    }

    #[test]
    fn elapsed_time_resolution() {
        assert_eq!(elapsed_ms(0, 1_000_000), 1.0);
        assert_eq!(elapsed_ms(1_000_000, 0), -1.0);
        assert_eq!(elapsed_ms(0, 20_000), 0.02);
        assert_eq!(elapsed_ms(0, 1_249), 0.001, "rounded to 0.5 µs");
        assert_eq!(elapsed_ms(0, 1_251), 0.0015);
    }

    #[test]
    fn durations_and_kernel_tables() {
        assert_eq!(parse_duration_ns("20us"), Ok(20_000));
        assert_eq!(parse_duration_ns("1ms"), Ok(1_000_000));
        assert_eq!(parse_duration_ns("50ms"), Ok(50_000_000));
        assert_eq!(parse_duration_ns("1.5ms"), Ok(1_500_000));
        assert_eq!(parse_duration_ns("2s"), Ok(2_000_000_000));
        assert_eq!(parse_duration_ns("2500"), Ok(2500));
        assert!(parse_duration_ns("20 parsecs").is_err());
        assert!(parse_duration_ns("ms").is_err());
        assert!(parse_duration_ns("0").is_err());
        assert!(parse_duration_ns("11s").is_err());
        assert_eq!(
            parse_kernel_table("k=20us, big = 1ms,k=30us"),
            Ok(vec![("k".into(), 30_000), ("big".into(), 1_000_000)])
        );
        assert_eq!(parse_kernel_table(""), Ok(vec![]));
        assert!(parse_kernel_table("k").is_err());
        assert!(parse_kernel_table("=1ms").is_err());
        assert!(parse_kernel_table("k=fast").is_err());
    }

    #[test]
    fn utilization_over_the_window() {
        let now = 10 * SAMPLE_WINDOW_NS;
        assert_eq!(utilization([], now), 0.0);
        assert_eq!(utilization([(0, now + 5, now + 5)], now), 1.0);
        let half = utilization([(now - SAMPLE_WINDOW_NS / 2, now, SAMPLE_WINDOW_NS / 2)], now);
        assert!((half - 0.5).abs() < 1e-9);
        assert_eq!(utilization([(0, now - SAMPLE_WINDOW_NS, now - SAMPLE_WINDOW_NS)], now), 0.0);
    }

    #[test]
    fn energy_units() {
        assert_eq!(energy_uj(1000, 1_000_000_000), 1_000_000); // 1 W for 1 s = 1 J
    }
}
