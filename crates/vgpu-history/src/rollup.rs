//! Rollups (schema version 2): the accounting of each whole hour and each whole day, kept so
//! that a report or `vgpu ps -a` reads a few rows per GPU-day instead of the day's ticks.
//!
//! The accounting of a window is defined on the grid of the Unix epoch's days and hours
//! (UTC): the window is cut into day pieces ([`cut`]), each day piece into hour pieces; each
//! hour piece is accounted on its own ([`account::account`]), the hour pieces of a day merged
//! in time order into the day's accounting, and the days merged in time order into the
//! window's. A rollup is the accounting of one whole hour, or of one whole day, stored as it
//! came out — the integer millijoules of each GPU and party, the GPU time and the grams as
//! the same `f64`s — with what it depended on beyond the rows:
//!
//! * the intensity figures in force over its span (`rollups.intensity`, [`Figures::key`]);
//! * each GPU's idle power and where it came from (`rollup_gpus.idle_w`, `idle_source`).
//!
//! A reader uses a rollup only when both are what it would use itself for that span; any
//! other piece (the ragged ends of the window, a span not rolled up yet, one whose figures
//! changed) it accounts from the hours below it, down to the rows. As the rows cannot change
//! under a rollup — a trigger on `gpu_samples` and `workload_gpu_time` deletes the rollups of
//! every hour and day a row inserted, changed or deleted overlaps, in the same transaction —
//! the report read through rollups is the report read from the rows alone, to the last bit.
//!
//! `vgpu watch`'s history thread makes them ([`crate::History::roll_up`]): the hours that
//! ended at least [`SETTLE_MS`] before the latest row, a bounded batch per transaction, the
//! newest first, then the days whose hours are made (from those hours' rollups); again
//! where a trigger dropped one, and where the intensity figures or a GPU's idle power
//! changed since. A day with a GPU whose idle power is its lowest observed (which depends on
//! the window) gets no rollup: its hours are read.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use rusqlite::{params, Connection, OptionalExtension as _};

use crate::db::HistoryError;
use crate::source::{IdleDefaults, Source, MAX_INTERVAL_MS, RAW_BATCH};
use vgpu_carbon::account::{self, Accounting, GpuAccount, GpuSample, GpuTime, IdlePower, IdleSource, IntensityPoint, Part, Party, Window};

/// An hour, in milliseconds: the finer grid of the accounting and its rollups.
pub const HOUR_MS: i64 = 3_600_000;

/// A day (of the Unix epoch, UTC), in milliseconds: the coarser grid.
pub const DAY_MS: i64 = 24 * HOUR_MS;

/// How long after a span's end (by the latest row's end) its rollup is made. The rows of
/// an hour are all written by then: the watch writes a row per GPU per `[history]
/// interval` with the time since the previous one, and a restarted watch bridges from the
/// last row (when it starts within 10 minutes of it). Once the latest row is that old
/// (no watch writes), everything up to it is made. A row that comes later anyway drops the
/// span's rollup (the triggers), and the next pass makes it again.
pub const SETTLE_MS: i64 = 15 * 60_000;

/// What `rollups.intensity` says when no intensity figure is known (emissions unknown).
pub const NO_FIGURES: &str = "none";

/// `rollups.intensity` of a day that gets no rollup (a GPU's idle power depends on the
/// window): never a reader's key, so its hours are read; made again when something changes.
pub const NO_DAY: &str = "-";

/// How many days' rollups are read at a time (memory stays bounded whatever the window).
const DAY_BATCH: usize = 31;

/// The start of the span of `span` ms that `t` is in.
pub fn floor_to(t: i64, span: i64) -> i64 {
    t.div_euclid(span) * span
}

