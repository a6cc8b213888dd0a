//! `vgpu watch` records the history (history.db) end to end: the real binary, the shim and
//! the simulated driver, as root with real cgroups. Each GPU's energy adds up exactly to its
//! counter's delta across rounds and across a restart; a workload's GPU time is the shim's
//! ledger, within each interval; a watch killed inside a round's transaction leaves a sound
//! database without that round; a full disk is one clear warning, enforcement goes on, and
//! recording resumes when space is back; retention deletes old rows only; `enabled = false`
//! records nothing; a link in place of history.db is refused, never followed; `[history]
//! interval` adds rounds up into longer rows; `vgpu carbon apply` records its intensity and
//! decision; a workload ends with `vgpu run`'s exit status, or as reconcile found it; a
//! write lock held elsewhere is one warning and delays nothing recorded; a damaged file is
//! one warning, left as it is, and a new database records once it is moved aside; a history
//! of schema version 1 is migrated in place and rolled up hour by hour (killed in the middle
//! of either: a sound database, nothing lost, the next watch finishes), and `vgpu carbon
//! report` says the same of it, byte for byte, from its rows and through its rollups.
//!
//! Synchronisation: the watch's `ready` and `round N done` lines, its warnings, and `vgpu
//! run` exiting. Each test has its own simulated GPU, state directory and mount, so they run
//! beside the harness's other tests; what they count in rounds allows for rounds stretched
//! by a busy machine (a 200 ms round is a timer, not a promise).

use std::io::Write as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::common::{self, Sim};
use rusqlite::Connection;
use crate::common::watch::Watch;
use crate::common::workload::workload_bin;

const ONE_GPU: &[(&str, &str)] = &[("NVIDIA H100-sim", "80GiB")];

/// A watch of 200 ms rounds writing a row per round (`[history] interval = "0s"`, unless
/// `extra`'s `[history]` sets its own), plus `extra`.
fn config(extra: &str) -> String {
    let extra = if !extra.contains("[history]") {
        format!("{extra}[history]\ninterval = \"0s\"\n")
    } else if !extra.contains("interval") {
        extra.replace("[history]\n", "[history]\ninterval = \"0s\"\n")
    } else {
        extra.to_string()
    };
    format!("[watch]\ninterval = \"200ms\"\nlisten = \"\"\n{extra}")
}

/// The first line with `needle` the watch logged, or the next one (the history thread
/// reports at the round after it tried, which may come before or after `ready`).
fn said_or_wait(watch: &mut Watch, needle: &str) -> String {
    match watch.log.iter().find(|l| l.contains(needle)).cloned() {
        Some(line) => line,
        None => watch.wait_line(needle, |l| l.contains(needle)),
    }
}

fn db_path(sim: &Sim) -> PathBuf {
    sim.path("lib/history.db")
}

/// The database, read-only (None: there is none).
fn open(sim: &Sim) -> Connection {
    vgpu_history::reader::open_ro(&sim.path("lib")).expect("open history.db").expect("history.db exists")
}

fn count(conn: &Connection, sql: &str) -> i64 {
    conn.query_row(sql, [], |r| r.get(0)).unwrap_or_else(|e| panic!("{sql}: {e}"))
}

fn integrity(conn: &Connection) -> String {
    conn.query_row("PRAGMA integrity_check", [], |r| r.get(0)).unwrap()
}

/// One GPU's rows: (t0, t1, energy, source, counter).
fn gpu_rows(conn: &Connection) -> Vec<(i64, i64, i64, String, Option<i64>)> {
    let mut stmt = conn.prepare("SELECT t0_ms, t1_ms, energy_mj, energy_source, energy_counter_mj FROM gpu_samples ORDER BY t1_ms").unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))).unwrap().map(Result::unwrap).collect()
}

