//! The rollups ([`crate::rollup`]) against the rows alone, through the writer
//! ([`crate::History`]) and the readers ([`crate::query::Reader`]): the module above both.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rusqlite::{params, Connection};

use crate::query::{IdleDefaults, Reader, Served, MAX_INTERVAL_MS};
use crate::rollup::{cut, floor_to, is_whole, Figures, DAY_MS, HOUR_MS, NO_FIGURES, SETTLE_MS};
use crate::History;
use vgpu_carbon::account::{self, Accounting, GroupBy, IdleSource, IntensityPoint, Window};

const H: i64 = HOUR_MS;
const MIN: i64 = 60_000;

fn sample(conn: &Connection, gpu: &str, t0: i64, t1: i64, energy_mj: i64, busy_ms: Option<i64>) {
    conn.execute(
        "INSERT OR IGNORE INTO gpu_samples (t0_ms, t1_ms, gpu_uuid, gpu_index, gpu_name, energy_mj, energy_source, busy_ms) VALUES (?1, ?2, ?3, ?4, 'NVIDIA H100', ?5, 'counter', ?6)",
        params![t0, t1, gpu, i64::from(gpu.as_bytes()[gpu.len() - 1]), energy_mj, busy_ms],
    )
    .unwrap();
}

fn busy(conn: &Connection, workload: &str, gpu: &str, t0: i64, t1: i64, busy_ms: i64) {
    conn.execute(
        "INSERT OR IGNORE INTO workload_gpu_time (t0_ms, t1_ms, workload_id, gpu_uuid, busy_ms, source) VALUES (?1, ?2, ?3, ?4, ?5, 'ledger')",
        params![t0, t1, workload, gpu, busy_ms],
    )
    .unwrap();
}

fn figure(conn: &Connection, ts: i64, kind: &str, g: f64) {
    conn.execute("INSERT OR REPLACE INTO intensity (ts_ms, kind, g_per_kwh, source, fetched_ms) VALUES (?1, ?2, ?3, 'test', ?1)", params![ts, kind, g]).unwrap();
}

fn model(conn: &Connection, gpu: &str, idle_w: f64) {
    conn.execute("INSERT OR REPLACE INTO power_models VALUES (?1, 'NVIDIA H100', 0, 1980, ?2, 700, 2, 1, 0, '[]')", params![gpu, idle_w]).unwrap();
}

/// The starts of the rollups of `span` there are (not the days marked as having none).
fn made(conn: &Connection, span: i64) -> Vec<i64> {
    let mut st = conn.prepare("SELECT start_ms FROM rollups WHERE span_ms = ?1 AND intensity <> '-' ORDER BY start_ms").unwrap();
    st.query_map([span], |r| r.get(0)).unwrap().collect::<Result<_, _>>().unwrap()
}

fn hours_made(conn: &Connection) -> Vec<i64> {
    made(conn, HOUR_MS)
}

fn count(conn: &Connection, table: &str) -> i64 {
    conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0)).unwrap()
}

/// One pass as while a watch writes (the latest row is now).
fn pass(h: &mut History, idle: &IdleDefaults<'_>, check: bool, budget: Duration) -> crate::RollUp {
    let now: i64 = h.connection().query_row("SELECT coalesce(max(t1_ms), 0) FROM gpu_samples", [], |r| r.get(0)).unwrap();
    h.roll_up_at(idle, check, budget, now).unwrap()
}

/// Every rollup due, made, as while a watch writes (the latest row is now).
fn roll_up_all(h: &mut History, idle: &IdleDefaults<'_>) -> usize {
    let mut made = 0;
    loop {
        let pass = pass(h, idle, true, Duration::from_secs(60));
        made += pass.made;
        if pass.left == 0 {
            return made;
        }
    }
}

/// The accounting of `window` read through the rollups and from the rows alone: they must
/// be the same, to the bit, and so must every report made of them.
fn both(reader: &mut Reader, window: Window, idle: &IdleDefaults<'_>, gpus_of: Option<&str>) -> (Accounting, Served) {
    reader.use_rollups(true);
    let (rolled, served) = reader.accounting_served(window, idle, gpus_of).unwrap();
    reader.use_rollups(false);
    let (raw, raw_served) = reader.accounting_served(window, idle, gpus_of).unwrap();
    assert_eq!((raw_served.days, raw_served.hours), (0, 0));
    assert_eq!(rolled, raw, "window {window:?}, gpus of {gpus_of:?}, served {served:?}");
    for by in [GroupBy::Workload, GroupBy::User, GroupBy::Service, GroupBy::Gpu] {
        assert_eq!(account::report(&rolled, by, &BTreeMap::new()), account::report(&raw, by, &BTreeMap::new()));
    }
    (rolled, served)
}