/// `window` cut on the grid of `span`, in time order: `[since, next edge)`, the whole spans,
/// `[last edge, until)` (a window inside one span is one piece).
pub fn cut(window: Window, span: i64) -> impl Iterator<Item = Window> {
    let mut since = window.since_ms;
    std::iter::from_fn(move || {
        if since >= window.until_ms {
            return None;
        }
        let next = floor_to(since, span).saturating_add(span).min(window.until_ms);
        let piece = Window { since_ms: since, until_ms: next };
        since = next;
        Some(piece)
    })
}

/// Whether `piece` is a whole span of the grid of `span`.
pub fn is_whole(piece: Window, span: i64) -> bool {
    piece.since_ms.rem_euclid(span) == 0 && piece.until_ms.checked_sub(piece.since_ms) == Some(span)
}

/// Add `piece` to the accounting so far (the first piece is it).
pub(crate) fn fold(into: &mut Option<Accounting>, piece: Accounting) {
    match into {
        Some(so_far) => so_far.merge(piece),
        None => *into = Some(piece),
    }
}

/// Intensity figures as the accounting reads them ([`account::Steps`]): those that are
/// finite and not negative, in time order (of equal times, the later in the list wins).
pub struct Figures(Vec<IntensityPoint>);

impl Figures {
    pub fn new(points: &[IntensityPoint]) -> Figures {
        let mut points: Vec<IntensityPoint> = points.iter().copied().filter(|p| p.g_per_kwh.is_finite() && p.g_per_kwh >= 0.0).collect();
        points.sort_by_key(|p| p.ts_ms);
        Figures(points)
    }

    /// The step function over `[h0, h1)`, written out: [`NO_FIGURES`] without any figure;
    /// else the figure in force at `h0` (the latest at or before it; before the first, the
    /// first), then ` @TS FIGURE` for each time inside `(h0, h1)` where a figure starts
    /// (the one that wins there). Two equal keys are the same function over the span, so
    /// the same grams for the same energy (each interval's at its midpoint). Figures are
    /// written as Rust writes an `f64`: the shortest text that reads back as the same
    /// number.
    pub fn key(&self, h0: i64, h1: i64) -> String {
        let points = &self.0;
        let Some(first) = points.first() else { return NO_FIGURES.to_string() };
        let n = points.partition_point(|p| p.ts_ms <= h0);
        let at = if n > 0 { points[n - 1].g_per_kwh } else { first.g_per_kwh };
        let mut key = format!("{at}");
        let mut i = n;
        while i < points.len() && points[i].ts_ms < h1 {
            let ts = points[i].ts_ms;
            let mut last = i;
            while last + 1 < points.len() && points[last + 1].ts_ms == ts {
                last += 1;
            }
            let _ = write!(key, " @{ts} {}", points[last].g_per_kwh);
            i = last + 1;
        }
        key
    }
}

fn source_name(source: IdleSource) -> &'static str {
    match source {
        IdleSource::Measured => "measured",
        IdleSource::Configured => "configured",
        IdleSource::PowerLimit => "power_limit",
        IdleSource::LowestObserved => "lowest_observed",
    }
}

fn source_of(name: &str) -> Option<IdleSource> {
    Some(match name {
        "measured" => IdleSource::Measured,
        "configured" => IdleSource::Configured,
        "power_limit" => IdleSource::PowerLimit,
        "lowest_observed" => IdleSource::LowestObserved,
        _ => return None,
    })
}

fn party_of(kind: &str, workload_id: String) -> Option<Party> {
    Some(match kind {
        "workload" => Party::Workload(workload_id),
        "idle" => Party::Idle,
        "unattributed" => Party::Unattributed,
        _ => return None,
    })
}

/// One GPU's accounting of one span, as stored.
struct StoredGpu {
    uuid: String,
    index: i64,
    name: Option<String>,
    energy_mj: u64,
    idle: IdlePower,
    /// What the accounting said of this GPU (its idle power taken as the lowest observed).
    note: Option<String>,
    parts: BTreeMap<Party, Part>,
}

