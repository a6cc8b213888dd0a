//! The typed writer over history.db ([`super::db::open_rw`]): one tick's rows in one
//! transaction, workloads as they start and end, intensity readings, clock decisions, and
//! retention.
//!
//! A failed write leaves the database as it was (the transaction is rolled back when it is
//! dropped uncommitted; a writer killed inside it leaves the WAL's last commit). A full disk
//! is [`WriteError::DiskFull`], one clear line, never a panic.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rusqlite::{params, Connection, ErrorCode, OptionalExtension as _};
use thiserror::Error;

use super::db::{self, HistoryError};
use super::source::{IdleDefaults, Source, RAW_BATCH};
use super::rollup;
use super::tick::{LastGpu, Tick};

/// Why a history write failed.
#[derive(Debug, Error)]
pub enum WriteError {
    #[error("{}: disk full: {detail}", .path.display())]
    DiskFull { path: PathBuf, detail: String },
    #[error("{}: busy: another process holds the database's write lock", .path.display())]
    Busy { path: PathBuf },
    #[error("{}: damaged: {detail} (move it aside; vgpu watch starts a new one)", .path.display())]
    Damaged { path: PathBuf, detail: String },
    #[error("{}: a symbolic link: refused, never followed (remove it; the watch then creates the database)", .path.display())]
    Link { path: PathBuf },
    #[error(transparent)]
    Open(HistoryError),
    #[error("{}: {source}", .path.display())]
    Sqlite { path: PathBuf, source: rusqlite::Error },
}

impl WriteError {
    /// A short name of the kind of failure, so that a caller can say each kind once.
    pub fn kind(&self) -> &'static str {
        match self {
            WriteError::DiskFull { .. } => "disk-full",
            WriteError::Busy { .. } => "busy",
            WriteError::Damaged { .. } => "damaged",
            WriteError::Link { .. } | WriteError::Open(_) => "open",
            WriteError::Sqlite { .. } => "sqlite",
        }
    }

    /// The caller may not write the database (a user's command where root's watch records).
    pub fn is_permission(&self) -> bool {
        match self {
            WriteError::Open(HistoryError::Io { source, .. }) => source.kind() == std::io::ErrorKind::PermissionDenied,
            WriteError::Sqlite { source, .. } => matches!(source.sqlite_error_code(), Some(ErrorCode::ReadOnly | ErrorCode::CannotOpen | ErrorCode::PermissionDenied)),
            _ => false,
        }
    }

    fn from_sqlite(path: &Path, source: rusqlite::Error) -> WriteError {
        let path = path.to_path_buf();
        match source.sqlite_error_code() {
            Some(ErrorCode::DiskFull) => WriteError::DiskFull { path, detail: source.to_string() },
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => WriteError::Busy { path },
            Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => WriteError::Damaged { path, detail: source.to_string() },
            _ => WriteError::Sqlite { path, source },
        }
    }

    fn from_open(e: HistoryError) -> WriteError {
        match e {
            HistoryError::Io { path, source } if source.raw_os_error() == Some(libc::ENOSPC) => {
                WriteError::DiskFull { path, detail: source.to_string() }
            }
            HistoryError::Io { path, source } if source.raw_os_error() == Some(libc::ELOOP) => WriteError::Link { path },
            HistoryError::Sqlite { path, source } => WriteError::from_sqlite(&path, source),
            HistoryError::BadCopy { path, detail } => WriteError::Damaged { path, detail },
            HistoryError::Migrating { path } => WriteError::Busy { path },
            other => WriteError::Open(other),
        }
    }
}

/// What a workload is, for the `workloads` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadInfo {
    pub id: String,
    pub name: String,
    pub uid: u32,
    pub user: String,
    pub service: Option<String>,
    pub command: String,
    /// GPU UUIDs.
    pub gpus: Vec<String>,
    pub started_ms: u64,
}

impl WorkloadInfo {
    pub fn of(w: &vgpu_store::state::Workload) -> WorkloadInfo {
        WorkloadInfo {
            id: w.id.clone(),
            name: w.name.clone(),
            uid: w.user.uid,
            user: w.user.name.clone(),
            service: w.service.as_ref().map(|s| s.name.clone()),
            // The record's, bounded (again: a record from before the bound).
            command: vgpu_store::state::workload::bounded_command(&w.command).join(" "),
            gpus: w.gpus.iter().map(|g| g.uuid.clone()).collect(),
            started_ms: w.created_unix_ms,
        }
    }
}

