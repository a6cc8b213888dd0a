//! The compute pool end to end: `vgpu run --tflops`, `vgpu pool`, preemption with the real
//! cgroup freezer, compaction exactly as in the design document.

use std::process::Child;
use std::time::Duration;

use crate::common::{wait_for, Sim};
use predicates::prelude::*;
use serde_json::Value;

/// A host whose pool is one declared 10-TFLOPS NPU (the simulated GPU is worth no block).
fn ten_block_pool() -> Sim {
    let sim = Sim::new(&[("NVIDIA L4", "24GiB")]);
    sim.write_vgpu_config("[pool.tflops]\n\"NVIDIA L4\" = 0.5\n\n[[pool.device]]\nkind = \"npu\"\nname = \"sim-npu\"\ntflops = 10\nenv = \"SIM_NPU_VISIBLE\"\n");
    sim
}

fn spawn(sim: &Sim, args: &[&str]) -> Child {
    sim.spawn(args)
}

/// Workload `low` (`vgpu run ARGS --name low`), a shell counting into a file as fast as it
/// can, once it has counted to 100; and how far it has counted.
fn counting(sim: &Sim, args: &[&str]) -> (Child, impl Fn() -> u64) {
    let counter = sim.path("counter");
    let script = format!("i=0; while :; do i=$((i+1)); echo $i > {}; done", counter.display());
    let mut argv = vec!["run"];
    argv.extend_from_slice(args);
    argv.extend_from_slice(&["--name", "low", "--", "sh", "-c", &script]);
    let low = spawn(sim, &argv);
    let read = move || std::fs::read_to_string(&counter).ok().and_then(|s| s.trim().parse::<u64>().ok()).unwrap_or(0);
    wait_for("low to make progress", || read() > 100);
    (low, read)
}

fn ranges_of(pool: &Value, name: &str) -> Value {
    pool["allocations"].as_array().unwrap().iter().find(|a| a["name"] == name).map(|a| a["ranges"].clone()).unwrap_or(Value::Null)
}

fn running(sim: &Sim, names: &[&str]) -> bool {
    let ps = sim.json(&["ps", "--json"])["workloads"].clone();
    names.iter().all(|n| ps.as_array().unwrap().iter().any(|w| w["name"] == *n && w["state"] == "running" && !w["pids"].as_array().unwrap().is_empty()))
}

#[test]
fn compaction_example_from_the_design_document() {
    let sim = ten_block_pool();
    let mut children = Vec::new();
    for (name, tflops) in [("app1", "3"), ("app2", "3"), ("app3", "2")] {
        children.push(spawn(&sim, &["run", "--tflops", tflops, "--kind", "npu", "--name", name, "--", "sleep", "60"]));
        wait_for(name, || running(&sim, &[name]));
    }
    let pool = sim.json(&["pool", "--json"]);
    assert_eq!(pool["total_blocks"], 10);
    assert_eq!(ranges_of(&pool, "app1"), serde_json::json!([[1, 3]]));
    assert_eq!(ranges_of(&pool, "app2"), serde_json::json!([[4, 6]]));
    assert_eq!(ranges_of(&pool, "app3"), serde_json::json!([[7, 8]]));
    assert_eq!(pool["free"], serde_json::json!([[9, 10]]));

    sim.vgpu(&["kill", "--signal", "KILL", "app1"]).assert().success();
    children.remove(0).wait().unwrap();
    children.push(spawn(&sim, &["run", "--tflops", "4", "--kind", "npu", "--name", "app4", "--", "sh", "-c", "echo $SIM_NPU_VISIBLE > $0; sleep 60", sim.path("npu-env").to_str().unwrap()]));
    wait_for("app4", || running(&sim, &["app4"]));

    let pool = sim.json(&["pool", "--json"]);
    assert_eq!(ranges_of(&pool, "app2"), serde_json::json!([[1, 3]]));
    assert_eq!(ranges_of(&pool, "app3"), serde_json::json!([[4, 5]]));
    assert_eq!(ranges_of(&pool, "app4"), serde_json::json!([[6, 9]]));
    assert_eq!(pool["free"], serde_json::json!([[10, 10]]));
    wait_for("app4's environment", || std::fs::read_to_string(sim.path("npu-env")).map(|s| s.trim() == "sim-npu").unwrap_or(false));

    sim.vgpu(&["pool"]).assert().success().stdout(predicate::str::contains("app4").and(predicate::str::contains("6–9")));
    for name in ["app2", "app3", "app4"] {
        sim.vgpu(&["kill", "--signal", "KILL", name]).assert().success();
    }
    for mut c in children {
        c.wait().unwrap();
    }
    assert_eq!(sim.json(&["pool", "--json"])["free"], serde_json::json!([[1, 10]]));
}