/// One span's rollup, as stored.
pub(crate) struct Stored {
    key: String,
    /// By UUID.
    gpus: BTreeMap<String, StoredGpu>,
}

impl Stored {
    /// The accounting of `piece` (this whole span) from the rollup, of the GPUs in `only`
    /// when given, if it is the one the rows would give with these intensity figures and
    /// idle powers: `None` when it is not (read what is below it); `Some(None)` when the
    /// span has no row of those GPUs.
    pub(crate) fn accounting(self, piece: Window, figures: &Figures, idle_w: &BTreeMap<String, IdlePower>, only: Option<&BTreeSet<String>>) -> Option<Option<Accounting>> {
        if self.key != figures.key(piece.since_ms, piece.until_ms) {
            return None;
        }
        let wanted = |uuid: &str| only.is_none_or(|o| o.contains(uuid));
        let day = piece.until_ms - piece.since_ms > HOUR_MS;
        for gpu in self.gpus.values().filter(|g| wanted(&g.uuid)) {
            let now = idle_w.get(&gpu.uuid)?;
            if now.source != gpu.idle.source || now.watts.to_bits() != gpu.idle.watts.to_bits() {
                return None;
            }
            // A day's notes would be its hours' (none is made for such a GPU).
            if day && (now.source == IdleSource::LowestObserved || gpu.note.is_some()) {
                return None;
            }
        }
        let emissions_known = self.key != NO_FIGURES;
        // As `account` says them: no intensity first, then each GPU's, by UUID.
        let mut notes = Vec::new();
        if !emissions_known {
            notes.push(account::NO_INTENSITY.to_string());
        }
        let mut gpus = BTreeMap::new();
        for (uuid, gpu) in self.gpus {
            if !wanted(&uuid) {
                continue;
            }
            notes.extend(gpu.note);
            gpus.insert(uuid, GpuAccount { uuid: gpu.uuid, index: gpu.index, name: gpu.name, energy_mj: gpu.energy_mj, idle: gpu.idle, parts: gpu.parts });
        }
        if gpus.is_empty() {
            return Some(None);
        }
        Some(Some(Accounting { window: piece, gpus, emissions_known, notes }))
    }
}

