//! Clocks that follow the work: with a carbon budget and caps in force, `vgpu run` re-plans
//! and applies when its workload starts (before the first kernel) and when it ends, so a
//! job does not run at an idle GPU's lowest clock until the next `carbon apply`. Without a
//! budget, `carbon apply` (the timer) does nothing and says so.
//!
//! The clock a GPU runs kernels at is read with `vgpu devices --json` (`sm_clock_mhz`)
//! while a `gpu_workload` keeps it busy: the simulated driver runs kernels at the locked
//! maximum.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::common::{wait_for, Sim};
use serde_json::Value;
use crate::common::workload::workload_bin;

const H100: (&str, &str) = ("NVIDIA H100 80GB HBM3", "80GiB");

fn decisions(sim: &Sim) -> Vec<Value> {
    let text = std::fs::read_to_string(sim.path("lib/carbon.jsonl")).unwrap_or_default();
    text.lines().map(|l| serde_json::from_str(l).expect("log line is JSON")).collect()
}

fn gpu0_clock(sim: &Sim) -> u64 {
    let v = sim.json(&["devices", "--json"]);
    // The list itself, or (with a schema version beside it) the one list in the object.
    let list = match &v {
        Value::Array(list) => list.clone(),
        Value::Object(fields) => fields.values().find_map(|f| f.as_array().cloned()).expect("a list of GPUs"),
        other => panic!("devices --json: {other}"),
    };
    list[0]["sm_clock_mhz"].as_u64().unwrap_or_else(|| panic!("sm_clock_mhz: {}", list[0]))
}

/// The cap the decision left on GPU 0: (kind, max MHz).
fn cap0(decision: &Value) -> (String, Option<u64>) {
    let cap = &decision["gpus"][0]["cap"];
    (cap["kind"].as_str().unwrap_or("").to_string(), cap["max_mhz"].as_u64())
}

/// Once `file` holds a step count above zero: a kernel has run.
fn wait_for_steps(file: &Path) {
    wait_for(&format!("{} to count a step", file.display()), || {
        std::fs::read_to_string(file).ok().and_then(|t| t.trim().parse::<u64>().ok()).is_some_and(|n| n > 0)
    });
}

/// `gpu_workload sync` for up to two minutes, until `stop` exists, counting steps in `progress`.
fn busy_args(progress: &Path, stop: &Path) -> Vec<String> {
    let w = workload_bin().to_str().unwrap().to_string();
    vec![w, "sync".into(), "120".into(), "--progress".into(), p(progress), "--stop".into(), p(stop)]
}

fn p(path: &Path) -> String {
    path.to_str().unwrap().to_string()
}

