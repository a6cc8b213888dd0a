//! Fitting the power and speed model to measured points (pure).
//!
//! * Power of a saturated GPU, `P(f) = P_idle + (P_max − P_idle)·(f/f_max)^γ`: for a fixed γ
//!   the model is linear in `a = P_idle` and `b = P_max − P_idle` (`P = a + b·x^γ`, `x =
//!   f/f_max`), solved by ordinary least squares (with `a ≥ 0`: where the free fit's `a` is
//!   negative, the best `a = 0` line); γ is the value in [`GAMMA_RANGE`] with the
//!   smallest squared error, found by a grid search refined by golden-section search. The
//!   root-mean-square error of the fit is reported.
//! * Speed, `s(f) = (1 − σ) + σ·f/f_max`: throughput `t = c·s(f) = c(1 − σ) + cσ·x` is a
//!   line in `x`; its least-squares intercept α and slope β give `c = α + β` (throughput at
//!   `f_max`) and `σ = β / (α + β)`, clamped to 0..=1.
//!
//! Degenerate input (too few distinct clocks, no throughput, non-finite numbers, a curve
//! that does not rise with the clock) is an error, never a NaN.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The exponents searched.
pub const GAMMA_RANGE: (f64, f64) = (0.5, 5.0);

/// One measured clock.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Point {
    pub clock_mhz: u32,
    /// Mean power while saturated, watts.
    pub power_w: f64,
    /// Calibration kernels completed per second.
    pub throughput: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PowerFit {
    pub idle_w: f64,
    pub max_w: f64,
    pub gamma: f64,
    pub rms_error_w: f64,
}