/// The `intensity` table's kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntensityKind {
    Reading,
    Fallback,
    Forecast,
}

impl IntensityKind {
    fn as_str(self) -> &'static str {
        match self {
            IntensityKind::Reading => "reading",
            IntensityKind::Fallback => "fallback",
            IntensityKind::Forecast => "forecast",
        }
    }
}

/// How many rows [`History::prune`] deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub rows: usize,
}

/// What one [`History::roll_up`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RollUp {
    /// Hours and days rolled up.
    pub made: usize,
    /// Hours and days still due (the next pass's).
    pub left: usize,
}

/// The longest a transaction of [`History::roll_up`] holds the write lock (then it commits
/// and takes it again): well below the 2 s a command's record may wait for it.
pub const ROLLUP_TX: Duration = Duration::from_millis(200);

/// history.db, open for writing.
pub struct History {
    conn: Connection,
    path: PathBuf,
    /// Every wait of this connection ends by then (`open_within`).
    deadline: Option<Instant>,
}

impl History {
    /// Open (creating) `<lib_dir>/history.db`; each wait for a lock is bounded by
    /// [`db::BUSY_TIMEOUT`].
    pub fn open(lib_dir: &Path) -> Result<History, WriteError> {
        let conn = db::open_rw(lib_dir).map_err(WriteError::from_open)?;
        Ok(History { conn, path: db::path_in(lib_dir), deadline: None })
    }

