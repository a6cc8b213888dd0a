//! The history's rows as the accounting reads them, on one connection ([`Source`]): a
//! window's rows, the intensity figures in force, each GPU's idle power, a workload's GPUs
//! and span. Below [`crate::rollup`] (which accounts windows, through the rollups) and
//! [`crate::query`] (the readers' API).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension as _};

use crate::db::HistoryError;
use vgpu_carbon::account::GpuSample;
use vgpu_carbon::account::GpuTime;
use vgpu_carbon::account::IdlePower;
use vgpu_carbon::account::IdleSource;
use vgpu_carbon::account::IntensityPoint;
use vgpu_carbon::account::Window;

/// How many consecutive pieces without a rollup are read from the rows at a time (each is
/// still accounted on its own): 4 hours, 14 400 rows per GPU at the watch's shortest
/// interval of a second.
pub(crate) const RAW_BATCH: usize = 4;

/// The longest interval (a `gpu_samples` or `workload_gpu_time` row) the accounting reads:
/// a chunk's rows are looked for by their end (the `t1_ms` indexes) up to this far past
/// the chunk, so that reading stays proportional to the window. `vgpu watch` writes a row
/// per tick (its interval is at most an hour) and bridges gaps of at most minutes; a
/// longer row, which only a hand-made history has, is left out of the accounting.
pub const MAX_INTERVAL_MS: i64 = 2 * 3_600_000;

/// A window's GPU samples and GPU-time rows.
pub(crate) type Rows = (Vec<GpuSample>, Vec<GpuTime>);

/// The queries on one connection: a reader's ([`crate::query::Reader`]), or the writer's
/// when it makes rollups.
pub(crate) struct Source<'c> {
    pub(crate) conn: &'c Connection,
    pub(crate) path: &'c Path,
    /// Whether whole hours are read from their rollups.
    pub(crate) rollups: bool,
}

