//! What this host's GPUs have emitted since a time: the grams a daily or monthly carbon
//! budget has already spent (`vgpu carbon plan/apply` with `budget_g_per_day` or `_month`).
//!
//! From the history database: Σ over `gpu_samples` in [from, to) of energy × the intensity
//! in force at the interval's midpoint, the intensity being a step function of the
//! `intensity` rows of kind 'reading' and 'fallback' (the latest at or before the
//! midpoint). A sample straddling `from` or `to` counts in proportion to its overlap.
//! Energy before the first recorded intensity is priced at the caller's `default` intensity
//! (and counted in `unpriced_kwh`).
//!
//! Without a database, [`spent_from_log`] assumes the plans were kept: Σ of each applied
//! decision's predicted gCO2/h × the time it was in force.
//!
//! (`vgpu carbon report` attributes the same energy to workloads, `carbon::account`; this
//! is the host's total only, read with the report's intensity figures and step function.)

use std::path::Path;

use chrono::{DateTime, Utc};
use rusqlite::{params, Connection};

use super::db::HistoryError;
use vgpu_carbon::account::Steps;
use vgpu_carbon::account::Window;
use vgpu_carbon::log::Action;
use vgpu_carbon::log::Decision;

/// Millijoules in a kilowatt-hour.
const MJ_PER_KWH: f64 = 3.6e9;

/// Emissions in a time range, from the history.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Spent {
    pub grams: f64,
    /// The GPUs' energy in the range.
    pub kwh: f64,
    /// Of it, energy from before any recorded intensity, priced at the default.
    pub unpriced_kwh: f64,
    /// GPU samples that counted.
    pub samples: usize,
}

/// Grams emitted in [from_ms, to_ms) by the GPUs in the database `conn` (at `path`, named in
/// errors); energy without a recorded intensity before it is priced at `default_g_per_kwh`.
pub fn spent(conn: &Connection, path: &Path, from_ms: i64, to_ms: i64, default_g_per_kwh: f64) -> Result<Spent, HistoryError> {
    let err = HistoryError::sqlite;
    // The intensity in force at from_ms, and every change after it (as the report reads it).
    let window = Window { since_ms: from_ms, until_ms: to_ms };
    let steps = Steps::new(super::source::intensity_in_force(conn, path, window)?);
    let mut out = Spent::default();
    let mut query = conn
        .prepare("SELECT t0_ms, t1_ms, energy_mj FROM gpu_samples WHERE t1_ms > ?1 AND t0_ms < ?2")
        .map_err(err(path))?;
    let rows = query
        .query_map(params![from_ms, to_ms], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?)))
        .map_err(err(path))?;
    for row in rows {
        let (t0, t1, energy_mj) = row.map_err(err(path))?;
        let (a, b) = (t0.max(from_ms), t1.min(to_ms));
        if b <= a || t1 <= t0 {
            continue;
        }
        let kwh = energy_mj as f64 * (b - a) as f64 / (t1 - t0) as f64 / MJ_PER_KWH;
        let mid = a + (b - a) / 2;
        let g_per_kwh = steps.in_force(mid).unwrap_or_else(|| {
            out.unpriced_kwh += kwh;
            default_g_per_kwh
        });
        out.grams += kwh * g_per_kwh;
        out.kwh += kwh;
        out.samples += 1;
    }
    Ok(out)
}