#[test]
fn a_window_is_cut_on_the_grid() {
    let cut = |since, until, span| cut(Window { since_ms: since, until_ms: until }, span).map(|w| (w.since_ms, w.until_ms)).collect::<Vec<_>>();
    assert_eq!(cut(10, 20, H), [(10, 20)]);
    assert_eq!(cut(0, 2 * H, H), [(0, H), (H, 2 * H)]);
    assert_eq!(cut(H / 2, 2 * H + 5, H), [(H / 2, H), (H, 2 * H), (2 * H, 2 * H + 5)]);
    assert_eq!(cut(-H - 1, 1, H), [(-H - 1, -H), (-H, 0), (0, 1)]);
    assert_eq!(cut(-1, DAY_MS + 1, DAY_MS), [(-1, 0), (0, DAY_MS), (DAY_MS, DAY_MS + 1)]);
    assert!(cut(5, 5, H).is_empty());
    assert!(is_whole(Window { since_ms: -H, until_ms: 0 }, H));
    assert!(!is_whole(Window { since_ms: 1, until_ms: H + 1 }, H));
    assert!(!is_whole(Window { since_ms: 0, until_ms: H }, DAY_MS));
    assert_eq!(floor_to(-1, H), -H);
    assert_eq!(floor_to(DAY_MS + 5, DAY_MS), DAY_MS);
}

#[test]
fn the_intensity_key_is_the_step_function_over_the_hour() {
    let p = |ts_ms, g_per_kwh| IntensityPoint { ts_ms, g_per_kwh };
    assert_eq!(Figures::new(&[]).key(0, H), NO_FIGURES);
    // Before the first figure, the first (of two at one time, the first listed); then the
    // last listed at each time.
    let f = Figures::new(&[p(10 * MIN, 200.0), p(10 * MIN, 300.0), p(50 * MIN, 0.5), p(2 * H, 9.0)]);
    assert_eq!(f.key(0, H), "200 @600000 300 @3000000 0.5");
    assert_eq!(f.key(H, 2 * H), "0.5");
    assert_eq!(f.key(2 * H, 3 * H), "9");
    // A figure at the hour's start is in force from it.
    assert_eq!(Figures::new(&[p(H, 7.25), p(-5, 1.0)]).key(H, 2 * H), "7.25");
    // Figures an accounting ignores (negative, not finite) are not in it.
    assert_eq!(Figures::new(&[p(0, -1.0), p(1, f64::NAN)]).key(0, H), NO_FIGURES);
}

#[test]
fn whole_hours_are_read_from_their_rollups_to_the_same_figures() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = History::open(dir.path()).unwrap();
    let conn = h.connection();
    // Three hours of 7-minute rows (not on the grid) on two GPUs, two workloads; a reading
    // changes in the second hour; GPU-a measured, GPU-b configured.
    for k in 0..30 {
        let (t0, t1) = (k * 7 * MIN + 11, (k + 1) * 7 * MIN + 11);
        sample(conn, "GPU-a", t0, t1, 1_000_003 * (k + 1), Some(5 * MIN));
        sample(conn, "GPU-b", t0, t1, 700_001 * (k + 1), None);
        busy(conn, "w1", "GPU-a", t0, t1, 3 * MIN);
        busy(conn, "w2", "GPU-a", t0, t1, MIN + k);
        busy(conn, "w2", "GPU-b", t0, t1, 4 * MIN);
    }
    figure(conn, -H, "reading", 250.0);
    figure(conn, H + 13 * MIN, "reading", 410.5);
    model(conn, "GPU-a", 1.5);
    let idle = IdleDefaults::new(Some(2.0), BTreeMap::new);
    // The last row ends at 3.5 h: hours 0 to 2 are over for long enough, hour 3 is not.
    assert_eq!(roll_up_all(&mut h, &idle), 3);
    assert_eq!(hours_made(h.connection()), [0, H, 2 * H]);
    let mut reader = Reader::open(dir.path()).unwrap().unwrap();
    // From 5 ms: hour 0 is a ragged edge, read from its rows as hour 3 is.
    let (a, served) = both(&mut reader, Window { since_ms: 5, until_ms: 4 * H }, &idle, None);
    assert_eq!(served, Served { days: 0, hours: 2, rows: 2 });
    let total: u64 = (0..30).map(|k| 1_000_003 * (k + 1) + 700_001 * (k + 1)).sum();
    assert_eq!(a.gpus.values().map(|g| g.energy_mj).sum::<u64>(), total, "every row inside the window, whole");
    for gpu in a.gpus.values() {
        assert_eq!(gpu.parts.values().map(|p| p.energy_mj).sum::<u64>(), gpu.energy_mj);
    }
    assert_eq!(a.gpus["GPU-b"].idle.source, IdleSource::Configured);
    // A workload's own: only its GPUs.
    let (w1, served) = both(&mut reader, Window { since_ms: 0, until_ms: 2 * H }, &idle, Some("w1"));
    assert_eq!(served.hours, 2);
    assert_eq!(w1.gpus.keys().collect::<Vec<_>>(), ["GPU-a"]);
    // Windows with ragged edges.
    for (since, until) in [(H / 3, 2 * H + 1), (-H, H), (H + 1, 2 * H - 1), (0, 10 * H)] {
        both(&mut reader, Window { since_ms: since, until_ms: until }, &idle, None);
    }
}

