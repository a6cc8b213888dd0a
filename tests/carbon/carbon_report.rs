//! `vgpu carbon report` with the real binary, on a history database the test fills as
//! `vgpu watch` would (`vgpu_history::db::open_rw`, rows as schema.sql defines them): the
//! table, `--json`, `--csv`, `--by`, no database, a bad `--since`, and a reader who is not
//! root.
//!
//! The history, an hour ago (figures by hand; intensity 360 g/kWh: 0.1 g per kJ):
//!
//! * GPU 0 (measured model: idle 100 W), 10 s, 3000 J: idle 1000 J; w1 (6 s of GPU time)
//!   and w2 (2 s) share the 2000 J active 3:1, 1500 J and 500 J.
//! * GPU 1 (no model: idle = its lowest observed power, 100 W), 10 s of 1000 J then 10 s of
//!   3000 J, busy the whole second interval, w1 for 5 s of it: idle 2000 J, w1 1000 J,
//!   unattributed 1000 J.
//!
//! Total 7000 J (0.001944 kWh, 0.7 g): w1 2500 J, w2 500 J, idle 3000 J, unattributed 1000 J.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use crate::common::Sim;
use rusqlite::Connection;
use serde_json::Value;

const MJ: [(&str, u64); 4] = [("w1", 2_500_000), ("w2", 500_000), ("idle", 3_000_000), ("unattributed", 1_000_000)];

/// When the filled history starts: an hour ago, to the second (RFC 3339 without fractions).
fn start_ms() -> i64 {
    (vgpu_now_ms() - 3_600_000) / 1000 * 1000
}

fn fill(lib: &Path) -> Connection {
    fill_at(lib, start_ms())
}

fn fill_at(lib: &Path, t: i64) -> Connection {
    let conn = vgpu_history::db::open_rw(lib).expect("history database");
    let sql = format!(
        "INSERT INTO gpu_samples VALUES ({t}, {t} + 10000, 'GPU-0', 0, 'NVIDIA A100', 3000000, 'counter', NULL, NULL, NULL, NULL);
         INSERT INTO gpu_samples VALUES ({t}, {t} + 10000, 'GPU-1', 1, 'NVIDIA A100', 1000000, 'counter', 0, NULL, NULL, NULL);
         INSERT INTO gpu_samples VALUES ({t} + 10000, {t} + 20000, 'GPU-1', 1, 'NVIDIA A100', 3000000, 'power', 10000, NULL, NULL, NULL);
         INSERT INTO workload_gpu_time VALUES ({t}, {t} + 10000, 'w1', 'GPU-0', 6000, 'ledger');
         INSERT INTO workload_gpu_time VALUES ({t}, {t} + 10000, 'w2', 'GPU-0', 2000, 'ledger');
         INSERT INTO workload_gpu_time VALUES ({t} + 10000, {t} + 20000, 'w1', 'GPU-1', 5000, 'nvml');
         INSERT INTO workloads VALUES ('w1', 'train', 1000, 'alice', NULL, 'python train.py', 'GPU-0,GPU-1', {t}, NULL, NULL);
         INSERT INTO workloads VALUES ('w2', 'eval, \"quoted\"', 1001, 'bob', 'web', 'python eval.py', 'GPU-0', {t}, {t} + 10000, 'exit 0');
         INSERT INTO intensity VALUES ({t} - 3600000, 'reading', 360, 'file', {t});
         INSERT INTO power_models VALUES ('GPU-0', 'NVIDIA A100', {t}, 1410, 100, 400, 2, 1, 0, '[]');"
    );
    conn.execute_batch(&sql).expect("fill the history");
    conn
}

fn vgpu_now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

fn report_json(sim: &Sim, extra: &[&str]) -> Value {
    let mut args = vec!["carbon", "report", "--json"];
    args.extend_from_slice(extra);
    sim.json(&args)
}

fn energy_of(doc: &Value, key: &str) -> u64 {
    let rows = doc["rows"].as_array().expect("rows");
    let row = rows.iter().find(|r| r["key"] == key).unwrap_or_else(|| panic!("no row {key}: {doc:#}"));
    row["energy_mj"].as_u64().unwrap()
}

