//! `vgpu carbon profile`: measure one GPU's power and speed at several locked clocks while
//! it runs a calibration load, fit the planner's model to them, and keep the fit in the
//! history database (`power_models`) for the planner.
//!
//! The procedure ([`profile`]):
//!
//! 1. Refuse a GPU with compute processes unless forced (the load would disturb them, and
//!    they the measure).
//! 2. Take the carbon caps' lock (`carbon apply` waits, bounded, rather than move the
//!    clocks mid-measure) and forget this GPU's remembered cap for the time being: if
//!    vgpu is killed (SIGKILL) with the clocks still locked at a profiling clock, the next
//!    `vgpu carbon apply` writes its cap again and `vgpu carbon reset` unlocks them.
//! 3. Measure idle power once (no kernels yet), then at each of K clocks spread over the
//!    supported range: lock the clocks there (min = max), size the batches, keep the GPU
//!    saturated for S seconds and measure power (the energy counter's delta over the time;
//!    the mean of power readings where the device has no counter) and throughput
//!    (calibration kernels completed per second).
//! 4. Always restore the clocks as they were: re-lock the carbon cap vgpu had set, else
//!    unlock them — on success, on error, and when SIGINT/SIGTERM/SIGHUP asked to stop
//!    (the caller passes the flag they set).
//! 5. Fit ([`vgpu_carbon::fit`]) `P_idle`, `P_max`, γ and the speed curve's σ.

pub mod cuda;

use std::path::Path;
use std::time::Instant;

use nvml_wrapper::enums::device::GpuLockedClocksSetting;
use nvml_wrapper::error::NvmlError;
use rusqlite::{params, Connection, OptionalExtension as _};
use serde::Serialize;
use thiserror::Error;

use self::cuda::{Calibrator, CudaError};
use vgpu_carbon::fit::{FitError, Point, PowerFit, SpeedFit};
use vgpu_carbon::apply::{self, AppliedStore, ApplyError, Cap};
use vgpu_gpu::explain;
use vgpu_gpu::Nvml;
use vgpu_history::db::HistoryError;

/// Clocks measured by default.
pub const DEFAULT_CLOCKS: usize = 6;
/// Seconds of saturated load per clock by default.
pub const DEFAULT_SECONDS: f64 = 2.0;
/// Bounds of `--clocks` (the power fit needs 3) and `--seconds`.
pub const CLOCKS_RANGE: (usize, usize) = (3, 32);
pub const MAX_SECONDS: f64 = 60.0;
/// Idle power is measured over this long at most (less with a shorter `--seconds`).
pub const IDLE_SECONDS: f64 = 1.0;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Options {
    /// NVML index.
    pub gpu: u32,
    pub clocks: usize,
    pub seconds: f64,
    /// Profile even though compute processes use the GPU.
    pub force: bool,
}

#[derive(Debug, Error)]
pub enum ProfileError {
    #[error("--clocks must be from {lo} to {hi}, got {0}", lo = CLOCKS_RANGE.0, hi = CLOCKS_RANGE.1)]
    BadClocks(usize),
    #[error("--seconds must be more than 0 and at most {MAX_SECONDS}, got {0}")]
    BadSeconds(f64),
    #[error("GPU {index}: {what}: {}", explain(.source))]
    Nvml { index: u32, what: &'static str, source: NvmlError },
    #[error("GPU {index} has compute processes (pids {pids}): profiling would disturb them and they the measure; stop them or pass --force")]
    Busy { index: u32, pids: String },
    #[error("GPU {index}: the driver lists fewer than 3 clocks ({count}): nothing to fit")]
    FewClocks { index: u32, count: usize },
    #[error("GPU {index}: {source}")]
    Cuda { index: u32, source: CudaError },
    #[error("GPU {index}: the measured points cannot be fitted: {source}")]
    Fit { index: u32, source: FitError },
    #[error("interrupted")]
    Interrupted,
    #[error(transparent)]
    Store(#[from] ApplyError),
    #[error("{measure}; and restoring the clocks failed: {restore} (run `vgpu carbon reset`)")]
    Restore { measure: String, restore: String },
}

/// How the clocks were left.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Restored {
    /// Unlocked (vgpu had set no clock cap).
    Unlocked,
    /// The carbon cap vgpu had set, locked again.
    Relocked { min_mhz: u32, max_mhz: u32 },
}

/// What one profile measured and fitted.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub gpu_index: u32,
    pub gpu_uuid: String,
    pub gpu_name: String,
    pub measured_ms: i64,
    pub max_clock_mhz: u32,
    /// Power with no work (no kernels, clocks as they were), watts.
    pub idle_power_w: f64,
    /// `counter`: NVML's energy counter; `power`: the mean of power readings.
    pub energy_source: &'static str,
    pub seconds_per_clock: f64,
    pub points: Vec<Point>,
    pub power: PowerFit,
    pub speed: SpeedFit,
    pub restored: Restored,
    pub notes: Vec<String>,
}