fn non_negative(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// The rollups of `span` starting in `[from_ms, until_ms)`, by start, of the GPUs in `only`
/// when given (a stored row that cannot be read as written is left out, and its span with
/// it).
pub(crate) fn load(conn: &Connection, path: &std::path::Path, span: i64, from_ms: i64, until_ms: i64, only: Option<&BTreeSet<String>>) -> Result<BTreeMap<i64, Stored>, HistoryError> {
    let err = HistoryError::sqlite(path);
    let mut out: BTreeMap<i64, Stored> = BTreeMap::new();
    let mut st = conn.prepare_cached("SELECT start_ms, intensity FROM rollups WHERE span_ms = ?1 AND start_ms >= ?2 AND start_ms < ?3").map_err(err)?;
    let rows = st.query_map(params![span, from_ms, until_ms], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))).map_err(HistoryError::sqlite(path))?;
    for row in rows {
        let (start, key) = row.map_err(HistoryError::sqlite(path))?;
        out.insert(start, Stored { key, gpus: BTreeMap::new() });
    }
    if out.is_empty() {
        return Ok(out);
    }
    let wanted = |uuid: &str| only.is_none_or(|o| o.contains(uuid));
    let mut bad = BTreeSet::new();
    let mut st = conn
        .prepare_cached("SELECT start_ms, gpu_uuid, gpu_index, gpu_name, energy_mj, idle_w, idle_source, note FROM rollup_gpus WHERE span_ms = ?1 AND start_ms >= ?2 AND start_ms < ?3")
        .map_err(HistoryError::sqlite(path))?;
    let mut rows = st.query(params![span, from_ms, until_ms]).map_err(HistoryError::sqlite(path))?;
    while let Some(r) = rows.next().map_err(HistoryError::sqlite(path))? {
        let hour: i64 = r.get(0).map_err(HistoryError::sqlite(path))?;
        let uuid: String = r.get(1).map_err(HistoryError::sqlite(path))?;
        let Some(stored) = out.get_mut(&hour) else { continue };
        if !wanted(&uuid) {
            continue;
        }
        let gpu = (|| -> rusqlite::Result<Option<StoredGpu>> {
            let Some(source) = source_of(&r.get::<_, String>(6)?) else { return Ok(None) };
            Ok(Some(StoredGpu {
                uuid: uuid.clone(),
                index: r.get(2)?,
                name: r.get(3)?,
                energy_mj: non_negative(r.get(4)?),
                idle: IdlePower { watts: r.get(5)?, source },
                note: r.get(7)?,
                parts: BTreeMap::new(),
            }))
        })();
        match gpu {
            Ok(Some(gpu)) => {
                stored.gpus.insert(uuid, gpu);
            }
            Ok(None) | Err(rusqlite::Error::FromSqlConversionFailure(..) | rusqlite::Error::InvalidColumnType(..)) => {
                bad.insert(hour);
            }
            Err(e) => return Err(HistoryError::Sqlite { path: path.to_path_buf(), source: e }),
        }
    }
    let mut st = conn
        .prepare_cached("SELECT start_ms, gpu_uuid, party, workload_id, energy_mj, gpu_time_ms, g_co2 FROM rollup_parts WHERE span_ms = ?1 AND start_ms >= ?2 AND start_ms < ?3")
        .map_err(HistoryError::sqlite(path))?;
    let mut rows = st.query(params![span, from_ms, until_ms]).map_err(HistoryError::sqlite(path))?;
    while let Some(r) = rows.next().map_err(HistoryError::sqlite(path))? {
        let hour: i64 = r.get(0).map_err(HistoryError::sqlite(path))?;
        let uuid: String = r.get(1).map_err(HistoryError::sqlite(path))?;
        let Some(gpu) = out.get_mut(&hour).and_then(|s| s.gpus.get_mut(&uuid)) else {
            // A part of a GPU that has no row: the span is not whole.
            if out.contains_key(&hour) && wanted(&uuid) {
                bad.insert(hour);
            }
            continue;
        };
        let part = (|| -> rusqlite::Result<Option<(Party, Part)>> {
            let Some(party) = party_of(&r.get::<_, String>(2)?, r.get(3)?) else { return Ok(None) };
            Ok(Some((party, Part { energy_mj: non_negative(r.get(4)?), gpu_time_ms: r.get(5)?, g_co2: r.get(6)? })))
        })();
        match part {
            Ok(Some((party, part))) => {
                gpu.parts.insert(party, part);
            }
            Ok(None) | Err(rusqlite::Error::FromSqlConversionFailure(..) | rusqlite::Error::InvalidColumnType(..)) => {
                bad.insert(hour);
            }
            Err(e) => return Err(HistoryError::Sqlite { path: path.to_path_buf(), source: e }),
        }
    }
    for hour in bad {
        out.remove(&hour);
    }
    Ok(out)
}

/// Delete the rollup of `span` starting at `start`.
fn forget(conn: &Connection, path: &std::path::Path, span: i64, start: i64) -> Result<(), HistoryError> {
    for sql in [
        "DELETE FROM rollup_parts WHERE span_ms = ?1 AND start_ms = ?2",
        "DELETE FROM rollup_gpus WHERE span_ms = ?1 AND start_ms = ?2",
        "DELETE FROM rollups WHERE span_ms = ?1 AND start_ms = ?2",
    ] {
        conn.prepare_cached(sql).and_then(|mut st| st.execute(params![span, start])).map_err(HistoryError::sqlite(path))?;
    }
    Ok(())
}

