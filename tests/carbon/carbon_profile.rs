//! `vgpu carbon profile` against the simulated driver: the fit recovers the curve the
//! driver was configured with (power: idle 70 W, max 700 W, γ 2.5; speed σ 0.6), the clocks
//! are as they were afterwards (read from the driver's own shared state), `carbon plan`
//! names the measured model after a profile and "default" before, a busy GPU is refused
//! without `--force`, and SIGTERM restores the clocks too.

use std::process::{Command, Stdio};

use crate::common::{serial, wait_for, workload, Sim};
use serde_json::Value;

const CURVE: &str = "[[device]]\nname = \"NVIDIA H100 80GB HBM3\"\nmemory = \"80GiB\"\n\
                     power_idle_w = 70\npower_max_w = 700\npower_exponent = 2.5\nclock_sensitivity = 0.6\n";
/// The locked clocks the simulated driver holds for GPU `uuid` (None: not locked), read from
/// its shared state file `<FAKEGPU_STATE>/<uuid>.state` (crates/fakegpu/README.md, "Shared
/// state"; `Layout` in crates/fakegpu/src/state.rs, repr(C): magic u64, version u32, slot
/// count u32, creation time, size, used, peak u64, then the locked minimum and maximum u32 at
/// bytes 48 and 52). Not through the fakegpu crate: linking its rlib here would rebuild
/// libfakegpu.so under the other tests' feet.
fn locked_clocks(sim: &Sim, uuid: &str) -> Option<(u32, u32)> {
    let bytes = std::fs::read(sim.path(&format!("fakegpu-state/{uuid}.state"))).expect("the driver's state file");
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    assert_eq!(&bytes[..8], b"FAKEGPU\x01", "not a fakegpu state file");
    assert_eq!(u32_at(8), 5, "fakegpu's state layout changed (version): update locked_clocks()");
    let (min, max) = (u32_at(48), u32_at(52));
    (max != 0).then_some((min, max))
}

fn uuid(sim: &Sim) -> String {
    sim.json(&["devices", "--json"])["gpus"][0]["uuid"].as_str().expect("uuid").to_string()
}

fn plan(sim: &Sim) -> Value {
    sim.json(&["carbon", "plan", "--json", "--intensity", "300", "--budget", "500"])["gpus"][0].clone()
}