/// The rows follow each other without gap or overlap, each is the counter's delta since the
/// previous reading, and their sum is the counter's delta from the first reading to the last.
fn assert_energy_adds_up(rows: &[(i64, i64, i64, String, Option<i64>)]) {
    assert!(rows.len() >= 2, "{rows:?}");
    for pair in rows.windows(2) {
        let ((_, t1, _, _, c1), (t0, _, e, _, c2)) = (&pair[0], &pair[1]);
        assert_eq!(t1, t0, "contiguous intervals: {pair:?}");
        assert_eq!(Some(*e), c2.zip(*c1).map(|(b, a)| b - a), "energy = counter delta: {pair:?}");
    }
    assert!(rows.iter().all(|r| r.3 == "counter" && r.2 >= 0), "{rows:?}");
    let first_reading = rows[0].4.unwrap() - rows[0].2;
    let total: i64 = rows.iter().map(|r| r.2).sum();
    assert_eq!(total, rows.last().unwrap().4.unwrap() - first_reading);
    // Sane: at least the simulated H100's idle power (70 W) all along, W × ms = mJ.
    let span = rows.last().unwrap().1 - rows[0].0;
    assert!(total >= 70 * span * 99 / 100, "{total} mJ in {span} ms is below idle power");
}

#[test]
fn energy_adds_up_across_rounds_and_a_restart_and_workload_time_is_the_ledger() {
    let w = workload_bin().to_str().unwrap().to_string();
    let sim = Sim::new(ONE_GPU);
    sim.write_vgpu_config(&config(""));
    let mut watch = Watch::start(&sim, &[]);
    let out = sim
        .vgpu(&["run", "--name", "hist", "--gpu", "0", "--mem", "1G", "--compute", "50", "--", &w, "sync", "2", "--kernel-us", "2000"])
        .output()
        .unwrap();
    assert!(out.status.success(), "vgpu run: {}", String::from_utf8_lossy(&out.stderr));
    // Rounds after its end (the lines logged meanwhile read first) record that it ended.
    watch.drain();
    watch.wait_rounds(3);
    assert!(watch.stop().success());

    let conn = open(&sim);
    assert_eq!(integrity(&conn), "ok");
    let first = gpu_rows(&conn);
    // About 10 (2 s at 200 ms rounds); at least half of them on a busy machine.
    assert!(first.len() >= 5, "2 s at 200 ms rounds: {first:?}");
    assert_energy_adds_up(&first);
    let (id, ended, outcome): (String, Option<i64>, Option<String>) =
        conn.query_row("SELECT id, ended_ms, outcome FROM workloads WHERE name = 'hist'", [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).unwrap();
    assert!(ended.is_some(), "its end is recorded");
    assert_eq!(outcome.as_deref(), Some("exit 0"), "vgpu run says how it ended");
    let mut stmt = conn.prepare("SELECT t1_ms - t0_ms, busy_ms, source FROM workload_gpu_time WHERE workload_id = ?1").unwrap();
    let times: Vec<(i64, i64, String)> = stmt.query_map([&id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).unwrap().map(Result::unwrap).collect();
    assert!(!times.is_empty(), "GPU time recorded");
    assert!(times.iter().all(|(dt, busy, _)| *busy > 0 && busy <= dt), "{times:?}");
    assert!(times.iter().any(|t| t.2 == "ledger"), "the shim's ledger counted: {times:?}");
    let busy: i64 = times.iter().map(|t| t.1).sum();
    eprintln!("{} GPU rows, {} mJ; workload {id}: {busy} ms of GPU time in {} rows", first.len(), first.iter().map(|r| r.2).sum::<i64>(), times.len());
    // At --compute 50 for 2 s: about 1 s, never more than the 2 s it ran.
    assert!(busy <= 2_500, "{busy} ms");
    // vgpu run said what it used, from what the watch recorded while it ran.
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains(&format!("workload hist ({id}) used ")), "the end-of-workload line: {said}");

    // `vgpu carbon report` over what this watch recorded: the TOTAL is the GPU's measured
    // energy, exactly; the workload's row carries its recorded GPU time and some energy.
    let recorded: i64 = first.iter().map(|r| r.2).sum();
    let report = sim.json(&["carbon", "report", "--json", "--since", "1h"]);
    assert_eq!(report["total_energy_mj"].as_i64(), Some(recorded), "{report}");
    let rows = report["rows"].as_array().unwrap();
    let parts: i64 = rows.iter().map(|r| r["energy_mj"].as_i64().unwrap()).sum();
    assert_eq!(parts, recorded, "the rows add up to the total: {report}");
    let mine = rows.iter().find(|r| r["key"] == id.as_str()).unwrap_or_else(|| panic!("a row for {id}: {report}"));
    assert_eq!(mine["gpu_time_ms"].as_i64(), Some(busy), "{mine}");
    assert!(mine["energy_mj"].as_i64().unwrap() > 0, "{mine}");
    assert!(rows.iter().any(|r| r["kind"] == "idle" && r["energy_mj"].as_i64().unwrap() > 0), "idle energy apart: {report}");
    drop(stmt);
    drop(conn);

    // Root's alone, mode 0600 (and so are its -wal and -shm, when there); the public copy
    // the watch made for everybody else is 0644.
    for suffix in ["", "-wal", "-shm"] {
        if let Ok(meta) = std::fs::metadata(sim.path(&format!("lib/history.db{suffix}"))) {
            assert_eq!((meta.uid(), meta.permissions().mode() & 0o7777), (0, 0o600), "history.db{suffix}");
        }
    }
    let meta = std::fs::metadata(sim.path("lib/history-snapshot.db")).unwrap();
    assert_eq!((meta.uid(), meta.permissions().mode() & 0o7777), (0, 0o644));

    // A restarted watch continues from the last reading: no energy lost in between.
    let mut watch = Watch::start(&sim, &[]);
    watch.wait_rounds(2);
    assert!(watch.stop().success());
    let all = gpu_rows(&open(&sim));
    assert!(all.len() > first.len());
    assert_energy_adds_up(&all);
}

#[test]
fn a_watch_killed_inside_a_round_leaves_a_sound_database_without_that_round() {
    let sim = Sim::new(ONE_GPU);
    sim.write_vgpu_config(&config(""));
    let mut watch = Watch::start(&sim, &[]);
    watch.wait_rounds(2);
    assert!(watch.stop().success());
    let before = gpu_rows(&open(&sim));
    assert!(!before.is_empty());

    // Its first round writes the GPU row bridging the gap, then dies before committing.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vgpu"));
    cmd.args(["--simulate", "watch"]).env_remove("VGPU_SIMULATE").env("VGPU_TEST_STOP_AT", "history:mid-tick");
    for (k, v) in sim.env() {
        cmd.env(k, v);
    }
    let status = cmd.stdout(Stdio::null()).stderr(Stdio::null()).status().unwrap();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL), "{status:?}");

    let conn = open(&sim);
    assert_eq!(integrity(&conn), "ok");
    assert_eq!(gpu_rows(&conn), before, "the half-written round is not there");
    drop(conn);

    let mut watch = Watch::start(&sim, &[]);
    watch.wait_rounds(1);
    assert!(watch.stop().success());
    let after = gpu_rows(&open(&sim));
    assert!(after.len() > before.len(), "the next round records");
    assert_energy_adds_up(&after);
}