#[test]
fn node0_numbering_from_the_spec() {
    let sim = Sim::new(&[("SimGPU-A", "16GiB"), ("SimGPU-B", "16GiB")]);
    sim.write_vgpu_config(
        "[pool.tflops]\n\"SimGPU-A\" = 8\n\"SimGPU-B\" = 10\n\n[[pool.device]]\nkind = \"fpga\"\nname = \"fpga0\"\ntflops = 25\n\n[[pool.device]]\nkind = \"npu\"\nname = \"npu0\"\ntflops = 20\n",
    );
    let pool = sim.json(&["pool", "--json"]);
    assert_eq!(pool["total_blocks"], 63);
    let regions: Vec<(String, u64, u64)> = pool["regions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["kind"].as_str().unwrap().to_string(), r["first"].as_u64().unwrap(), r["last"].as_u64().unwrap()))
        .collect();
    assert_eq!(regions, vec![("gpu".into(), 1, 18), ("npu".into(), 19, 38), ("fpga".into(), 39, 63)]);
    // A 50-TFLOPS request is served with blocks 1–50 (1–18 GPU, 19–38 NPU, 39–50 FPGA) and
    // gets both GPUs.
    let cvd = sim.path("cvd");
    let mut child = spawn(&sim, &["run", "--tflops", "50", "--name", "fifty", "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES > $0; sleep 60", cvd.to_str().unwrap()]);
    wait_for("fifty", || running(&sim, &["fifty"]));
    assert_eq!(ranges_of(&sim.json(&["pool", "--json"]), "fifty"), serde_json::json!([[1, 50]]));
    wait_for("its environment", || std::fs::read_to_string(&cvd).map(|s| s.trim().split(',').count() == 2).unwrap_or(false));
    sim.vgpu(&["kill", "--signal", "KILL", "fifty"]).assert().success();
    child.wait().unwrap();
}

#[test]
fn bad_pool_requests_are_usage_errors_and_allocate_nothing() {
    let sim = ten_block_pool();
    for (args, needle) in [
        (&["run", "--tflops", "0", "--", "true"][..], "--tflops"),
        (&["run", "--tflops", "-2", "--", "true"][..], "--tflops"),
        (&["run", "--tflops", "lots", "--", "true"][..], "--tflops"),
        (&["run", "--tflops", "2", "--kind", "tpu", "--", "true"][..], "tpu"),
        (&["run", "--tflops", "2", "--priority", "101", "--", "true"][..], "priority"),
        (&["run", "--tflops", "11", "--kind", "npu", "--", "true"][..], "10"),
    ] {
        sim.vgpu(args).assert().code(2).stderr(predicate::str::contains(needle));
    }
    sim.write_vgpu_config("[[pool.device]]\nkind = \"npu\"\nname = \"no-figure\"\n");
    sim.vgpu(&["pool"]).assert().code(2).stderr(predicate::str::contains("no-figure"));
    assert!(!sim.path("run/pool.json").exists() || sim.json(&["pool", "--json"])["allocations"] == serde_json::json!([]));
}

#[test]
fn preemption_suspends_lower_priority_work_and_resumes_it() {
    let sim = ten_block_pool();
    let (mut low, read) = counting(&sim, &["--tflops", "8", "--kind", "npu", "--priority", "10"]);

    // Equal or lower priority cannot preempt: refused, naming the holder.
    sim.vgpu(&["run", "--tflops", "5", "--kind", "npu", "--priority", "10", "--", "true"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("low"));

    let high_marker = sim.path("high-running");
    let mut high = spawn(&sim, &["run", "--tflops", "5", "--kind", "npu", "--priority", "90", "--name", "high", "--", "sh", "-c", &format!("touch {}; sleep 1", high_marker.display())]);
    wait_for("high to start", || high_marker.exists());
    let ps = sim.json(&["ps", "--json"])["workloads"].clone();
    let low_row = ps.as_array().unwrap().iter().find(|w| w["name"] == "low").unwrap().clone();
    assert_eq!(low_row["state"], "suspended");
    assert_eq!(low_row["suspended_reason"], "preempted");
    assert_eq!(low_row["suspended_by"]["name"], "high", "{low_row}");
    let pool = sim.json(&["pool", "--json"]);
    let low_alloc = pool["allocations"].as_array().unwrap().iter().find(|a| a["name"] == "low").unwrap().clone();
    assert_eq!((low_alloc["suspended_reason"].as_str(), low_alloc["suspended_by"]["name"].as_str()), (Some("preempted"), Some("high")), "{pool}");
    assert_eq!(low_alloc["suspended_by"]["id"], low_row["suspended_by"]["id"], "one vocabulary: {pool}");
    let frozen_at = read();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(read(), frozen_at, "the preempted workload kept running");
    sim.vgpu(&["resume", "low"]).assert().code(1).stderr(predicate::str::contains("preempted"));

    assert!(high.wait().unwrap().success());
    wait_for("low to resume after high exits", || read() > frozen_at + 100);
    assert_eq!(sim.json(&["ps", "--json"])["workloads"][0]["state"], "running");
    sim.vgpu(&["kill", "--signal", "KILL", "low"]).assert().success();
    low.wait().unwrap();
}

#[test]
fn waiting_request_starts_when_blocks_free_up() {
    let sim = ten_block_pool();
    let mut holder = spawn(&sim, &["run", "--tflops", "10", "--kind", "npu", "--name", "holder", "--", "sleep", "60"]);
    wait_for("holder", || running(&sim, &["holder"]));
    sim.vgpu(&["run", "--tflops", "4", "--kind", "npu", "--wait", "300ms", "--", "true"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("timed out"));
    let marker = sim.path("waiter-ran");
    let mut waiter = spawn(&sim, &["run", "--tflops", "4", "--kind", "npu", "--wait", "--name", "waiter", "--", "touch", marker.to_str().unwrap()]);
    wait_for("the waiter to queue", || {
        sim.json(&["ps", "--json"])["workloads"].as_array().unwrap().iter().any(|w| w["name"] == "waiter" && w["state"] == "waiting")
    });
    assert!(!marker.exists());
    sim.vgpu(&["kill", "--signal", "KILL", "holder"]).assert().success();
    holder.wait().unwrap();
    assert!(waiter.wait().unwrap().success());
    assert!(marker.exists());
}

/// A preemption victim whose cgroup cannot be opened cannot be frozen: that is a failed
/// freeze (the request is refused, nothing changes), not a suspension recorded while the
/// victim keeps running on blocks given away.
#[test]
fn a_victim_whose_cgroup_is_gone_is_a_failed_freeze() {
    let sim = ten_block_pool();
    let (mut low, read) = counting(&sim, &["--tflops", "8", "--kind", "npu", "--priority", "10"]);
    let row = sim.json(&["ps", "--json"])["workloads"][0].clone();
    let (id, pids) = (row["id"].as_str().unwrap().to_string(), row["pids"].as_array().unwrap().clone());
    assert_eq!(pids.len(), 1, "{row}");
    // Its process leaves the cgroup (into each hierarchy's root), and the cgroup goes.
    let layout = vgpu_cgroups::Layout::detect().expect("cgroups");
    let cgroup = vgpu_cgroups::Cgroup::open(&layout, &id).unwrap();
    for dir in cgroup.paths() {
        let root = dir.parent().and_then(|p| p.parent()).unwrap();
        std::fs::write(root.join("cgroup.procs"), pids[0].to_string()).unwrap();
        std::fs::remove_dir(&dir).unwrap();
    }
    sim.vgpu(&["run", "--tflops", "5", "--kind", "npu", "--priority", "90", "--name", "high", "--", "true"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("cannot suspend low").and(predicate::str::contains("nothing was changed")));
    let ps = sim.json(&["ps", "--json"])["workloads"].clone();
    assert_eq!(ps.as_array().unwrap().len(), 1, "high was not admitted: {ps}");
    assert_eq!(ps[0]["state"], "running", "{ps}");
    let pool = sim.json(&["pool", "--json"]);
    assert!(pool["allocations"].as_array().unwrap().iter().all(|a| a["state"] != "suspended"), "{pool}");
    let at = read();
    wait_for("low to keep running", || read() > at + 100);
    // SAFETY: kill(2) on the pid of low's shell.
    unsafe { libc::kill(pids[0].as_i64().unwrap() as i32, libc::SIGKILL) };
    low.wait().unwrap();
}

/// Issue 12's measured scenario: on a 10-TFLOPS GPU, `low` (priority 1, 8 TFLOPS) holds 80 %
/// of the memory as its default share; `high` (priority 5, 5 TFLOPS, so 50 %) could take the
/// blocks but not the memory, since a frozen workload keeps its device memory. It is refused
/// before anyone is frozen: the stop point after the victims' freeze is never reached, and
/// low never stops.
#[test]
fn a_preemption_that_cannot_serve_the_memory_freezes_nobody() {
    // A driver without the checkpoint API (older than 570): a frozen victim keeps its
    // memory (with it, see tests/host/suspend_memory.rs).
    let sim = Sim::with_config("checkpoint = false\n\n[[device]]\nname = \"NVIDIA L4\"\nmemory = \"24GiB\"\n");
    sim.write_vgpu_config("[pool.tflops]\n\"NVIDIA L4\" = 10\n");
    let (mut low, read) = counting(&sim, &["--tflops", "8", "--priority", "1"]);
    let low_row = sim.json(&["ps", "--json"])["workloads"][0].clone();
    assert_eq!(low_row["gpus"][0]["memory_quota_bytes"].as_u64(), Some((24u64 << 30) * 8 / 10), "{low_row}");
    let out =
        sim.vgpu(&["run", "--tflops", "5", "--priority", "5", "--name", "high", "--", "true"]).env("VGPU_TEST_STOP_AT", "preempt:frozen").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "refused, not killed at the stop point: {err}");
    assert!(
        err.contains("5 TFLOPS were available by suspending low, but not the memory (a suspended workload keeps its GPU memory here")
            && err.contains("nobody was suspended")
            && err.contains("does not fit"),
        "{err}"
    );
    let layout = vgpu_cgroups::Layout::detect().expect("cgroups");
    let cgroup = vgpu_cgroups::Cgroup::open(&layout, low_row["id"].as_str().unwrap()).unwrap();
    assert_eq!(cgroup.state().unwrap(), vgpu_cgroups::FreezerState::Thawed);
    let at = read();
    wait_for("low to keep running", || read() > at + 100);
    let ps = sim.json(&["ps", "--json"])["workloads"].clone();
    assert_eq!((ps.as_array().unwrap().len(), ps[0]["state"].as_str()), (1, Some("running")), "{ps}");
    sim.vgpu(&["kill", "--signal", "KILL", "low"]).assert().success();
    low.wait().unwrap();
}

#[test]
fn a_waiting_request_waits_for_the_memory_too() {
    use std::io::{BufRead, BufReader};
    // Without the checkpoint API, suspending low would not free its memory.
    let sim = Sim::with_config("checkpoint = false\n\n[[device]]\nname = \"NVIDIA L4\"\nmemory = \"24GiB\"\n");
    sim.write_vgpu_config("[pool.tflops]\n\"NVIDIA L4\" = 10\n");
    let (mut low, _read) = counting(&sim, &["--tflops", "8", "--priority", "1"]);
    let mut high = std::process::Command::new(env!("CARGO_BIN_EXE_vgpu"));
    high.args(["--simulate", "run", "--tflops", "5", "--priority", "5", "--wait", "--name", "high", "--", "true"])
        .envs(sim.env())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut high = high.spawn().unwrap();
    let mut lines = BufReader::new(high.stderr.take().unwrap()).lines();
    let line = lines.next().unwrap().unwrap();
    assert!(line.contains("waiting for the memory") && line.contains("nobody was suspended"), "{line}");
    assert_eq!(sim.row("low")["state"], "running", "nobody is suspended while it waits");
    sim.vgpu(&["kill", "--signal", "KILL", "low"]).assert().success();
    low.wait().unwrap();
    let status = high.wait().unwrap();
    assert!(status.success(), "{:?}", lines.map_while(Result::ok).collect::<Vec<_>>());
}
