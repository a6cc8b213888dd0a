use super::*;
use crate::tick::EnergySource;
use crate::tick::GpuRow;
use crate::tick::TimeSource;
use crate::tick::WorkloadRow;

fn row(t0: u64, t1: u64, energy: u64) -> GpuRow {
    GpuRow {
        t0_ms: t0,
        t1_ms: t1,
        gpu_uuid: "GPU-0".into(),
        gpu_index: 0,
        gpu_name: "H100".into(),
        energy_mj: energy,
        energy_source: EnergySource::Counter,
        busy_ms: Some(1),
        sm_clock_mhz: Some(1980),
        power_w: Some(300.0),
        energy_counter_mj: Some(t1 * 10),
    }
}

fn work(t0: u64, t1: u64, id: &str) -> WorkloadRow {
    WorkloadRow { t0_ms: t0, t1_ms: t1, workload_id: id.into(), gpu_uuid: "GPU-0".into(), busy_ms: 5, source: TimeSource::Ledger }
}

fn count(h: &History, table: &str) -> i64 {
    h.connection().query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0)).unwrap()
}

#[test]
fn a_tick_is_written_whole_or_not_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = History::open(dir.path()).unwrap();
    h.record_tick(&Tick { gpus: vec![row(0, 1000, 7)], workloads: vec![work(0, 1000, "w")] }).unwrap();
    // The second workload row breaks the primary key: the GPU row before it goes too.
    let bad = Tick { gpus: vec![row(1000, 2000, 8)], workloads: vec![work(1000, 2000, "w"), work(1000, 2000, "w")] };
    assert!(matches!(h.record_tick(&bad), Err(WriteError::Sqlite { .. })));
    assert_eq!((count(&h, "gpu_samples"), count(&h, "workload_gpu_time")), (1, 1));
    assert_eq!(h.last_gpus().unwrap(), vec![("GPU-0".to_string(), LastGpu { t_ms: 1000, counter_mj: Some(10_000) })]);
    h.record_tick(&Tick { gpus: vec![row(1000, 2000, 8)], workloads: vec![] }).unwrap();
    assert_eq!(h.last_gpus().unwrap(), vec![("GPU-0".to_string(), LastGpu { t_ms: 2000, counter_mj: Some(20_000) })]);
    assert_eq!(h.integrity_check().unwrap(), "ok");
}

#[test]
fn workloads_keep_their_start_and_their_first_end() {
    let dir = tempfile::tempdir().unwrap();
    let h = History::open(dir.path()).unwrap();
    let mut info = WorkloadInfo::of(&vgpu_store::state::workload::tests::sample());
    info.started_ms = 100;
    h.upsert_workload(&info).unwrap();
    info.started_ms = 999;
    info.name = "renamed".into();
    h.upsert_workload(&info).unwrap();
    assert_eq!(h.running_workloads().unwrap(), vec![info.id.clone()]);
    // The watch sees it gone first; vgpu run then says how it ended.
    assert!(h.end_workload(&info.id, 500, None).unwrap());
    assert!(!h.end_workload(&info.id, 550, None).unwrap());
    assert!(h.end_workload(&info.id, 600, Some("exit 0")).unwrap());
    assert!(!h.end_workload(&info.id, 700, Some("exit 1")).unwrap());
    let got: (String, i64, i64, String, String) = h
        .connection()
        .query_row("SELECT name, started_ms, ended_ms, outcome, gpus FROM workloads", [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))
        .unwrap();
    assert_eq!(got, ("renamed".into(), 100, 500, "exit 0".into(), "GPU-x".into()));
    assert!(h.running_workloads().unwrap().is_empty());
}

#[test]
fn a_workload_never_seen_is_recorded_with_its_end_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let h = History::open(dir.path()).unwrap();
    let mut info = WorkloadInfo::of(&vgpu_store::state::workload::tests::sample());
    info.started_ms = 100;
    assert!(h.record_ended(&info, 500, Some("exit 3")).unwrap());
    let got: (i64, i64, String) =
        h.connection().query_row("SELECT started_ms, ended_ms, outcome FROM workloads", [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).unwrap();
    assert_eq!(got, (100, 500, "exit 3".into()));
    // Already ended with an outcome: nothing changes, and it is still one row.
    assert!(!h.record_ended(&info, 900, Some("exit 4")).unwrap());
    assert_eq!(count(&h, "workloads"), 1);
    assert!(h.running_workloads().unwrap().is_empty());
}

#[test]
fn a_reading_is_recorded_once_a_forecast_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let h = History::open(dir.path()).unwrap();
    assert!(h.record_intensity(IntensityKind::Reading, 1000, 200.0, "static", 1000).unwrap());
    assert!(!h.record_intensity(IntensityKind::Reading, 1000, 200.0, "static", 2000).unwrap());
    h.record_intensity(IntensityKind::Forecast, 5000, 100.0, "uk", 1000).unwrap();
    h.record_intensity(IntensityKind::Forecast, 5000, 120.0, "uk", 2000).unwrap();
    assert_eq!(count(&h, "intensity"), 2);
    let g: f64 = h.connection().query_row("SELECT g_per_kwh FROM intensity WHERE kind = 'forecast'", [], |r| r.get(0)).unwrap();
    assert_eq!(g, 120.0);
}

