//! The physics of the simulated GPU, as pure functions: which clock it runs at, how long a
//! kernel takes, how busy it was, how much power it draws.
//!
//! * Clock while busy: the highest supported graphics clock not above
//!   `min(locked max, max clock, power-cap clock)`, and never below the lowest supported
//!   clock. The power-cap clock is the one at which the busy power reaches the power limit.
//!   Idle: the locked minimum if clocks are locked, else the lowest supported clock.
//! * Kernel duration: `waves × kernel_wave_us × f_max / f`, where one wave is one thread
//!   block per SM (`waves = ceil(blocks / sm_count)`), capped at [`MAX_KERNEL_NS`].
//! * Utilization: the fraction of the last [`SAMPLE_WINDOW_NS`] covered by busy runs
//!   (kernels back to back, or separated by less than [`MERGE_GAP_NS`]).
//! * Power: `P = P_idle + (P_max − P_idle) · u · (f / f_max)^γ`, clamped to the power limit.

use crate::config::DeviceConfig;

/// NVML's utilization sample period (nvml.h: "between 1 second and 1/6 second").
pub const SAMPLE_WINDOW_NS: u64 = 1_000_000_000;

/// Kernels separated by less than this count as one busy run (launch overhead is not idle
/// time for the GPU's utilization counter either).
pub const MERGE_GAP_NS: u64 = 2_000_000;

/// No single launch occupies the simulated device for longer than this.
pub const MAX_KERNEL_NS: u64 = 10_000_000_000;

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

/// How long a launch of `blocks` thread blocks keeps the device busy at `clock_mhz`.
pub fn kernel_duration_ns(dev: &DeviceConfig, blocks: u64, clock_mhz: u32) -> u64 {
    let sms = u64::from(dev.sm_count.max(1));
    let waves = blocks.max(1).div_ceil(sms);
    let at_max = waves
        .saturating_mul(u64::from(dev.kernel_wave_us))
        .saturating_mul(1000);
    let scaled = at_max as f64 * f64::from(dev.max_clock_mhz) / f64::from(clock_mhz.max(1));
    (scaled as u64).clamp(1, MAX_KERNEL_NS)
}

/// Power in mW at utilization `u` (0..=1) and clock `clock_mhz`, clamped to the limit.
pub fn power_mw(dev: &DeviceConfig, utilization: f64, clock_mhz: u32, power_limit_mw: u32) -> u32 {
    let idle = f64::from(dev.power_idle_mw);
    let dynamic = f64::from(dev.power_max_mw.saturating_sub(dev.power_idle_mw));
    let ratio = f64::from(clock_mhz) / f64::from(dev.max_clock_mhz.max(1));
    let p = idle + dynamic * utilization.clamp(0.0, 1.0) * ratio.powf(dev.power_exponent);
    (p.round() as u32).min(power_limit_mw.max(dev.power_idle_mw))
}

/// Fraction of the window `[now − SAMPLE_WINDOW_NS, now]` covered by the busy runs
/// `(start, end)` (nanoseconds; runs may extend into the future).
pub fn utilization(runs: impl IntoIterator<Item = (u64, u64)>, now_ns: u64) -> f64 {
    let window_start = now_ns.saturating_sub(SAMPLE_WINDOW_NS);
    let busy: u64 = runs
        .into_iter()
        .map(|(start, end)| end.min(now_ns).saturating_sub(start.max(window_start)))
        .sum();
    (busy as f64 / SAMPLE_WINDOW_NS as f64).clamp(0.0, 1.0)
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
    fn utilization_over_the_window() {
        let now = 10 * SAMPLE_WINDOW_NS;
        assert_eq!(utilization([], now), 0.0);
        assert_eq!(utilization([(0, now + 5)], now), 1.0);
        let half = utilization([(now - SAMPLE_WINDOW_NS / 2, now)], now);
        assert!((half - 0.5).abs() < 1e-9);
        assert_eq!(utilization([(0, now - SAMPLE_WINDOW_NS)], now), 0.0);
    }

    #[test]
    fn energy_units() {
        assert_eq!(energy_uj(1000, 1_000_000_000), 1_000_000); // 1 W for 1 s = 1 J
    }
}
