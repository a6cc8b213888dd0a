//! Reading the history for `vgpu carbon report`, `vgpu ps -a` and the line `vgpu run` prints
//! when a workload ends: a window's accounting ([`vgpu_carbon::account`]), read through the
//! rollups of its whole days and hours ([`crate::rollup`]) and the rows of the rest.
//!
//! Root reads history.db itself; anyone else reads its public copy, which `vgpu watch`
//! refreshes at most once a minute and takes no lock to read ([`super::snapshot`]);
//! [`Reader::from`] says which.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rusqlite::{params, Connection};

use super::db::{HistoryError, ReadFrom};
use crate::rollup;
use crate::source::Source;
pub use crate::rollup::Served;
pub use crate::source::{IdleDefaults, IdlePowers, MAX_INTERVAL_MS};
use vgpu_carbon::account;
use vgpu_carbon::account::Accounting;
use vgpu_carbon::account::Window;
use vgpu_carbon::account::WorkloadInfo;
use vgpu_store::state::ended::EndNote;

/// The history, opened to read.
pub struct Reader {
    conn: Connection,
    path: PathBuf,
    from: ReadFrom,
    rollups: bool,
}

impl Reader {
    /// Open the history of `lib_dir` to read, as this caller may ([`db::open_reader`]);
    /// `Ok(None)` when there is none yet.
    pub fn open(lib_dir: &Path) -> Result<Option<Reader>, HistoryError> {
        Ok(crate::reader::open_reader(lib_dir)?.map(|o| {
            let rollups = rollup::present(&o.conn);
            Reader { conn: o.conn, path: o.path, from: o.from, rollups }
        }))
    }

    /// Read through the connection a writer holds (root, the live database): what it just
    /// wrote, without opening the database again.
    pub fn from_history(history: crate::store::History) -> Reader {
        let (conn, path) = history.into_parts();
        let rollups = rollup::present(&conn);
        Reader { conn, path, from: ReadFrom::Live, rollups }
    }

    /// The live database, or the public copy and when it was made.
    pub fn from(&self) -> ReadFrom {
        self.from
    }

    /// Read every piece from its rows (`false`), as a history without rollups is read: the
    /// same accounting, to the bit, only slower (tests and benchmarks compare the two).
    pub fn use_rollups(&mut self, on: bool) {
        self.rollups = on && rollup::present(&self.conn);
    }