/// K clocks spread evenly (by position) over the supported ones (ascending), the lowest and
/// the highest included.
pub fn spread(clocks: &[u32], k: usize) -> Vec<u32> {
    let mut sorted: Vec<u32> = clocks.iter().copied().filter(|&c| c > 0).collect();
    sorted.sort_unstable();
    sorted.dedup();
    if sorted.len() <= k || k < 2 {
        return sorted;
    }
    let n = sorted.len() - 1;
    let mut picked: Vec<u32> = (0..k).map(|i| sorted[(i * n + (k - 1) / 2) / (k - 1)]).collect();
    picked.dedup();
    picked
}

/// An energy (mJ, `counter`) or power (mW) reading of the device.
fn read_meter(device: &nvml_wrapper::Device<'_>, counter: bool) -> Option<f64> {
    if counter {
        device.total_energy_consumption().ok().map(|mj| mj as f64)
    } else {
        device.power_usage().ok().map(f64::from)
    }
}

/// Mean power over a stretch: the counter's delta over the time, or the mean reading.
#[derive(Default)]
struct Stretch {
    first: Option<(Instant, f64)>,
    last: Option<(Instant, f64)>,
    sum_mw: f64,
    count: usize,
}

impl Stretch {
    fn add(&mut self, value: Option<f64>) {
        let Some(v) = value else { return };
        let now = Instant::now();
        if self.first.is_none() {
            self.first = Some((now, v));
        } else {
            self.sum_mw += v;
            self.count += 1;
        }
        self.last = Some((now, v));
    }

    fn watts(&self, counter: bool) -> f64 {
        if counter {
            match (self.first, self.last) {
                (Some((t0, e0)), Some((t1, e1))) if t1 > t0 => (e1 - e0) / 1000.0 / (t1 - t0).as_secs_f64(),
                _ => f64::NAN,
            }
        } else if self.count > 0 {
            self.sum_mw / self.count as f64 / 1000.0
        } else {
            self.first.map_or(f64::NAN, |(_, v)| v / 1000.0)
        }
    }
}