#[test]
fn whole_days_are_read_from_their_rollups_made_from_their_hours() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = History::open(dir.path()).unwrap();
    // 3 days and a half of 10-minute rows from 30 minutes past midnight, a reading every
    // 5 hours; GPU-a measured, GPU-b without a model (configured).
    for k in 0..(84 * 6) {
        let (t0, t1) = (30 * MIN + k * 10 * MIN, 40 * MIN + k * 10 * MIN);
        sample(h.connection(), "GPU-a", t0, t1, 600_000 + k, Some(4 * MIN));
        sample(h.connection(), "GPU-b", t0, t1, 500_000, Some(MIN));
        busy(h.connection(), if k % 50 < 30 { "w1" } else { "w2" }, "GPU-a", t0, t1, 3 * MIN);
        if k % 30 == 0 {
            figure(h.connection(), t0 + 7, "reading", 100.0 + k as f64);
        }
    }
    model(h.connection(), "GPU-a", 30.0);
    let idle = IdleDefaults::new(Some(20.0), BTreeMap::new);
    roll_up_all(&mut h, &idle);
    // Days 0 to 2 are over; day 3 is not.
    assert_eq!(made(h.connection(), DAY_MS), [0, DAY_MS, 2 * DAY_MS]);
    let mut reader = Reader::open(dir.path()).unwrap().unwrap();
    let (_, served) = both(&mut reader, Window { since_ms: 0, until_ms: 4 * DAY_MS }, &idle, None);
    // Day 3: hours 72 to 83 rolled up (the last row ends at 84.5 h), the rest from rows.
    assert_eq!(served, Served { days: 3, hours: 12, rows: 12 });
    // Ragged ends: the hours of the first and last days, the days between.
    let (_, served) = both(&mut reader, Window { since_ms: 5 * H + 3, until_ms: 2 * DAY_MS + 4 * H + 5 }, &idle, None);
    assert_eq!(served, Served { days: 1, hours: 18 + 4, rows: 2 });
    both(&mut reader, Window { since_ms: 0, until_ms: 4 * DAY_MS }, &idle, Some("w2"));
    // A late row in day 1 drops that day and its hour; the next pass makes both again.
    sample(h.connection(), "GPU-c", DAY_MS + 5 * H, DAY_MS + 5 * H + MIN, 1, None);
    assert_eq!(made(h.connection(), DAY_MS), [0, 2 * DAY_MS]);
    let (_, served) = both(&mut reader, Window { since_ms: 0, until_ms: 3 * DAY_MS }, &idle, None);
    assert_eq!(served, Served { days: 2, hours: 23, rows: 1 });
    assert_eq!(roll_up_all(&mut h, &idle), 2);
    // A GPU without a model nor a default: its days are not rolled up, its hours are.
    h.connection().execute("DELETE FROM power_models", []).unwrap();
    let bare = IdleDefaults::new(None, BTreeMap::new);
    roll_up_all(&mut h, &bare);
    assert!(made(h.connection(), DAY_MS).is_empty());
    let (_, served) = both(&mut reader, Window { since_ms: 0, until_ms: 3 * DAY_MS }, &bare, None);
    assert_eq!(served.days, 0);
}