    fn source(&self) -> Source<'_> {
        Source { conn: &self.conn, path: &self.path, rollups: self.rollups }
    }

    fn err(&self) -> impl FnOnce(rusqlite::Error) -> HistoryError + '_ {
        HistoryError::sqlite(&self.path)
    }

    /// The accounting of `window` ([`account::account`]), of the GPUs the workload `gpus_of`
    /// used when given. Idle power per GPU: its measured model (`power_models`), else
    /// `idle` ([`IdleDefaults`]), else its lowest average power over an interval of the
    /// window. The window is accounted on the grid of days and hours ([`rollup`]): each
    /// hour piece on its own, the hours of a day merged in time order, the days merged in
    /// time order; whole days and hours from their rollups where they match, the rest from
    /// the rows. Memory stays bounded whatever the window. An interval across an hour's edge
    /// is clipped pro rata on both sides, which loses no millijoule (see the accounting's
    /// clipping rule).
    pub fn accounting(&self, window: Window, idle: &IdleDefaults<'_>, gpus_of: Option<&str>) -> Result<Accounting, HistoryError> {
        Ok(self.source().accounting(window, idle, gpus_of)?.0)
    }

    /// [`Reader::accounting`], with how its pieces were read.
    pub fn accounting_served(&self, window: Window, idle: &IdleDefaults<'_>, gpus_of: Option<&str>) -> Result<(Accounting, Served), HistoryError> {
        self.source().accounting(window, idle, gpus_of)
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
        self.ended_since_with(since_ms, limit, idle, &[])
    }

    /// [`Reader::ended_since`], with the ends `vgpu run` left for the watch and the watch has
    /// not recorded yet (`vgpu_store::state::ended`) as the history will hold them.
    pub fn ended_since_with(&self, since_ms: i64, limit: usize, idle: &IdleDefaults<'_>, left: &[EndNote]) -> Result<Vec<Ended>, HistoryError> {
        let mut st = self
            .conn
            .prepare(
                "SELECT id, name, user, gpus, started_ms, ended_ms, outcome FROM workloads
                 WHERE ended_ms IS NOT NULL AND ended_ms >= ?1 ORDER BY ended_ms DESC, id LIMIT ?2",
            )
            .map_err(self.err())?;
        let sql_limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = st
            .query_map(params![since_ms, sql_limit], |r| {
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
        let rows = with_left(rows, left, since_ms, limit);
        // One accounting over the union of their lives (each is attributed nothing outside
        // its own GPU-time rows): read once however many there are.
        let src = self.source();
        let mut spans = Vec::new();
        for row in &rows {
            spans.push(src.span(&row.id)?);
        }
        let since = spans.iter().filter_map(|s| s.map(|s| s.0)).min();
        let until = spans.iter().filter_map(|s| s.map(|s| s.1)).max();
        let accounting = match (since, until) {
            (Some(since_ms), Some(until_ms)) => Some(self.accounting(Window { since_ms, until_ms }, idle, None)?),
            _ => None,
        };
        Ok(rows.into_iter().map(|row| used_in(row, accounting.as_ref())).collect())
    }

    /// Whether any GPU time is recorded for the workload `id`: without, it used nothing the
    /// history accounts ([`Reader::workload_usage`] finds no energy), which one look at an
    /// index tells (`vgpu run` asks on the history's thread, at its workload's end).
    pub fn has_gpu_time(&self, id: &str) -> Result<bool, HistoryError> {
        let mut st = self.conn.prepare("SELECT 1 FROM workload_gpu_time WHERE workload_id = ?1 LIMIT 1").map_err(self.err())?;
        st.exists([id]).map_err(self.err())
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
        // Outside its GPU-time rows nothing is its; on other GPUs neither.
        let accounting = match self.source().span(&row.id)? {
            Some((since_ms, until_ms)) => Some(self.accounting(Window { since_ms, until_ms }, idle, Some(&row.id))?),
            None => None,
        };
        Ok(used_in(row, accounting.as_ref()))
    }
}

/// Workloads that ended at or after `since_ms` as the ends left for the watch say, the
/// latest first, at most `limit`, without what they used (no history to read it from).
pub fn ended_left(left: &[EndNote], since_ms: i64, limit: usize) -> Vec<Ended> {
    with_left(Vec::new(), left, since_ms, limit).into_iter().map(|row| used_in(row, None)).collect()
}

/// `rows` (from the history, the latest end first) with the ends `left` for the watch, as
/// the history will hold them once it records them: a workload it has already seen end
/// keeps that end (the first recorded counts) and gains the note's outcome if it had none.
fn with_left(mut rows: Vec<EndedRow>, left: &[EndNote], since_ms: i64, limit: usize) -> Vec<EndedRow> {
    for note in left {
        let w = &note.workload;
        match rows.iter_mut().find(|r| r.id == w.id) {
            Some(row) => {
                row.outcome.get_or_insert_with(|| note.outcome.clone());
            }
            None => {
                let ended_ms = i64::try_from(note.ended_unix_ms).unwrap_or(i64::MAX);
                if ended_ms >= since_ms {
                    rows.push(EndedRow {
                        id: w.id.clone(),
                        name: Some(w.name.clone()),
                        user: Some(w.user.name.clone()),
                        started_ms: i64::try_from(w.created_unix_ms).ok(),
                        ended_ms: Some(ended_ms),
                        outcome: Some(note.outcome.clone()),
                    });
                }
            }
        }
    }
    rows.sort_by(|a, b| b.ended_ms.cmp(&a.ended_ms).then_with(|| a.id.cmp(&b.id)));
    rows.truncate(limit);
    rows
}

/// The workload of `row` with what `accounting` attributes to it.
fn used_in(row: EndedRow, accounting: Option<&Accounting>) -> Ended {
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
    let Some(accounting) = accounting else {
        return ended;
    };
    let mut gpu_time = 0.0;
    let party = account::Party::Workload(ended.id.clone());
    for gpu in accounting.gpus.values() {
        if let Some(part) = gpu.parts.get(&party) {
            *ended.energy_mj.get_or_insert(0) += part.energy_mj;
            gpu_time += part.gpu_time_ms;
            if let Some(g) = part.g_co2 {
                *ended.g_co2.get_or_insert(0.0) += g;
            }
            ended.gpu_indexes.push(gpu.index);
        }
    }
    ended.gpu_indexes.sort_unstable();
    ended.gpu_time_ms = gpu_time.round() as u64;
    ended
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

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_carbon::account::{IdlePower, IdleSource};

    #[test]
    fn reads_a_window_and_a_workloads_usage() {
        let dir = tempfile::tempdir().unwrap();
        let conn = crate::db::open_rw(dir.path()).unwrap();
        conn.execute_batch(
            "INSERT INTO gpu_samples VALUES (0, 10000, 'GPU-x', 0, 'NVIDIA A100', 3000000, 'counter', NULL, NULL, NULL, NULL);
             INSERT INTO gpu_samples VALUES (10000, 20000, 'GPU-x', 0, 'NVIDIA A100', 1000000, 'counter', NULL, NULL, NULL, NULL);
             INSERT INTO workload_gpu_time VALUES (0, 10000, 'w1', 'GPU-x', 10000, 'ledger');
             INSERT INTO workloads VALUES ('w1', 'train', 0, 'root', NULL, 'python', 'GPU-x', 0, 10000, 'exit 0');
             INSERT INTO intensity VALUES (-100, 'fallback', 100, 'config', 0);
             INSERT INTO intensity VALUES (-100, 'reading', 200, 'file', 0);
             INSERT INTO intensity VALUES (15000, 'reading', 400, 'file', 0);
             INSERT INTO power_models VALUES ('GPU-x', 'NVIDIA A100', 0, 1410, 100, 400, 2, 1, 0, '[]');",
        )
        .unwrap();
        let reader = Reader::open(dir.path()).unwrap().unwrap();
        let window = Window { since_ms: 5000, until_ms: 20_000 };
        let intensity = reader.source().intensity(window).unwrap();
        assert_eq!(intensity.iter().map(|p| p.g_per_kwh).collect::<Vec<_>>(), [100.0, 200.0, 400.0]);
        let idle = IdleDefaults::new(Some(50.0), || panic!("configured"));
        assert_eq!(reader.source().idle_w(window, &idle, None).unwrap()["GPU-x"], IdlePower { watts: 100.0, source: IdleSource::Measured });
        // From 5 s: half the first interval (1500 J, idle 500 J, w1 1000 J at 200 g/kWh),
        // the second (1000 J idle, at 400 g/kWh from 15 s on, its midpoint).
        let a = reader.accounting(window, &idle, None).unwrap();
        let gpu = &a.gpus["GPU-x"];
        assert_eq!(gpu.energy_mj, 2_500_000);
        assert_eq!(gpu.parts[&account::Party::Idle].energy_mj, 1_500_000);
        assert_eq!(gpu.parts[&account::Party::Workload("w1".into())].energy_mj, 1_000_000);
        let used = reader.workload_usage("w1", &IdleDefaults::none()).unwrap();
        // 3000 J, idle 100 W × 10 s = 1000 J, 2000 J to w1 at 200 g/kWh.
        assert_eq!(used.energy_mj, Some(2_000_000));
        assert_eq!(used.gpu_time_ms, 10_000);
        assert!((used.g_co2.unwrap() - 2_000_000.0 / 3.6e9 * 200.0).abs() < 1e-12);
        assert_eq!(reader.ended_since(0, 20, &IdleDefaults::none()).unwrap(), vec![used]);
        assert!(reader.ended_since(10_001, 20, &IdleDefaults::none()).unwrap().is_empty());
        assert_eq!(reader.workload_usage("nope", &IdleDefaults::none()).unwrap().energy_mj, None);
        // Whether any GPU time is recorded: as the usage says.
        assert!(reader.has_gpu_time("w1").unwrap());
        assert!(!reader.has_gpu_time("nope").unwrap());
    }

    #[test]
    fn a_long_window_is_accounted_an_hour_at_a_time_to_the_same_total() {
        // 3 h of 7-minute intervals (not aligned with the hours), one workload on half of
        // each: the total is every interval's energy, the workload's share the same as one
        // window's would give (its GPU time is proportional, the split exact).
        let dir = tempfile::tempdir().unwrap();
        let conn = crate::db::open_rw(dir.path()).unwrap();
        let step = 7 * 60_000;
        let mut total = 0;
        for k in 0..26i64 {
            let (t0, t1) = (k * step + 1, (k + 1) * step + 1);
            let e = 1_000_003 * (k as u64 + 1);
            total += e;
            conn.execute("INSERT INTO gpu_samples VALUES (?1, ?2, 'GPU-x', 0, NULL, ?3, 'counter', NULL, NULL, NULL, NULL)", params![t0, t1, e]).unwrap();
            conn.execute("INSERT INTO workload_gpu_time VALUES (?1, ?2, 'w1', 'GPU-x', ?3, 'ledger')", params![t0, t1, step / 2]).unwrap();
        }
        let reader = Reader::open(dir.path()).unwrap().unwrap();
        let window = Window { since_ms: 0, until_ms: 26 * step + 1 };
        let chunked = reader.accounting(window, &IdleDefaults::new(Some(0.0), BTreeMap::new), None).unwrap();
        let gpu = &chunked.gpus["GPU-x"];
        assert_eq!(gpu.energy_mj, total);
        assert_eq!(gpu.parts.values().map(|p| p.energy_mj).sum::<u64>(), total);
        // With nobody else on the GPU and no idle power, all of it is the workload's.
        assert_eq!(gpu.parts[&account::Party::Workload("w1".into())].energy_mj, total);
        assert_eq!(gpu.parts[&account::Party::Workload("w1".into())].gpu_time_ms.round() as i64, 26 * step / 2);
    }

    fn note(id: &str, ended_ms: u64, outcome: &str) -> EndNote {
        let mut w = vgpu_store::state::workload::tests::sample();
        w.id = id.to_string();
        w.name = format!("job-{id}");
        w.created_unix_ms = 100;
        EndNote::new(w, ended_ms, outcome.to_string())
    }

    fn row(id: &str, ended_ms: i64, outcome: Option<&str>) -> EndedRow {
        EndedRow { id: id.into(), name: Some(id.into()), user: Some("root".into()), started_ms: Some(1), ended_ms: Some(ended_ms), outcome: outcome.map(str::to_string) }
    }

    #[test]
    fn ends_left_for_the_watch_are_listed_as_the_history_will_hold_them() {
        // The watch recorded w1's end first (no outcome): its time stays, the note's outcome
        // fills in. w2 and w3 are only notes; w4 ended before the window.
        let rows = vec![row("w1", 500, None), row("w0", 400, Some("exit 0"))];
        let left = [note("w1", 450, "exit 3"), note("w2", 700, "exit 1"), note("w3", 600, "failed: x"), note("w4", 50, "exit 0")];
        let got = with_left(rows, &left, 100, 10);
        let summary: Vec<_> = got.iter().map(|r| (r.id.as_str(), r.ended_ms, r.outcome.as_deref())).collect();
        assert_eq!(summary, vec![("w2", Some(700), Some("exit 1")), ("w3", Some(600), Some("failed: x")), ("w1", Some(500), Some("exit 3")), ("w0", Some(400), Some("exit 0"))]);
        assert_eq!(got[0].name.as_deref(), Some("job-w2"));
        assert_eq!(got[0].started_ms, Some(100));
        // At most `limit`, the latest kept.
        let got = with_left(vec![row("w0", 400, Some("exit 0"))], &left, 100, 2);
        assert_eq!(got.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), vec!["w2", "w3"]);
        // Without a history: the notes alone, nothing used.
        let alone = ended_left(&left, 100, 10);
        assert_eq!(alone.iter().map(|e| (e.id.as_str(), e.energy_mj)).collect::<Vec<_>>(), vec![("w2", None), ("w3", None), ("w1", None)]);
    }
}
