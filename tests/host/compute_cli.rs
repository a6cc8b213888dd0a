//! The CLI's side of the compute governor, end to end through the real binary on the
//! simulated driver (as root, real cgroups): `--compute-policy` and `[compute] policy`
//! reach the vGPU's usage file, the vGPU's slot on the GPU's board is created, `vgpu
//! update` and `vgpu partition update` change a running vGPU's share live, and `vgpu ps`
//! shows the target and the measured share.

use std::path::PathBuf;
use std::process::Child;

use crate::common::Sim;
use predicates::prelude::*;
use vgpu_abi::compute::Policy;
use vgpu_abi::process::{start_time, ProcessId};
use vgpu_abi::usage::UsageFile;

const TWO_GPUS: &[(&str, &str)] = &[("NVIDIA A16-sim", "16GiB"), ("NVIDIA A16-sim", "16GiB")];

/// A workload that runs until the test touches its `done` file (or 60 s pass, so that a
/// failed test leaves nothing running for long).
struct Held {
    child: Child,
    done: PathBuf,
}

impl Held {
    fn start(sim: &Sim, name: &str, run_args: &[&str]) -> Held {
        let done = sim.path(&format!("{name}.done"));
        let script = format!("i=0; while [ ! -e {d} ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done", d = done.display());
        let child = sim.spawn_running(name, run_args, &script);
        Held { child, done }
    }

    fn stop(mut self) {
        std::fs::write(&self.done, b"").unwrap();
        assert!(self.child.wait().unwrap().success());
    }
}

fn usage_of(sim: &Sim, vgpu: &str) -> UsageFile {
    UsageFile::open(&sim.path(&format!("run/vgpus/{vgpu}/usage"))).expect("the vGPU's usage file")
}

/// (compute_pct, policy) of every device of a vGPU.
fn shares(usage: &UsageFile) -> Vec<(u32, Policy)> {
    usage.devices().iter().map(|d| (d.compute_pct, d.policy)).collect()
}

fn record(sim: &Sim, id: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(sim.path(&format!("run/workloads/{id}.json"))).unwrap()).unwrap()
}

#[test]
fn run_puts_share_policy_and_priority_in_the_usage_file_and_makes_the_board() {
    let sim = Sim::new(TWO_GPUS);
    let held = Held::start(&sim, "fair30", &["--gpu", "1", "--mem", "1G", "--compute", "30", "--compute-policy", "fair", "--priority", "70"]);
    let w = sim.row("fair30");
    let id = w["id"].as_str().unwrap();
    let usage = usage_of(&sim, id);
    let devices = usage.devices();
    assert_eq!(devices.len(), 1);
    assert_eq!((devices[0].compute_pct, devices[0].policy, devices[0].priority), (30, Policy::Fair, 70));
    let uuid = w["gpus"][0]["gpu_uuid"].as_str().unwrap();
    assert_eq!(devices[0].uuid, uuid);

    // The vGPU's slot on the board of GPU 1 (a root-owned directory), its own to write and
    // everybody's to read; none for GPU 0, which no vGPU uses.
    let board = sim.path(&format!("run/gpus/{uuid}"));
    use std::os::unix::fs::PermissionsExt;
    assert!(std::fs::symlink_metadata(&board).unwrap().is_dir());
    assert_eq!(std::fs::metadata(&board).unwrap().permissions().mode() & 0o7777, 0o755);
    let slot = board.join(id);
    assert_eq!(std::fs::metadata(&slot).unwrap().permissions().mode() & 0o7777, 0o644);
    assert!(vgpu_abi::board::Board::open(&sim.path(&format!("run/vgpus/{id}")), uuid).is_ok());
    assert_eq!(std::fs::read_dir(&board).unwrap().count(), 1);
    assert_eq!(std::fs::read_dir(sim.path("run/gpus")).unwrap().count(), 1);

    // ps and the record say the same.
    assert_eq!(w["compute_pct"], 30);
    assert_eq!(w["compute_policy"], "fair");
    assert_eq!(w["gpus"][0]["compute_pct"], 30);
    assert_eq!(w["compute_measured_pct"], serde_json::Value::Null, "an idle workload has no measured share");
    assert_eq!(w["gpu_time_ns"], 0);
    assert_eq!(record(&sim, id)["compute_policy"], "fair");
    held.stop();
}