/// Store `accounting` as the rollup of the span `piece` (`notes`: each GPU's).
fn store(conn: &Connection, path: &std::path::Path, piece: Window, key: &str, accounting: &Accounting, notes: &BTreeMap<String, String>, made_ms: i64) -> Result<(), HistoryError> {
    let err = || HistoryError::sqlite(path);
    let (span, start) = (piece.until_ms - piece.since_ms, piece.since_ms);
    let mut gpu_row = conn
        .prepare_cached("INSERT INTO rollup_gpus (span_ms, start_ms, gpu_uuid, gpu_index, gpu_name, energy_mj, idle_w, idle_source, note) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)")
        .map_err(err())?;
    let mut part_row = conn
        .prepare_cached("INSERT INTO rollup_parts (span_ms, start_ms, gpu_uuid, party, workload_id, energy_mj, gpu_time_ms, g_co2) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)")
        .map_err(err())?;
    for (uuid, gpu) in &accounting.gpus {
        gpu_row
            .execute(params![span, start, uuid, gpu.index, gpu.name, ms(gpu.energy_mj), gpu.idle.watts, source_name(gpu.idle.source), notes.get(uuid)])
            .map_err(err())?;
        for (party, part) in &gpu.parts {
            let (kind, id) = match party {
                Party::Workload(id) => ("workload", id.as_str()),
                Party::Idle => ("idle", ""),
                Party::Unattributed => ("unattributed", ""),
            };
            part_row.execute(params![span, start, uuid, kind, id, ms(part.energy_mj), part.gpu_time_ms, part.g_co2]).map_err(err())?;
        }
    }
    conn.prepare_cached("INSERT INTO rollups (span_ms, start_ms, intensity, made_ms) VALUES (?1, ?2, ?3, ?4)")
        .and_then(|mut st| st.execute(params![span, start, key, made_ms]))
        .map_err(err())?;
    Ok(())
}

/// Make the rollups of the consecutive hours starting at `hours` (ascending), replacing
/// any, from their rows (read at once), each with the intensity figures and idle powers a
/// reader of that hour alone would use. An hour without rows gets none. Returns how many
/// were made.
pub(crate) fn build_hours(src: &Source<'_>, idle: &IdleDefaults<'_>, hours: &[i64], made_ms: i64) -> Result<usize, HistoryError> {
    for &hour in hours {
        forget(src.conn, src.path, HOUR_MS, hour)?;
    }
    let pieces: Vec<Window> = hours.iter().map(|&h| Window { since_ms: h, until_ms: h + HOUR_MS }).collect();
    let mut made = 0;
    for (window, (samples, gpu_time)) in pieces.iter().copied().zip(src.rows_by_piece(&pieces, None)?) {
        if samples.is_empty() {
            continue;
        }
        let intensity = src.intensity(window)?;
        let idle_w = src.idle_w(window, idle, None)?;
        let key = Figures::new(&intensity).key(window.since_ms, window.until_ms);
        // GPU by GPU (each GPU's accounting is its own rows' alone), so that each note is
        // its GPU's; then as one accounting of the hour.
        let mut by_gpu: BTreeMap<String, (Vec<GpuSample>, Vec<GpuTime>)> = BTreeMap::new();
        for s in samples {
            by_gpu.entry(s.gpu_uuid.clone()).or_default().0.push(s);
        }
        for t in gpu_time {
            if let Some(gpu) = by_gpu.get_mut(&t.gpu_uuid) {
                gpu.1.push(t);
            }
        }
        let mut hour = Accounting { window, gpus: BTreeMap::new(), emissions_known: false, notes: Vec::new() };
        let mut notes = BTreeMap::new();
        for (uuid, (samples, gpu_time)) in by_gpu {
            let history = account::History { samples, gpu_time, intensity: intensity.clone(), idle_w: idle_w.clone() };
            let mut accounting = account::account(&history, window);
            if let Some(note) = accounting.notes.iter().find(|n| n.as_str() != account::NO_INTENSITY) {
                notes.insert(uuid.clone(), note.clone());
            }
            if let Some(gpu) = accounting.gpus.remove(&uuid) {
                hour.gpus.insert(uuid, gpu);
            }
        }
        store(src.conn, src.path, window, &key, &hour, &notes, made_ms)?;
        made += 1;
    }
    Ok(made)
}