#[test]
fn json_attributes_the_measured_energy_and_adds_up() {
    let sim = Sim::new(&[]);
    drop(fill(&sim.path("lib")));
    let doc = report_json(&sim, &[]);
    assert_eq!(doc["schema"], 1);
    for (key, mj) in MJ {
        assert_eq!(energy_of(&doc, key), mj, "{key}");
    }
    assert_eq!(doc["total_energy_mj"], 7_000_000);
    let sum: u64 = doc["rows"].as_array().unwrap().iter().map(|r| r["energy_mj"].as_u64().unwrap()).sum();
    assert_eq!(sum, 7_000_000);
    assert!((doc["total_g_co2"].as_f64().unwrap() - 0.7).abs() < 1e-9, "{doc:#}");
    let w1 = &doc["rows"][0];
    assert_eq!((w1["key"].as_str(), w1["name"].as_str(), w1["user"].as_str()), (Some("w1"), Some("train"), Some("alice")));
    assert_eq!(w1["gpu_indexes"], serde_json::json!([0, 1]));
    assert_eq!(w1["gpu_time_ms"], 11_000);
    assert!((w1["g_co2"].as_f64().unwrap() - 0.25).abs() < 1e-9);
    let gpus = doc["gpus"].as_array().unwrap();
    assert_eq!((gpus[0]["idle_source"].as_str(), gpus[1]["idle_source"].as_str()), (Some("measured"), Some("lowest_observed")));
    assert!(doc["notes"][0].as_str().unwrap().contains("GPU 1 (GPU-1) has no power model"), "{doc:#}");

    // A window that ended before the history: nothing in it, totals zero.
    let before = report_json(&sim, &["--since", "3d", "--until", "2d"]);
    assert_eq!(before["total_energy_mj"], 0);
    assert_eq!(before["rows"], serde_json::json!([]));
}

#[test]
fn a_window_from_the_middle_of_an_interval_counts_it_pro_rata() {
    let sim = Sim::new(&[]);
    let t = start_ms();
    drop(fill_at(&sim.path("lib"), t));
    let since = chrono::DateTime::from_timestamp_millis(t + 5000).unwrap().to_rfc3339();
    let doc = report_json(&sim, &["--since", &since]);
    // GPU 0 from 5 s: 1500 J (idle 500, w1 750, w2 250); GPU 1: 500 J (idle) then 3000 J
    // (idle 1000, w1 1000, unattributed 1000).
    assert_eq!(doc["total_energy_mj"], 5_000_000, "{doc:#}");
    assert_eq!(energy_of(&doc, "w1"), 1_750_000);
    assert_eq!(energy_of(&doc, "w2"), 250_000);
    assert_eq!(energy_of(&doc, "idle"), 2_000_000);
    assert_eq!(energy_of(&doc, "unattributed"), 1_000_000);
}

#[test]
fn by_user_service_and_gpu() {
    let sim = Sim::new(&[]);
    drop(fill(&sim.path("lib")));
    let user = report_json(&sim, &["--by", "user"]);
    assert_eq!((energy_of(&user, "alice"), energy_of(&user, "bob")), (2_500_000, 500_000));
    let service = report_json(&sim, &["--by", "service"]);
    assert_eq!((energy_of(&service, "-"), energy_of(&service, "web")), (2_500_000, 500_000));
    let gpu = report_json(&sim, &["--by", "gpu"]);
    assert_eq!((energy_of(&gpu, "GPU-0"), energy_of(&gpu, "GPU-1")), (2_000_000, 1_000_000));
    for doc in [user, service, gpu] {
        assert_eq!(doc["total_energy_mj"], 7_000_000);
        assert_eq!(energy_of(&doc, "idle"), 3_000_000);
    }
}

#[test]
fn table_and_csv() {
    let sim = Sim::new(&[]);
    drop(fill(&sim.path("lib")));
    let out = sim.vgpu(&["carbon", "report"]).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for want in ["WORKLOAD", "ENERGY(kWh)", "CO2(g)", "train", "alice", "idle", "unattributed", "TOTAL", "0.001944", "0.70", "100.0%"] {
        assert!(text.contains(want), "no {want:?} in\n{text}");
    }
    let total = text.lines().find(|l| l.contains("TOTAL")).unwrap();
    assert!(total.contains("0.001944") && total.contains("0.70"), "{total}");

    let out = sim.vgpu(&["carbon", "report", "--csv"]).output().unwrap();
    assert!(out.status.success());
    let csv = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], "kind,key,name,user,gpus,gpu_time_ms,energy_mj,energy_kwh,g_co2,share_pct");
    assert_eq!(lines.len(), 6, "{csv}");
    assert!(lines[1].starts_with("workload,w1,train,alice,0 1,11000,2500000,"), "{csv}");
    // A name with a comma and quotes is quoted, its quotes doubled.
    assert!(lines[2].starts_with("workload,w2,\"eval, \"\"quoted\"\"\",bob,0,2000,500000,"), "{csv}");
    assert!(lines[5].starts_with("total,,,,,,7000000,"), "{csv}");
}