#[test]
fn the_config_policy_is_the_default_and_the_flag_wins() {
    let sim = Sim::new(TWO_GPUS);
    sim.write_vgpu_config("[compute]\npolicy = \"fair\"\n");
    let by_config = Held::start(&sim, "byconfig", &["--gpu", "0", "--mem", "1G", "--compute", "40"]);
    let by_flag = Held::start(&sim, "byflag", &["--gpu", "1", "--mem", "1G", "--compute", "40", "--compute-policy", "strict"]);
    let id = |name: &str| sim.row(name)["id"].as_str().unwrap().to_string();
    assert_eq!(shares(&usage_of(&sim, &id("byconfig"))), [(40, Policy::Fair)]);
    assert_eq!(shares(&usage_of(&sim, &id("byflag"))), [(40, Policy::Strict)]);
    by_config.stop();
    by_flag.stop();
    // Without either: strict.
    sim.write_vgpu_config("");
    let plain = Held::start(&sim, "plain", &["--mem", "1G"]);
    assert_eq!(shares(&usage_of(&sim, &id("plain"))), [(100, Policy::Strict)]);
    plain.stop();
}

#[test]
fn a_bad_config_policy_is_an_error_naming_the_key() {
    let sim = Sim::new(TWO_GPUS);
    sim.write_vgpu_config("[compute]\npolicy = \"bogus\"\n");
    sim.vgpu(&["run", "--mem", "1G", "--", "true"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("compute.policy").and(predicate::str::contains("bogus")));
    sim.vgpu(&["run", "--mem", "1G", "--compute-policy", "bogus", "--", "true"]).assert().code(2);
    assert!(!sim.path("run/workloads").exists() || std::fs::read_dir(sim.path("run/workloads")).unwrap().count() == 0);
}

#[test]
fn update_changes_a_running_workloads_share_live() {
    let sim = Sim::new(TWO_GPUS);
    let held = Held::start(&sim, "both", &["--gpu", "0", "--gpu", "1", "--mem", "1G", "--compute", "30"]);
    let id = sim.row("both")["id"].as_str().unwrap().to_string();
    let usage = usage_of(&sim, &id);
    assert_eq!(shares(&usage), [(30, Policy::Strict), (30, Policy::Strict)]);

    sim.vgpu(&["update", &id[..4], "--compute", "60"]).assert().success().stdout(predicate::str::contains("compute 60%,60% strict (was 30%,30% strict)"));
    // The same mapping sees the change: this is what the running shim reads.
    assert_eq!(shares(&usage), [(60, Policy::Strict), (60, Policy::Strict)]);
    let w = sim.row("both");
    assert_eq!(w["compute_pct"], 60);
    assert_eq!(w["gpus"][0]["compute_pct"], 60);
    assert_eq!(w["gpus"][1]["compute_pct"], 60);
    assert_eq!(record(&sim, &id)["gpus"][1]["compute_pct"], 60);

    // The policy alone, by name, with --json.
    let out = sim.json(&["update", "both", "--compute-policy", "fair", "--json"])["workloads"].clone();
    assert_eq!(out[0]["id"], id.as_str());
    assert_eq!(out[0]["compute_policy"], "fair");
    assert_eq!(out[0]["previous_compute_policy"], "strict");
    assert_eq!(out[0]["gpus"][0]["compute_pct"], 60);
    assert_eq!(out[0]["gpus"][0]["previous_compute_pct"], 60);
    assert_eq!(shares(&usage), [(60, Policy::Fair), (60, Policy::Fair)]);
    assert_eq!(sim.row("both")["compute_policy"], "fair");
    assert_eq!(record(&sim, &id)["compute_policy"], "fair");
    held.stop();
}

/// `vgpu update --turn` changes a running vGPU's longest turn beside a higher priority live
/// (in its root-owned limits, the mapping its shims read at each claim of a turn), with the
/// checks of `vgpu run --turn`; a refused one changes nothing.
#[test]
fn update_changes_a_running_workloads_turn_live() {
    let sim = Sim::new(TWO_GPUS);
    sim.vgpu(&["partition", "create", "svc", "--gpu", "1", "--mem", "2G", "--compute", "50"]).assert().success();
    let held = Held::start(&sim, "batch", &["--gpu", "0", "--mem", "1G", "--compute", "80", "--turn", "5ms"]);
    let inpart = Held::start(&sim, "inpart", &["--partition", "svc"]);
    let id = sim.row("batch")["id"].as_str().unwrap().to_string();
    let usage = usage_of(&sim, &id);
    assert_eq!(usage.turn_max_ns(0), 5_000_000);

    sim.vgpu(&["update", "batch", "--turn", "2ms"]).assert().success().stdout(predicate::str::contains("turn beside a higher priority 5ms → 2ms"));
    assert_eq!(usage.turn_max_ns(0), 2_000_000);
    let out = sim.json(&["update", "batch", "--turn", "3ms", "--json"])["workloads"].clone();
    assert_eq!((out[0]["turn_max_us"].as_u64(), out[0]["previous_turn_max_us"].as_u64()), (Some(3000), Some(2000)));
    assert_eq!(usage.turn_max_ns(0), 3_000_000);
    // Other changes leave it alone, and say nothing of it.
    let out = sim.json(&["update", "batch", "--compute", "70", "--json"])["workloads"].clone();
    assert!(out[0].get("turn_max_us").is_none(), "{out}");
    assert_eq!(usage.turn_max_ns(0), 3_000_000);

    for (args, needle) in [
        (&["update", "batch", "--turn", "500us"][..], "--turn"),
        (&["update", "batch", "--turn", "20ms"], "--turn"),
        (&["update", "batch", "--turn", "soon"], "--turn"),
        (&["update", "inpart", "--turn", "2ms"], "vgpu partition update svc"),
    ] {
        let out = sim.vgpu(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    assert_eq!(usage.turn_max_ns(0), 3_000_000);
    held.stop();
    inpart.stop();
}

#[test]
fn update_refuses_bad_requests_and_changes_nothing() {
    let sim = Sim::new(TWO_GPUS);
    sim.vgpu(&["partition", "create", "svc", "--gpu", "1", "--mem", "2G", "--compute", "50"]).assert().success();
    let mine = Held::start(&sim, "mine", &["--gpu", "0", "--mem", "1G", "--compute", "30"]);
    let inpart = Held::start(&sim, "inpart", &["--partition", "svc"]);
    let id = sim.row("mine")["id"].as_str().unwrap().to_string();
    let record_path = sim.path(&format!("run/workloads/{id}.json"));
    let before = std::fs::read(&record_path).unwrap();
    let usage = usage_of(&sim, &id);

    let cases: &[(&[&str], i32, &str)] = &[
        (&["update", "nosuch", "--compute", "60"], 2, "no workload \"nosuch\""),
        // One bad id among good ones: the good one is not changed either.
        (&["update", "mine", "nosuch", "--compute", "60"], 2, "no workload"),
        (&["update", "mine", "--compute", "0"], 2, "--compute"),
        (&["update", "mine", "--compute", "101"], 2, "--compute"),
        (&["update", "mine", "--compute-policy", "greedy"], 2, "--compute-policy"),
        (&["update", "mine"], 2, "--compute"),
        (&["update", "--compute", "60"], 2, "ID"),
        (&["update", "mine", "inpart", "--compute", "60"], 2, "vgpu partition update svc"),
    ];
    for (args, code, needle) in cases {
        let out = sim.vgpu(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(*code), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    assert_eq!(shares(&usage), [(30, Policy::Strict)]);
    assert_eq!(std::fs::read(&record_path).unwrap(), before, "a refused update changed the record");
    let pid = sim.row("inpart")["id"].as_str().unwrap().to_string();
    assert_eq!(sim.row("inpart")["compute_pct"], 50);
    assert_eq!(record(&sim, &pid)["gpus"][0]["compute_pct"], 50);

    // Not root: one clear line, nothing changed.
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_vgpu"));
    cmd.args(["--simulate", "update", "mine", "--compute", "60"]);
    for (k, v) in sim.env() {
        cmd.env(k, v);
    }
    use std::os::unix::process::CommandExt;
    cmd.uid(nobody.uid.as_raw()).gid(nobody.gid.as_raw());
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("must run as root") && stderr.trim().lines().count() == 1, "{stderr}");
    assert_eq!(shares(&usage), [(30, Policy::Strict)]);
    mine.stop();
    inpart.stop();
}

#[test]
fn partition_update_changes_the_definition_and_the_live_vgpu() {
    let sim = Sim::new(TWO_GPUS);
    sim.vgpu(&["partition", "create", "svc", "--gpu", "1", "--mem", "2G", "--compute", "50", "--compute-policy", "fair"]).assert().success();
    let list = sim.json(&["partition", "list", "--json"])["partitions"].clone();
    assert_eq!((list[0]["compute_pct"].clone(), list[0]["compute_policy"].clone()), (50.into(), "fair".into()));

    // Before any use: only partitions.json changes.
    let out = sim.json(&["partition", "update", "svc", "--compute", "40", "--json"]);
    assert_eq!(out["live"], false);
    assert_eq!((out["compute_pct"].clone(), out["previous_compute_pct"].clone()), (40.into(), 50.into()));
    assert_eq!(out["compute_policy"], "fair");

    // Its first workload creates the vGPU with the new definition, and the GPU's board.
    let held = Held::start(&sim, "server", &["--partition", "svc"]);
    let uuid = list[0]["gpu_uuid"].as_str().unwrap();
    assert!(vgpu_abi::board::Board::open(&sim.path("run/vgpus/p-svc"), uuid).is_ok());
    use std::os::unix::fs::PermissionsExt;
    let slot = sim.path(&format!("run/gpus/{uuid}/p-svc"));
    // A partition with no --user or --group is root's: so is its slot (a group's is 0664).
    assert_eq!(std::fs::metadata(&slot).unwrap().permissions().mode() & 0o7777, 0o644, "a root-only partition's slot");
    let usage = usage_of(&sim, "p-svc");
    assert_eq!(shares(&usage), [(40, Policy::Fair)]);
    let w = sim.row("server");
    assert_eq!((w["compute_pct"].clone(), w["compute_policy"].clone()), (40.into(), "fair".into()));

    // While it runs: live.
    let out = sim.json(&["partition", "update", "svc", "--compute", "70", "--compute-policy", "strict", "--json"]);
    assert_eq!(out["live"], true);
    assert_eq!(out["workloads"][0]["id"], w["id"]);
    assert_eq!(shares(&usage), [(70, Policy::Strict)]);
    let w = sim.row("server");
    assert_eq!((w["compute_pct"].clone(), w["compute_policy"].clone()), (70.into(), "strict".into()));
    let list = sim.json(&["partition", "list", "--json"])["partitions"].clone();
    assert_eq!((list[0]["compute_pct"].clone(), list[0]["compute_policy"].clone()), (70.into(), "strict".into()));

    // Bad requests change nothing.
    sim.vgpu(&["partition", "update", "nope", "--compute", "10"]).assert().code(2).stderr(predicate::str::contains("no partition"));
    sim.vgpu(&["partition", "update", "svc", "--compute", "0"]).assert().code(2);
    sim.vgpu(&["partition", "update", "svc"]).assert().code(2);
    assert_eq!(shares(&usage), [(70, Policy::Strict)]);
    held.stop();

    // The vGPU outlives its workloads: a later update still reaches it, and the next
    // workload starts with it.
    sim.vgpu(&["partition", "update", "svc", "--compute", "20"]).assert().success();
    assert_eq!(shares(&usage_of(&sim, "p-svc")), [(20, Policy::Strict)]);
}

#[test]
fn ps_shows_the_measured_share_and_gpu_time() {
    let sim = Sim::new(TWO_GPUS);
    let held = Held::start(&sim, "busy", &["--gpu", "0", "--mem", "1G", "--compute", "30"]);
    let w = sim.row("busy");
    let id = w["id"].as_str().unwrap().to_string();
    let pid = w["pids"][0].as_u64().unwrap() as u32;
    let usage = usage_of(&sim, &id);

    // Stand in for the shim: a measurement window that used 28 % of the GPU, 3 s of GPU
    // time charged in all, 1.5 s of it by the workload's process. The window is stamped
    // in the future so that it is still fresh whenever ps runs.
    let ledger = usage.ledger(0);
    ledger.charged_ns.store(3_000_000_000, std::sync::atomic::Ordering::SeqCst);
    ledger.last_share_ppm.store(280_000, std::sync::atomic::Ordering::SeqCst);
    ledger.last_window_end_ns.store(vgpu_abi::layout::now_mono_ns() + 60_000_000_000, std::sync::atomic::Ordering::SeqCst);
    let proc = usage.register(ProcessId { pid, start_time: start_time(pid).unwrap() }).unwrap();
    usage.charge_process(&proc, 0, 1_500_000_000);

    let w = sim.row("busy");
    assert_eq!(w["compute_pct"], 30);
    assert_eq!(w["compute_measured_pct"], 28.0);
    assert_eq!(w["gpu_time_ns"], 3_000_000_000u64);
    assert_eq!(w["gpus"][0]["compute_measured_pct"], 28.0);
    assert_eq!(w["gpus"][0]["gpu_time_ns"], 3_000_000_000u64);
    let all = sim.json(&["ps", "-a", "--json"]);
    let procs = all["workloads"][0]["processes"].as_array().unwrap();
    let p = procs.iter().find(|p| p["pid"] == pid).expect("the workload's process");
    assert_eq!(p["gpu_time_ns"], serde_json::json!([1_500_000_000u64]));

    let table = sim.vgpu(&["ps", "-a"]).output().unwrap();
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("MEASURED") && text.contains("30% strict") && text.contains("28%"), "{text}");
    assert!(text.contains("1.500s gpu"), "{text}");
    drop(proc);

    // Idle again (the window went stale): no measured share, shown as "-".
    ledger.last_window_end_ns.store(1, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(sim.row("busy")["compute_measured_pct"], serde_json::Value::Null);
    held.stop();
}

#[test]
fn a_pool_workloads_share_follows_its_blocks_and_only_its_policy_updates() {
    let sim = Sim::new(TWO_GPUS);
    sim.write_vgpu_config("[pool.tflops]\n\"NVIDIA A16-sim\" = 10\n");
    let held = Held::start(&sim, "pooled", &["--tflops", "3", "--compute-policy", "fair", "--priority", "80"]);
    let w = sim.row("pooled");
    let id = w["id"].as_str().unwrap().to_string();
    let usage = usage_of(&sim, &id);
    // 3 of the GPU's 10 blocks: 30 %.
    assert_eq!(shares(&usage), [(30, Policy::Fair)]);
    assert_eq!(usage.devices()[0].priority, 80);
    assert_eq!(w["compute_pct"], 30);
    sim.vgpu(&["update", "pooled", "--compute", "50"]).assert().code(2).stderr(predicate::str::contains("pool blocks"));
    assert_eq!(shares(&usage), [(30, Policy::Fair)]);
    sim.vgpu(&["update", "pooled", "--compute-policy", "strict"]).assert().success();
    assert_eq!(shares(&usage), [(30, Policy::Strict)]);
    held.stop();
}