/// Profile one GPU (see the module's doc). `cuda_library`: the driver to load (the
/// simulated one in simulation), else `libcuda.so.1`. `stop` says whether a signal asked
/// to stop.
pub fn profile(
    nvml: &Nvml,
    cuda_library: Option<&Path>,
    store: &AppliedStore,
    options: &Options,
    stop: &dyn Fn() -> bool,
) -> Result<Report, ProfileError> {
    if !(CLOCKS_RANGE.0..=CLOCKS_RANGE.1).contains(&options.clocks) {
        return Err(ProfileError::BadClocks(options.clocks));
    }
    if !(options.seconds.is_finite() && options.seconds > 0.0 && options.seconds <= MAX_SECONDS) {
        return Err(ProfileError::BadSeconds(options.seconds));
    }
    let index = options.gpu;
    let nvml_err = |what| move |source| ProfileError::Nvml { index, what, source };
    let mut device = nvml.device(index).map_err(nvml_err("cannot open"))?;
    let uuid = device.uuid().map_err(nvml_err("cannot read the UUID"))?;
    let gpu_name = device.name().map_err(nvml_err("cannot read the name"))?;
    let supported = apply::supported_clocks(&device).map_err(nvml_err("cannot read the supported clocks"))?;
    let clocks = spread(&supported, options.clocks);
    if clocks.len() < 3 {
        return Err(ProfileError::FewClocks { index, count: clocks.len() });
    }
    let max_clock_mhz = clocks[clocks.len() - 1];
    let pids: Vec<u32> = device.running_compute_processes().map(|ps| ps.into_iter().map(|p| p.pid).collect()).unwrap_or_default();
    if !pids.is_empty() && !options.force {
        let list: Vec<String> = pids.iter().map(u32::to_string).collect();
        return Err(ProfileError::Busy { index, pids: list.join(", ") });
    }
    let mut notes = Vec::new();
    if let (Ok(limit), Ok(default)) = (device.power_management_limit(), device.power_management_limit_default()) {
        if limit + 1000 < default {
            notes.push(format!(
                "the power limit ({} W) is below the default ({} W): the highest clocks may be power-capped; `vgpu carbon reset` first for a clean measure",
                limit / 1000,
                default / 1000
            ));
        }
    }

    // Forget the remembered cap while the clocks are ours (see the module's doc).
    let _lock = store.lock().map_err(ApplyError::from)?;
    let mut records = store.load();
    let previous = records.iter().find(|r| r.uuid == uuid).cloned();
    if previous.is_some() {
        records.retain(|r| r.uuid != uuid);
        store.save(&records)?;
    }
    let relock = match previous.as_ref().map(|p| p.cap) {
        Some(Cap::LockedClocks { min_mhz, max_mhz }) => Some((min_mhz, max_mhz)),
        _ => None,
    };

    let measured = measure(&mut device, cuda_library, &uuid, &clocks, options, stop, &mut notes);

    // Restore, whatever happened.
    let restored = match relock {
        Some((min_mhz, max_mhz)) => device
            .set_gpu_locked_clocks(GpuLockedClocksSetting::Numeric { min_clock_mhz: min_mhz, max_clock_mhz: max_mhz })
            .map(|()| Restored::Relocked { min_mhz, max_mhz }),
        // A device that cannot lock clocks has none locked (and `measure` said why).
        None => match device.reset_gpu_locked_clocks() {
            Ok(()) | Err(NvmlError::NotSupported) => Ok(Restored::Unlocked),
            Err(e) => Err(e),
        },
    };
    let restored = match (restored, measured.as_ref()) {
        (Ok(r), _) => r,
        (Err(e), Ok(_)) => {
            return Err(ProfileError::Restore { measure: "measured".into(), restore: explain(&e) });
        }
        (Err(e), Err(m)) => {
            return Err(ProfileError::Restore { measure: m.to_string(), restore: explain(&e) });
        }
    };
    if let Some(previous) = previous {
        records.push(previous);
        if let Err(e) = store.save(&records) {
            tracing::warn!("{e}: the next carbon apply will write the caps again");
        }
    }
    let (idle_power_w, counter, points) = measured?;
    let power = vgpu_carbon::fit::fit_power(&points, max_clock_mhz).map_err(|source| ProfileError::Fit { index, source })?;
    let speed = vgpu_carbon::fit::fit_speed(&points, max_clock_mhz).map_err(|source| ProfileError::Fit { index, source })?;
    Ok(Report {
        gpu_index: index,
        gpu_uuid: uuid,
        gpu_name,
        measured_ms: chrono::Utc::now().timestamp_millis(),
        max_clock_mhz,
        idle_power_w,
        energy_source: if counter { "counter" } else { "power" },
        seconds_per_clock: options.seconds,
        points,
        power,
        speed,
        restored,
        notes,
    })
}