#[test]
fn a_decision_keeps_its_whole_record() {
    let dir = tempfile::tempdir().unwrap();
    let h = History::open(dir.path()).unwrap();
    let d = vgpu_carbon::log::Decision {
        time: chrono::DateTime::from_timestamp_millis(1_700_000_000_123).unwrap(),
        action: vgpu_carbon::log::Action::Apply,
        intensity: Some(210.0),
        intensity_source: None,
        budget_g_per_hour: Some(400.0),
        predicted_g_per_hour: Some(380.0),
        budget_met: Some(true),
        notes: vec![],
        gpus: vec![],
        reason: Some("workload started w".into()),
        horizons: vec![],
    };
    h.record_decision(&d).unwrap();
    let (ts, action, met, record): (i64, String, bool, String) = h
        .connection()
        .query_row("SELECT ts_ms, action, budget_met, record FROM decisions", [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap();
    assert_eq!((ts, action.as_str(), met), (1_700_000_000_123, "apply", true));
    assert_eq!(serde_json::from_str::<vgpu_carbon::log::Decision>(&record).unwrap(), d);
}

#[test]
fn prune_deletes_only_what_is_older_than_the_horizon() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = History::open(dir.path()).unwrap();
    let day = 86_400_000;
    h.record_tick(&Tick { gpus: vec![row(0, day, 1), row(day, 3 * day, 2)], workloads: vec![work(0, day, "old"), work(day, 3 * day, "new")] }).unwrap();
    h.record_intensity(IntensityKind::Reading, day - 1, 1.0, "s", 0).unwrap();
    h.record_intensity(IntensityKind::Reading, 2 * day, 1.0, "s", 0).unwrap();
    let mut info = WorkloadInfo::of(&vgpu_store::state::workload::tests::sample());
    h.upsert_workload(&info).unwrap();
    h.end_workload(&info.id, day - 1, None).unwrap();
    info.id = "running".into();
    h.upsert_workload(&info).unwrap();
    // Keep 2 days at day 3: what ended before day 1 goes.
    let pruned = h.prune(3 * day - 1, Duration::from_millis(2 * day)).unwrap();
    assert_eq!(pruned.rows, 0, "rows ending exactly at the horizon stay");
    let pruned = h.prune(3 * day + 1, Duration::from_millis(2 * day)).unwrap();
    assert_eq!(pruned.rows, 4);
    assert_eq!((count(&h, "gpu_samples"), count(&h, "workload_gpu_time"), count(&h, "intensity"), count(&h, "workloads")), (1, 1, 1, 1));
    let left: String = h.connection().query_row("SELECT workload_id FROM workload_gpu_time", [], |r| r.get(0)).unwrap();
    assert_eq!(left, "new");
}

#[test]
fn errors_are_classified() {
    let path = PathBuf::from("/x/history.db");
    let full = rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL), None);
    let e = WriteError::from_sqlite(&path, full);
    assert_eq!(e.kind(), "disk-full");
    assert!(e.to_string().starts_with("/x/history.db: disk full: "), "{e}");
    let busy = rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY), None);
    assert_eq!(WriteError::from_sqlite(&path, busy).kind(), "busy");
    let enospc = HistoryError::Io { path: path.clone(), source: std::io::Error::from_raw_os_error(libc::ENOSPC) };
    assert_eq!(WriteError::from_open(enospc).kind(), "disk-full");
    let link = HistoryError::Io { path: path.clone(), source: std::io::Error::from_raw_os_error(libc::ELOOP) };
    assert!(WriteError::from_open(link).to_string().contains("a symbolic link: refused, never followed"));
}

#[test]
fn a_commands_record_is_bounded_in_total_not_per_statement() {
    let dir = tempfile::tempdir().unwrap();
    drop(History::open(dir.path()).unwrap());
    // Another writer holds the write lock: each statement waits for it, but only for what
    // is left of the one deadline.
    let other = rusqlite::Connection::open(super::db::path_in(dir.path())).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let deadline = std::time::Instant::now() + Duration::from_millis(300);
    let h = History::open_within(dir.path(), deadline).unwrap();
    let info = WorkloadInfo::of(&vgpu_store::state::workload::tests::sample());
    assert_eq!(h.upsert_workload(&info).unwrap_err().kind(), "busy");
    while std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    // The deadline spent, the next statements do not wait at all, even with the lock free.
    other.execute_batch("COMMIT").unwrap();
    assert!(matches!(h.end_workload(&info.id, 1, None), Err(WriteError::Busy { .. })));
    assert!(matches!(History::open_within(dir.path(), deadline), Err(WriteError::Busy { .. })));
}
