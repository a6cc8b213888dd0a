//! Crash consistency (issue #10, items 4 and 6): a command SIGKILLed at an exact step of a
//! multi-step change (the `VGPU_TEST_STOP_AT` stop points, src/stop_point.rs) leaves
//! nothing the next command does not repair. Runs as root on the host's real cgroups (like
//! tests/host/run.rs); the freezer state is read from the cgroup filesystem itself.

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use crate::common::{wait_for, Sim};
use serde_json::Value;
use vgpu_cgroups::Controller;
use vgpu_cgroups::Layout;
use vgpu_cgroups::Mode;

const GPU16: &[(&str, &str)] = &[("NVIDIA A16-sim", "16GiB")];

/// `vgpu --simulate ARGS…` made to SIGKILL itself at stop point `at`; checks it died there.
fn killed_at(sim: &Sim, at: &str, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vgpu"));
    cmd.arg("--simulate").args(args).env("VGPU_LOG", "vgpu=warn").env("VGPU_TEST_STOP_AT", at);
    for (k, v) in sim.env() {
        cmd.env(k, v);
    }
    let out = cmd.stdin(Stdio::null()).output().expect("run vgpu");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGKILL),
        "vgpu {args:?} was to die at {at}: {:?}, stderr {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn layout() -> Layout {
    Layout::detect().expect("a cgroup filesystem")
}

/// The directories of workload cgroup `name`, one per hierarchy.
fn cgroup_dirs(name: &str) -> Vec<PathBuf> {
    let layout = layout();
    match layout.mode {
        Mode::V2 => layout.unified.iter().map(|root| root.join("vgpu").join(name)).collect(),
        Mode::V1 | Mode::Hybrid => {
            let mut dirs: Vec<PathBuf> = layout.v1.values().map(|mount| mount.join("vgpu").join(name)).collect();
            dirs.sort();
            dirs.dedup();
            dirs
        }
    }
}

/// Whether cgroup `name` is frozen, read from the kernel's own file.
fn frozen(name: &str) -> bool {
    let layout = layout();
    match layout.mode {
        Mode::V2 => {
            let events = std::fs::read_to_string(layout.unified.unwrap().join("vgpu").join(name).join("cgroup.events")).unwrap();
            events.lines().any(|l| l.trim() == "frozen 1")
        }
        Mode::V1 | Mode::Hybrid => {
            let dir = layout.v1[&Controller::Freezer].join("vgpu").join(name);
            let state = std::fs::read_to_string(dir.join("freezer.state")).unwrap();
            state.trim() != "THAWED"
        }
    }
}

/// Freeze cgroup `name` behind vgpu's back, through the kernel's file.
fn freeze_directly(name: &str) {
    let layout = layout();
    match layout.mode {
        Mode::V2 => std::fs::write(layout.unified.unwrap().join("vgpu").join(name).join("cgroup.freeze"), "1").unwrap(),
        Mode::V1 | Mode::Hybrid => std::fs::write(layout.v1[&Controller::Freezer].join("vgpu").join(name).join("freezer.state"), "FROZEN").unwrap(),
    }
    wait_for("the cgroup to freeze", || frozen(name));
}

fn ps(sim: &Sim) -> Vec<Value> {
    sim.json(&["ps", "--json"])["workloads"].as_array().unwrap().clone()
}

fn row(sim: &Sim, name: &str) -> Value {
    ps(sim).into_iter().find(|w| w["name"] == name).unwrap_or_else(|| panic!("no workload {name} in ps"))
}

/// A workload that counts as fast as it can into a file: whether it runs is visible.
struct Counter {
    path: PathBuf,
}

impl Counter {
    fn new(sim: &Sim) -> Counter {
        Counter { path: sim.path("counter") }
    }

    fn script(&self) -> String {
        format!("i=0; while :; do i=$((i+1)); echo $i > {}; done", self.path.display())
    }

    fn read(&self) -> u64 {
        std::fs::read_to_string(&self.path).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
    }