/// Idle power, whether the energy counter was used, and the points.
fn measure(
    device: &mut nvml_wrapper::Device<'_>,
    cuda_library: Option<&Path>,
    uuid: &str,
    clocks: &[u32],
    options: &Options,
    stop: &dyn Fn() -> bool,
    notes: &mut Vec<String>,
) -> Result<(f64, bool, Vec<Point>), ProfileError> {
    let index = options.gpu;
    let mut cal = Calibrator::open(cuda_library, uuid).map_err(|source| ProfileError::Cuda { index, source })?;
    let counter = device.total_energy_consumption().is_ok();
    if !counter {
        notes.push("the GPU has no energy counter: power is the mean of power readings".into());
    }
    let stopped = stop;

    // Idle: a stretch with no kernels.
    let mut idle = Stretch::default();
    idle.add(read_meter(device, counter));
    let until = Instant::now() + std::time::Duration::from_secs_f64(options.seconds.min(IDLE_SECONDS));
    while Instant::now() < until {
        if stopped() {
            return Err(ProfileError::Interrupted);
        }
        std::thread::sleep(std::time::Duration::from_millis(50).min(until.saturating_duration_since(Instant::now())));
        idle.add(read_meter(device, counter));
    }
    let idle_power_w = idle.watts(counter);

    let cuda_err = |source| ProfileError::Cuda { index, source };
    let mut points = Vec::with_capacity(clocks.len());
    for &clock in clocks {
        if stopped() {
            return Err(ProfileError::Interrupted);
        }
        device
            .set_gpu_locked_clocks(GpuLockedClocksSetting::Numeric { min_clock_mhz: clock, max_clock_mhz: clock })
            .map_err(|source| ProfileError::Nvml { index, what: "cannot lock the clocks", source })?;
        cal.warm_up().map_err(cuda_err)?;
        let stretch = std::cell::RefCell::new(Stretch::default());
        let reader: &nvml_wrapper::Device<'_> = device;
        let run = cal
            .saturate(options.seconds, &mut || stretch.borrow_mut().add(read_meter(reader, counter)), &mut || {
                stretch.borrow_mut().add(read_meter(reader, counter));
                !stopped()
            })
            .map_err(cuda_err)?;
        if stopped() {
            return Err(ProfileError::Interrupted);
        }
        let power_w = stretch.borrow().watts(counter);
        let throughput = if run.seconds > 0.0 { run.kernels as f64 / run.seconds } else { 0.0 };
        tracing::debug!("GPU {index} at {clock} MHz: {power_w:.1} W, {throughput:.1} kernels/s");
        points.push(Point { clock_mhz: clock, power_w, throughput });
    }
    Ok((idle_power_w, counter, points))
}

// ---- the fits in the history database ----

/// A fit as stored in `power_models`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Measured {
    pub gpu_uuid: String,
    pub gpu_name: String,
    pub measured_ms: i64,
    pub max_clock_mhz: u32,
    pub idle_w: f64,
    pub max_w: f64,
    pub gamma: f64,
    pub speed_sigma: f64,
    pub rms_error_w: f64,
}

/// Keep `report`'s fit as the GPU's model (replacing an older one).
pub fn save(conn: &Connection, path: &Path, report: &Report) -> Result<(), HistoryError> {
    let points = serde_json::to_string(&report.points).unwrap_or_else(|_| "[]".into());
    conn.execute(
        "INSERT OR REPLACE INTO power_models
           (gpu_uuid, gpu_name, measured_ms, max_clock_mhz, idle_w, max_w, gamma, speed_sigma, rms_error_w, points)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        params![
            report.gpu_uuid,
            report.gpu_name,
            report.measured_ms,
            report.max_clock_mhz,
            report.power.idle_w,
            report.power.max_w,
            report.power.gamma,
            report.speed.sigma,
            report.power.rms_error_w,
            points
        ],
    )
    .map_err(HistoryError::sqlite(path))?;
    Ok(())
}

/// The model for a GPU: its own fit, else the newest fit of a GPU of the same name.
/// `Ok(None)`: none. Rows with non-finite or inconsistent figures are ignored.
pub fn find(conn: &Connection, uuid: &str, name: &str) -> rusqlite::Result<Option<Measured>> {
    let query = |sql: &str, key: &str| -> rusqlite::Result<Option<Measured>> {
        conn.query_row(sql, params![key], |r| {
            Ok(Measured {
                gpu_uuid: r.get(0)?,
                gpu_name: r.get(1)?,
                measured_ms: r.get(2)?,
                max_clock_mhz: r.get(3)?,
                idle_w: r.get(4)?,
                max_w: r.get(5)?,
                gamma: r.get(6)?,
                speed_sigma: r.get(7)?,
                rms_error_w: r.get(8)?,
            })
        })
        .optional()
        .map(|m| m.filter(usable))
    };
    const COLUMNS: &str = "SELECT gpu_uuid, gpu_name, measured_ms, max_clock_mhz, idle_w, max_w, gamma, speed_sigma, rms_error_w FROM power_models";
    if let Some(own) = query(&format!("{COLUMNS} WHERE gpu_uuid = ?1"), uuid)? {
        return Ok(Some(own));
    }
    if name.is_empty() {
        return Ok(None);
    }
    query(&format!("{COLUMNS} WHERE gpu_name = ?1 ORDER BY measured_ms DESC LIMIT 1"), name)
}