    /// Open, with every wait from now on (the open's included) ending by `deadline` in
    /// total, not per statement: a command's best-effort record cannot take longer whatever
    /// holds the database ([`super::best_effort`]).
    pub fn open_within(lib_dir: &Path, deadline: Instant) -> Result<History, WriteError> {
        let path = db::path_in(lib_dir);
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(WriteError::Busy { path });
        }
        let conn = db::open_rw_within(lib_dir, left).map_err(WriteError::from_open)?;
        Ok(History { conn, path, deadline: Some(deadline) })
    }

    /// This connection with every wait from now on ending by `deadline` in total, as though
    /// it were opened now with [`History::open_within`] (a connection opened ahead of its use,
    /// [`crate::Ahead`]).
    pub fn bounded_by(self, deadline: Instant) -> History {
        History { deadline: Some(deadline), ..self }
    }

    /// Before a statement: what is left of the deadline becomes the connection's busy wait
    /// (none left: busy).
    fn bound(&self) -> Result<(), WriteError> {
        let Some(deadline) = self.deadline else { return Ok(()) };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(WriteError::Busy { path: self.path.clone() });
        }
        self.conn.busy_timeout(left.min(db::BUSY_TIMEOUT)).map_err(self.err())
    }

    fn err(&self) -> impl Fn(rusqlite::Error) -> WriteError + '_ {
        move |e| WriteError::from_sqlite(&self.path, e)
    }

    /// Wait at most `wait` for another connection's lock (shorter than
    /// [`db::BUSY_TIMEOUT`] for the watch, whose rounds must not stall on it).
    pub fn set_busy_timeout(&self, wait: Duration) -> Result<(), WriteError> {
        self.conn.busy_timeout(wait.min(db::BUSY_TIMEOUT)).map_err(self.err())
    }

    /// The connection, for readers in tests and tools.
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// The connection and the database's path, for a reader ([`crate::query::Reader::from_history`]).
    pub fn into_parts(self) -> (Connection, PathBuf) {
        (self.conn, self.path)
    }

    /// One tick's rows (gpu_samples and workload_gpu_time), all or none.
    pub fn record_tick(&mut self, tick: &Tick) -> Result<(), WriteError> {
        self.bound()?;
        let path = self.path.clone();
        let err = |e| WriteError::from_sqlite(&path, e);
        let tx = self.conn.transaction().map_err(err)?;
        {
            let mut gpu = tx
                .prepare_cached(
                    "INSERT INTO gpu_samples (t0_ms, t1_ms, gpu_uuid, gpu_index, gpu_name, energy_mj, energy_source, busy_ms, sm_clock_mhz, power_w, energy_counter_mj)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                )
                .map_err(err)?;
            for r in &tick.gpus {
                gpu.execute(params![
                    ms(r.t0_ms),
                    ms(r.t1_ms),
                    r.gpu_uuid,
                    r.gpu_index,
                    r.gpu_name,
                    ms(r.energy_mj),
                    r.energy_source.as_str(),
                    r.busy_ms.map(ms),
                    r.sm_clock_mhz,
                    r.power_w,
                    r.energy_counter_mj.map(ms),
                ])
                .map_err(err)?;
            }
        }
        // A test kills the writer here: the half-written tick must not survive.
        vgpu_store::stop_point::stop_point("history:mid-tick");
        {
            let mut work = tx
                .prepare_cached(
                    "INSERT INTO workload_gpu_time (t0_ms, t1_ms, workload_id, gpu_uuid, busy_ms, source) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )
                .map_err(err)?;
            for r in &tick.workloads {
                work.execute(params![ms(r.t0_ms), ms(r.t1_ms), r.workload_id, r.gpu_uuid, ms(r.busy_ms), r.source.as_str()]).map_err(err)?;
            }
        }
        tx.commit().map_err(err)
    }

    /// The last sample of each GPU (its end and its counter reading), so that a restarted
    /// watch continues the interval.
    pub fn last_gpus(&self) -> Result<Vec<(String, LastGpu)>, WriteError> {
        self.bound()?;
        // SQLite gives the bare columns of the row where max() is found.
        let mut stmt = self
            .conn
            .prepare("SELECT gpu_uuid, max(t1_ms), energy_counter_mj FROM gpu_samples GROUP BY gpu_uuid")
            .map_err(self.err())?;
        let rows = stmt
            .query_map([], |r| {
                let t: i64 = r.get(1)?;
                let counter: Option<i64> = r.get(2)?;
                Ok((r.get::<_, String>(0)?, LastGpu { t_ms: t.max(0) as u64, counter_mj: counter.map(|c| c.max(0) as u64) }))
            })
            .map_err(self.err())?;
        rows.collect::<Result<Vec<_>, _>>().map_err(self.err())
    }

    /// Record a workload seen running (its start is kept from the first time).
    pub fn upsert_workload(&self, w: &WorkloadInfo) -> Result<(), WriteError> {
        self.bound()?;
        self.conn
            .execute(
                "INSERT INTO workloads (id, name, uid, user, service, command, gpus, started_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
                 ON CONFLICT (id) DO UPDATE SET name = excluded.name, uid = excluded.uid, user = excluded.user,
                   service = excluded.service, command = excluded.command, gpus = excluded.gpus,
                   started_ms = coalesce(workloads.started_ms, excluded.started_ms)",
                params![w.id, w.name, w.uid, w.user, w.service, w.command, w.gpus.join(","), ms(w.started_ms)],
            )
            .map_err(self.err())?;
        Ok(())
    }

    /// Record that a workload ended: the first end's time counts, and the first outcome said
    /// (the watch sees a record gone without knowing how it ended; `vgpu run` knows). Returns
    /// whether a row changed.
    pub fn end_workload(&self, id: &str, ended_ms: u64, outcome: Option<&str>) -> Result<bool, WriteError> {
        self.bound()?;
        let n = self
            .conn
            .execute(
                "UPDATE workloads SET ended_ms = coalesce(ended_ms, ?2), outcome = coalesce(outcome, ?3)
                 WHERE id = ?1 AND (ended_ms IS NULL OR (outcome IS NULL AND ?3 IS NOT NULL))",
                params![id, ms(ended_ms), outcome],
            )
            .map_err(self.err())?;
        Ok(n > 0)
    }

    /// A workload's row and its end in one transaction (`vgpu run` at its workload's end):
    /// [`Self::upsert_workload`] then [`Self::end_workload`], committed together.
    pub fn record_ended(&self, w: &WorkloadInfo, ended_ms: u64, outcome: Option<&str>) -> Result<bool, WriteError> {
        self.bound()?;
        let tx = self.conn.unchecked_transaction().map_err(self.err())?;
        self.upsert_workload(w)?;
        let changed = self.end_workload(&w.id, ended_ms, outcome)?;
        tx.commit().map_err(self.err())?;
        Ok(changed)
    }

    /// The workloads recorded as running (no end), e.g. to close those that ended while no
    /// watch ran.
    pub fn running_workloads(&self) -> Result<Vec<String>, WriteError> {
        self.bound()?;
        let mut stmt = self.conn.prepare("SELECT id FROM workloads WHERE ended_ms IS NULL").map_err(self.err())?;
        let rows = stmt.query_map([], |r| r.get::<_, String>(0)).map_err(self.err())?;
        rows.collect::<Result<Vec<_>, _>>().map_err(self.err())
    }

    /// Record one intensity figure. A reading already recorded for its time is not recorded
    /// twice (returns false); a fallback or forecast for the same time replaces the old one.
    pub fn record_intensity(&self, kind: IntensityKind, ts_ms: u64, g_per_kwh: f64, source: &str, fetched_ms: u64) -> Result<bool, WriteError> {
        self.bound()?;
        let verb = if kind == IntensityKind::Reading { "INSERT OR IGNORE" } else { "INSERT OR REPLACE" };
        let n = self
            .conn
            .execute(
                &format!("{verb} INTO intensity (ts_ms, kind, g_per_kwh, source, fetched_ms) VALUES (?1, ?2, ?3, ?4, ?5)"),
                params![ms(ts_ms), kind.as_str(), g_per_kwh, source, ms(fetched_ms)],
            )
            .map_err(self.err())?;
        Ok(n > 0)
    }

    /// Record what vgpu used as the intensity (`--intensity` overrides are not readings of
    /// the grid and are not recorded).
    pub fn record_resolved(&self, found: &vgpu_carbon::intensity::Intensity, now_ms: u64) -> Result<bool, WriteError> {
        use vgpu_carbon::intensity::Status;
        let ts = found.timestamp.timestamp_millis().max(0) as u64;
        match found.status {
            Status::Fresh | Status::Cached => self.record_intensity(IntensityKind::Reading, ts, found.intensity, &found.source, now_ms),
            Status::Fallback => self.record_intensity(IntensityKind::Fallback, now_ms, found.intensity, &found.source, now_ms),
            Status::Override => Ok(false),
        }
    }

    /// Record one clock decision, the whole of it in `record` (as in carbon.jsonl).
    pub fn record_decision(&self, d: &vgpu_carbon::log::Decision) -> Result<(), WriteError> {
        self.bound()?;
        let record = serde_json::to_string(d).map_err(|e| WriteError::Sqlite { path: self.path.clone(), source: rusqlite::Error::ToSqlConversionFailure(e.into()) })?;
        let action = serde_json::to_value(d.action).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
        self.conn
            .execute(
                "INSERT INTO decisions (ts_ms, action, reason, intensity, budget_g_per_hour, predicted_g_per_hour, budget_met, record)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    d.time.timestamp_millis(),
                    action,
                    d.reason,
                    d.intensity,
                    d.budget_g_per_hour,
                    d.predicted_g_per_hour,
                    d.budget_met,
                    record
                ],
            )
            .map_err(self.err())?;
        Ok(())
    }

    /// Delete what is older than `keep` before `now_ms`: time-series rows that ended before
    /// the horizon and workloads that ended before it, and the rollups of the hours that
    /// ended by then (first, so that the triggers find none to drop). Power models and
    /// sensitivities stay.
    pub fn prune(&mut self, now_ms: u64, keep: Duration) -> Result<Pruned, WriteError> {
        self.bound()?;
        let horizon = ms(now_ms.saturating_sub(keep.as_millis().min(u128::from(u64::MAX)) as u64));
        let path = self.path.clone();
        let err = |e| WriteError::from_sqlite(&path, e);
        let tx = self.conn.transaction().map_err(err)?;
        for sql in [
            "DELETE FROM rollup_parts WHERE start_ms + span_ms <= ?1",
            "DELETE FROM rollup_gpus WHERE start_ms + span_ms <= ?1",
            "DELETE FROM rollups WHERE start_ms + span_ms <= ?1",
        ] {
            tx.execute(sql, params![horizon]).map_err(err)?;
        }
        let mut rows = 0;
        for sql in [
            "DELETE FROM gpu_samples WHERE t1_ms < ?1",
            "DELETE FROM workload_gpu_time WHERE t1_ms < ?1",
            "DELETE FROM intensity WHERE ts_ms < ?1",
            "DELETE FROM decisions WHERE ts_ms < ?1",
            "DELETE FROM workloads WHERE ended_ms < ?1",
        ] {
            rows += tx.execute(sql, params![horizon]).map_err(err)?;
        }
        tx.commit().map_err(err)?;
        Ok(Pruned { rows })
    }

    /// Make the rollups that are due ([`rollup`]): those of the hours and days that are over
    /// and have none, and with `check` also those that no longer match the intensity figures
    /// or a GPU's idle power (`idle`: as `vgpu carbon report` resolves it on this host), the
    /// hours first, the newest first, for at most `budget` (past it, the hours or the day in
    /// hand are finished). Each batch of at most [`ROLLUP_TX`] is one transaction: killed at
    /// any point, the database keeps the rollups of the batches committed, and a span
    /// without one is read from what is below it. Returns what was made and what is left for
    /// the next pass.
    pub fn roll_up(&mut self, idle: &IdleDefaults<'_>, check: bool, budget: Duration) -> Result<RollUp, WriteError> {
        self.roll_up_at(idle, check, budget, ms(crate::now_ms()))
    }

    /// [`History::roll_up`] as if it were `now_ms`.
    pub(crate) fn roll_up_at(&mut self, idle: &IdleDefaults<'_>, check: bool, budget: Duration, now_ms: i64) -> Result<RollUp, WriteError> {
        self.bound()?;
        let started = Instant::now();
        let path = self.path.clone();
        let open = |e| WriteError::from_open(e);
        let due = rollup::due(&Source { conn: &self.conn, path: &path, rollups: false }, idle, check, now_ms).map_err(open)?;
        // The hours first (a day is made from its hours'), then the days.
        let todo: Vec<(i64, i64)> = due.hours.iter().map(|&h| (rollup::HOUR_MS, h)).chain(due.days.iter().map(|&d| (rollup::DAY_MS, d))).collect();
        let mut made = 0;
        let mut done = 0;
        while done < todo.len() && (done == 0 || started.elapsed() < budget) {
            self.bound()?;
            let tx = self.conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).map_err(|e| WriteError::from_sqlite(&path, e))?;
            let batch = Instant::now();
            let now = ms(crate::now_ms());
            let src = Source { conn: &tx, path: &path, rollups: false };
            while let Some(&(span, start)) = todo.get(done) {
                if span == rollup::DAY_MS {
                    made += usize::from(rollup::build_day(&src, idle, start, now).map_err(open)?);
                    done += 1;
                } else {
                    // A run of consecutive hours (the list is the newest first), read at once.
                    let mut run = vec![start];
                    while run.len() < RAW_BATCH && todo.get(done + run.len()) == Some(&(span, run[run.len() - 1] - span)) {
                        run.push(run[run.len() - 1] - span);
                    }
                    run.reverse();
                    made += rollup::build_hours(&src, idle, &run, now).map_err(open)?;
                    done += run.len();
                }
                if batch.elapsed() >= ROLLUP_TX || started.elapsed() >= budget {
                    break;
                }
            }
            // A test kills the writer here: the batch in hand must not survive, nor harm.
            vgpu_store::stop_point::stop_point("history:mid-rollup");
            tx.commit().map_err(|e| WriteError::from_sqlite(&path, e))?;
        }
        Ok(RollUp { made, left: todo.len() - done })
    }

    /// `PRAGMA integrity_check`'s answer ("ok" when sound).
    pub fn integrity_check(&self) -> Result<String, WriteError> {
        self.conn.query_row("PRAGMA integrity_check", [], |r| r.get(0)).optional().map(|v| v.unwrap_or_default()).map_err(self.err())
    }
}

/// A u64 figure as SQLite's INTEGER (i64), saturating.
fn ms(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests;