impl Source<'_> {
    fn err(&self) -> impl FnOnce(rusqlite::Error) -> HistoryError + '_ {
        HistoryError::sqlite(self.path)
    }

    /// For each of the consecutive `pieces`, the rows a read of it alone ([`Source::rows`])
    /// gives, read at once: each row goes to every piece it overlaps.
    pub(crate) fn rows_by_piece(&self, pieces: &[Window], only: Option<&BTreeSet<String>>) -> Result<Vec<Rows>, HistoryError> {
        let mut out: Vec<Rows> = pieces.iter().map(|_| Default::default()).collect();
        let (Some(first), Some(last)) = (pieces.first(), pieces.last()) else { return Ok(out) };
        let (samples, gpu_time) = self.rows(Window { since_ms: first.since_ms, until_ms: last.until_ms }, only)?;
        // The pieces that [t0, t1) overlaps.
        let overlapped = |t0: i64, t1: i64| pieces.partition_point(|p| p.until_ms <= t0)..pieces.partition_point(|p| p.since_ms < t1);
        for s in samples {
            let range = overlapped(s.t0_ms, s.t1_ms);
            if let Some((last, before)) = out[range].split_last_mut() {
                for piece in before {
                    piece.0.push(s.clone());
                }
                last.0.push(s);
            }
        }
        for g in gpu_time {
            let range = overlapped(g.t0_ms, g.t1_ms);
            if let Some((last, before)) = out[range].split_last_mut() {
                for piece in before {
                    piece.1.push(g.clone());
                }
                last.1.push(g);
            }
        }
        Ok(out)
    }

    /// The samples and GPU-time rows overlapping `window` (with `only`: on those GPUs).
    pub(crate) fn rows(&self, window: Window, only: Option<&BTreeSet<String>>) -> Result<Rows, HistoryError> {
        let wanted = |uuid: &str| only.is_none_or(|o| o.contains(uuid));
        let mut st = self
            .conn
            .prepare_cached(&format!("SELECT t0_ms, t1_ms, gpu_uuid, gpu_index, gpu_name, energy_mj, busy_ms FROM gpu_samples WHERE t1_ms > ?1 AND t1_ms < ?2 + {MAX_INTERVAL_MS} AND t0_ms < ?2 AND t1_ms - t0_ms <= {MAX_INTERVAL_MS}"))
            .map_err(self.err())?;
        let mut samples = Vec::new();
        let rows = st
            .query_map(params![window.since_ms, window.until_ms], |r| {
                Ok(GpuSample {
                    t0_ms: r.get(0)?,
                    t1_ms: r.get(1)?,
                    gpu_uuid: r.get(2)?,
                    gpu_index: r.get(3)?,
                    gpu_name: r.get(4)?,
                    energy_mj: non_negative(r.get(5)?),
                    busy_ms: r.get::<_, Option<i64>>(6)?.map(non_negative),
                })
            })
            .map_err(HistoryError::sqlite(self.path))?;
        for row in rows {
            let sample = row.map_err(HistoryError::sqlite(self.path))?;
            if wanted(&sample.gpu_uuid) {
                samples.push(sample);
            }
        }
        if samples.is_empty() {
            return Ok((samples, Vec::new()));
        }
        let mut st = self
            .conn
            .prepare_cached(&format!("SELECT t0_ms, t1_ms, workload_id, gpu_uuid, busy_ms FROM workload_gpu_time WHERE t1_ms > ?1 AND t1_ms < ?2 + {MAX_INTERVAL_MS} AND t0_ms < ?2 AND t1_ms - t0_ms <= {MAX_INTERVAL_MS}"))
            .map_err(HistoryError::sqlite(self.path))?;
        let mut gpu_time = Vec::new();
        let rows = st
            .query_map(params![window.since_ms, window.until_ms], |r| {
                Ok(GpuTime { t0_ms: r.get(0)?, t1_ms: r.get(1)?, workload_id: r.get(2)?, gpu_uuid: r.get(3)?, busy_ms: non_negative(r.get(4)?) })
            })
            .map_err(HistoryError::sqlite(self.path))?;
        for row in rows {
            let time = row.map_err(HistoryError::sqlite(self.path))?;
            if wanted(&time.gpu_uuid) {
                gpu_time.push(time);
            }
        }
        Ok((samples, gpu_time))
    }

    /// The intensity figures for `window`: the one in force at `since` (the latest at or
    /// before it) and every later one before `until`; of a reading and a fallback at the same
    /// time, the reading comes last and wins. None of those: the first figure there is (in
    /// force before it).
    pub(crate) fn intensity(&self, window: Window) -> Result<Vec<IntensityPoint>, HistoryError> {
        let point = |r: &rusqlite::Row<'_>| Ok(IntensityPoint { ts_ms: r.get(0)?, g_per_kwh: r.get(1)? });
        let found = intensity_in_force(self.conn, self.path, window)?;
        if !found.is_empty() {
            return Ok(found);
        }
        let mut st = self
            .conn
            .prepare_cached("SELECT ts_ms, g_per_kwh FROM intensity WHERE kind IN ('reading', 'fallback') ORDER BY ts_ms, kind DESC LIMIT 1")
            .map_err(self.err())?;
        st.query_map([], point).and_then(Iterator::collect::<Result<Vec<_>, _>>).map_err(HistoryError::sqlite(self.path))
    }

    /// Every GPU there is in `gpu_samples`: a walk along its primary key, one step per GPU.
    fn gpus(&self) -> Result<Vec<String>, HistoryError> {
        let mut st = self.conn.prepare_cached("SELECT gpu_uuid FROM gpu_samples WHERE gpu_uuid > ?1 ORDER BY gpu_uuid LIMIT 1").map_err(self.err())?;
        let mut out: Vec<String> = Vec::new();
        while let Some(next) = st.query_row([out.last().map_or("", String::as_str)], |r| r.get(0)).optional().map_err(HistoryError::sqlite(self.path))? {
            out.push(next);
        }
        Ok(out)
    }

    /// The GPUs the workload `id` has GPU-time rows on: a walk along the primary key.
    pub(crate) fn gpus_of(&self, id: &str) -> Result<Vec<String>, HistoryError> {
        let mut st = self
            .conn
            .prepare_cached("SELECT gpu_uuid FROM workload_gpu_time WHERE workload_id = ?1 AND gpu_uuid > ?2 ORDER BY gpu_uuid LIMIT 1")
            .map_err(self.err())?;
        let mut out: Vec<String> = Vec::new();
        while let Some(next) = st.query_row(params![id, out.last().map_or("", String::as_str)], |r| r.get(0)).optional().map_err(HistoryError::sqlite(self.path))? {
            out.push(next);
        }
        Ok(out)
    }

    /// A GPU's idle power when it does not depend on the window: its measured model, else
    /// `idle`'s; `None`: its lowest observed power in the window is taken.
    pub(crate) fn idle_known(&self, uuid: &str, idle: &IdleDefaults<'_>) -> Result<Option<IdlePower>, HistoryError> {
        let mut st = self.conn.prepare_cached("SELECT idle_w FROM power_models WHERE gpu_uuid = ?1").map_err(self.err())?;
        let measured: Option<f64> = st.query_row([uuid], |r| r.get(0)).optional().map_err(HistoryError::sqlite(self.path))?;
        Ok(match measured {
            Some(watts) => Some(IdlePower { watts, source: IdleSource::Measured }),
            None => idle.of(uuid),
        })
    }

    /// The idle power of every GPU with samples in `window` (see
    /// [`crate::query::Reader::accounting`]).
    pub(crate) fn idle_w(&self, window: Window, idle: &IdleDefaults<'_>, gpus_of: Option<&str>) -> Result<BTreeMap<String, IdlePower>, HistoryError> {
        let in_window = format!(
            "gpu_uuid = ?1 AND t1_ms > ?2 AND t1_ms < ?3 + {MAX_INTERVAL_MS} AND t0_ms < ?3 AND t1_ms - t0_ms <= {MAX_INTERVAL_MS}"
        );
        let mut any = self.conn.prepare_cached(&format!("SELECT 1 FROM gpu_samples WHERE {in_window} LIMIT 1")).map_err(self.err())?;
        let mut gpus = Vec::new();
        for uuid in self.gpus()? {
            if any.exists(params![uuid, window.since_ms, window.until_ms]).map_err(HistoryError::sqlite(self.path))? {
                gpus.push(uuid);
            }
        }
        if let Some(id) = gpus_of {
            let used = self.gpus_of(id)?;
            gpus.retain(|g| used.contains(g));
        }
        let mut lowest = self
            .conn
            .prepare_cached(&format!("SELECT min(CAST(energy_mj AS REAL) / (t1_ms - t0_ms)) FROM gpu_samples WHERE {in_window}"))
            .map_err(HistoryError::sqlite(self.path))?;
        let mut out = BTreeMap::new();
        for uuid in gpus {
            let found = match self.idle_known(&uuid, idle)? {
                Some(found) => found,
                None => {
                    let watts: Option<f64> = lowest.query_row(params![uuid, window.since_ms, window.until_ms], |r| r.get(0)).map_err(HistoryError::sqlite(self.path))?;
                    IdlePower { watts: watts.filter(|w| w.is_finite()).unwrap_or(0.0), source: IdleSource::LowestObserved }
                }
            };
            out.insert(uuid, found);
        }
        Ok(out)
    }

    /// From the start of the workload `id`'s first GPU-time row to the end of its last, of
    /// the rows the accounting reads (at most [`MAX_INTERVAL_MS`] long). Found along the
    /// primary key on each of its GPUs: its first row by end, and the earliest start among
    /// the rows that end within [`MAX_INTERVAL_MS`] of it (no later row can start earlier);
    /// its last row by end.
    pub(crate) fn span(&self, id: &str) -> Result<Option<(i64, i64)>, HistoryError> {
        let counted = format!("workload_id = ?1 AND gpu_uuid = ?2 AND t1_ms - t0_ms <= {MAX_INTERVAL_MS}");
        let mut first_end = self.conn.prepare_cached(&format!("SELECT t1_ms FROM workload_gpu_time WHERE {counted} ORDER BY t1_ms LIMIT 1")).map_err(self.err())?;
        let mut start = self
            .conn
            .prepare_cached(&format!("SELECT min(t0_ms) FROM workload_gpu_time WHERE {counted} AND t1_ms < ?3 + {MAX_INTERVAL_MS}"))
            .map_err(HistoryError::sqlite(self.path))?;
        let mut last_end = self
            .conn
            .prepare_cached(&format!("SELECT t1_ms FROM workload_gpu_time WHERE {counted} ORDER BY t1_ms DESC LIMIT 1"))
            .map_err(HistoryError::sqlite(self.path))?;
        let err = || HistoryError::sqlite(self.path);
        let mut span: Option<(i64, i64)> = None;
        for gpu in self.gpus_of(id)? {
            let Some(t1) = first_end.query_row(params![id, gpu], |r| r.get::<_, i64>(0)).optional().map_err(err())? else { continue };
            let t0: Option<i64> = start.query_row(params![id, gpu, t1], |r| r.get(0)).map_err(err())?;
            let end: i64 = last_end.query_row(params![id, gpu], |r| r.get(0)).map_err(err())?;
            let t0 = t0.unwrap_or(t1);
            span = Some(match span {
                Some((a, b)) => (a.min(t0), b.max(end)),
                None => (t0, end),
            });
        }
        Ok(span)
    }
}

