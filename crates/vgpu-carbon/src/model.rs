//! The planner's model of power and speed: what a GPU draws at a clock, and how fast a
//! workload runs at a clock and a GPU count.
//!
//! Defaults, and where they come from:
//!
//! * Power: `P(f) = P_idle + (P_max − P_idle)·(f/f_max)^γ` with
//!   - `P_max` the device's default power limit (NVML `nvmlDeviceGetPowerManagementDefaultLimit`,
//!     the board power the device is rated for at full clock), else its enforced limit;
//!   - `P_idle = 0.15·P_max`: data-centre GPUs idle at 10–20 % of their rated board power
//!     (an idle A100-SXM4 draws about 50–60 W of 400 W, an H100-SXM about 70–100 W of
//!     700 W); the device's minimum power limit is no guide to it (200 W on an H100);
//!   - `γ = 2`: dynamic power goes as f·V², and on current NVIDIA parts the voltage only
//!     scales over the upper part of the clock range, so measured curves lie between linear
//!     and cubic. `[carbon] gamma`, `power_idle_w` and `power_max_w` override.
//! * Speed with the clock: `s(f) = (1 − σ) + σ·f/f_max`, σ the workload's frequency
//!   sensitivity: 1 (default) = proportional to the clock (compute-bound), 0 = the clock does
//!   not matter (memory- or I/O-bound). `vgpu run --freq-sensitivity` sets it per workload.
//! * Speed with the GPU count: `S(n) = 1 + (n − 1)·η`, η the scaling efficiency, default 0.9
//!   (data-parallel training on one NVLink/PCIe host typically keeps 80–95 % per added GPU).
//! * Work: without a better estimate every workload has one unit of remaining work, so the
//!   completion time of a workload is `1 / (S(n)·s(f))`.

use serde::Serialize;
use thiserror::Error;

pub const DEFAULT_GAMMA: f64 = 2.0;
pub const DEFAULT_SCALING_EFFICIENCY: f64 = 0.9;
pub const DEFAULT_FREQ_SENSITIVITY: f64 = 1.0;
/// `P_idle` as a share of `P_max`.
pub const DEFAULT_IDLE_FRACTION: f64 = 0.15;

/// The model's knobs after defaults (`[carbon]` config).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Tunables {
    pub gamma: f64,
    pub scaling_efficiency: f64,
    pub freq_sensitivity: f64,
    /// Stage 2's clock step; `None`: the next supported clock.
    pub delta_f_mhz: Option<u32>,
}

impl Default for Tunables {
    fn default() -> Self {
        Tunables {
            gamma: DEFAULT_GAMMA,
            scaling_efficiency: DEFAULT_SCALING_EFFICIENCY,
            freq_sensitivity: DEFAULT_FREQ_SENSITIVITY,
            delta_f_mhz: None,
        }
    }
}

#[derive(Debug, Error, PartialEq)]
pub enum ModelError {
    #[error("GPU {0}: the driver lists no supported clocks")]
    NoClocks(u32),
    #[error("GPU {index}: power model needs 0 ≤ idle ≤ max, got idle {idle_w} W and max {max_w} W")]
    BadPower { index: u32, idle_w: f64, max_w: f64 },
}

/// One GPU as the planner sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuModel {
    pub index: u32,
    /// Supported graphics clocks, MHz, ascending, without duplicates, never empty.
    pub clocks_mhz: Vec<u32>,
    pub idle_w: f64,
    pub max_w: f64,
    pub gamma: f64,
}

impl GpuModel {
    pub fn new(
        index: u32,
        mut clocks_mhz: Vec<u32>,
        idle_w: f64,
        max_w: f64,
        gamma: f64,
    ) -> Result<GpuModel, ModelError> {
        clocks_mhz.retain(|&c| c > 0);
        clocks_mhz.sort_unstable();
        clocks_mhz.dedup();
        if clocks_mhz.is_empty() {
            return Err(ModelError::NoClocks(index));
        }
        if !(idle_w.is_finite() && max_w.is_finite() && 0.0 <= idle_w && idle_w <= max_w) {
            return Err(ModelError::BadPower { index, idle_w, max_w });
        }
        Ok(GpuModel { index, clocks_mhz, idle_w, max_w, gamma })
    }

    pub fn min_clock(&self) -> u32 {
        self.clocks_mhz[0]
    }

    pub fn max_clock(&self) -> u32 {
        self.clocks_mhz[self.clocks_mhz.len() - 1]
    }