/// Grams emitted in [from, to) if every applied decision of the log was kept: each one's
/// predicted gCO2/h over the time until the next decision (a reset: nothing predicted).
pub fn spent_from_log(decisions: &[Decision], from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    let mut sorted: Vec<&Decision> = decisions.iter().collect();
    sorted.sort_by_key(|d| d.time);
    let mut grams = 0.0;
    for (i, d) in sorted.iter().enumerate() {
        let end = sorted.get(i + 1).map_or(to, |next| next.time).min(to);
        let start = d.time.max(from);
        if end <= start || d.action != Action::Apply {
            continue;
        }
        let hours = (end - start).num_milliseconds() as f64 / 3.6e6;
        grams += d.predicted_g_per_hour.unwrap_or(0.0) * hours;
    }
    grams
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db() -> (tempfile::TempDir, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let conn = super::super::db::open_rw(dir.path()).unwrap();
        (dir, conn)
    }

    const H: i64 = 3_600_000;

    fn sample(conn: &Connection, gpu: &str, t0: i64, t1: i64, kwh: f64) {
        conn.execute(
            "INSERT INTO gpu_samples (t0_ms, t1_ms, gpu_uuid, gpu_index, energy_mj, energy_source) VALUES (?1, ?2, ?3, 0, ?4, 'counter')",
            params![t0, t1, gpu, (kwh * MJ_PER_KWH) as i64],
        )
        .unwrap();
    }

    fn intensity(conn: &Connection, ts: i64, kind: &str, g: f64) {
        conn.execute(
            "INSERT INTO intensity (ts_ms, kind, g_per_kwh, source, fetched_ms) VALUES (?1, ?2, ?3, 'test', ?1)",
            params![ts, kind, g],
        )
        .unwrap();
    }

    #[test]
    fn energy_times_the_intensity_in_force_at_each_midpoint() {
        let (dir, conn) = db();
        let path = dir.path().join("history.db");
        // 100 g/kWh from before the range, 500 from hour 2; a forecast row is not a reading.
        intensity(&conn, -5 * H, "reading", 100.0);
        intensity(&conn, 2 * H, "fallback", 500.0);
        intensity(&conn, H, "forecast", 9999.0);
        for h in 0..4 {
            sample(&conn, "GPU-a", h * H, (h + 1) * H, 1.0);
            sample(&conn, "GPU-b", h * H, (h + 1) * H, 0.5);
        }
        let got = spent(&conn, &path, 0, 4 * H, 7.0).unwrap();
        assert_eq!(got.samples, 8);
        assert!((got.kwh - 6.0).abs() < 1e-9, "{got:?}");
        assert!((got.grams - (3.0 * 100.0 + 3.0 * 500.0)).abs() < 1e-6, "{got:?}");
        assert_eq!(got.unpriced_kwh, 0.0);
        // Half of the first hour: half its energy, at its midpoint's intensity.
        let got = spent(&conn, &path, H / 2, H, 7.0).unwrap();
        assert!((got.grams - 0.75 * 100.0).abs() < 1e-6, "{got:?}");
        // A reading and a fallback at one time: the reading.
        intensity(&conn, 2 * H, "reading", 300.0);
        let got = spent(&conn, &path, 2 * H, 3 * H, 7.0).unwrap();
        assert!((got.grams - 1.5 * 300.0).abs() < 1e-6, "{got:?}");
    }

    #[test]
    fn energy_before_any_intensity_is_priced_at_the_default() {
        let (dir, conn) = db();
        let path = dir.path().join("history.db");
        sample(&conn, "GPU-a", 0, H, 2.0);
        intensity(&conn, H, "reading", 100.0);
        sample(&conn, "GPU-a", H, 2 * H, 1.0);
        let got = spent(&conn, &path, 0, 2 * H, 50.0).unwrap();
        assert!((got.grams - (2.0 * 50.0 + 100.0)).abs() < 1e-6, "{got:?}");
        assert!((got.unpriced_kwh - 2.0).abs() < 1e-9);
        assert_eq!(spent(&conn, &path, 5 * H, 6 * H, 50.0).unwrap(), Spent::default(), "nothing recorded: nothing spent");
    }

    #[test]
    fn without_a_database_the_logged_plans_count() {
        let t = |h: i64| DateTime::from_timestamp(h * 3600, 0).unwrap();
        let decision = |h: i64, action: Action, g: Option<f64>| Decision {
            time: t(h),
            action,
            intensity: None,
            intensity_source: None,
            budget_g_per_hour: None,
            predicted_g_per_hour: g,
            budget_met: None,
            notes: Vec::new(),
            gpus: Vec::new(),
            reason: None,
            horizons: Vec::new(),
        };
        // 100 g/h from before the range, 300 g/h from hour 2, reset at hour 3.
        let log = vec![
            decision(2, Action::Apply, Some(300.0)),
            decision(-1, Action::Apply, Some(100.0)),
            decision(3, Action::Reset, None),
        ];
        assert!((spent_from_log(&log, t(0), t(4)) - (200.0 + 300.0)).abs() < 1e-9);
        assert!((spent_from_log(&log, t(0), t(1)) - 100.0).abs() < 1e-9);
        assert_eq!(spent_from_log(&[], t(0), t(4)), 0.0);
    }
}