/// Make the rollup of the day starting at `day` (replacing any): the accounting of its
/// hours, each from its rollup (or its rows), merged as a reader merges them, with the
/// intensity figures and idle powers a reader of that day alone would use. A day without
/// rows gets none; a day with a GPU whose idle power is its lowest observed gets the
/// marker [`NO_DAY`]. Returns whether it got a rollup.
pub(crate) fn build_day(src: &Source<'_>, idle: &IdleDefaults<'_>, day: i64, made_ms: i64) -> Result<bool, HistoryError> {
    forget(src.conn, src.path, DAY_MS, day)?;
    let window = Window { since_ms: day, until_ms: day + DAY_MS };
    let intensity = src.intensity(window)?;
    let idle_w = src.idle_w(window, idle, None)?;
    let empty = Accounting { window, gpus: BTreeMap::new(), emissions_known: false, notes: Vec::new() };
    if idle_w.values().any(|p| p.source == IdleSource::LowestObserved) {
        store(src.conn, src.path, window, NO_DAY, &empty, &BTreeMap::new(), made_ms)?;
        return Ok(false);
    }
    let figures = Figures::new(&intensity);
    let key = figures.key(window.since_ms, window.until_ms);
    let mut history = account::History { samples: Vec::new(), gpu_time: Vec::new(), intensity, idle_w };
    let reader = Source { conn: src.conn, path: src.path, rollups: true };
    let Some(accounting) = reader.day(window, &figures, &mut history, None, &mut Default::default())? else { return Ok(false) };
    store(src.conn, src.path, window, &key, &accounting, &BTreeMap::new(), made_ms)?;
    Ok(true)
}

fn ms(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// What is to be rolled up: hours, the newest first, then days, the newest first.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Due {
    pub(crate) hours: Vec<i64>,
    pub(crate) days: Vec<i64>,
}