#[test]
fn a_row_written_late_drops_the_rollups_of_the_hours_it_overlaps_and_they_are_made_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = History::open(dir.path()).unwrap();
    for k in 0..60 {
        sample(h.connection(), "GPU-a", k * 6 * MIN, (k + 1) * 6 * MIN, 360_000, Some(MIN));
        busy(h.connection(), "w1", "GPU-a", k * 6 * MIN, (k + 1) * 6 * MIN, MIN);
    }
    let idle = IdleDefaults::new(Some(0.5), BTreeMap::new);
    assert_eq!(roll_up_all(&mut h, &idle), 5);
    assert_eq!(hours_made(h.connection()), [0, H, 2 * H, 3 * H, 4 * H]);
    let mut reader = Reader::open(dir.path()).unwrap().unwrap();
    let window = Window { since_ms: 0, until_ms: 6 * H };
    let (before, _) = both(&mut reader, window, &idle, None);
    // Another GPU's row over the end of hour 1 and the start of hour 2; a workload's row
    // inside hour 3; a row of hour 4 deleted; nothing else is touched.
    sample(h.connection(), "GPU-b", 2 * H - MIN, 2 * H + MIN, 5_000, None);
    assert_eq!(hours_made(h.connection()), [0, 3 * H, 4 * H]);
    busy(h.connection(), "w2", "GPU-a", 3 * H + MIN, 3 * H + 2 * MIN, 10);
    h.connection().execute("DELETE FROM gpu_samples WHERE t1_ms = ?1", [4 * H + 6 * MIN]).unwrap();
    assert_eq!(hours_made(h.connection()), [0]);
    for table in ["rollup_gpus", "rollup_parts"] {
        let n: i64 = h.connection().query_row(&format!("SELECT count(*) FROM {table} WHERE start_ms <> 0"), [], |r| r.get(0)).unwrap();
        assert_eq!(n, 0, "{table}: dropped with the hour");
    }
    let (after, served) = both(&mut reader, window, &idle, None);
    assert_eq!(served.hours, 1);
    assert_eq!(after.gpus["GPU-b"].energy_mj, 5_000);
    assert_eq!(after.gpus["GPU-a"].energy_mj, before.gpus["GPU-a"].energy_mj - 360_000);
    assert_eq!(roll_up_all(&mut h, &idle), 4);
    let (again, served) = both(&mut reader, window, &idle, None);
    assert_eq!(served.hours, 5);
    assert_eq!(again, after);
}

#[test]
fn a_late_reading_or_a_new_power_model_is_seen_and_the_hours_made_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = History::open(dir.path()).unwrap();
    for k in 0..40 {
        sample(h.connection(), "GPU-a", k * 6 * MIN, (k + 1) * 6 * MIN, 3_600_000 + k, Some(3 * MIN));
        busy(h.connection(), "w1", "GPU-a", k * 6 * MIN, (k + 1) * 6 * MIN, 2 * MIN);
    }
    figure(h.connection(), 0, "reading", 100.0);
    let idle = IdleDefaults::new(None, || [("GPU-a".to_string(), 45.0)].into());
    assert_eq!(roll_up_all(&mut h, &idle), 3);
    let mut reader = Reader::open(dir.path()).unwrap().unwrap();
    let window = Window { since_ms: 0, until_ms: 3 * H };
    let (first, served) = both(&mut reader, window, &idle, None);
    assert_eq!(served.hours, 3);
    assert_eq!(first.gpus["GPU-a"].idle.source, IdleSource::PowerLimit);
    // A reading for the middle of hour 1, recorded late: hours 1 and 2 see another function
    // (2 from its start on), hour 0 the same.
    figure(h.connection(), H + 20 * MIN, "reading", 300.0);
    let (_, served) = both(&mut reader, window, &idle, None);
    assert_eq!(served.hours, 1);
    // `carbon profile` measures the GPU: every hour's idle power changes.
    model(h.connection(), "GPU-a", 40.0);
    let (_, served) = both(&mut reader, window, &idle, None);
    assert_eq!(served.hours, 0);
    // Without the check the writer does not look (nothing is missing); with it, all three.
    assert_eq!(pass(&mut h, &idle, false, Duration::from_secs(60)), crate::RollUp { made: 0, left: 0 });
    assert_eq!(roll_up_all(&mut h, &idle), 3);
    let (last, served) = both(&mut reader, window, &idle, None);
    assert_eq!(served.hours, 3);
    assert_eq!(last.gpus["GPU-a"].idle.source, IdleSource::Measured);
    // Another host's view (another configured idle power) reads the rows, to its figures.
    let other = IdleDefaults::new(Some(10.0), BTreeMap::new);
    model(h.connection(), "GPU-b", 1.0);
    h.connection().execute("DELETE FROM power_models WHERE gpu_uuid = 'GPU-a'", []).unwrap();
    let (_, served) = both(&mut reader, window, &other, None);
    assert_eq!(served.hours, 0);
}

