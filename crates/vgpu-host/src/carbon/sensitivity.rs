//! Each workload's frequency sensitivity σ, learned from the history instead of a flat
//! default.
//!
//! The reasoning: a workload that does a steady amount of work per second without filling
//! the GPU (serving, a paced pipeline) keeps the GPU busy for the time that work takes, so
//! its busy fraction is `b(f) = k / s(f)` with `s(f) = (1 − σ) + σ·f/f_max` its speed at the
//! clock. Hence `1/b = (1 − σ)/k + (σ/k)·f/f_max`, a line in `x = f/f_max` whose intercept
//! `A` and slope `B` give `σ = B / (A + B)`. As carbon caps move the clock over days, the
//! history (`workload_gpu_time` busy time against `gpu_samples.sm_clock_mhz`) holds points
//! of that line; a weighted least-squares fit (weights: the intervals' lengths) recovers σ.
//!
//! A workload that saturates its GPU (busy ≈ 100 % at every clock) does more work at a
//! higher clock but its GPU time cannot show it: it carries no signal, and keeps the default
//! (or its `--freq-sensitivity`). So do workloads with too few samples or too little spread
//! of clocks. Saturated samples (busy ≥ [`SATURATED`]) are left out of the fit; a workload
//! most of whose samples are saturated is "saturating".
//!
//! Keys (`workload_sensitivity.key`), what identifies a workload across runs: `service:NAME`
//! for a service's replicas, `name:NAME` for a named workload, `id:ID` otherwise.

use rusqlite::{params, Connection, OptionalExtension as _};
use serde::Serialize;

use vgpu_history::db::HistoryError;

/// A busy fraction at or above this is saturated.
pub const SATURATED: f64 = 0.95;
/// Busy fractions below this (a workload that barely ran) are noise, left out.
pub const MIN_BUSY: f64 = 0.005;
/// Unsaturated samples needed for a fit.
pub const MIN_SAMPLES: usize = 12;
/// The clocks of the samples must span at least this share of the maximum clock.
pub const MIN_SPREAD: f64 = 0.15;
/// The history looked at: the last 14 days.
pub const WINDOW_MS: i64 = 14 * 24 * 3600 * 1000;

/// One interval of a workload on a GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Busy fraction of the interval, 0..=1.
    pub busy: f64,
    /// The GPU's SM clock then, as a fraction of its maximum.
    pub clock_ratio: f64,
    /// The interval's length (weight), ms.
    pub weight: f64,
}

/// What the history says about a workload's σ.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "result", rename_all = "kebab-case")]
pub enum Learned {
    Sigma { sigma: f64, samples: usize },
    /// Most samples are saturated: GPU time says nothing about speed.
    Saturating { samples: usize },
    TooFewSamples { samples: usize },
    /// The clock did not move enough.
    NoClockSpread { spread: f64 },
}

/// Fit σ to a workload's samples (pure).
pub fn learn(samples: &[Sample]) -> Learned {
    let valid: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.busy.is_finite() && s.clock_ratio.is_finite() && s.weight.is_finite() && s.weight > 0.0)
        .filter(|s| s.busy >= MIN_BUSY && s.clock_ratio > 0.0)
        .collect();
    let saturated = valid.iter().filter(|s| s.busy >= SATURATED).count();
    if !valid.is_empty() && saturated * 2 > valid.len() {
        return Learned::Saturating { samples: valid.len() };
    }
    let used: Vec<&Sample> = valid.into_iter().filter(|s| s.busy < SATURATED).collect();
    if used.len() < MIN_SAMPLES {
        return Learned::TooFewSamples { samples: used.len() };
    }
    let lo = used.iter().map(|s| s.clock_ratio).fold(f64::INFINITY, f64::min);
    let hi = used.iter().map(|s| s.clock_ratio).fold(f64::NEG_INFINITY, f64::max);
    if hi - lo < MIN_SPREAD {
        return Learned::NoClockSpread { spread: hi - lo };
    }
    // Weighted least squares of y = 1/b on x.
    let w: f64 = used.iter().map(|s| s.weight).sum();
    let mx = used.iter().map(|s| s.weight * s.clock_ratio).sum::<f64>() / w;
    let my = used.iter().map(|s| s.weight / s.busy).sum::<f64>() / w;
    let sxx: f64 = used.iter().map(|s| s.weight * (s.clock_ratio - mx).powi(2)).sum();
    let sxy: f64 = used.iter().map(|s| s.weight * (s.clock_ratio - mx) * (1.0 / s.busy - my)).sum();
    let slope = sxy / sxx;
    let intercept = my - slope * mx;
    let at_max = intercept + slope;
    if !(slope.is_finite() && at_max.is_finite() && at_max > 0.0) {
        return Learned::NoClockSpread { spread: hi - lo };
    }
    Learned::Sigma { sigma: (slope / at_max).clamp(0.0, 1.0), samples: used.len() }
}