fn usable(m: &Measured) -> bool {
    [m.idle_w, m.max_w, m.gamma, m.speed_sigma].iter().all(|v| v.is_finite())
        && 0.0 <= m.idle_w
        && m.idle_w <= m.max_w
        && m.gamma > 0.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks_are_spread_over_the_range() {
        let all: Vec<u32> = (0..=109).map(|i| 345 + 15 * i).collect();
        let picked = spread(&all, 6);
        assert_eq!(picked.len(), 6);
        assert_eq!((picked[0], picked[5]), (345, 1980));
        assert!(picked.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(spread(&[1000, 500, 1500, 500], 6), vec![500, 1000, 1500]);
        assert_eq!(spread(&all, 2), vec![345, 1980]);
    }

    #[test]
    fn power_from_readings_where_there_is_no_counter() {
        let mut readings = Stretch::default();
        assert!(readings.watts(false).is_nan(), "nothing read: no figure");
        // mW readings; the first (taken as the stretch starts) is left out of the mean.
        for mw in [100_000.0, 300_000.0, 500_000.0] {
            readings.add(Some(mw));
        }
        readings.add(None);
        assert_eq!(readings.watts(false), 400.0);
        let mut one = Stretch::default();
        one.add(Some(250_000.0));
        assert_eq!(one.watts(false), 250.0);
    }

    fn report(uuid: &str, name: &str, when: i64, idle: f64) -> Report {
        Report {
            gpu_index: 0,
            gpu_uuid: uuid.into(),
            gpu_name: name.into(),
            measured_ms: when,
            max_clock_mhz: 1980,
            idle_power_w: 60.0,
            energy_source: "counter",
            seconds_per_clock: 1.0,
            points: vec![Point { clock_mhz: 1980, power_w: 700.0, throughput: 10.0 }],
            power: PowerFit { idle_w: idle, max_w: 700.0, gamma: 2.5, rms_error_w: 0.5 },
            speed: SpeedFit { sigma: 0.6, throughput_at_max: 10.0 },
            restored: Restored::Unlocked,
            notes: vec![],
        }
    }

    #[test]
    fn a_gpu_uses_its_own_fit_else_its_models_newest() {
        let dir = tempfile::tempdir().unwrap();
        let conn = vgpu_history::db::open_rw(dir.path()).unwrap();
        let path = vgpu_history::db::path_in(dir.path());
        assert_eq!(find(&conn, "GPU-a", "H100").unwrap(), None);
        save(&conn, &path, &report("GPU-a", "H100", 1000, 71.0)).unwrap();
        save(&conn, &path, &report("GPU-b", "H100", 2000, 72.0)).unwrap();
        save(&conn, &path, &report("GPU-c", "A100", 3000, 73.0)).unwrap();
        assert_eq!(find(&conn, "GPU-a", "H100").unwrap().unwrap().idle_w, 71.0, "its own");
        assert_eq!(find(&conn, "GPU-z", "H100").unwrap().unwrap().idle_w, 72.0, "the same model's newest");
        assert_eq!(find(&conn, "GPU-z", "L4").unwrap(), None);
        // A new profile replaces the GPU's old fit.
        save(&conn, &path, &report("GPU-a", "H100", 4000, 74.0)).unwrap();
        assert_eq!(find(&conn, "GPU-a", "H100").unwrap().unwrap().idle_w, 74.0);
        let points: String = conn.query_row("SELECT points FROM power_models WHERE gpu_uuid = 'GPU-a'", [], |r| r.get(0)).unwrap();
        assert_eq!(points, r#"[{"clock_mhz":1980,"power_w":700.0,"throughput":10.0}]"#);
    }
}
