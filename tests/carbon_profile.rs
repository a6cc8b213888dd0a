//! `vgpu carbon profile` against the simulated driver: the fit recovers the curve the
//! driver was configured with (power: idle 70 W, max 700 W, γ 2.5; speed σ 0.6), the clocks
//! are as they were afterwards (read from the driver's own shared state), `carbon plan`
//! names the measured model after a profile and "default" before, a busy GPU is refused
//! without `--force`, and SIGTERM restores the clocks too.

mod common;
#[path = "support/process.rs"]
mod process;
#[path = "support/workload.rs"]
mod workload;

use std::process::{Command, Stdio};

use common::{wait_for, Sim};
use serde_json::Value;

const CURVE: &str = "[[device]]\nname = \"NVIDIA H100 80GB HBM3\"\nmemory = \"80GiB\"\n\
                     power_idle_w = 70\npower_max_w = 700\npower_exponent = 2.5\nclock_sensitivity = 0.6\n";
const MEMORY: u64 = 80 << 30;

/// The locked clocks the simulated driver holds for GPU `uuid` (None: not locked).
fn locked_clocks(sim: &Sim, uuid: &str) -> Option<(u32, u32)> {
    fakegpu::state::DeviceState::open(&sim.path("fakegpu-state"), uuid, MEMORY).expect("the driver's state").locked_clocks()
}

fn uuid(sim: &Sim) -> String {
    sim.json(&["devices", "--json"])["gpus"][0]["uuid"].as_str().expect("uuid").to_string()
}

fn plan(sim: &Sim) -> Value {
    sim.json(&["carbon", "plan", "--json", "--intensity", "300", "--budget", "500"])["gpus"][0].clone()
}

fn within(got: &Value, want: f64, share: f64) -> bool {
    got.as_f64().is_some_and(|g| (g - want).abs() <= share * want.abs())
}

#[test]
fn the_fit_recovers_the_configured_curve_and_the_clocks_are_restored() {
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
    let ready = sim.path("holder.ready");
    let mut holder = Command::new(workload::workload_bin())
        .args(["idle", "300", "--alloc-mib", "16", "--ready"])
        .arg(&ready)
        .envs(sim.env())
        .env("LD_LIBRARY_PATH", sim.path("run/simulate"))
        .env_remove("LD_PRELOAD")
        .stdout(Stdio::null())
        .spawn()
        .expect("start a CUDA process");
    wait_for("the process to hold memory", || ready.exists());
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
    let mut child = sim.spawn(&["carbon", "profile", "--seconds", "30"]);
    // The first locked clock is the event: profiling has the GPU.
    wait_for("profiling to lock the clocks", || locked_clocks(&sim, &uuid).is_some());
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