impl PowerFit {
    /// The fitted power at `x = f/f_max`.
    pub fn at(&self, x: f64) -> f64 {
        self.idle_w + (self.max_w - self.idle_w) * x.powf(self.gamma)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SpeedFit {
    /// 0..=1.
    pub sigma: f64,
    /// Fitted throughput at the maximum clock (kernels per second).
    pub throughput_at_max: f64,
}

#[derive(Debug, Error, PartialEq)]
pub enum FitError {
    #[error("the fit needs at least {need} distinct clocks, got {got}")]
    TooFewClocks { need: usize, got: usize },
    #[error("the maximum clock is 0 MHz")]
    NoMaxClock,
    #[error("a measured value is not a finite non-negative number (clock {clock_mhz} MHz)")]
    NotFinite { clock_mhz: u32 },
    #[error("no throughput was measured: the calibration load completed no work")]
    NoThroughput,
    #[error("the measured power does not rise with the clock (fitted {what}): not the curve of a GPU at work")]
    NotRising { what: String },
}

fn check(points: &[Point], need: usize, max_clock_mhz: u32) -> Result<(), FitError> {
    if max_clock_mhz == 0 {
        return Err(FitError::NoMaxClock);
    }
    for p in points {
        if !(p.power_w.is_finite() && p.power_w >= 0.0 && p.throughput.is_finite() && p.throughput >= 0.0) {
            return Err(FitError::NotFinite { clock_mhz: p.clock_mhz });
        }
    }
    let mut clocks: Vec<u32> = points.iter().map(|p| p.clock_mhz).filter(|&c| c > 0).collect();
    clocks.sort_unstable();
    clocks.dedup();
    if clocks.len() < need {
        return Err(FitError::TooFewClocks { need, got: clocks.len() });
    }
    Ok(())
}

/// Least squares `y = a + b·u` with weights 1: `(a, b, sum of squared residuals)`. `None`
/// when every `u` is the same.
fn line(us: &[f64], ys: &[f64]) -> Option<(f64, f64, f64)> {
    let n = us.len() as f64;
    let mu = us.iter().sum::<f64>() / n;
    let my = ys.iter().sum::<f64>() / n;
    let suu: f64 = us.iter().map(|u| (u - mu) * (u - mu)).sum();
    let suy: f64 = us.iter().zip(ys).map(|(u, y)| (u - mu) * (y - my)).sum();
    if suu <= f64::EPSILON * n * (mu * mu).max(1e-300) || !suu.is_normal() {
        return None;
    }
    let b = suy / suu;
    let a = my - b * mu;
    let sse = us.iter().zip(ys).map(|(u, y)| (y - a - b * u).powi(2)).sum();
    Some((a, b, sse))
}

/// [`line`] with the intercept kept non-negative (a GPU draws no negative power): where the
/// free fit's is below 0, the best line through the origin.
fn line_from_zero_up(us: &[f64], ys: &[f64]) -> Option<(f64, f64, f64)> {
    let (a, b, sse) = line(us, ys)?;
    if a >= 0.0 {
        return Some((a, b, sse));
    }
    let suu: f64 = us.iter().map(|u| u * u).sum();
    let b = us.iter().zip(ys).map(|(u, y)| u * y).sum::<f64>() / suu;
    let sse = us.iter().zip(ys).map(|(u, y)| (y - b * u).powi(2)).sum();
    Some((0.0, b, sse))
}

/// Fit `P_idle`, `P_max`, γ to the points (at least 3 distinct clocks). `P_idle` is kept
/// at 0 W or more.
pub fn fit_power(points: &[Point], max_clock_mhz: u32) -> Result<PowerFit, FitError> {
    check(points, 3, max_clock_mhz)?;
    let points: Vec<&Point> = points.iter().filter(|p| p.clock_mhz > 0).collect();
    let xs: Vec<f64> = points.iter().map(|p| f64::from(p.clock_mhz) / f64::from(max_clock_mhz)).collect();
    let ys: Vec<f64> = points.iter().map(|p| p.power_w).collect();
    let sse = |gamma: f64| -> f64 {
        let us: Vec<f64> = xs.iter().map(|x| x.powf(gamma)).collect();
        line_from_zero_up(&us, &ys).map_or(f64::INFINITY, |(_, _, sse)| sse)
    };
    // Grid search, then golden-section search around the best grid point.
    let (lo, hi) = GAMMA_RANGE;
    let step = 0.05;
    let steps = ((hi - lo) / step).round() as usize;
    let best = (0..=steps).map(|i| lo + step * i as f64).min_by(|a, b| sse(*a).total_cmp(&sse(*b))).unwrap_or(2.0);
    let (mut a, mut b) = ((best - step).max(lo), (best + step).min(hi));
    let phi = (5f64.sqrt() - 1.0) / 2.0;
    for _ in 0..60 {
        let c = b - phi * (b - a);
        let d = a + phi * (b - a);
        if sse(c) < sse(d) {
            b = d;
        } else {
            a = c;
        }
    }
    let gamma = (a + b) / 2.0;
    let us: Vec<f64> = xs.iter().map(|x| x.powf(gamma)).collect();
    let (idle, slope, sse) = line_from_zero_up(&us, &ys).ok_or(FitError::TooFewClocks { need: 3, got: 1 })?;
    if !(slope.is_finite() && slope > 0.0) {
        return Err(FitError::NotRising { what: format!("P_max − P_idle = {slope:.1} W") });
    }
    if !(idle.is_finite() && idle >= 0.0) {
        return Err(FitError::NotRising { what: format!("P_idle = {idle:.1} W") });
    }
    let rms_error_w = (sse / ys.len() as f64).sqrt();
    Ok(PowerFit { idle_w: idle, max_w: idle + slope, gamma, rms_error_w })
}

/// Fit the speed curve's σ to the points' throughput (at least 2 distinct clocks).
pub fn fit_speed(points: &[Point], max_clock_mhz: u32) -> Result<SpeedFit, FitError> {
    check(points, 2, max_clock_mhz)?;
    let points: Vec<&Point> = points.iter().filter(|p| p.clock_mhz > 0).collect();
    if points.iter().all(|p| p.throughput <= 0.0) {
        return Err(FitError::NoThroughput);
    }
    let xs: Vec<f64> = points.iter().map(|p| f64::from(p.clock_mhz) / f64::from(max_clock_mhz)).collect();
    let ys: Vec<f64> = points.iter().map(|p| p.throughput).collect();
    let (alpha, beta, _) = line(&xs, &ys).ok_or(FitError::TooFewClocks { need: 2, got: 1 })?;
    let at_max = alpha + beta;
    if !(at_max.is_finite() && at_max > 0.0) {
        return Err(FitError::NoThroughput);
    }
    Ok(SpeedFit { sigma: (beta / at_max).clamp(0.0, 1.0), throughput_at_max: at_max })
}

#[cfg(test)]
mod tests {
    use super::*;

    const F_MAX: u32 = 1980;

    /// Points on the exact curve, with `noise(i)` added to the power (watts) and the
    /// throughput multiplied by `1 + tnoise(i)`.
    fn curve(
        idle: f64,
        max: f64,
        gamma: f64,
        sigma: f64,
        noise: impl Fn(usize) -> f64,
        tnoise: impl Fn(usize) -> f64,
    ) -> Vec<Point> {
        [345u32, 675, 1005, 1335, 1665, 1980]
            .iter()
            .enumerate()
            .map(|(i, &f)| {
                let x = f64::from(f) / f64::from(F_MAX);
                Point {
                    clock_mhz: f,
                    power_w: idle + (max - idle) * x.powf(gamma) + noise(i),
                    throughput: 1000.0 * ((1.0 - sigma) + sigma * x) * (1.0 + tnoise(i)),
                }
            })
            .collect()
    }

    #[test]
    fn exact_points_give_the_curve_back() {
        for (idle, max, gamma, sigma) in [(70.0, 700.0, 2.5, 0.6), (50.0, 400.0, 1.2, 1.0), (90.0, 650.0, 3.7, 0.0)] {
            let points = curve(idle, max, gamma, sigma, |_| 0.0, |_| 0.0);
            let p = fit_power(&points, F_MAX).unwrap();
            assert!((p.idle_w - idle).abs() < 1e-3, "{p:?}");
            assert!((p.max_w - max).abs() < 1e-3, "{p:?}");
            assert!((p.gamma - gamma).abs() < 1e-4, "{p:?}");
            assert!(p.rms_error_w < 1e-3, "{p:?}");
            let s = fit_speed(&points, F_MAX).unwrap();
            assert!((s.sigma - sigma).abs() < 1e-9, "{s:?}");
            assert!((s.throughput_at_max - 1000.0).abs() < 1e-6, "{s:?}");
        }
    }

    #[test]
    fn noisy_points_give_it_within_a_few_percent() {
        // ±5 W and ±1 % of deterministic "noise" of alternating sign.
        let sign = |i: usize| if i % 2 == 0 { 1.0 } else { -1.0 };
        let points = curve(70.0, 700.0, 2.5, 0.6, |i| 5.0 * sign(i), |i| 0.01 * sign(i + 1));
        let p = fit_power(&points, F_MAX).unwrap();
        assert!((p.idle_w - 70.0).abs() / 70.0 < 0.15, "{p:?}");
        assert!((p.max_w - 700.0).abs() / 700.0 < 0.03, "{p:?}");
        assert!((p.gamma - 2.5).abs() / 2.5 < 0.05, "{p:?}");
        assert!(p.rms_error_w > 1.0 && p.rms_error_w < 6.0, "{p:?}");
        let s = fit_speed(&points, F_MAX).unwrap();
        assert!((s.sigma - 0.6).abs() < 0.03, "{s:?}");
    }

    #[test]
    fn degenerate_input_is_a_clear_error() {
        let one = [Point { clock_mhz: 1980, power_w: 700.0, throughput: 10.0 }; 4];
        assert_eq!(fit_power(&one, F_MAX), Err(FitError::TooFewClocks { need: 3, got: 1 }));
        assert_eq!(fit_speed(&one, F_MAX), Err(FitError::TooFewClocks { need: 2, got: 1 }));
        assert_eq!(fit_power(&[], F_MAX), Err(FitError::TooFewClocks { need: 3, got: 0 }));
        let zero: Vec<Point> = curve(70.0, 700.0, 2.0, 1.0, |_| 0.0, |_| -1.0);
        assert_eq!(fit_speed(&zero, F_MAX), Err(FitError::NoThroughput));
        let mut nan = curve(70.0, 700.0, 2.0, 1.0, |_| 0.0, |_| 0.0);
        nan[2].power_w = f64::NAN;
        assert_eq!(fit_power(&nan, F_MAX), Err(FitError::NotFinite { clock_mhz: 1005 }));
        assert_eq!(fit_power(&curve(70.0, 700.0, 2.0, 1.0, |_| 0.0, |_| 0.0), 0), Err(FitError::NoMaxClock));
        // Power falling with the clock.
        let falling = curve(700.0, 70.0, 2.0, 1.0, |_| 0.0, |_| 0.0);
        assert!(matches!(fit_power(&falling, F_MAX), Err(FitError::NotRising { .. })));
        // Flat power: no rise either.
        let flat = curve(300.0, 300.0, 2.0, 1.0, |_| 0.0, |_| 0.0);
        assert!(matches!(fit_power(&flat, F_MAX), Err(FitError::NotRising { .. })));
    }

    #[test]
    fn idle_power_is_never_negative() {
        // Power that rises faster than any curve from a positive idle: the free fit's
        // intercept would be below 0 W.
        let points: Vec<Point> = [(500u32, 10.0), (1000, 200.0), (1500, 420.0), (1980, 700.0)]
            .iter()
            .map(|&(f, p)| Point { clock_mhz: f, power_w: p, throughput: 1.0 })
            .collect();
        let fit = fit_power(&points, F_MAX).unwrap();
        assert!(fit.idle_w >= 0.0 && fit.max_w > 600.0 && fit.rms_error_w.is_finite(), "{fit:?}");
    }

    #[test]
    fn sigma_is_clamped() {
        // Throughput falling with the clock: σ < 0, clamped to 0.
        let mut points = curve(70.0, 700.0, 2.0, 0.0, |_| 0.0, |_| 0.0);
        for (i, p) in points.iter_mut().enumerate() {
            p.throughput = 1000.0 - 10.0 * i as f64;
        }
        assert_eq!(fit_speed(&points, F_MAX).unwrap().sigma, 0.0);
    }
}