/// A GPU's idle power where it has no measured model: the planner's model, configured
/// (`[carbon] power_idle_w`, or 15 % of `power_max_w`), else from the driver's power limits
/// (asked once, and only when a GPU needs it).
pub struct IdleDefaults<'a> {
    configured_w: Option<f64>,
    driver: std::cell::OnceCell<BTreeMap<String, f64>>,
    load: Box<dyn Fn() -> BTreeMap<String, f64> + 'a>,
}

impl<'a> IdleDefaults<'a> {
    pub fn new(configured_w: Option<f64>, load: impl Fn() -> BTreeMap<String, f64> + 'a) -> Self {
        IdleDefaults { configured_w, driver: std::cell::OnceCell::new(), load: Box::new(load) }
    }

    /// Neither configured nor from a driver: measured models, else the lowest observed.
    pub fn none() -> IdleDefaults<'static> {
        IdleDefaults::new(None, BTreeMap::new)
    }

    pub(crate) fn of(&self, uuid: &str) -> Option<IdlePower> {
        if let Some(watts) = self.configured_w {
            return Some(IdlePower { watts, source: IdleSource::Configured });
        }
        let watts = *self.driver.get_or_init(&self.load).get(uuid)?;
        Some(IdlePower { watts, source: IdleSource::PowerLimit })
    }
}

