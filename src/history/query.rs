//! Reading the history for `vgpu carbon report`, `vgpu ps -a` and the line `vgpu run` prints
//! when a workload ends: a window's rows, in [`crate::carbon::account`]'s terms.
//!
//! Anyone may read the history (the file is 0644). A reader that cannot write to the lib
//! directory (a user who is not root) cannot make the `-shm` file SQLite's WAL mode needs;
//! when the writer has gone and SQLite has removed `-wal` and `-shm`, opening fails
//! (`SQLITE_CANTOPEN`). Then the whole database is in the main file and, no writer having it
//! open, nothing changes under the reader: it is opened again with `immutable=1` (no locks,
//! no `-shm`). Were a writer to start meanwhile, the worst is a report made of a database
//! changing under it, once; with `-wal` and `-shm` present the ordinary read-only open works
//! (SQLite reads a `-shm` it may not write in its "readonly_shm" mode).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rusqlite::{params, Connection, OpenFlags};

use super::db::{self, HistoryError, BUSY_TIMEOUT};
use crate::carbon::account::{self, GpuSample, GpuTime, History, IdlePower, IdleSource, IntensityPoint, Window, WorkloadInfo};

/// The history, opened to read.
pub struct Reader {
    conn: Connection,
    path: PathBuf,
}

impl Reader {
    /// Open the history of `lib_dir` to read; `Ok(None)` when there is none yet.
    pub fn open(lib_dir: &Path) -> Result<Option<Reader>, HistoryError> {
        let path = db::path_in(lib_dir);
        match db::open_ro(lib_dir) {
            Ok(conn) => Ok(conn.map(|conn| Reader { conn, path })),
            Err(HistoryError::Sqlite { source, .. }) if cannot_open(&source) && !wal_of(&path).exists() => {
                let conn = open_immutable(&path)?;
                Ok(Some(Reader { conn, path }))
            }
            Err(e) => Err(e),
        }
    }