/// A tmpfs mounted on a directory, unmounted when dropped.
struct Mount(PathBuf);

impl Mount {
    fn tmpfs(dir: &Path, size: &str) -> Mount {
        let out = Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size},mode=0755"), "tmpfs"]).arg(dir).output().expect("run mount");
        // No skip: CI runs as root, where this must work.
        assert!(out.status.success(), "cannot mount a tmpfs on {}: {}", dir.display(), String::from_utf8_lossy(&out.stderr));
        Mount(dir.to_path_buf())
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Fill the file system of `path` (a file there grows until ENOSPC).
fn fill(path: &Path) {
    let mut f = std::fs::File::create(path).unwrap();
    let block = vec![0u8; 64 << 10];
    loop {
        match f.write(&block) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
    // The last partial blocks.
    while f.write(&[0u8; 512]).is_ok_and(|n| n > 0) {}
}

#[test]
fn a_full_disk_is_one_clear_warning_enforcement_goes_on_and_recording_resumes() {
    let sim = Sim::new(ONE_GPU);
    let prom = sim.path("vgpu.prom");
    sim.write_vgpu_config(&config(&format!("textfile = \"{}\"\n", prom.display())));
    let _mount = Mount::tmpfs(&sim.path("lib"), "16m");
    let mut watch = Watch::start(&sim, &[]);
    watch.wait_rounds(2);
    let filler = sim.path("lib/filler");
    fill(&filler);
    let warning = watch.wait_line("the disk-full warning", |l| l.contains("history: cannot record"));
    assert!(warning.contains("history.db: disk full"), "{warning}");
    // Rounds go on, and the warning is not repeated; the metrics count the failures.
    watch.wait_rounds(3);
    let counted = |l: &str| l.starts_with("vgpu_history_write_failures_total{kind=\"disk-full\"} ") && !l.ends_with(" 0");
    common::wait_for("the metrics to count the failures", || std::fs::read_to_string(&prom).is_ok_and(|t| t.lines().any(counted)));
    assert_eq!(watch.log.iter().filter(|l| l.contains("warning: history: cannot record")).count(), 1, "{:#?}", watch.log);
    let conn = open(&sim);
    assert_eq!(integrity(&conn), "ok");
    let during = gpu_rows(&conn).len();
    drop(conn);
    std::fs::remove_file(&filler).unwrap();
    watch.wait_line("recording to resume", |l| l.contains("history: recording again"));
    watch.wait_rounds(2);
    assert!(watch.stop().success());
    let conn = open(&sim);
    assert_eq!(integrity(&conn), "ok");
    let rows = gpu_rows(&conn);
    assert!(rows.len() > during, "recording resumed");
    // The round that could not be written is covered by the next: no energy lost.
    assert_energy_adds_up(&rows);
}

#[test]
fn retention_deletes_old_rows_only_and_disabled_records_nothing() {
    let sim = Sim::new(ONE_GPU);
    sim.write_vgpu_config(&config("[history]\nenabled = false\n"));
    let mut watch = Watch::start(&sim, &[]);
    watch.wait_rounds(3);
    assert!(watch.stop().success());
    assert!(!db_path(&sim).exists(), "enabled = false: no database");

    // Rows 40 days and 1 day old, kept 30 days.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let day = 86_400_000;
    {
        let mut h = vgpu_history::History::open(&sim.path("lib")).unwrap();
        for (age, id) in [(40, "old"), (1, "new")] {
            let t1 = now - age * day;
            let gpu = vgpu_history::tick::GpuRow {
                t0_ms: t1 - 1000,
                t1_ms: t1,
                gpu_uuid: format!("GPU-{id}"),
                gpu_index: 9,
                gpu_name: "x".into(),
                energy_mj: 1,
                energy_source: vgpu_history::tick::EnergySource::Counter,
                busy_ms: None,
                sm_clock_mhz: None,
                power_w: None,
                energy_counter_mj: None,
            };
            let work = vgpu_history::tick::WorkloadRow {
                t0_ms: t1 - 1000,
                t1_ms: t1,
                workload_id: id.into(),
                gpu_uuid: format!("GPU-{id}"),
                busy_ms: 1,
                source: vgpu_history::tick::TimeSource::Nvml,
            };
            h.record_tick(&vgpu_history::tick::Tick { gpus: vec![gpu], workloads: vec![work] }).unwrap();
        }
    }
    sim.write_vgpu_config(&config("[history]\nkeep = \"30d\"\n"));
    // Retention runs when the history thread first opens the database, before the stop
    // (which waits for that thread) returns.
    let watch = Watch::start(&sim, &[]);
    assert!(watch.stop().success());
    let conn = open(&sim);
    assert_eq!(count(&conn, "SELECT count(*) FROM gpu_samples WHERE gpu_uuid = 'GPU-old'"), 0);
    assert_eq!(count(&conn, "SELECT count(*) FROM workload_gpu_time WHERE workload_id = 'old'"), 0);
    assert_eq!(count(&conn, "SELECT count(*) FROM gpu_samples WHERE gpu_uuid = 'GPU-new'"), 1);
    assert_eq!(count(&conn, "SELECT count(*) FROM workload_gpu_time WHERE workload_id = 'new'"), 1);
}

#[test]
fn a_link_in_place_of_the_database_is_refused_not_followed() {
    let sim = Sim::new(ONE_GPU);
    sim.write_vgpu_config(&config(""));
    let target = sim.path("elsewhere.db");
    std::fs::write(&target, b"precious").unwrap();
    std::os::unix::fs::symlink(&target, db_path(&sim)).unwrap();
    let mut watch = Watch::start(&sim, &[]);
    // Said at a round once the history thread has tried.
    let warning = said_or_wait(&mut watch, "warning: history: cannot record");
    assert!(warning.contains("history.db: a symbolic link: refused, never followed"), "{warning}");
    watch.wait_rounds(2);
    assert!(watch.stop().success());
    assert_eq!(std::fs::read(&target).unwrap(), b"precious");
    assert!(!sim.path("elsewhere.db-wal").exists());
    assert!(std::fs::symlink_metadata(db_path(&sim)).unwrap().file_type().is_symlink());
}

#[test]
fn carbon_apply_records_the_intensity_it_used_and_its_decision() {
    let sim = Sim::new(ONE_GPU);
    sim.write_vgpu_config("[carbon]\nsource = \"static\"\nvalue = 250\nbudget_g_per_hour = 500\n");
    for args in [&["carbon", "apply", "--json"][..], &["carbon", "apply", "--json", "--intensity", "300"]] {
        let out = sim.vgpu(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let conn = open(&sim);
    let mut stmt = conn.prepare("SELECT action, intensity, json_extract(record, '$.intensity') FROM decisions ORDER BY ts_ms").unwrap();
    let decisions: Vec<(String, f64, f64)> = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).unwrap().map(Result::unwrap).collect();
    assert_eq!(decisions, [("apply".to_string(), 250.0, 250.0), ("apply".to_string(), 300.0, 300.0)]);
    // The source's reading is recorded; an --intensity override is not a reading of the grid.
    let mut stmt = conn.prepare("SELECT kind, g_per_kwh, source FROM intensity").unwrap();
    let readings: Vec<(String, f64, String)> = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).unwrap().map(Result::unwrap).collect();
    assert_eq!(readings.len(), 1, "{readings:?}");
    assert_eq!((readings[0].0.as_str(), readings[0].1), ("reading", 250.0), "{readings:?}");
}

#[test]
fn a_history_interval_adds_rounds_up_and_the_stop_writes_the_rest() {
    let sim = Sim::new(ONE_GPU);
    sim.write_vgpu_config(&config("[history]\ninterval = \"1s\"\n"));
    let mut watch = Watch::start(&sim, &[]);
    watch.wait_rounds(13);
    assert!(watch.stop().success());
    let rows = gpu_rows(&open(&sim));
    assert!(rows.len() >= 2, "{rows:?}");
    // 200 ms rounds, a row per second at least; the last, written at the stop, may be shorter.
    assert!(rows[..rows.len() - 1].iter().all(|r| r.1 - r.0 >= 1000), "{rows:?}");
    // Rounds added up, not a row each: 13 rounds of 200 ms make 3 or 4 rows of 1 s (more if a
    // busy machine stretched the rounds, never more than a row per second they spanned).
    let span = rows.last().unwrap().1 - rows[0].0;
    assert!(rows.len() < 13 && rows.len() as i64 <= span / 1000 + 1, "13 rounds of 200 ms in rows of 1 s over {span} ms: {rows:?}");
    assert_energy_adds_up(&rows);
}

#[test]
fn a_workload_whose_supervisor_died_is_recorded_ended_by_the_watch() {
    let sim = Sim::new(ONE_GPU);
    sim.write_vgpu_config(&config(""));
    let mut watch = Watch::start(&sim, &[]);
    let mut supervisor = sim.spawn_running("orphan", &["--mem", "1G"], "exec sleep 3600");
    // Seen by a round after it runs.
    watch.drain();
    watch.wait_rounds(2);
    supervisor.kill().unwrap();
    supervisor.wait().unwrap();
    watch.wait_line("reconcile to clean it up", |l| l.contains("cleaned up workload orphan"));
    watch.wait_rounds(1);
    assert!(watch.stop().success());
    let (ended, outcome): (Option<i64>, Option<String>) =
        open(&sim).query_row("SELECT ended_ms, outcome FROM workloads WHERE name = 'orphan'", [], |r| Ok((r.get(0)?, r.get(1)?))).unwrap();
    assert!(ended.is_some());
    let outcome = outcome.unwrap_or_default();
    assert!(outcome.starts_with("supervisor (pid ") && outcome.ends_with(") died"), "{outcome}");
}

#[test]
fn a_database_locked_elsewhere_is_one_warning_and_nothing_is_lost() {
    let sim = Sim::new(ONE_GPU);
    sim.write_vgpu_config(&config(""));
    let mut watch = Watch::start(&sim, &[]);
    watch.wait_rounds(1);
    // An admin's sqlite3 holding the write lock.
    let other = Connection::open(db_path(&sim)).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let warning = watch.wait_line("the busy warning", |l| l.contains("warning: history: cannot record"));
    assert!(warning.contains("history.db: busy"), "{warning}");
    watch.wait_rounds(3);
    other.execute_batch("COMMIT").unwrap();
    drop(other);
    watch.wait_line("recording to resume", |l| l.contains("history: recording again"));
    watch.wait_rounds(1);
    assert!(watch.stop().success());
    assert_energy_adds_up(&gpu_rows(&open(&sim)));
}

#[test]
fn a_damaged_database_is_one_warning_and_moved_aside_a_new_one_records() {
    let sim = Sim::new(ONE_GPU);
    sim.write_vgpu_config(&config(""));
    std::fs::write(db_path(&sim), vec![0xA5u8; 8192]).unwrap();
    std::fs::set_permissions(db_path(&sim), std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut watch = Watch::start(&sim, &[]);
    let warning = said_or_wait(&mut watch, "warning: history: cannot record");
    assert!(warning.contains("history.db: damaged: ") && warning.contains("move it aside"), "{warning}");
    watch.wait_rounds(2);
    assert_eq!(std::fs::read(db_path(&sim)).unwrap(), vec![0xA5u8; 8192], "left as it was");
    std::fs::rename(db_path(&sim), sim.path("lib/history.db.damaged")).unwrap();
    watch.wait_line("recording to resume", |l| l.contains("history: recording again"));
    watch.wait_rounds(2);
    assert!(watch.stop().success());
    assert!(!gpu_rows(&open(&sim)).is_empty());
}

/// A history of 3 days as vgpu 0.1 made it (schema version 1, verbatim: its
/// `schema/v1.sql`), ending a week ago at midnight (UTC): two GPUs with a measured power
/// model, a row a minute each, two workloads, a reading an hour. Returns the window.
fn history_of_version_1(lib: &Path) -> (i64, i64) {
    const H: i64 = 3_600_000;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let until = (now - 7 * 24 * H) / (24 * H) * (24 * H);
    let since = until - 3 * 24 * H;
    std::fs::create_dir_all(lib).unwrap();
    let path = lib.join("history.db");
    std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path).unwrap();
    let mut conn = Connection::open(&path).unwrap();
    conn.execute_batch(&format!("PRAGMA journal_mode = WAL; BEGIN; {} PRAGMA user_version = 1; COMMIT;", include_str!("../../crates/vgpu-history/src/schema/v1.sql")))
        .unwrap();
    let tx = conn.transaction().unwrap();
    let mut t = since;
    let mut k = 0i64;
    while t < until {
        for (g, gpu) in ["GPU-old-0", "GPU-old-1"].iter().enumerate() {
            let busy = (k * 7 + g as i64 * 13) % 60_000;
            tx.execute(
                "INSERT INTO gpu_samples VALUES (?1, ?2, ?3, ?4, 'NVIDIA A100', ?5, 'counter', ?6, 1410, 200.5, NULL)",
                rusqlite::params![t, t + 60_000, gpu, g as i64, 3_000_000 + 11 * busy + k % 997, busy],
            )
            .unwrap();
            if busy > 10_000 {
                let workload = if g == 0 { "old-train" } else { "old-eval" };
                tx.execute("INSERT INTO workload_gpu_time VALUES (?1, ?2, ?3, ?4, ?5, 'ledger')", rusqlite::params![t, t + 60_000, workload, gpu, busy - 10_000]).unwrap();
            }
        }
        if t % H == 0 {
            tx.execute("INSERT INTO intensity VALUES (?1 + 420000, 'reading', ?2, 'test', ?1)", rusqlite::params![t, 150.0 + (k % 37) as f64 * 7.25]).unwrap();
        }
        t += 60_000;
        k += 1;
    }
    tx.execute_batch(&format!(
        "INSERT INTO workloads VALUES ('old-train', 'train', 0, 'root', NULL, 'python train.py', 'GPU-old-0', {since}, {until}, 'exit 0');
         INSERT INTO workloads VALUES ('old-eval', 'eval', 0, 'root', NULL, 'python eval.py', 'GPU-old-1', {since}, {until}, 'exit 0');
         INSERT INTO power_models VALUES ('GPU-old-0', 'NVIDIA A100', 0, 1410, 45.5, 400, 2, 1, 0, '[]');
         INSERT INTO power_models VALUES ('GPU-old-1', 'NVIDIA A100', 0, 1410, 48.25, 400, 2, 1, 0, '[]');"
    ))
    .unwrap();
    tx.commit().unwrap();
    (since, until)
}

/// The rows of version 1's tables up to `until`, as text (what the watch adds later is not).
fn old_rows(conn: &Connection, until: i64) -> Vec<String> {
    let mut out = Vec::new();
    for (table, time) in [("gpu_samples", "t1_ms"), ("workload_gpu_time", "t1_ms"), ("intensity", "ts_ms"), ("workloads", "started_ms"), ("power_models", "measured_ms")] {
        let mut st = conn.prepare(&format!("SELECT * FROM {table} WHERE {time} <= ?1 ORDER BY 1, 2, 3")).unwrap();
        let n = st.column_count();
        let mut rows = st.query([until]).unwrap();
        while let Some(r) = rows.next().unwrap() {
            out.push(format!("{table}: {:?}", (0..n).map(|i| format!("{:?}", r.get_ref(i).unwrap())).collect::<Vec<_>>()));
        }
    }
    out
}

fn user_version(conn: &Connection) -> i64 {
    conn.pragma_query_value(None, "user_version", |r| r.get(0)).unwrap()
}

/// `vgpu --simulate watch` killed at `stop_at` (a `VGPU_TEST_STOP_AT` point).
fn watch_killed_at(sim: &Sim, stop_at: &str) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vgpu"));
    cmd.args(["--simulate", "watch"]).env_remove("VGPU_SIMULATE").env("VGPU_TEST_STOP_AT", stop_at);
    for (k, v) in sim.env() {
        cmd.env(k, v);
    }
    let status = cmd.stdout(Stdio::null()).stderr(Stdio::null()).status().unwrap();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL), "killed at {stop_at}: {status:?}");
}