    /// Power of a working GPU at clock `f_mhz`, watts.
    pub fn power_w(&self, f_mhz: u32) -> f64 {
        let ratio = (f64::from(f_mhz) / f64::from(self.max_clock())).clamp(0.0, 1.0);
        self.idle_w + (self.max_w - self.idle_w) * ratio.powf(self.gamma)
    }

    /// The highest supported clock not above `f_mhz` (the lowest one if all are above).
    pub fn snap_down(&self, f_mhz: u32) -> u32 {
        match self.clocks_mhz.partition_point(|&c| c <= f_mhz) {
            0 => self.min_clock(),
            n => self.clocks_mhz[n - 1],
        }
    }

    /// The clock one step of `delta` above `f_mhz` (`None`: the next supported clock):
    /// the lowest supported clock at least `f + delta`, or the maximum when that overshoots.
    /// `None` when already at the maximum.
    pub fn step_up(&self, f_mhz: u32, delta_mhz: Option<u32>) -> Option<u32> {
        if f_mhz >= self.max_clock() {
            return None;
        }
        let target = f_mhz.saturating_add(delta_mhz.unwrap_or(1).max(1));
        let i = self.clocks_mhz.partition_point(|&c| c < target);
        Some(self.clocks_mhz.get(i).copied().unwrap_or(self.max_clock()))
    }
}

/// A workload's relative speed at clock `f` of `f_max`: `(1 − σ) + σ·f/f_max`.
pub fn clock_factor(sensitivity: f64, f_mhz: u32, f_max_mhz: u32) -> f64 {
    let ratio = if f_max_mhz == 0 { 1.0 } else { (f64::from(f_mhz) / f64::from(f_max_mhz)).clamp(0.0, 1.0) };
    (1.0 - sensitivity) + sensitivity * ratio
}

/// A workload's throughput on `n` GPUs relative to one: `1 + (n − 1)·η`.
pub fn gpu_factor(n: usize, scaling_efficiency: f64) -> f64 {
    if n == 0 {
        0.0
    } else {
        1.0 + (n as f64 - 1.0) * scaling_efficiency
    }
}

/// gCO2 per hour of `watts` at `g_per_kwh`.
pub fn g_per_hour(watts: f64, g_per_kwh: f64) -> f64 {
    watts * g_per_kwh / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu() -> GpuModel {
        GpuModel::new(0, vec![1980, 210, 1500, 1000, 1000], 100.0, 700.0, 2.0).unwrap()
    }

    #[test]
    fn clocks_are_sorted_and_deduplicated() {
        assert_eq!(gpu().clocks_mhz, vec![210, 1000, 1500, 1980]);
        assert_eq!(GpuModel::new(3, vec![], 1.0, 2.0, 2.0), Err(ModelError::NoClocks(3)));
        assert!(GpuModel::new(3, vec![1], 3.0, 2.0, 2.0).is_err());
    }

    #[test]
    fn power_follows_the_curve() {
        let g = gpu();
        assert_eq!(g.power_w(1980), 700.0);
        assert!((g.power_w(990) - (100.0 + 600.0 * 0.25)).abs() < 1e-9);
        assert!(g.power_w(210) < g.power_w(1000));
        assert_eq!(g.power_w(5000), 700.0);
    }

    #[test]
    fn snapping_and_stepping() {
        let g = gpu();
        assert_eq!(g.snap_down(1499), 1000);
        assert_eq!(g.snap_down(100), 210);
        assert_eq!(g.snap_down(9999), 1980);
        assert_eq!(g.step_up(210, None), Some(1000));
        assert_eq!(g.step_up(1000, Some(100)), Some(1500));
        assert_eq!(g.step_up(1500, Some(1000)), Some(1980));
        assert_eq!(g.step_up(1980, None), None);
    }

    #[test]
    fn speed_factors() {
        assert_eq!(clock_factor(1.0, 990, 1980), 0.5);
        assert_eq!(clock_factor(0.0, 990, 1980), 1.0);
        assert_eq!(clock_factor(0.5, 990, 1980), 0.75);
        assert_eq!(gpu_factor(0, 0.9), 0.0);
        assert_eq!(gpu_factor(1, 0.9), 1.0);
        assert!((gpu_factor(3, 0.9) - 2.8).abs() < 1e-12);
        assert_eq!(g_per_hour(500.0, 400.0), 200.0);
    }
}