#[test]
fn a_pass_is_bounded_and_resumes_where_it_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = History::open(dir.path()).unwrap();
    // 30 hours, a gap of 5 days without rows, 10 hours more.
    for k in 0..(30 * 6) {
        sample(h.connection(), "GPU-a", k * 10 * MIN, (k + 1) * 10 * MIN, 1000, None);
    }
    let later = 30 * H + 5 * 24 * H;
    for k in 0..(10 * 6) {
        sample(h.connection(), "GPU-a", later + k * 10 * MIN, later + (k + 1) * 10 * MIN, 1000, None);
    }
    let idle = IdleDefaults::new(Some(0.0), BTreeMap::new);
    // A budget of nothing still makes the newest hours, a run of them read at once.
    let first = pass(&mut h, &idle, false, Duration::ZERO);
    // 35 hours left, and days 0 and 1 (the last day is not over).
    assert_eq!(first, crate::RollUp { made: 4, left: 37 });
    assert_eq!(hours_made(h.connection()), [later + 5 * H, later + 6 * H, later + 7 * H, later + 8 * H]);
    assert_eq!(roll_up_all(&mut h, &idle), 37);
    assert_eq!(hours_made(h.connection()).len(), 39, "no rollup for the hours without rows");
    assert_eq!(made(h.connection(), DAY_MS), [0, DAY_MS]);
    assert_eq!(pass(&mut h, &idle, true, Duration::from_secs(60)), crate::RollUp { made: 0, left: 0 });
    // The last hour ends with the last row: while a watch writes, a late row may still
    // come into it. Once that row is SETTLE_MS old (no watch writes), it is made (its day
    // is not over: no day).
    let last_end = later + 10 * H;
    assert_eq!(h.roll_up_at(&idle, false, Duration::from_secs(60), last_end + SETTLE_MS - 1).unwrap(), crate::RollUp { made: 0, left: 0 });
    assert_eq!(h.roll_up_at(&idle, false, Duration::from_secs(60), last_end + SETTLE_MS).unwrap(), crate::RollUp { made: 1, left: 0 });
    assert_eq!(hours_made(h.connection()).len(), 40);
}

#[test]
fn retention_deletes_the_rollups_of_the_hours_before_the_horizon() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = History::open(dir.path()).unwrap();
    for k in 0..(6 * 6) {
        sample(h.connection(), "GPU-a", k * 10 * MIN, (k + 1) * 10 * MIN, 1000, None);
    }
    let idle = IdleDefaults::new(Some(0.0), BTreeMap::new);
    assert_eq!(roll_up_all(&mut h, &idle), 5);
    // Keep what ended at or after 2.5 h: hours 0 and 1 go, hour 2 loses rows (made again).
    h.prune((2 * H + H / 2) as u64 + 1000, Duration::from_secs(1)).unwrap();
    assert_eq!(hours_made(h.connection()), [3 * H, 4 * H]);
    assert_eq!(count(h.connection(), "rollup_gpus"), 2);
    assert_eq!(roll_up_all(&mut h, &idle), 1);
    let mut reader = Reader::open(dir.path()).unwrap().unwrap();
    let (a, served) = both(&mut reader, Window { since_ms: 0, until_ms: 6 * H }, &idle, None);
    assert_eq!(served.hours, 3);
    // The rows that end at or after the horizon (2.5 h).
    assert_eq!(a.gpus["GPU-a"].energy_mj, 1000 * 22);
}

/// A database as vgpu 0.1 made it: schema version 1, verbatim (`src/schema/v1.sql`).
fn version_1(lib: &std::path::Path) -> Connection {
    let conn = Connection::open(crate::db::path_in(lib)).unwrap();
    conn.execute_batch(&format!("PRAGMA journal_mode = WAL; BEGIN; {} PRAGMA user_version = 1; COMMIT;", include_str!("schema/v1.sql"))).unwrap();
    conn
}

/// Every row of every table of schema version 1, as text.
fn dump(conn: &Connection) -> Vec<String> {
    let mut out = Vec::new();
    for table in ["gpu_samples", "workload_gpu_time", "workloads", "intensity", "decisions", "power_models", "workload_sensitivity"] {
        let mut st = conn.prepare(&format!("SELECT * FROM {table} ORDER BY 1, 2, 3")).unwrap();
        let n = st.column_count();
        let mut rows = st.query([]).unwrap();
        while let Some(r) = rows.next().unwrap() {
            let cells: Vec<String> = (0..n).map(|i| format!("{:?}", r.get_ref(i).unwrap())).collect();
            out.push(format!("{table}: {}", cells.join(" | ")));
        }
    }
    out
}