/// `vgpu --simulate carbon profile ARGS…` in the background, its stderr kept in a file
/// (shown when a test fails).
fn spawn_profile(sim: &Sim, args: &[&str]) -> (std::process::Child, std::path::PathBuf) {
    let log = sim.path(&format!("profile-{}.stderr", args.join("_")));
    let child = Command::new(env!("CARGO_BIN_EXE_vgpu"))
        .args(["--simulate", "carbon", "profile"])
        .args(args)
        .envs(sim.env())
        .env("VGPU_LOG", "vgpu=warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("stderr file"))
        .spawn()
        .expect("spawn vgpu carbon profile");
    (child, log)
}

fn within(got: &Value, want: f64, share: f64) -> bool {
    got.as_f64().is_some_and(|g| (g - want).abs() <= share * want.abs())
}

/// Serial (`serial()`, ahead of the other tests on the CPU): the fit's speed is kernels per
/// second at each clock in 0.3 s, which a loaded machine skews (σ 0.56 for 0.60 beside the
/// other tests, when they shared the CPU equally).
#[test]
fn the_fit_recovers_the_configured_curve_and_the_clocks_are_restored() {
    let _serial = serial();
    let sim = Sim::with_config(CURVE);
    let uuid = uuid(&sim);
    let before = plan(&sim);
    assert_eq!((&before["power_model"], &before["power_model_source"]), (&Value::from("default"), &Value::from("default")));

    let out = sim.vgpu(&["carbon", "profile", "--gpu", "0", "--json", "--seconds", "0.3"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stdout.starts_with(b"{"), "the real-GPU kit expects JSON first");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["schema"], 1);
    assert_eq!(report["gpu_uuid"], uuid.as_str());
    assert_eq!(report["points"].as_array().unwrap().len(), 6, "{report}");
    assert_eq!(report["energy_source"], "counter");
    let fit = &report["fit"];
    assert!(within(&fit["idle_w"], 70.0, 0.03), "{fit}");
    assert!(within(&fit["max_w"], 700.0, 0.03), "{fit}");
    assert!(within(&fit["gamma"], 2.5, 0.03), "{fit}");
    assert!(within(&fit["speed_sigma"], 0.6, 0.03), "{fit}");
    assert!(within(&report["idle_power_w"], 70.0, 0.03), "{report}");
    assert_eq!(report["restored"]["kind"], "unlocked");
    assert_eq!(locked_clocks(&sim, &uuid), None, "the clocks are unlocked again");

    let after = plan(&sim);
    assert_eq!(after["power_model_source"], "measured", "{after}");
    let words = after["power_model"].as_str().unwrap();
    assert!(words.starts_with("measured 20") && words.ends_with(&format!(" on {uuid}")), "{words}");
    // Stored once, with finite figures.
    let db = rusqlite::Connection::open(sim.path("lib/history.db")).unwrap();
    let (rows, gamma): (i64, f64) =
        db.query_row("SELECT count(*), max(gamma) FROM power_models", [], |r| Ok((r.get(0)?, r.get(1)?))).unwrap();
    assert_eq!(rows, 1);
    assert!((gamma - 2.5).abs() < 0.1, "{gamma}");
}

#[test]
fn a_carbon_cap_is_locked_again_and_apply_stays_idempotent() {
    let sim = Sim::with_config(CURVE);
    let uuid = uuid(&sim);
    // An idle GPU is capped at its lowest clock.
    sim.json(&["carbon", "apply", "--json", "--intensity", "400", "--budget", "100"]);
    assert_eq!(locked_clocks(&sim, &uuid), Some((345, 345)));
    let report = sim.json(&["carbon", "profile", "--json", "--seconds", "0.2", "--clocks", "3"]);
    assert_eq!(report["restored"], serde_json::json!({"kind": "relocked", "min_mhz": 345, "max_mhz": 345}));
    assert_eq!(locked_clocks(&sim, &uuid), Some((345, 345)), "vgpu's cap is in force again");
    let again = sim.json(&["carbon", "apply", "--json", "--intensity", "400", "--budget", "100"]);
    assert!(again["gpus"][0]["writes"].as_array().unwrap().is_empty(), "the remembered cap is back: {again}");
}

#[test]
fn a_gpu_with_processes_is_refused_without_force() {
    let sim = Sim::with_config(CURVE);
    let uuid = uuid(&sim);
    let mut holder = workload::unmanaged(&sim, "holder", 16);
    let out = sim.vgpu(&["carbon", "profile", "--seconds", "0.2", "--clocks", "3"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("has compute processes") && stderr.contains("--force"), "{stderr}");
    assert_eq!(locked_clocks(&sim, &uuid), None, "nothing touched");
    assert!(!sim.path("lib/history.db").exists(), "nothing stored");
    let forced = sim.json(&["carbon", "profile", "--json", "--seconds", "0.2", "--clocks", "3", "--force"]);
    assert_eq!(forced["points"].as_array().unwrap().len(), 3);
    let _ = holder.kill();
    let _ = holder.wait();
}

#[test]
fn sigterm_restores_the_clocks_and_stores_nothing() {
    let sim = Sim::with_config(CURVE);
    let uuid = uuid(&sim);
    let (mut child, log) = spawn_profile(&sim, &["--seconds", "30"]);
    // The first locked clock is the event: profiling has the GPU.
    wait_for(&format!("profiling to lock the clocks (stderr: {})", log.display()), || {
        locked_clocks(&sim, &uuid).is_some() || child.try_wait().unwrap().is_some()
    });
    assert!(child.try_wait().unwrap().is_none(), "{}", std::fs::read_to_string(&log).unwrap_or_default());
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt as _;
    assert_eq!(status.signal(), Some(libc::SIGTERM), "it dies of the signal, as without a handler: {status:?}");
    assert_eq!(locked_clocks(&sim, &uuid), None, "the clocks are unlocked again");
    let stored: i64 = rusqlite::Connection::open(sim.path("lib/history.db"))
        .and_then(|db| db.query_row("SELECT count(*) FROM power_models", [], |r| r.get(0)))
        .unwrap_or(0);
    assert_eq!(stored, 0);
}

/// A recorded history of `server` (σ 0.5, busy 20 % at full clock) on GPU `uuid` as the
/// clock moved, as `vgpu watch` records it.
fn record_history(sim: &Sim, uuid: &str) {
    let conn = vgpu_history::db::open_rw(&sim.path("lib")).unwrap();
    let now = chrono::Utc::now().timestamp_millis();
    conn.execute("INSERT INTO workloads (id, name) VALUES ('0123456789ab', 'server')", []).unwrap();
    for i in 0..32i64 {
        let (t0, t1) = (now - (i + 1) * 10_000, now - i * 10_000);
        let clock = 345 + (i % 8) * 233;
        let x = clock as f64 / 1980.0;
        let busy = (10_000.0 * 0.2 / (0.5 + 0.5 * x)).round() as i64;
        conn.execute(
            "INSERT INTO gpu_samples (t0_ms, t1_ms, gpu_uuid, gpu_index, energy_mj, energy_source, sm_clock_mhz) VALUES (?1, ?2, ?3, 0, 1000, 'counter', ?4)",
            rusqlite::params![t0, t1, uuid, clock],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO workload_gpu_time (t0_ms, t1_ms, workload_id, gpu_uuid, busy_ms, source) VALUES (?1, ?2, '0123456789ab', ?3, ?4, 'ledger')",
            rusqlite::params![t0, t1, uuid, busy],
        )
        .unwrap();
    }
}

#[test]
fn the_planner_uses_the_sensitivity_learned_from_the_history() {
    let sim = Sim::with_config(CURVE);
    sim.write_vgpu_config("");
    let uuid = uuid(&sim);
    let mut run = Command::new(env!("CARGO_BIN_EXE_vgpu"))
        .args(["--simulate", "run", "--gpu", "0", "--mem", "1G", "--name", "server", "--", "sleep", "60"])
        .envs(sim.env())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("vgpu run");
    let plan = |sim: &Sim| sim.json(&["carbon", "plan", "--json", "--intensity", "400", "--budget", "100"]);
    wait_for("the planner to see server", || plan(&sim)["workloads"][0]["name"] == "server");
    // Before any history: σ 1, completion time f_max / f.
    let before = plan(&sim)["workloads"][0].clone();
    let clock = before["clock_mhz"].as_f64().unwrap();
    assert!(clock < 1500.0, "a tight budget lowers the clock: {before}");
    assert!(within(&before["completion_time"], 1980.0 / clock, 0.01), "{before}");

    record_history(&sim, &uuid);
    let after = plan(&sim)["workloads"][0].clone();
    let clock = after["clock_mhz"].as_f64().unwrap();
    assert!(within(&after["completion_time"], 1.0 / (0.5 + 0.5 * clock / 1980.0), 0.02), "σ 0.5 learned and used: {after}");
    let db = rusqlite::Connection::open(sim.path("lib/history.db")).unwrap();
    let sigma: f64 = db.query_row("SELECT sigma FROM workload_sensitivity WHERE key = 'name:server'", [], |r| r.get(0)).unwrap();
    assert!((sigma - 0.5).abs() < 0.02, "{sigma}");
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(run.id() as i32), nix::sys::signal::Signal::SIGTERM);
    let _ = run.wait();
}

#[test]
fn after_a_sigkill_the_next_apply_writes_the_cap_again() {
    let sim = Sim::with_config(CURVE);
    let uuid = uuid(&sim);
    sim.json(&["carbon", "apply", "--json", "--intensity", "400", "--budget", "100"]);
    let applied = sim.path("run/carbon-applied.json");
    assert!(std::fs::read_to_string(&applied).unwrap().contains(&uuid));
    let (mut child, log) = spawn_profile(&sim, &["--seconds", "30"]);
    // The event: profiling has set the GPU's remembered cap aside (its clocks are now ours).
    wait_for("profiling to set the cap aside", || {
        !std::fs::read_to_string(&applied).unwrap_or_default().contains(&uuid) || child.try_wait().unwrap().is_some()
    });
    assert!(child.try_wait().unwrap().is_none(), "{}", std::fs::read_to_string(&log).unwrap_or_default());
    child.kill().unwrap();
    child.wait().unwrap();
    // Whatever clock it died at, apply does not trust a cap it no longer remembers.
    let again = sim.json(&["carbon", "apply", "--json", "--intensity", "400", "--budget", "100"]);
    let writes = again["gpus"][0]["writes"].to_string();
    assert!(writes.contains("lock-clocks"), "{again}");
    assert_eq!(locked_clocks(&sim, &uuid), Some((345, 345)));
}

#[test]
fn a_gpu_that_cannot_lock_clocks_is_a_clear_error() {
    let sim = Sim::with_config(&format!("{CURVE}clock_locking = false\n"));
    let out = sim.vgpu(&["carbon", "profile", "--seconds", "0.2", "--clocks", "3"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("GPU 0: cannot lock the clocks: ") && !stderr.contains("restoring"), "{stderr}");
}