#[test]
fn a_version_1_history_is_migrated_and_rolled_up_by_the_watch_killed_anywhere_and_reports_the_same() {
    let sim = Sim::new(ONE_GPU);
    sim.write_vgpu_config(&config(""));
    let lib = sim.path("lib");
    let (since, until) = history_of_version_1(&lib);
    let rfc3339 = |ms: i64| chrono::DateTime::from_timestamp_millis(ms).unwrap().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let report = || {
        let out = sim.vgpu(&["carbon", "report", "--json", "--since", &rfc3339(since + 1234), "--until", &rfc3339(until - 5000)]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let conn = open(&sim);
    let rows = old_rows(&conn, until);
    drop(conn);
    // This vgpu reads version 1 as it is (from the rows).
    let from_rows = report();
    assert!(from_rows.contains("old-train"), "{from_rows}");

    // Killed inside the migration's transaction: version 1, whole.
    watch_killed_at(&sim, "history:mid-migration");
    let conn = open(&sim);
    assert_eq!((user_version(&conn), integrity(&conn)), (1, "ok".to_string()));
    assert_eq!(count(&conn, "SELECT count(*) FROM sqlite_schema WHERE name LIKE 'rollup%'"), 0);
    assert_eq!(old_rows(&conn, until), rows);
    drop(conn);
    assert_eq!(report(), from_rows);

    // Killed inside the first batch of rollups: migrated, none made.
    watch_killed_at(&sim, "history:mid-rollup");
    let conn = open(&sim);
    assert_eq!((user_version(&conn), integrity(&conn)), (vgpu_history::SCHEMA_VERSION, "ok".to_string()));
    assert_eq!(count(&conn, "SELECT count(*) FROM rollups"), 0);
    assert_eq!(old_rows(&conn, until), rows);
    drop(conn);
    assert_eq!(report(), from_rows);

    // The next watch makes them all, and says so.
    let mut watch = Watch::start(&sim, &[]);
    let said = said_or_wait(&mut watch, "history: rollups up to date");
    assert!(watch.stop().success());
    let conn = open(&sim);
    assert_eq!(integrity(&conn), "ok");
    let made = |span: i64| count(&conn, &format!("SELECT count(*) FROM rollups WHERE span_ms = {span} AND start_ms >= {since} AND start_ms < {until}"));
    assert_eq!((made(3_600_000), made(86_400_000)), (72, 3), "every hour and day of the 3 days: {said}");
    let gpus = count(&conn, &format!("SELECT count(*) FROM rollup_gpus WHERE start_ms >= {since} AND start_ms < {until} AND idle_source = 'measured'"));
    assert_eq!(gpus, 2 * (72 + 3));
    assert_eq!(old_rows(&conn, until), rows, "no row of version 1 lost or changed");
    drop(conn);
    // Read through the rollups (a day's, the hours' of the ragged days, the ends' rows):
    // the same report, byte for byte.
    assert_eq!(report(), from_rows);
}

/// `vgpu ps -a --json`'s ended workload `id`: (when it ended, how).
fn ps_ended(sim: &Sim, id: &str) -> (Option<i64>, Option<String>) {
    let out = sim.vgpu(&["ps", "-a", "--json"]).output().expect("vgpu ps -a");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("ps -a --json: {e}: {}", String::from_utf8_lossy(&out.stdout)));
    let ended = json["ended"].as_array().unwrap_or_else(|| panic!("ps -a lists ended workloads: {json}"));
    let row = ended.iter().find(|r| r["id"] == id).unwrap_or_else(|| panic!("{id} in ps -a's ended: {json}"));
    (row["ended_unix_ms"].as_i64(), row["outcome"].as_str().map(str::to_string))
}

/// The workloads table's end of `id`, if it has a row.
fn recorded_end(sim: &Sim, id: &str) -> Option<(Option<i64>, Option<String>)> {
    use rusqlite::OptionalExtension as _;
    open(sim).query_row("SELECT ended_ms, outcome FROM workloads WHERE id = ?1", [id], |r| Ok((r.get(0)?, r.get(1)?))).optional().expect("query")
}

#[test]
fn vgpu_run_leaves_its_end_to_the_watch_which_records_it_exactly_and_ps_lists_it_meanwhile() {
    let sim = Sim::new(ONE_GPU);
    // Rounds of 1 s: the GPU list stays current for 3 s after the watch's last round, which
    // covers the end of the workload below while the watch is stopped.
    sim.write_vgpu_config("[watch]\ninterval = \"1s\"\nlisten = \"\"\n");
    let mut watch = Watch::start(&sim, &[]);
    let go = sim.path("go");
    let script = format!("while [ ! -e {} ]; do sleep 0.05; done; exit 3", go.display());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vgpu"));
    cmd.args(["--simulate", "run", "--name", "noted", "--mem", "1G", "--", "sh", "-c", &script]);
    for (k, v) in sim.env() {
        cmd.env(k, v);
    }
    let run = cmd.env("VGPU_LOG", "vgpu=debug").stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("vgpu run");
    common::wait_for("noted to run", || sim.ps().iter().any(|w| w["name"] == "noted" && w["state"] == "running"));
    // A round sees it run (it ends, for that watch, once its record is gone); then the
    // watch stops, its history thread with it.
    watch.drain();
    watch.wait_rounds(2);
    watch.signal(libc::SIGSTOP);
    std::fs::write(&go, b"").expect("go");
    let out = run.wait_with_output().expect("vgpu run ends");
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{said}");
    assert!(said.contains("its end is left for vgpu watch to record in the history"), "{said}");

    // The note: the record as it ended, how and when.
    let notes: Vec<PathBuf> = std::fs::read_dir(sim.path("run/ended")).expect("the notes' directory").map(|e| e.expect("entry").path()).collect();
    assert_eq!(notes.len(), 1, "{notes:?}");
    let note: serde_json::Value = serde_json::from_slice(&std::fs::read(&notes[0]).expect("note")).expect("note json");
    assert_eq!(note["outcome"], "exit 3", "{note}");
    let id = note["workload"]["id"].as_str().expect("id").to_string();
    assert_eq!(notes[0].file_name().and_then(|n| n.to_str()), Some(format!("{id}.json").as_str()));
    let ended_ms = note["ended_unix_ms"].as_i64().expect("ended_unix_ms");
    assert_eq!(std::fs::metadata(&notes[0]).expect("meta").mode() & 0o7777, 0o644);
    // Not in the history yet (the watch may have recorded its row, not its end), and listed
    // by `ps -a` as ended all the same.
    if let Some(row) = recorded_end(&sim, &id) {
        assert_eq!(row, (None, None), "only the watch records it, and it is stopped");
    }
    assert_eq!(ps_ended(&sim, &id), (Some(ended_ms), Some("exit 3".to_string())));

    // Going on, the watch finds the record gone and the note: the note's end is recorded
    // (its exact time and how), not the watch's own, and the note removed.
    watch.signal(libc::SIGCONT);
    common::wait_for("the note to be recorded and removed", || !notes[0].exists());
    assert_eq!(recorded_end(&sim, &id), Some((Some(ended_ms), Some("exit 3".to_string()))));
    watch.wait_rounds(2);
    assert_eq!(recorded_end(&sim, &id), Some((Some(ended_ms), Some("exit 3".to_string()))), "the watch's own end changes nothing");
    assert_eq!(ps_ended(&sim, &id), (Some(ended_ms), Some("exit 3".to_string())));
    assert!(watch.stop().success());
}