#[test]
fn a_version_1_database_with_rows_is_migrated_in_place_and_reads_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let old = version_1(dir.path());
    for k in 0..50 {
        sample(&old, "GPU-a", k * 5 * MIN, (k + 1) * 5 * MIN, 999_999 + k, Some(2 * MIN));
        sample(&old, "GPU-b", k * 5 * MIN + 7, (k + 1) * 5 * MIN + 7, 500_000, None);
        busy(&old, "w1", "GPU-a", k * 5 * MIN, (k + 1) * 5 * MIN, MIN + k);
    }
    figure(&old, 30 * MIN, "reading", 123.25);
    figure(&old, 30 * MIN, "fallback", 300.0);
    model(&old, "GPU-a", 20.0);
    old.execute_batch(
        "INSERT INTO workloads VALUES ('w1', 'train', 1000, 'alice', NULL, 'python train.py', 'GPU-a', 0, 15000000, 'exit 0');
         INSERT INTO decisions VALUES (5, 'apply', 'budget', 123.25, 10, 9, 1, '{}');
         INSERT INTO workload_sensitivity VALUES ('name:train', 0.5, 3, 9);",
    )
    .unwrap();
    let rows = dump(&old);
    drop(old);
    let idle = IdleDefaults::new(Some(3.0), BTreeMap::new);
    let window = Window { since_ms: 0, until_ms: 5 * H };
    // The new reader of the old database: from the rows (no rollup tables there).
    let reader = Reader::open(dir.path()).unwrap().unwrap();
    let (read_old, served) = reader.accounting_served(window, &idle, None).unwrap();
    assert_eq!(served.hours, 0);
    let ended_old = reader.ended_since(0, 20, &idle).unwrap();
    drop(reader);
    let mut h = History::open(dir.path()).unwrap();
    let version: i64 = h.connection().pragma_query_value(None, "user_version", |r| r.get(0)).unwrap();
    assert_eq!(version, crate::SCHEMA_VERSION);
    assert_eq!(dump(h.connection()), rows, "every row of version 1 kept as it was");
    assert_eq!(h.integrity_check().unwrap(), "ok");
    assert!(roll_up_all(&mut h, &idle) >= 3);
    let mut reader = Reader::open(dir.path()).unwrap().unwrap();
    let (read_new, served) = both(&mut reader, window, &idle, None);
    assert!(served.hours >= 3, "{served:?}");
    assert_eq!(read_new, read_old);
    assert_eq!(reader.ended_since(0, 20, &idle).unwrap(), ended_old);
    // Opened again: nothing to do.
    drop(h);
    assert_eq!(dump(History::open(dir.path()).unwrap().connection()), rows);
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    const GPUS: [&str; 3] = ["GPU-a", "GPU-b", "GPU-c"];
    const WORKLOADS: [&str; 4] = ["w1", "w2", "w3", "w4"];

    /// Where the idle power of a GPU without a measured model comes from.
    #[derive(Debug, Clone)]
    enum Defaults {
        Configured(f64),
        /// The driver's, per GPU (none: the lowest observed).
        Driver([Option<f64>; 3]),
    }

    impl Defaults {
        fn idle(&self) -> IdleDefaults<'static> {
            match self.clone() {
                Defaults::Configured(w) => IdleDefaults::new(Some(w), BTreeMap::new),
                Defaults::Driver(w) => IdleDefaults::new(None, move || w.iter().enumerate().filter_map(|(g, w)| w.map(|w| (GPUS[g].to_string(), w))).collect()),
            }
        }

        fn all_known(&self, models: &[Option<f64>; 3]) -> bool {
            match self {
                Defaults::Configured(_) => true,
                Defaults::Driver(w) => (0..3).all(|g| w[g].is_some() || models[g].is_some()),
            }
        }
    }

    /// What changes after the rollups are made.
    #[derive(Debug, Clone)]
    enum Change {
        Sample { gpu: usize, t0: i64, len: i64, energy: i64 },
        Busy { workload: usize, gpu: usize, t0: i64, len: i64, busy: i64 },
        DeleteSample { nth: usize },
        Figure { ts: i64, reading: bool, g: f64 },
        Model { gpu: usize, watts: f64 },
    }

    #[derive(Debug, Clone)]
    struct Case {
        base: i64,
        /// Per row: GPU, a gap before it, its length, energy, busy.
        samples: Vec<(usize, i64, i64, i64, Option<i64>)>,
        busy: Vec<(usize, usize, i64, i64, i64)>,
        figures: Vec<(i64, bool, f64)>,
        models: [Option<f64>; 3],
        defaults: Defaults,
        /// The writer's view of the idle power differs from the readers'.
        other_writer: bool,
        changes: Vec<Change>,
        /// After the changes, a pass with this budget (ms), or none.
        again: Option<u64>,
        windows: Vec<(i64, i64, Option<usize>)>,
        /// How long the history is, about (hours).
        hours: i64,
    }

    /// The scale of a history: hours, or days (rows of an hour or so, windows of days).
    #[derive(Debug, Clone, Copy)]
    struct Scale {
        /// How long the history is, about.
        hours: i64,
        /// How many GPU rows, at least and at most.
        rows: (usize, usize),
        days: bool,
    }

    const HOURS: Scale = Scale { hours: 9, rows: (0, 50), days: false };
    const DAYS: Scale = Scale { hours: 4 * 24, rows: (150, 300), days: true };

    fn length(scale: Scale) -> BoxedStrategy<i64> {
        if scale.days {
            prop_oneof![2 => 1_000i64..15 * MIN, 5 => 15 * MIN..70 * MIN, 3 => 70 * MIN..150 * MIN].boxed()
        } else {
            prop_oneof![6 => 1_000i64..15 * MIN, 3 => 15 * MIN..70 * MIN, 1 => 70 * MIN..150 * MIN].boxed()
        }
    }

    fn at(scale: Scale) -> BoxedStrategy<i64> {
        // Anywhere over the history, or on the grid (ties with the hours' edges).
        prop_oneof![3 => -2 * H..scale.hours * H, 1 => (-2i64..scale.hours).prop_map(|h| h * H)].boxed()
    }

    fn change(scale: Scale) -> impl Strategy<Value = Change> {
        prop_oneof![
            (0usize..3, at(scale), length(scale), 0i64..5_000_000).prop_map(|(gpu, t0, len, energy)| Change::Sample { gpu, t0, len, energy }),
            (0usize..4, 0usize..3, at(scale), length(scale), 0i64..5_000_000).prop_map(|(workload, gpu, t0, len, busy)| Change::Busy { workload, gpu, t0, len, busy }),
            (0usize..60).prop_map(|nth| Change::DeleteSample { nth }),
            (at(scale), any::<bool>(), 0.0f64..900.0).prop_map(|(ts, reading, g)| Change::Figure { ts, reading, g }),
            (0usize..3, 0.0f64..400.0).prop_map(|(gpu, watts)| Change::Model { gpu, watts }),
        ]
    }

    fn cases(scale: Scale) -> impl Strategy<Value = Case> {
        let samples = proptest::collection::vec((0usize..3, prop_oneof![4 => Just(0i64), 1 => 1i64..90 * MIN], length(scale), 0i64..5_000_000, proptest::option::of(0i64..6_000_000)), scale.rows.0..scale.rows.1);
        let busy = proptest::collection::vec((0usize..4, 0usize..3, at(scale), length(scale), 0i64..6_000_000), 0..scale.rows.1 * 4 / 5);
        let figures = proptest::collection::vec((at(scale), any::<bool>(), 0.0f64..900.0), 0..(8 + scale.hours as usize / 8));
        let models = proptest::array::uniform3(proptest::option::of(0.0f64..400.0));
        let defaults = prop_oneof![(0.0f64..400.0).prop_map(Defaults::Configured), proptest::array::uniform3(proptest::option::of(0.0f64..400.0)).prop_map(Defaults::Driver)];
        let windows = proptest::collection::vec((prop_oneof![at(scale), -3 * H..(scale.hours + 1) * H], 1i64..(scale.hours + 3) * H, proptest::option::of(0usize..4)), 1..4);
        let changes = proptest::collection::vec(change(scale), 0..3);
        let base = prop_oneof![Just(0i64), -3 * H..3 * H];
        (base, samples, busy, figures, models, defaults, proptest::bool::weighted(0.15), changes, proptest::option::of(0u64..3), windows).prop_map(
            move |(base, samples, busy, figures, models, defaults, other_writer, changes, again, windows)| Case {
                base,
                samples,
                busy,
                figures,
                models,
                defaults,
                other_writer,
                changes,
                again,
                windows,
                hours: scale.hours,
            },
        )
    }

    /// Σ over the rows of `gpu` that the accounting reads (at most MAX_INTERVAL_MS long) of
    /// their energy clipped to the window as documented: straight from the table.
    fn measured(conn: &Connection, gpu: &str, w: Window) -> u64 {
        let mut st = conn.prepare("SELECT t0_ms, t1_ms, energy_mj FROM gpu_samples WHERE gpu_uuid = ?1").unwrap();
        let rows: Vec<(i64, i64, i64)> = st.query_map([gpu], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).unwrap().collect::<Result<_, _>>().unwrap();
        rows.into_iter()
            .filter(|&(t0, t1, _)| t1 - t0 <= MAX_INTERVAL_MS)
            .map(|(t0, t1, e)| {
                let (c0, c1) = (t0.max(w.since_ms), t1.min(w.until_ms));
                if c1 <= c0 {
                    return 0;
                }
                let f = |t: i64| (e as u128 * (t - t0) as u128 / (t1 - t0) as u128) as u64;
                f(c1) - f(c0)
            })
            .sum()
    }

    fn apply(conn: &Connection, base: i64, change: &Change) {
        match *change {
            Change::Sample { gpu, t0, len, energy } => sample(conn, GPUS[gpu], base + t0, base + t0 + len, energy, None),
            Change::Busy { workload, gpu, t0, len, busy: b } => busy(conn, WORKLOADS[workload], GPUS[gpu], base + t0, base + t0 + len, b.min(len)),
            Change::DeleteSample { nth } => {
                let keys: Vec<(String, i64)> = {
                    let mut st = conn.prepare("SELECT gpu_uuid, t1_ms FROM gpu_samples ORDER BY t1_ms, gpu_uuid").unwrap();
                    st.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap().collect::<Result<_, _>>().unwrap()
                };
                if let Some((gpu, t1)) = keys.get(nth % keys.len().max(1)) {
                    conn.execute("DELETE FROM gpu_samples WHERE gpu_uuid = ?1 AND t1_ms = ?2", params![gpu, t1]).unwrap();
                }
            }
            Change::Figure { ts, reading, g } => figure(conn, base + ts, if reading { "reading" } else { "fallback" }, g),
            Change::Model { gpu, watts } => model(conn, GPUS[gpu], watts),
        }
    }

    /// See the tests below.
    fn check(case: Case) -> Result<(), TestCaseError> {
        let dir = tempfile::tempdir().unwrap();
        let mut h = History::open(dir.path()).unwrap();
        let base = case.base;
        {
            let conn = h.connection();
            let mut end = [0i64; 3];
            for &(g, gap, len, energy, busy_ms) in &case.samples {
                let t0 = end[g] + gap;
                end[g] = t0 + len;
                sample(conn, GPUS[g], base + t0, base + t0 + len, energy, busy_ms.map(|b| b.min(len)));
            }
            for &(w, g, t0, len, b) in &case.busy {
                busy(conn, WORKLOADS[w], GPUS[g], base + t0, base + t0 + len, b.min(len));
            }
            for &(ts, reading, g) in &case.figures {
                figure(conn, base + ts, if reading { "reading" } else { "fallback" }, g);
            }
            for (g, m) in case.models.iter().enumerate() {
                if let Some(w) = m {
                    model(conn, GPUS[g], *w);
                }
            }
        }
        let idle = case.defaults.idle();
        let writer = if case.other_writer { IdleDefaults::new(Some(17.5), BTreeMap::new) } else { case.defaults.idle() };
        roll_up_all(&mut h, &writer);
        // Of a reading and a fallback at the first time of all, a window that reaches
        // past it and one that does not take different figures for the hours before it
        // (`account::Steps` before its first figure, `Source::intensity` without one):
        // there a rollup matches only some windows (the others read the rows).
        let first = case.figures.iter().map(|f| f.0).min();
        let tie = first.is_some_and(|t| case.figures.iter().filter(|f| f.0 == t).map(|f| f.1).collect::<BTreeSet<_>>().len() == 2);
        let clean = case.changes.is_empty() && !case.other_writer && case.defaults.all_known(&case.models) && !tie;
        for change in &case.changes {
            apply(h.connection(), base, change);
        }
        if let Some(budget) = case.again {
            pass(&mut h, &writer, true, Duration::from_millis(budget));
        }
        let mut reader = Reader::open(dir.path()).unwrap().unwrap();
        // The random windows, and one over everything (every rollup made is read).
        let everything = (-3 * H, (case.hours + 6) * H + 2 * DAY_MS, None);
        for &(since, len, of) in case.windows.iter().chain([&everything]) {
            let window = Window { since_ms: base + since, until_ms: base + since + len };
            let gpus_of = of.map(|w| WORKLOADS[w]);
            let (a, served) = both(&mut reader, window, &idle, gpus_of);
            if gpus_of.is_none() {
                for gpu in GPUS {
                    let want = measured(h.connection(), gpu, window);
                    let got = a.gpus.get(gpu).map_or(0, |g| g.energy_mj);
                    prop_assert_eq!(got, want, "GPU {}", gpu);
                    let parts = a.gpus.get(gpu).map_or(0, |g| g.parts.values().map(|p| p.energy_mj).sum::<u64>());
                    prop_assert_eq!(parts, want, "GPU {}: idle + unattributed + workloads", gpu);
                }
            }
            if clean && gpus_of.is_none() {
                // Every rollup made inside the window was read: each whole day's, and each
                // whole hour's outside those days.
                let inside = |span: i64| made(h.connection(), span).into_iter().filter(|&t| t >= window.since_ms && t + span <= window.until_ms).collect::<Vec<_>>();
                let days = inside(DAY_MS);
                prop_assert_eq!(served.days, days.len());
                let hours = inside(HOUR_MS).into_iter().filter(|&t| !days.contains(&floor_to(t, DAY_MS))).count();
                prop_assert_eq!(served.hours, hours);
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(160))]

        /// Random rows (not on the grid, of any length, overlapping hours and each other),
        /// random intensity figures (ties included) and idle powers, over some hours;
        /// rollups made, then rows, figures and models changed (some made again, some not):
        /// for random windows, of all GPUs or a workload's, the accounting read through the
        /// rollups is the one read from the rows alone, to the bit, and its energy is every
        /// row's clipped energy, to the millijoule.
        #[test]
        fn rollups_and_rows_give_the_accounting_of_the_rows_alone(case in cases(HOURS)) {
            check(case)?;
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(40))]

        /// The same over days (daily rollups, windows of days).
        #[test]
        fn over_days_rollups_and_rows_give_the_accounting_of_the_rows_alone(case in cases(DAYS)) {
            check(case)?;
        }
    }
}