#[test]
fn no_history_is_one_line_and_success() {
    let sim = Sim::new(&[]);
    let out = sim.vgpu(&["carbon", "report"]).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.starts_with("no history yet"), "{text}");
    let doc = report_json(&sim, &[]);
    assert_eq!((doc["rows"].clone(), doc["total_energy_mj"].clone()), (serde_json::json!([]), serde_json::json!(0)));
    assert!(!sim.path("lib/history.db").exists(), "a report must not create the history");
}

#[test]
fn a_bad_time_is_a_usage_error_of_one_line() {
    let sim = Sim::new(&[]);
    for args in [vec!["--since", "last tuesday"], vec!["--until", "2026-02-30"], vec!["--since", "1h", "--until", "2h"]] {
        let mut all = vec!["carbon", "report"];
        all.extend_from_slice(&args);
        let out = sim.vgpu(&all).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(out.stdout.is_empty());
    }
}

/// `PROGRAM ARGS…` as user nobody (uid/gid 65534, no groups), in the simulation's
/// environment.
fn nobody(sim: &Sim, program: &str, args: &[&str]) -> Output {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid", "65534", "--regid", "65534", "--clear-groups", "--", program]).args(args).env_remove("VGPU_SIMULATE");
    for (k, v) in sim.env() {
        cmd.env(k, v);
    }
    cmd.stdin(Stdio::null()).output().expect("setpriv")
}

/// `vgpu carbon report --json` as user nobody.
fn as_nobody(sim: &Sim) -> Output {
    nobody(sim, env!("CARGO_BIN_EXE_vgpu"), &["carbon", "report", "--json"])
}