/// The spans whose rollup is to be made: the hours and days with rows that ended at least
/// [`SETTLE_MS`] before the latest row (or before it, when it is that old at `now_ms`) and
/// have none; with `check`, also those whose
/// rollup no longer matches the intensity figures (a reading recorded late, one deleted by
/// retention) or a GPU's idle power (a new power model, another config).
pub(crate) fn due(src: &Source<'_>, idle: &IdleDefaults<'_>, check: bool, now_ms: i64) -> Result<Due, HistoryError> {
    let conn = src.conn;
    let err = || HistoryError::sqlite(src.path);
    let bound = |sql: &str| -> Result<Option<i64>, HistoryError> { conn.query_row(sql, [], |r| r.get(0)).map_err(err()) };
    let (Some(first_end), Some(last_end)) = (bound("SELECT min(t1_ms) FROM gpu_samples")?, bound("SELECT max(t1_ms) FROM gpu_samples")?) else {
        return Ok(Due::default());
    };
    // Rows longer than MAX_INTERVAL_MS are not accounted: none starts before this.
    let first = first_end.saturating_sub(MAX_INTERVAL_MS);
    // Settled: [`SETTLE_MS`] before the latest row; all of it once that row is as old (no
    // watch writes, and one that starts now does not bridge from it).
    let settled = last_end.saturating_sub(SETTLE_MS).max(last_end.min(now_ms.saturating_sub(SETTLE_MS)));
    let mut any = conn
        .prepare_cached(&format!(
            "SELECT 1 FROM gpu_samples WHERE t1_ms > ?1 AND t1_ms < ?2 + {MAX_INTERVAL_MS} AND t0_ms < ?2 AND t1_ms - t0_ms <= {MAX_INTERVAL_MS} LIMIT 1"
        ))
        .map_err(err())?;
    let mut next = conn.prepare_cached("SELECT min(t1_ms) FROM gpu_samples WHERE t1_ms > ?1").map_err(err())?;
    let mut found = |span: i64| -> Result<BTreeSet<i64>, HistoryError> {
        let (start, end) = (floor_to(first, span), floor_to(settled, span));
        let mut made: BTreeMap<i64, String> = BTreeMap::new();
        {
            let mut st = conn.prepare_cached("SELECT start_ms, intensity FROM rollups WHERE span_ms = ?1 AND start_ms >= ?2 AND start_ms < ?3").map_err(err())?;
            let rows = st.query_map(params![span, start, end], |r| Ok((r.get(0)?, r.get(1)?))).map_err(err())?;
            for row in rows {
                let (at, key) = row.map_err(err())?;
                made.insert(at, key);
            }
        }
        let mut todo = BTreeSet::new();
        // The spans without a rollup that have rows, skipping stretches without any.
        let mut at = start;
        while at < end {
            if made.contains_key(&at) {
                at += span;
                continue;
            }
            if any.exists(params![at, at + span]).map_err(err())? {
                todo.insert(at);
                at += span;
                continue;
            }
            let Some(later) = next.query_row([at + span], |r| r.get::<_, Option<i64>>(0)).map_err(err())? else { break };
            at = (at + span).max(floor_to(later.saturating_sub(MAX_INTERVAL_MS), span));
        }
        if check {
            for (&at, key) in &made {
                let window = Window { since_ms: at, until_ms: at + span };
                if Figures::new(&src.intensity(window)?).key(window.since_ms, window.until_ms) != *key {
                    todo.insert(at);
                }
            }
        }
        Ok(todo)
    };
    let mut hours = found(HOUR_MS)?;
    let mut days = found(DAY_MS)?;
    if check {
        let mut now: BTreeMap<String, Option<IdlePower>> = BTreeMap::new();
        let mut st = conn.prepare_cached("SELECT span_ms, start_ms, gpu_uuid, idle_w, idle_source FROM rollup_gpus").map_err(err())?;
        let rows = st
            .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, String>(2)?, r.get::<_, f64>(3)?, r.get::<_, String>(4)?)))
            .map_err(err())?;
        for row in rows {
            let (span, at, uuid, watts, source) = row.map_err(err())?;
            let current = match now.get(&uuid) {
                Some(found) => *found,
                None => {
                    let found = src.idle_known(&uuid, idle)?;
                    now.insert(uuid, found);
                    found
                }
            };
            let same = match (current, source_of(&source)) {
                // The lowest observed in the hour: from its rows, which have not changed.
                (None, Some(IdleSource::LowestObserved)) => true,
                (Some(p), Some(s)) => p.source == s && p.watts.to_bits() == watts.to_bits(),
                _ => false,
            };
            if !same {
                if span == DAY_MS {
                    days.insert(at);
                } else {
                    hours.insert(at);
                }
            }
        }
    }
    // A day is made from its hours': after them.
    for &hour in &hours {
        days.insert(floor_to(hour, DAY_MS));
    }
    days.retain(|&d| d + DAY_MS <= settled);
    Ok(Due { hours: hours.into_iter().rev().collect(), days: days.into_iter().rev().collect() })
}

/// How a window's pieces ([`cut`]) were accounted: whole days from their rollups,
/// hours from theirs, hour pieces from their rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Served {
    pub days: usize,
    pub hours: usize,
    pub rows: usize,
}