fn vgpu_run(sim: &Sim, argv: &[String]) -> Child {
    let mut args = vec!["run".to_string(), "--gpu".into(), "0".into(), "--".into()];
    args.extend_from_slice(argv);
    Command::new(env!("CARGO_BIN_EXE_vgpu"))
        .arg("--simulate")
        .args(&args)
        .envs(sim.env())
        .env("VGPU_LOG", "vgpu=warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("vgpu run")
}

fn file_source_config(sim: &Sim) -> PathBuf {
    let csv = sim.path("intensity.csv");
    std::fs::write(&csv, "timestamp,gco2_per_kwh\n2020-01-01T00:00:00Z,200\n").unwrap();
    sim.write_vgpu_config(&format!(
        "[carbon]\nsource = \"file\"\npath = \"{}\"\nbudget_g_per_hour = 1000\n",
        csv.display()
    ));
    csv
}

#[test]
fn a_workload_started_by_vgpu_run_gets_its_planned_clock_at_once_and_the_idle_plan_returns_after() {
    let sim = Sim::new(&[H100]);
    file_source_config(&sim);
    let apply = sim.json(&["carbon", "apply", "--json"]);
    assert_eq!(cap0(&apply), ("locked-clocks".into(), Some(345)), "an idle GPU is locked at its lowest clock: {apply}");

    let (progress, stop) = (sim.path("progress"), sim.path("stop"));
    let mut run = vgpu_run(&sim, &busy_args(&progress, &stop));
    wait_for_steps(&progress);
    // No timer tick happened: only the start of the workload can have raised the cap.
    assert_eq!(gpu0_clock(&sim), 1980, "the job runs at the planned clock, not the idle cap");
    let started = decisions(&sim);
    let last = started.last().expect("a decision");
    let id = sim.ps()[0]["id"].as_str().expect("workload id").to_string();
    assert_eq!(last["reason"], format!("workload started {id}"), "{last}");
    assert_eq!(last["gpus"][0]["clock_mhz"], 1980, "{last}");
    assert_eq!(cap0(last).0, "uncapped", "{last}");

    std::fs::write(&stop, "").unwrap();
    let status = run.wait().unwrap();
    assert!(status.success(), "vgpu run: {status}");
    let ended = decisions(&sim);
    let last = ended.last().expect("a decision");
    assert_eq!(last["reason"], format!("workload ended {id}"), "{last}");
    assert_eq!(cap0(last), ("locked-clocks".into(), Some(345)), "the idle plan again: {last}");
    assert_eq!(ended.len(), 3, "apply, started, ended: {ended:?}");

    // On the device: a CUDA client vgpu did not start (no re-plan) runs at the idle cap.
    let (progress, stop) = (sim.path("progress2"), sim.path("stop2"));
    let argv = busy_args(&progress, &stop);
    let mut direct = Command::new(&argv[0])
        .args(&argv[1..])
        .envs(sim.env())
        .env("LD_LIBRARY_PATH", sim.path("run/simulate"))
        .stdout(Stdio::null())
        .spawn()
        .expect("gpu_workload");
    wait_for_steps(&progress);
    assert_eq!(gpu0_clock(&sim), 345, "the GPU is locked low again once the job ended");
    std::fs::write(&stop, "").unwrap();
    assert!(direct.wait().unwrap().success());
}

#[test]
fn without_caps_in_force_or_without_a_budget_vgpu_run_leaves_the_clocks_alone() {
    let sim = Sim::new(&[H100]);
    file_source_config(&sim);
    // A budget, but carbon apply never ran: nothing is capped, nothing is re-planned.
    let out = sim.vgpu(&["run", "--gpu", "0", "--", "true"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(decisions(&sim).is_empty());
    assert!(!sim.path("run/carbon-applied.json").exists());

    // Caps in force, then the budget removed from the config: runs change nothing.
    sim.json(&["carbon", "apply", "--json"]);
    let csv = sim.path("intensity.csv");
    sim.write_vgpu_config(&format!("[carbon]\nsource = \"file\"\npath = \"{}\"\n", csv.display()));
    let out = sim.vgpu(&["run", "--gpu", "0", "--", "true"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(decisions(&sim).len(), 1, "only the apply: {:?}", decisions(&sim));
}

#[test]
fn a_hanging_intensity_source_falls_back_to_the_remembered_reading_and_the_run_starts() {
    let sim = Sim::new(&[H100]);
    let value = sim.path("value");
    std::fs::write(&value, "300\n").unwrap();
    sim.write_vgpu_config(&format!(
        "[carbon]\nsource = \"command\"\ncommand = \"cat {}\"\ntimeout = \"1s\"\nbudget_g_per_hour = 1000\n",
        value.display()
    ));
    let apply = sim.json(&["carbon", "apply", "--json"]);
    assert_eq!(apply["intensity_source"]["status"], "fresh", "{apply}");
    // Now the command hangs: `cat` of a FIFO nobody writes blocks in open().
    std::fs::remove_file(&value).unwrap();
    nix::unistd::mkfifo(&value, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();

    let out = sim.vgpu(&["run", "--gpu", "0", "--", "true"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("did not finish within 1s") && stderr.contains("using the value read"), "{stderr}");
    let all = decisions(&sim);
    assert_eq!(all.len(), 3, "apply, started, ended: {all:?}");
    for d in &all[1..] {
        assert_eq!(d["intensity_source"]["status"], "cached", "{d}");
        assert_eq!(d["intensity"], 300.0, "{d}");
    }
}

#[test]
fn carbon_apply_without_a_budget_does_nothing_and_succeeds() {
    let sim = Sim::new(&[H100]);
    // The shipped default config: every [carbon] key commented out.
    let example = std::fs::read_to_string(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join("examples/config.toml")).unwrap();
    let config = sim.write_vgpu_config(&example);
    let out = sim.vgpu(&["--config", config.to_str().unwrap(), "carbon", "apply"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.contains(&format!(
            "no carbon budget configured ([carbon] budget_g_per_hour, budget_g_per_day or budget_g_per_month in {}): nothing to do",
            config.display()
        )),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
    assert!(!sim.path("lib/carbon.jsonl").exists() && !sim.path("run/carbon-applied.json").exists());
    // `plan` still says what is missing.
    let out = sim.vgpu(&["carbon", "plan", "--intensity", "100"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no carbon budget"));
}

#[test]
fn reconcile_re_plans_when_it_cleans_up_after_a_dead_supervisor() {
    let sim = Sim::new(&[H100]);
    file_source_config(&sim);
    sim.json(&["carbon", "apply", "--json"]);
    let (progress, stop) = (sim.path("progress"), sim.path("stop"));
    let mut run = vgpu_run(&sim, &busy_args(&progress, &stop));
    wait_for_steps(&progress);
    let id = sim.ps()[0]["id"].as_str().expect("workload id").to_string();
    assert_eq!(decisions(&sim).last().unwrap()["reason"], format!("workload started {id}"));
    // The supervisor dies without tearing down; the next command that reconciles does.
    run.kill().unwrap();
    run.wait().unwrap();
    let out = sim.vgpu(&["ps"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(sim.ps().is_empty(), "cleaned up");
    let last = decisions(&sim).pop().unwrap();
    assert_eq!(last["reason"], format!("workload ended {id}"), "{last}");
    assert_eq!(cap0(&last), ("locked-clocks".into(), Some(345)), "the idle plan again: {last}");
}

/// A uk-grid source at an API that accepts connections (the kernel's backlog) and never
/// answers, with a 1 s timeout and a budget, and a good reading of it (321 g/kWh) remembered
/// a minute ago. The listener must live as long as the test needs the silent API.
fn silent_uk_grid(sim: &Sim) -> std::net::TcpListener {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    sim.write_vgpu_config(&format!(
        "[carbon]\nsource = \"uk-grid\"\nbase_url = \"http://127.0.0.1:{port}\"\ntimeout = \"1s\"\nbudget_g_per_hour = 1000\n"
    ));
    let at = chrono::Utc::now() - chrono::Duration::minutes(1);
    let cached = serde_json::json!({
        "source": "uk-grid national",
        "reading": {"g_per_kwh": 321.0, "timestamp": at.to_rfc3339()},
        "fetched_at": at.to_rfc3339(),
    });
    std::fs::write(sim.path("lib/carbon-intensity.json"), cached.to_string()).unwrap();
    silent
}

#[test]
fn an_api_that_never_answers_falls_back_to_the_remembered_reading_and_the_run_starts() {
    let sim = Sim::new(&[H100]);
    let silent = silent_uk_grid(&sim);
    let apply = sim.json(&["carbon", "apply", "--json"]);
    assert_eq!(apply["intensity_source"]["status"], "cached", "{apply}");

    let out = sim.vgpu(&["run", "--gpu", "0", "--", "true"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("did not answer within 1s"), "{stderr}");
    let all = decisions(&sim);
    let reasons: Vec<&str> = all.iter().filter_map(|d| d["reason"].as_str()).collect();
    assert_eq!(reasons.len(), 2, "started and ended: {all:?}");
    for d in &all[1..] {
        assert_eq!(
            (d["intensity_source"]["status"].as_str(), d["intensity"].as_f64()),
            (Some("cached"), Some(321.0)),
            "{d}"
        );
    }
    drop(silent);
}

/// Reconcile re-plans with the store lock held: it must not ask the source (up to its
/// timeout, 10 s by default, longer than other commands wait for the lock, 5 s), but use the
/// remembered reading. The source is an API that accepts connections and never answers: a
/// connection waiting in its backlog after `vgpu ps` means reconcile asked it.
#[test]
fn reconcile_re_plans_with_the_remembered_reading_never_asking_the_source_under_the_lock() {
    let sim = Sim::new(&[H100]);
    let silent = silent_uk_grid(&sim);
    silent.set_nonblocking(true).unwrap();
    sim.json(&["carbon", "apply", "--json"]);
    let (progress, stop) = (sim.path("progress"), sim.path("stop"));
    let mut run = vgpu_run(&sim, &busy_args(&progress, &stop));
    wait_for_steps(&progress);
    let id = sim.ps()[0]["id"].as_str().expect("workload id").to_string();
    // `apply` and the run's start asked the API (outside the lock); their connections are
    // done with before the workload's first step.
    let drain = || std::iter::from_fn(|| silent.accept().ok()).count();
    assert!(drain() >= 1, "the run's start did not ask the API");
    run.kill().unwrap();
    run.wait().unwrap();
    let out = sim.vgpu(&["ps"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(sim.ps().is_empty(), "cleaned up");
    assert_eq!(drain(), 0, "reconcile asked the intensity source with the store lock held");
    let last = decisions(&sim).pop().unwrap();
    assert_eq!(last["reason"], format!("workload ended {id}"), "{last}");
    assert_eq!((last["intensity_source"]["status"].as_str(), last["intensity"].as_f64()), (Some("cached"), Some(321.0)), "{last}");
}

#[test]
fn a_daily_budget_is_followed_with_the_remembered_forecast() {
    let sim = Sim::new(&[H100]);
    // The command counts its runs: one a reading or a forecast.
    let count = sim.path("count");
    sim.write_vgpu_config(&format!(
        "[carbon]\nsource = \"command\"\ncommand = \"echo x >> {}; echo 300\"\nbudget_g_per_day = 1000000\n",
        count.display()
    ));
    let runs = || std::fs::read_to_string(&count).unwrap_or_default().lines().count();
    let apply = sim.json(&["carbon", "apply", "--json"]);
    assert_eq!(apply["horizons"][0]["period"], "day", "{apply}");
    assert_eq!(runs(), 2, "apply reads the value now and the forecast");
    assert!(sim.path("lib/carbon-forecast.json").is_file());

    let out = sim.vgpu(&["run", "--gpu", "0", "--", "true"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let all = decisions(&sim);
    assert_eq!(all.len(), 3, "apply, started, ended: {all:?}");
    for d in &all[1..] {
        assert_eq!(d["horizons"][0]["period"], "day", "{d}");
        assert_eq!(d["horizons"][0]["feasible"], true, "{d}");
    }
    // Each re-plan read the value now (before the store lock), never the forecast.
    assert_eq!(runs(), 4);
}