    fn wait_progress(&self, what: &str) {
        let from = self.read();
        wait_for(what, || self.read() > from + 50);
    }
}

/// The running victim; killed (thawed first by `vgpu kill`) however the test ends, so a
/// failing test leaves no frozen process behind.
struct Victim<'a> {
    sim: &'a Sim,
    child: std::process::Child,
}

impl Drop for Victim<'_> {
    fn drop(&mut self) {
        let _ = self.sim.vgpu(&["kill", "--signal", "KILL", "victim"]).output();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_counter<'a>(sim: &'a Sim, counter: &Counter, extra: &[&str]) -> (Victim<'a>, String) {
    let script = counter.script();
    let mut args = vec!["run"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--name", "victim", "--", "sh", "-c", &script]);
    let child = sim.spawn(&args);
    wait_for("the victim to run", || {
        ps(sim).iter().any(|w| w["name"] == "victim" && w["state"] == "running" && w["pids"].as_array().is_some_and(|p| !p.is_empty()))
    });
    counter.wait_progress("the victim to count");
    let id = row(sim, "victim")["id"].as_str().unwrap().to_string();
    (Victim { sim, child }, id)
}

/// Item 4, `vgpu suspend`: killed after the freeze, before the record. The next command
/// thaws the workload (a suspend that was never recorded is undone), and `resume` and a
/// new `suspend` work.
#[test]
fn a_suspend_killed_after_the_freeze_leaves_no_frozen_running_workload() {
    let sim = Sim::new(GPU16);
    let counter = Counter::new(&sim);
    let (_victim, id) = start_counter(&sim, &counter, &["--mem", "1G"]);

    killed_at(&sim, "suspend:frozen", &["suspend", "victim"]);
    assert!(frozen(&id), "the stop point is after the freeze");

    let victim = row(&sim, "victim"); // reconciles
    assert_eq!(victim["state"], "running", "{victim}");
    assert!(!frozen(&id), "ps says running: the cgroup must not stay frozen");
    counter.wait_progress("the victim to count again");

    sim.vgpu(&["suspend", "victim"]).assert().success();
    assert!(frozen(&id));
    assert_eq!(row(&sim, "victim")["state"], "suspended");
    sim.vgpu(&["resume", "victim"]).assert().success();
    assert!(!frozen(&id));
    assert_eq!(row(&sim, "victim")["state"], "running");
}

/// Item 4, preemption: `vgpu run --tflops --priority` killed after freezing its victim and
/// before saving the pool. The victim is thawed, the pool still holds its blocks and no one
/// else's; `resume` says it is not suspended because it runs; a later preemption works.
#[test]
fn a_preempting_run_killed_after_the_freeze_leaves_no_frozen_running_workload() {
    let sim = Sim::new(&[("NVIDIA L4", "24GiB")]);
    sim.write_vgpu_config("[pool.tflops]\n\"NVIDIA L4\" = 0.5\n\n[[pool.device]]\nkind = \"npu\"\nname = \"sim-npu\"\ntflops = 10\n");
    let counter = Counter::new(&sim);
    let (_victim, id) = start_counter(&sim, &counter, &["--tflops", "8", "--kind", "npu", "--priority", "10"]);

    killed_at(&sim, "preempt:frozen", &["run", "--tflops", "5", "--kind", "npu", "--priority", "90", "--name", "high", "--", "true"]);
    assert!(frozen(&id), "the stop point is after the victim's freeze");

    let victim = row(&sim, "victim"); // reconciles
    assert_eq!(victim["state"], "running", "{victim}");
    assert!(!frozen(&id), "ps says running: the cgroup must not stay frozen");
    counter.wait_progress("the victim to count again");
    let pool = sim.json(&["pool", "--json"]);
    let allocations = pool["allocations"].as_array().unwrap();
    assert_eq!(allocations.len(), 1, "only the victim holds blocks: {pool}");
    assert_eq!(allocations[0]["name"], "victim");
    assert_eq!(pool["free"], serde_json::json!([[9, 10]]), "{pool}");
    sim.vgpu(&["resume", "victim"]).assert().success();
    assert!(!frozen(&id));

    // Killed once the pool is saved, before the records: the pool is followed (the dead
    // preemptor's blocks are given back and the victim resumed).
    killed_at(&sim, "preempt:saved", &["run", "--tflops", "5", "--kind", "npu", "--priority", "90", "--name", "high", "--", "true"]);
    assert_eq!(row(&sim, "victim")["state"], "running");
    assert!(!frozen(&id));
    assert_eq!(sim.json(&["pool", "--json"])["free"], serde_json::json!([[9, 10]]));

    // A preemption that completes still suspends and records it, then resumes it.
    sim.vgpu(&["run", "--tflops", "5", "--kind", "npu", "--priority", "90", "--name", "high", "--", "true"]).assert().success();
    counter.wait_progress("the victim to count after the preemptor exited");
    assert_eq!(row(&sim, "victim")["state"], "running");
}

/// `vgpu resume` thaws a frozen workload whatever its record says (here: running).
#[test]
fn resume_thaws_a_frozen_workload_whatever_the_record_says() {
    let sim = Sim::new(GPU16);
    let counter = Counter::new(&sim);
    let (_victim, id) = start_counter(&sim, &counter, &["--mem", "1G"]);
    freeze_directly(&id);
    sim.vgpu(&["resume", "victim"]).assert().success();
    assert!(!frozen(&id));
    counter.wait_progress("the victim to count again");
    assert_eq!(row(&sim, "victim")["state"], "running");
}

/// A running workload frozen behind its record's back (as a `vgpu watch` killed at an
/// offence, before it could record it, leaves one) is thawed by the next command, here a
/// `vgpu run`: reconcile reads every running workload's freezer state, and looks further
/// only at a frozen one (issue 28: each workload costs that one read).
#[test]
fn the_next_run_thaws_a_running_workload_frozen_behind_its_records_back() {
    let sim = Sim::new(GPU16);
    let counter = Counter::new(&sim);
    let (_victim, id) = start_counter(&sim, &counter, &["--mem", "1G"]);
    freeze_directly(&id);
    sim.vgpu(&["run", "--mem", "1G", "--", "true"])
        .assert()
        .success()
        .stderr(predicates::str::contains(format!("victim ({id}) thawed: a change froze it and died before recording it")));
    assert!(!frozen(&id));
    counter.wait_progress("the victim to count again");
    assert_eq!(row(&sim, "victim")["state"], "running");
}

/// Item 6: `vgpu run` killed between creating the cgroup and writing the record. The next
/// command removes the cgroup (in every hierarchy), the vGPU directory and the intent.
#[test]
fn a_run_killed_between_cgroup_and_record_leaves_no_cgroup() {
    let sim = Sim::new(GPU16);
    killed_at(&sim, "run:cgroup-created", &["run", "--mem", "1G", "--", "sleep", "120"]);
    // Its id names its vGPU directory (made just before the cgroup) and its cgroup.
    let leaked: Vec<String> = std::fs::read_dir(sim.path("run/vgpus")).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(leaked.len(), 1, "{leaked:?}");
    assert!(cgroup_dirs(&leaked[0]).iter().all(|d| d.is_dir()), "the killed run made its cgroup (the premise)");
    let records = std::fs::read_dir(sim.path("run/workloads")).unwrap().flatten().filter(|e| e.file_name().to_string_lossy().ends_with(".json")).count();
    assert_eq!(records, 0, "no record was written");

    sim.vgpu(&["ps"]).assert().success(); // reconciles
    for dir in cgroup_dirs(&leaked[0]) {
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
    let left: Vec<PathBuf> = ["run/vgpus", "run/workloads", "run/intents"]
        .iter()
        .flat_map(|d| std::fs::read_dir(sim.path(d)).into_iter().flatten().flatten().map(|e| e.path()))
        .collect();
    assert!(left.is_empty(), "left in the store: {left:?}");
    sim.vgpu(&["run", "--mem", "1G", "--", "true"]).assert().success();
}