    fn err(&self) -> impl FnOnce(rusqlite::Error) -> HistoryError + '_ {
        HistoryError::sqlite(&self.path)
    }

    /// The rows of `window` the accounting needs; idle power per GPU from its measured
    /// model (`power_models`), else from `idle` ([`IdleDefaults`]), else none (the
    /// accounting falls back to the lowest observed power).
    pub fn history(&self, window: Window, idle: &IdleDefaults<'_>) -> Result<History, HistoryError> {
        self.history_of(window, idle, None)
    }

    /// [`Reader::history`], of the GPUs the workload `gpus_of` used when given (through the
    /// primary keys: a workload's rows, then each of its GPUs' samples).
    fn history_of(&self, window: Window, idle: &IdleDefaults<'_>, gpus_of: Option<&str>) -> Result<History, HistoryError> {
        let w = params![window.since_ms, window.until_ms];
        let only = if gpus_of.is_some() {
            " AND gpu_uuid IN (SELECT DISTINCT gpu_uuid FROM workload_gpu_time WHERE workload_id = ?3)"
        } else {
            ""
        };
        let with = params![window.since_ms, window.until_ms, gpus_of.unwrap_or_default()];
        let with: &[&dyn rusqlite::ToSql] = if gpus_of.is_some() { with } else { &with[..2] };
        let mut st = self
            .conn
            .prepare(&format!("SELECT t0_ms, t1_ms, gpu_uuid, gpu_index, gpu_name, energy_mj, busy_ms FROM gpu_samples WHERE t1_ms > ?1 AND t0_ms < ?2{only}"))
            .map_err(self.err())?;
        let samples = st
            .query_map(with, |r| {
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
            .and_then(Iterator::collect::<Result<Vec<_>, _>>)
            .map_err(self.err())?;
        let mut st = self
            .conn
            .prepare(&format!("SELECT t0_ms, t1_ms, workload_id, gpu_uuid, busy_ms FROM workload_gpu_time WHERE t1_ms > ?1 AND t0_ms < ?2{only}"))
            .map_err(self.err())?;
        let gpu_time = st
            .query_map(with, |r| {
                Ok(GpuTime { t0_ms: r.get(0)?, t1_ms: r.get(1)?, workload_id: r.get(2)?, gpu_uuid: r.get(3)?, busy_ms: non_negative(r.get(4)?) })
            })
            .and_then(Iterator::collect::<Result<Vec<_>, _>>)
            .map_err(self.err())?;
        // The figure in force at `since` (the latest at or before it) and every later one
        // before `until`; of a reading and a fallback at the same time, the reading comes
        // last and wins. None of those: the first figure there is (in force before it).
        let point = |r: &rusqlite::Row<'_>| Ok(IntensityPoint { ts_ms: r.get(0)?, g_per_kwh: r.get(1)? });
        let mut st = self
            .conn
            .prepare(
                "SELECT ts_ms, g_per_kwh FROM intensity WHERE kind IN ('reading', 'fallback') AND ts_ms < ?2
                 AND ts_ms >= coalesce((SELECT max(ts_ms) FROM intensity WHERE kind IN ('reading', 'fallback') AND ts_ms <= ?1), ?1)
                 ORDER BY ts_ms, kind",
            )
            .map_err(self.err())?;
        let mut intensity = st.query_map(w, point).and_then(Iterator::collect::<Result<Vec<_>, _>>).map_err(self.err())?;
        if intensity.is_empty() {
            let mut st = self
                .conn
                .prepare("SELECT ts_ms, g_per_kwh FROM intensity WHERE kind IN ('reading', 'fallback') ORDER BY ts_ms, kind DESC LIMIT 1")
                .map_err(self.err())?;
            intensity = st.query_map([], point).and_then(Iterator::collect::<Result<Vec<_>, _>>).map_err(self.err())?;
        }
        let mut idle_w = BTreeMap::new();
        let mut st = self.conn.prepare("SELECT gpu_uuid, idle_w FROM power_models").map_err(self.err())?;
        let measured = st
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, f64>(1)?)))
            .and_then(Iterator::collect::<Result<Vec<_>, _>>)
            .map_err(self.err())?;
        for (uuid, watts) in measured {
            idle_w.insert(uuid, IdlePower { watts, source: IdleSource::Measured });
        }
        for s in &samples {
            if !idle_w.contains_key(&s.gpu_uuid) {
                if let Some(found) = idle.of(&s.gpu_uuid) {
                    idle_w.insert(s.gpu_uuid.clone(), found);
                }
            }
        }
        Ok(History { samples, gpu_time, intensity, idle_w })
    }

    /// What the history knows of the workloads `ids`.
    pub fn workloads<'a>(&self, ids: impl IntoIterator<Item = &'a str>) -> Result<BTreeMap<String, WorkloadInfo>, HistoryError> {
        let mut st = self.conn.prepare("SELECT name, user, service FROM workloads WHERE id = ?1").map_err(self.err())?;
        let mut out = BTreeMap::new();
        for id in ids {
            let mut rows = st
                .query_map([id], |r| Ok(WorkloadInfo { name: r.get(0)?, user: r.get(1)?, service: r.get(2)? }))
                .map_err(self.err())?;
            if let Some(info) = rows.next() {
                out.insert(id.to_string(), info.map_err(self.err())?);
            }
        }
        Ok(out)
    }

    /// Workloads that ended at or after `since_ms`, the latest first, at most `limit`.
    pub fn ended_since(&self, since_ms: i64, limit: usize, idle: &IdleDefaults<'_>) -> Result<Vec<Ended>, HistoryError> {
        let mut st = self
            .conn
            .prepare(
                "SELECT id, name, user, gpus, started_ms, ended_ms, outcome FROM workloads
                 WHERE ended_ms IS NOT NULL AND ended_ms >= ?1 ORDER BY ended_ms DESC, id LIMIT ?2",
            )
            .map_err(self.err())?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = st
            .query_map(params![since_ms, limit], |r| {
                Ok(EndedRow {
                    id: r.get(0)?,
                    name: r.get(1)?,
                    user: r.get(2)?,
                    started_ms: r.get(4)?,
                    ended_ms: r.get(5)?,
                    outcome: r.get(6)?,
                })
            })
            .and_then(Iterator::collect::<Result<Vec<_>, _>>)
            .map_err(self.err())?;
        rows.into_iter().map(|row| self.used_by(row, idle)).collect()
    }

    /// What the workload `id` used over its life as the history recorded it (its
    /// `workloads` row may not be there yet: then from its GPU-time rows alone).
    pub fn workload_usage(&self, id: &str, idle: &IdleDefaults<'_>) -> Result<Ended, HistoryError> {
        let mut st = self
            .conn
            .prepare("SELECT id, name, user, gpus, started_ms, ended_ms, outcome FROM workloads WHERE id = ?1")
            .map_err(self.err())?;
        let mut rows = st
            .query_map([id], |r| {
                Ok(EndedRow { id: r.get(0)?, name: r.get(1)?, user: r.get(2)?, started_ms: r.get(4)?, ended_ms: r.get(5)?, outcome: r.get(6)? })
            })
            .map_err(self.err())?;
        let row = match rows.next() {
            Some(row) => row.map_err(self.err())?,
            None => EndedRow { id: id.to_string(), name: None, user: None, started_ms: None, ended_ms: None, outcome: None },
        };
        self.used_by(row, idle)
    }

    /// The energy and emissions attributed to the workload of `row` over its recorded life:
    /// the accounting of the GPUs it used, from its first GPU-time row to its last.
    fn used_by(&self, row: EndedRow, idle: &IdleDefaults<'_>) -> Result<Ended, HistoryError> {
        let (first, last): (Option<i64>, Option<i64>) = self
            .conn
            .query_row("SELECT min(t0_ms), max(t1_ms) FROM workload_gpu_time WHERE workload_id = ?1", [&row.id], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(self.err())?;
        let mut ended = Ended {
            id: row.id,
            name: row.name,
            user: row.user,
            started_unix_ms: row.started_ms,
            ended_unix_ms: row.ended_ms,
            outcome: row.outcome,
            gpu_indexes: Vec::new(),
            gpu_time_ms: 0,
            energy_mj: None,
            g_co2: None,
        };
        // Outside its GPU-time rows nothing is its; on other GPUs neither.
        let (Some(since), Some(until)) = (first, last) else {
            return Ok(ended);
        };
        let window = Window { since_ms: since, until_ms: until };
        let accounting = account::account(&self.history_of(window, idle, Some(&ended.id))?, window);
        let mut gpu_time = 0.0;
        let mut g_co2 = None;
        let mut energy = None;
        let party = account::Party::Workload(ended.id.clone());
        for gpu in accounting.gpus.values() {
            if let Some(part) = gpu.parts.get(&party) {
                *energy.get_or_insert(0) += part.energy_mj;
                gpu_time += part.gpu_time_ms;
                if let Some(g) = part.g_co2 {
                    *g_co2.get_or_insert(0.0) += g;
                }
                ended.gpu_indexes.push(gpu.index);
            }
        }
        ended.gpu_indexes.sort_unstable();
        ended.gpu_time_ms = gpu_time.round() as u64;
        ended.energy_mj = energy;
        ended.g_co2 = g_co2;
        Ok(ended)
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

    fn of(&self, uuid: &str) -> Option<IdlePower> {
        if let Some(watts) = self.configured_w {
            return Some(IdlePower { watts, source: IdleSource::Configured });
        }
        let watts = *self.driver.get_or_init(&self.load).get(uuid)?;
        Some(IdlePower { watts, source: IdleSource::PowerLimit })
    }
}

struct EndedRow {
    id: String,
    name: Option<String>,
    user: Option<String>,
    started_ms: Option<i64>,
    ended_ms: Option<i64>,
    outcome: Option<String>,
}

/// A workload the history has seen, with what it used (`vgpu ps -a`'s "ended" section; the
/// line `vgpu run` prints at its end).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Ended {
    pub id: String,
    pub name: Option<String>,
    pub user: Option<String>,
    pub started_unix_ms: Option<i64>,
    pub ended_unix_ms: Option<i64>,
    pub outcome: Option<String>,
    /// GPUs the history attributes energy to it on.
    pub gpu_indexes: Vec<i64>,
    pub gpu_time_ms: u64,
    /// `None`: no energy recorded for it.
    pub energy_mj: Option<u64>,
    /// `None`: no energy, or no intensity, recorded.
    pub g_co2: Option<f64>,
}