/// Accounting a window, on one connection: through the rollups where [`Source::rollups`].
impl Source<'_> {
    /// See [`crate::query::Reader::accounting`].
    pub(crate) fn accounting(&self, window: Window, idle: &IdleDefaults<'_>, gpus_of: Option<&str>) -> Result<(Accounting, Served), HistoryError> {
        let intensity = self.intensity(window)?;
        let idle_w = self.idle_w(window, idle, gpus_of)?;
        let only = match gpus_of {
            Some(id) => Some(self.gpus_of(id)?.into_iter().collect::<BTreeSet<String>>()),
            None => None,
        };
        let figures = Figures::new(&intensity);
        let mut total = Accounting { window, gpus: BTreeMap::new(), emissions_known: !intensity.is_empty(), notes: Vec::new() };
        let mut served = Served::default();
        let mut history = account::History { samples: Vec::new(), gpu_time: Vec::new(), intensity, idle_w };
        let days: Vec<Window> = cut(window, DAY_MS).collect();
        for batch in days.chunks(DAY_BATCH) {
            let mut stored = match (self.rollups, batch.first(), batch.last()) {
                (true, Some(first), Some(last)) => load(self.conn, self.path, DAY_MS, floor_to(first.since_ms, DAY_MS), last.until_ms, only.as_ref())?,
                _ => BTreeMap::new(),
            };
            for &day in batch {
                let found = match stored.remove(&day.since_ms) {
                    Some(rolled) if is_whole(day, DAY_MS) => rolled.accounting(day, &figures, &history.idle_w, only.as_ref()),
                    _ => None,
                };
                let accounting = match found {
                    Some(accounting) => {
                        served.days += 1;
                        accounting
                    }
                    None => self.day(day, &figures, &mut history, only.as_ref(), &mut served)?,
                };
                if let Some(accounting) = accounting {
                    total.merge(accounting);
                }
            }
        }
        Ok((total, served))
    }

    /// The accounting of `day` (a day piece) from its hour pieces, each from its rollup
    /// where it has one that matches, else from its rows, merged in time order (`None`: no
    /// row in it).
    pub(crate) fn day(&self, day: Window, figures: &Figures, history: &mut account::History, only: Option<&BTreeSet<String>>, served: &mut Served) -> Result<Option<Accounting>, HistoryError> {
        let mut stored = if self.rollups {
            load(self.conn, self.path, HOUR_MS, floor_to(day.since_ms, HOUR_MS), day.until_ms, only)?
        } else {
            BTreeMap::new()
        };
        let mut accounting = None;
        let mut raw: Vec<Window> = Vec::new();
        for hour in cut(day, HOUR_MS) {
            let found = match stored.remove(&hour.since_ms) {
                Some(rolled) if is_whole(hour, HOUR_MS) => rolled.accounting(hour, figures, &history.idle_w, only),
                _ => None,
            };
            match found {
                Some(found) => {
                    self.account_rows(&mut raw, history, only, &mut accounting, served)?;
                    served.hours += 1;
                    if let Some(found) = found {
                        fold(&mut accounting, found);
                    }
                }
                None => raw.push(hour),
            }
        }
        self.account_rows(&mut raw, history, only, &mut accounting, served)?;
        Ok(accounting)
    }

    /// Account the consecutive `pieces` from their rows (read [`RAW_BATCH`] pieces at a time,
    /// each accounted on its own) into `accounting`, in order; `pieces` is emptied.
    fn account_rows(&self, pieces: &mut Vec<Window>, history: &mut account::History, only: Option<&BTreeSet<String>>, accounting: &mut Option<Accounting>, served: &mut Served) -> Result<(), HistoryError> {
        for batch in pieces.chunks(RAW_BATCH) {
            for (&piece, (samples, gpu_time)) in batch.iter().zip(self.rows_by_piece(batch, only)?) {
                served.rows += 1;
                if samples.is_empty() {
                    continue;
                }
                history.samples = samples;
                history.gpu_time = gpu_time;
                fold(accounting, account::account(history, piece));
            }
        }
        pieces.clear();
        Ok(())
    }

}

/// Whether the database has the rollup tables (schema version 2 and later).
pub(crate) fn present(conn: &Connection) -> bool {
    conn.query_row("SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'rollups'", [], |_| Ok(()))
        .optional()
        .is_ok_and(|found| found.is_some())
}