/// What nobody gets trying to open `path` read-only (the shell's `<`, open(2) with
/// O_RDONLY): "opened", or "EACCES" when refused for want of permission.
fn nobody_opens(sim: &Sim, path: &Path) -> String {
    let out = nobody(sim, "/bin/sh", &["-c", "exec 3< \"$1\" && echo opened", "sh", path.to_str().unwrap()]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    match (out.status.success(), stdout.trim()) {
        (true, "opened") => "opened".into(),
        // strerror(EACCES)
        (false, _) if stderr.contains("Permission denied") => "EACCES".into(),
        _ => panic!("opening {} as nobody: {stdout} {stderr}", path.display()),
    }
}

#[test]
fn a_user_who_is_not_root_reads_the_public_copy_and_cannot_open_the_database() {
    assert!(nix::unistd::Uid::effective().is_root(), "this test runs as root (it becomes nobody)");
    let sim = Sim::new(&[]);
    std::fs::set_permissions(sim.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let lib = sim.path("lib");
    let writer = fill(&lib);
    // The writer open: -wal and -shm are there, root's alone like the database. A user
    // cannot open any of them, so cannot take the locks that stall the watch (issue 24).
    for name in ["history.db", "history.db-wal", "history.db-shm"] {
        let path = lib.join(name);
        assert!(path.exists(), "{name}");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777, 0o600, "{name}");
        assert_eq!(nobody_opens(&sim, &path), "EACCES", "{name}");
    }
    let read = |what: &str| -> Value {
        let out = as_nobody(&sim);
        assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    // No public copy yet: an empty report that says why.
    let doc = read("before the copy");
    assert_eq!(doc["total_energy_mj"], 0, "{doc:#}");
    assert!(doc["notes"].as_array().unwrap().iter().any(|n| n.as_str().unwrap().contains("no public copy of the history yet")), "{doc:#}");
    // The watch's history thread publishes it (this call); nobody reads it, and is told
    // how old it is.
    vgpu_history::snapshot::publish(&writer, &lib).unwrap();
    let copy = vgpu_history::snapshot::path_in(&lib);
    assert_eq!(std::fs::metadata(&copy).unwrap().permissions().mode() & 0o7777, 0o644);
    assert_eq!(nobody_opens(&sim, &copy), "opened");
    let doc = read("from the copy");
    assert_eq!(doc["total_energy_mj"], 7_000_000, "{doc:#}");
    assert!(doc["notes"].as_array().unwrap().iter().any(|n| n.as_str().unwrap().contains("public copy of the history made at")), "{doc:#}");
    // What root writes after the copy is root's until the next copy; root reads it live.
    let t = start_ms() + 30_000;
    writer
        .execute_batch(&format!("INSERT INTO gpu_samples VALUES ({t}, {t} + 10000, 'GPU-0', 0, 'NVIDIA A100', 1000000, 'counter', NULL, NULL, NULL, NULL);"))
        .unwrap();
    assert_eq!(read("the copy again")["total_energy_mj"], 7_000_000);
    assert_eq!(report_json(&sim, &[])["total_energy_mj"], 8_000_000);
    // No lock is taken on the copy, and none of SQLite's files is made beside it.
    drop(writer);
    read("with no writer");
    assert!(!lib.join("history-snapshot.db-shm").exists() && !lib.join("history-snapshot.db-journal").exists());
    // `ps -a` as nobody: the recently ended, from the copy.
    let out = nobody(&sim, env!("CARGO_BIN_EXE_vgpu"), &["ps", "-a", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let ended = doc["ended"].as_array().unwrap_or_else(|| panic!("no ended: {doc:#}"));
    assert_eq!(ended.iter().map(|e| e["id"].as_str().unwrap()).collect::<Vec<_>>(), ["w2"], "{doc:#}");
}

#[test]
fn ps_all_lists_the_recently_ended_with_their_energy() {
    let sim = Sim::new(&[]);
    drop(fill(&sim.path("lib")));
    let doc = sim.json(&["ps", "--json", "-a"]);
    let ended = doc["ended"].as_array().unwrap_or_else(|| panic!("no ended: {doc:#}"));
    // w1 still runs (no ended_ms); w2 ended 50 minutes ago, 500 J at 360 g/kWh.
    assert_eq!(ended.len(), 1, "{doc:#}");
    assert_eq!((ended[0]["id"].as_str(), ended[0]["outcome"].as_str()), (Some("w2"), Some("exit 0")));
    assert_eq!(ended[0]["energy_mj"], 500_000);
    assert_eq!(ended[0]["gpu_indexes"], serde_json::json!([0]));
    assert!((ended[0]["g_co2"].as_f64().unwrap() - 0.05).abs() < 1e-9);
    assert!(sim.json(&["ps", "--json"]).get("ended").is_none(), "ended only with -a");
    let out = sim.vgpu(&["ps", "-a"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Ended in the last 24 hours") && text.contains("0.1 Wh") && text.contains("exit 0"), "{text}");
}

#[test]
fn a_workload_says_its_energy_when_it_ends() {
    use std::io::{BufRead as _, Write as _};
    let sim = Sim::new(&[("NVIDIA A100-SXM4-40GB", "40GiB")]);
    let start = |script: &str| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vgpu"));
        cmd.args(["--simulate", "run", "--name", "job", "--mem", "1G", "--", "sh", "-c", script]).env("VGPU_LOG", "vgpu=warn");
        for (k, v) in sim.env() {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("vgpu run")
    };
    // The workload says its ID, then waits until the history has its figures.
    let mut run = start("echo $VGPU_WORKLOAD_ID; read x");
    let mut id = String::new();
    std::io::BufReader::new(run.stdout.take().unwrap()).read_line(&mut id).unwrap();
    let id = id.trim().to_string();
    assert!(!id.is_empty());
    let conn = vgpu_history::db::open_rw(&sim.path("lib")).unwrap();
    let t = vgpu_now_ms() - 20_000;
    conn.execute_batch(&format!(
        "INSERT INTO gpu_samples VALUES ({t}, {t} + 10000, 'GPU-0', 0, NULL, 3000000, 'counter', NULL, NULL, NULL, NULL);
         INSERT INTO workload_gpu_time VALUES ({t}, {t} + 10000, '{id}', 'GPU-0', 8000, 'ledger');
         INSERT INTO intensity VALUES ({t}, 'reading', 360, 'file', {t});
         INSERT INTO power_models VALUES ('GPU-0', 'sim', {t}, 1410, 100, 400, 2, 1, 0, '[]');"
    ))
    .unwrap();
    drop(conn);
    writeln!(run.stdin.take().unwrap()).unwrap();
    let out = run.wait_with_output().unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    // 3000 J less 1000 J idle, all of it the workload's: 2000 J = 0.6 Wh, 0.2 g.
    let line = format!("vgpu: workload job ({id}) used 0.6 Wh on GPU 0 (GPU time 8s), 0.2 g CO2");
    assert!(stderr.lines().any(|l| l == line), "no {line:?} in {stderr}");

    // Nothing recorded for it: nothing said, but at -v.
    let quiet = sim.vgpu(&["run", "--mem", "1G", "--", "true"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&quiet.stderr).contains("used"), "{}", String::from_utf8_lossy(&quiet.stderr));
    let verbose = sim.vgpu(&["-v", "run", "--mem", "1G", "--", "true"]).env("VGPU_LOG", "").output().unwrap();
    let stderr = String::from_utf8_lossy(&verbose.stderr);
    assert!(stderr.contains("no energy recorded (is vgpu watch running?)"), "{stderr}");
}

#[test]
fn idle_power_without_a_measured_model_is_the_planners() {
    // An A100 of the simulated driver: default power limit 400 W, so the planner's idle is
    // 15 % of it, 60 W. 10 s of 1000 J, no workload: idle 600 J, unattributed 400 J.
    let sim = Sim::new(&[("NVIDIA A100-SXM4-40GB", "40GiB")]);
    let uuid = sim.json(&["devices", "--json"])["gpus"][0]["uuid"].as_str().expect("a UUID").to_string();
    let conn = vgpu_history::db::open_rw(&sim.path("lib")).unwrap();
    let t = vgpu_now_ms() - 60_000;
    conn.execute_batch(&format!("INSERT INTO gpu_samples VALUES ({t}, {t} + 10000, '{uuid}', 0, NULL, 1000000, 'counter', NULL, NULL, NULL, NULL);"))
        .unwrap();
    drop(conn);
    let doc = report_json(&sim, &[]);
    assert_eq!((energy_of(&doc, "idle"), energy_of(&doc, "unattributed")), (600_000, 400_000), "{doc:#}");
    assert_eq!((doc["gpus"][0]["idle_source"].as_str(), doc["gpus"][0]["idle_w"].as_f64()), (Some("power_limit"), Some(60.0)));
    // The config's model comes first.
    sim.write_vgpu_config("[carbon]\npower_idle_w = 80\n");
    let doc = report_json(&sim, &[]);
    assert_eq!(energy_of(&doc, "idle"), 800_000, "{doc:#}");
    assert_eq!(doc["gpus"][0]["idle_source"], "configured");
}

/// A history with the grid's intensity but no GPU sample yet (a watch just started, or
/// none running): the report says nothing was recorded, in one line, and its totals are
/// zero, never `-0` (issue 29: an empty table with `TOTAL 0.000000 -0.00`, no note).
#[test]
fn a_history_with_nothing_recorded_says_so() {
    let sim = Sim::new(&[]);
    let t = start_ms();
    let conn = vgpu_history::db::open_rw(&sim.path("lib")).expect("history database");
    conn.execute_batch(&format!("INSERT INTO intensity VALUES ({t}, 'reading', 360, 'file', {t});")).expect("fill");
    drop(conn);
    let out = sim.vgpu(&["carbon", "report"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(text.contains("nothing recorded in this window: no GPU energy samples"), "{text}");
    assert!(!text.contains("TOTAL") && !text.contains("-0"), "{text}");
    let doc = report_json(&sim, &[]);
    assert_eq!(doc["total_energy_mj"], 0);
    let g = doc["total_g_co2"].as_f64().expect("emissions known: the intensity is");
    assert!(g == 0.0 && g.is_sign_positive(), "{doc:#}");
    assert!(doc["notes"].as_array().unwrap().iter().any(|n| n.as_str().unwrap().starts_with("nothing recorded")), "{doc:#}");
    let csv = sim.vgpu(&["carbon", "report", "--csv"]).output().unwrap();
    let (csv_out, csv_err) = (String::from_utf8_lossy(&csv.stdout), String::from_utf8_lossy(&csv.stderr));
    assert!(csv_out.lines().last().unwrap().starts_with("total,") && !csv_out.contains("-0"), "{csv_out}");
    assert!(csv_err.contains("note: nothing recorded"), "{csv_err}");
}