/// The key a workload is learned under.
pub fn key(service: Option<&str>, name: &str, id: &str) -> String {
    match (service, name) {
        (Some(s), _) if !s.is_empty() => format!("service:{s}"),
        (_, n) if !n.is_empty() => format!("name:{n}"),
        _ => format!("id:{id}"),
    }
}

/// Every key's samples in the history since `since_ms`: each workload interval on a GPU,
/// with the clock of the GPU sample that ended within it. `max_clock` gives a GPU's maximum
/// clock by UUID (GPUs it does not know are skipped).
pub fn samples_by_key(
    conn: &Connection,
    since_ms: i64,
    max_clock: &dyn Fn(&str) -> Option<u32>,
) -> rusqlite::Result<Vec<(String, Vec<Sample>)>> {
    let mut stmt = conn.prepare(
        "SELECT wl.service, wl.name, w.workload_id, w.gpu_uuid, w.t0_ms, w.t1_ms, w.busy_ms, g.sm_clock_mhz
           FROM workload_gpu_time w
           JOIN gpu_samples g ON g.gpu_uuid = w.gpu_uuid AND g.t1_ms > w.t0_ms AND g.t1_ms <= w.t1_ms
           LEFT JOIN workloads wl ON wl.id = w.workload_id
          WHERE w.t1_ms >= ?1 AND g.sm_clock_mhz IS NOT NULL AND g.sm_clock_mhz > 0",
    )?;
    let rows = stmt.query_map(params![since_ms], |r| {
        Ok((
            r.get::<_, Option<String>>(0)?,
            r.get::<_, Option<String>>(1)?,
            r.get::<_, String>(2)?,
            r.get::<_, String>(3)?,
            r.get::<_, i64>(4)?,
            r.get::<_, i64>(5)?,
            r.get::<_, i64>(6)?,
            r.get::<_, i64>(7)?,
        ))
    })?;
    let mut out: Vec<(String, Vec<Sample>)> = Vec::new();
    for row in rows {
        let (service, name, id, uuid, t0, t1, busy_ms, clock) = row?;
        let Some(max) = max_clock(&uuid).filter(|&m| m > 0) else {
            continue;
        };
        let length = (t1 - t0) as f64;
        let sample = Sample {
            busy: (busy_ms as f64 / length).min(1.0),
            clock_ratio: (clock as f64 / f64::from(max)).min(1.0),
            weight: length,
        };
        let k = key(service.as_deref(), name.as_deref().unwrap_or(""), &id);
        match out.iter_mut().find(|(key, _)| *key == k) {
            Some((_, list)) => list.push(sample),
            None => out.push((k, vec![sample])),
        }
    }
    Ok(out)
}

/// Learn every key's σ from the history and store those learned (`workload_sensitivity`).
/// Returns what was learned for each key.
pub fn update(
    conn: &mut Connection,
    path: &std::path::Path,
    now_ms: i64,
    max_clock: &dyn Fn(&str) -> Option<u32>,
) -> Result<Vec<(String, Learned)>, HistoryError> {
    let err = HistoryError::sqlite(path);
    let found = samples_by_key(conn, now_ms - WINDOW_MS, max_clock).map_err(HistoryError::sqlite(path))?;
    let results: Vec<(String, Learned)> = found.into_iter().map(|(k, s)| (k, learn(&s))).collect();
    let tx = conn.transaction().map_err(HistoryError::sqlite(path))?;
    for (k, learned) in &results {
        if let Learned::Sigma { sigma, samples } = learned {
            tx.execute(
                "INSERT INTO workload_sensitivity (key, sigma, samples, updated_ms) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (key) DO UPDATE SET sigma = excluded.sigma, samples = excluded.samples, updated_ms = excluded.updated_ms",
                params![k, sigma, *samples as i64, now_ms],
            )
            .map_err(HistoryError::sqlite(path))?;
        }
    }
    tx.commit().map_err(err)?;
    Ok(results)
}