fn non_negative(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn cannot_open(e: &rusqlite::Error) -> bool {
    matches!(e.sqlite_error_code(), Some(rusqlite::ErrorCode::CannotOpen | rusqlite::ErrorCode::ReadOnly))
}

fn wal_of(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push("-wal");
    PathBuf::from(name)
}

/// Open `path` read-only as an immutable database (see the module's documentation).
fn open_immutable(path: &Path) -> Result<Connection, HistoryError> {
    let uri = format!("file:{}?immutable=1", uri_path(path));
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI | OpenFlags::SQLITE_OPEN_NOFOLLOW | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(uri, flags).map_err(HistoryError::sqlite(path))?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(HistoryError::sqlite(path))?;
    let found: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0)).map_err(HistoryError::sqlite(path))?;
    if found > super::SCHEMA_VERSION {
        return Err(HistoryError::NewerSchema { path: path.to_path_buf(), found });
    }
    Ok(conn)
}

/// A path as a `file:` URI's path: every byte but unreserved ones and `/` percent-encoded.
fn uri_path(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt as _;
    let mut out = String::new();
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || b"/-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_window_and_a_workloads_usage() {
        let dir = tempfile::tempdir().unwrap();
        let conn = db::open_rw(dir.path()).unwrap();
        conn.execute_batch(
            "INSERT INTO gpu_samples VALUES (0, 10000, 'GPU-x', 0, 'NVIDIA A100', 3000000, 'counter', NULL, NULL, NULL);
             INSERT INTO gpu_samples VALUES (10000, 20000, 'GPU-x', 0, 'NVIDIA A100', 1000000, 'counter', NULL, NULL, NULL);
             INSERT INTO workload_gpu_time VALUES (0, 10000, 'w1', 'GPU-x', 10000, 'ledger');
             INSERT INTO workloads VALUES ('w1', 'train', 0, 'root', NULL, 'python', 'GPU-x', 0, 10000, 'exit 0');
             INSERT INTO intensity VALUES (-100, 'fallback', 100, 'config', 0);
             INSERT INTO intensity VALUES (-100, 'reading', 200, 'file', 0);
             INSERT INTO intensity VALUES (15000, 'reading', 400, 'file', 0);
             INSERT INTO power_models VALUES ('GPU-x', 'NVIDIA A100', 0, 1410, 100, 400, 2, 1, 0, '[]');",
        )
        .unwrap();
        let reader = Reader::open(dir.path()).unwrap().unwrap();
        let h = reader.history(Window { since_ms: 5000, until_ms: 20_000 }, &IdleDefaults::new(Some(50.0), || panic!("configured"))).unwrap();
        assert_eq!(h.samples.len(), 2);
        assert_eq!(h.intensity.iter().map(|p| p.g_per_kwh).collect::<Vec<_>>(), [100.0, 200.0, 400.0]);
        assert_eq!(h.idle_w["GPU-x"], IdlePower { watts: 100.0, source: IdleSource::Measured });
        let used = reader.workload_usage("w1", &IdleDefaults::none()).unwrap();
        // 3000 J, idle 100 W × 10 s = 1000 J, 2000 J to w1 at 200 g/kWh.
        assert_eq!(used.energy_mj, Some(2_000_000));
        assert_eq!(used.gpu_time_ms, 10_000);
        assert!((used.g_co2.unwrap() - 2_000_000.0 / 3.6e9 * 200.0).abs() < 1e-12);
        assert_eq!(reader.ended_since(0, 20, &IdleDefaults::none()).unwrap(), vec![used]);
        assert!(reader.ended_since(10_001, 20, &IdleDefaults::none()).unwrap().is_empty());
        assert_eq!(reader.workload_usage("nope", &IdleDefaults::none()).unwrap().energy_mj, None);
    }

    #[test]
    fn uri_paths_are_escaped() {
        assert_eq!(uri_path(Path::new("/var/lib/a b?#%.db")), "/var/lib/a%20b%3F%23%25.db");
    }
}