/// [`IdleDefaults`] as plain values, to hand to another thread (`vgpu watch`'s history
/// thread makes rollups with the idle powers reports take).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IdlePowers {
    /// `[carbon] power_idle_w`, or 15 % of `power_max_w`.
    pub configured_w: Option<f64>,
    /// 15 % of each GPU's default power limit, from the driver, by UUID.
    pub driver_w: BTreeMap<String, f64>,
}

impl IdlePowers {
    pub fn defaults(&self) -> IdleDefaults<'_> {
        IdleDefaults::new(self.configured_w, move || self.driver_w.clone())
    }
}

pub(crate) fn non_negative(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// The intensity figures (readings and fallbacks) of `window`: the one in force at `since`
/// (the latest at or before it) and every later one before `until`; of a reading and a
/// fallback at the same time, the reading comes last and wins (as [`account::Steps`] reads
/// them). Empty when none is at or before `until`.
pub(crate) fn intensity_in_force(conn: &Connection, path: &Path, window: Window) -> Result<Vec<IntensityPoint>, HistoryError> {
    let point = |r: &rusqlite::Row<'_>| Ok(IntensityPoint { ts_ms: r.get(0)?, g_per_kwh: r.get(1)? });
    let mut st = conn
        .prepare_cached(
            "SELECT ts_ms, g_per_kwh FROM intensity WHERE kind IN ('reading', 'fallback') AND ts_ms < ?2
             AND ts_ms >= coalesce((SELECT max(ts_ms) FROM intensity WHERE kind IN ('reading', 'fallback') AND ts_ms <= ?1), ?1)
             ORDER BY ts_ms, kind",
        )
        .map_err(HistoryError::sqlite(path))?;
    st.query_map(params![window.since_ms, window.until_ms], point)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(HistoryError::sqlite(path))
}