/// The stored σ of `key`, if learned.
pub fn stored(conn: &Connection, key: &str) -> rusqlite::Result<Option<f64>> {
    conn.query_row("SELECT sigma FROM workload_sensitivity WHERE key = ?1", params![key], |r| r.get::<_, f64>(0))
        .optional()
        .map(|s| s.filter(|s| s.is_finite() && (0.0..=1.0).contains(s)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A steady workload of `k` busy at full clock, at clocks sweeping 0.3..=1.
    fn steady(sigma: f64, k: f64, n: usize, noise: f64) -> Vec<Sample> {
        (0..n)
            .map(|i| {
                let x = 0.3 + 0.7 * (i % 8) as f64 / 7.0;
                let wiggle = if i % 2 == 0 { 1.0 + noise } else { 1.0 - noise };
                Sample { busy: (k / ((1.0 - sigma) + sigma * x) * wiggle).min(1.0), clock_ratio: x, weight: 10_000.0 }
            })
            .collect()
    }

    #[test]
    fn a_steady_workload_gives_its_sigma() {
        for sigma in [0.0, 0.3, 0.6, 1.0] {
            match learn(&steady(sigma, 0.25, 40, 0.0)) {
                Learned::Sigma { sigma: got, samples } => {
                    assert!((got - sigma).abs() < 1e-9, "{sigma}: {got}");
                    assert_eq!(samples, 40);
                }
                other => panic!("{sigma}: {other:?}"),
            }
        }
        // With ±3 % noise, still close.
        let Learned::Sigma { sigma, .. } = learn(&steady(0.6, 0.25, 40, 0.03)) else { panic!() };
        assert!((sigma - 0.6).abs() < 0.08, "{sigma}");
    }

    #[test]
    fn saturating_workloads_and_thin_histories_teach_nothing() {
        // Busy 100 % at every clock: the workload fills the GPU.
        let full: Vec<Sample> = steady(1.0, 1.0, 40, 0.0);
        assert!(matches!(learn(&full), Learned::Saturating { .. }), "{:?}", learn(&full));
        assert_eq!(learn(&steady(0.5, 0.25, 5, 0.0)), Learned::TooFewSamples { samples: 5 });
        let one_clock: Vec<Sample> = (0..40).map(|_| Sample { busy: 0.4, clock_ratio: 0.8, weight: 1.0 }).collect();
        assert!(matches!(learn(&one_clock), Learned::NoClockSpread { .. }));
        assert_eq!(learn(&[]), Learned::TooFewSamples { samples: 0 });
    }

    #[test]
    fn keys() {
        assert_eq!(key(Some("api"), "api-0", "w1"), "service:api");
        assert_eq!(key(None, "trainer", "w1"), "name:trainer");
        assert_eq!(key(None, "", "w1"), "id:w1");
    }

    #[test]
    fn learned_from_a_database_history() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = vgpu_history::db::open_rw(dir.path()).unwrap();
        let gpu = "GPU-1";
        conn.execute("INSERT INTO workloads (id, name, service) VALUES ('w1', 'server', NULL), ('w2', 'trainer', NULL)", [])
            .unwrap();
        // 10 s ticks; the clock moves through 8 values; `server` (σ 0.5) is busy 20 % at
        // full clock, `trainer` always 100 %.
        for i in 0..48i64 {
            let (t0, t1) = (i * 10_000, (i + 1) * 10_000);
            let x = 0.3 + 0.7 * (i % 8) as f64 / 7.0;
            let clock = (1980.0 * x).round() as i64;
            conn.execute(
                "INSERT INTO gpu_samples (t0_ms, t1_ms, gpu_uuid, gpu_index, energy_mj, energy_source, sm_clock_mhz) VALUES (?1, ?2, ?3, 0, 0, 'counter', ?4)",
                params![t0, t1, gpu, clock],
            )
            .unwrap();
            let x = clock as f64 / 1980.0;
            let busy = (10_000.0 * 0.2 / (0.5 + 0.5 * x)).round() as i64;
            for (id, b) in [("w1", busy), ("w2", 10_000)] {
                conn.execute(
                    "INSERT INTO workload_gpu_time (t0_ms, t1_ms, workload_id, gpu_uuid, busy_ms, source) VALUES (?1, ?2, ?3, ?4, ?5, 'ledger')",
                    params![t0, t1, id, gpu, b],
                )
                .unwrap();
            }
        }
        let path = vgpu_history::db::path_in(dir.path());
        let now = 48 * 10_000;
        let results = update(&mut conn, &path, now, &|uuid| (uuid == gpu).then_some(1980)).unwrap();
        assert!(matches!(results.iter().find(|(k, _)| k == "name:trainer"), Some((_, Learned::Saturating { .. }))));
        let sigma = stored(&conn, "name:server").unwrap().expect("learned");
        assert!((sigma - 0.5).abs() < 0.01, "{sigma}");
        assert_eq!(stored(&conn, "name:trainer").unwrap(), None, "a saturating workload keeps the default");
    }
}
