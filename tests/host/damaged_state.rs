//! Damaged state files fail safe (issue #10, item 7), end to end as root with the simulated
//! driver: a damaged workload record keeps its reservation until `vgpu doctor --repair`
//! removes it (only once no process is left in its cgroup), orphaned vGPUs are still
//! cleaned up around it, and a damaged `pool.json` blocks only pool operations.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common::{wait_for, Sim};
use serde_json::Value;

const TWO_GPUS: &[(&str, &str)] = &[("NVIDIA A16-sim", "16GiB"), ("NVIDIA A16-sim", "16GiB")];

fn ps(sim: &Sim) -> Vec<Value> {
    sim.json(&["ps", "--json"])["workloads"].as_array().cloned().unwrap_or_default()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Exit 1 and one line on stderr that contains every needle.
fn assert_refused_with(out: &Output, needles: &[&str]) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    for needle in needles {
        assert!(err.contains(needle), "{needle:?} not in: {err}");
    }
}

fn cgroup_dir_exists(id: &str) -> bool {
    ["pids", "memory", "freezer", "cpu", "unified"].iter().any(|h| Path::new(&format!("/sys/fs/cgroup/{h}/vgpu/{id}")).exists())
}

#[test]
fn a_damaged_record_keeps_its_reservation_until_repaired() {
    let sim = Sim::new(TWO_GPUS);
    let mut a = sim.spawn(&["run", "--gpu", "0", "--mem", "12G", "--name", "a", "--", "sleep", "300"]);
    // Running in its record too: its supervisor writes the record once more when it starts it.
    wait_for("a to run", || ps(&sim).iter().any(|w| w["name"] == "a" && w["state"] == "running" && w["pids"].as_array().is_some_and(|p| !p.is_empty())));
    let row = ps(&sim).into_iter().find(|w| w["name"] == "a").unwrap();
    let id = row["id"].as_str().unwrap().to_string();
    let workload_pid = row["pids"][0].as_u64().unwrap() as i32;
    let record: PathBuf = sim.path(&format!("run/workloads/{id}.json"));
    let original: Value = serde_json::from_str(&std::fs::read_to_string(&record).unwrap()).unwrap();
    let record_name = record.display().to_string();

    // Damaged beyond reading: its GPUs are unknown, so no GPU admits more memory.
    std::fs::write(&record, "{ \"format\": 1, \"id\": ").unwrap();
    for gpu in ["0", "1"] {
        let out = sim.vgpu(&["run", "--gpu", gpu, "--mem", "12G", "--", "true"]).output().unwrap();
        assert_refused_with(&out, &[&record_name, "vgpu doctor --repair", "on any GPU"]);
        // A partition reserves memory too.
        let out = sim.vgpu(&["partition", "create", "p", "--gpu", gpu, "--mem", "1G"]).output().unwrap();
        assert_refused_with(&out, &[&record_name, "vgpu doctor --repair"]);
    }
    // Readable JSON of another format: it still says its GPU, and only that GPU is blocked;
    // without --gpu the other one is picked.
    let mut other_format = original.clone();
    other_format["format"] = 99.into();
    std::fs::write(&record, other_format.to_string()).unwrap();
    let out = sim.vgpu(&["run", "--gpu", "0", "--mem", "12G", "--", "true"]).output().unwrap();
    assert_refused_with(&out, &[&record_name, "GPU 0 is blocked"]);
    sim.vgpu(&["run", "--gpu", "1", "--mem", "12G", "--", "true"]).assert().success();
    sim.vgpu(&["run", "--mem", "12G", "--", "true"]).assert().success();

    // Orphaned vGPUs are removed around a damaged record; the one named like it is kept.
    std::fs::write(&record, "garbage").unwrap();
    let orphan = sim.path("run/vgpus/deadbeef");
    std::fs::create_dir_all(orphan.join("procs")).unwrap();
    sim.vgpu(&["ps"]).assert().success();
    assert!(!orphan.exists(), "the orphan vGPU was not removed");
    assert!(sim.path(&format!("run/vgpus/{id}")).is_dir(), "the damaged record's vGPU was removed");

    // Its supervisor dies: nothing can clean it up from the record, and the workload runs on.
    a.kill().unwrap();
    a.wait().unwrap();
    sim.vgpu(&["ps"]).assert().success();
    assert!(record.exists());
    let out = sim.vgpu(&["doctor", "--repair", "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["removed"], serde_json::json!([]), "{report}");
    assert_eq!(report["left"][0]["path"], record_name.as_str(), "{report}");
    let reason = report["left"][0]["reason"].as_str().unwrap();
    assert!(reason.contains(&workload_pid.to_string()) && reason.contains(&format!("vgpu/{id}")), "{reason}");
    assert!(record.exists() && sim.path(&format!("run/vgpus/{id}")).is_dir() && cgroup_dir_exists(&id));
    let out = sim.vgpu(&["run", "--gpu", "0", "--mem", "12G", "--", "true"]).output().unwrap();
    assert_refused_with(&out, &[&record_name]);

    // Once its processes are gone, repair removes the record, its cgroup and its vGPU.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(workload_pid), nix::sys::signal::Signal::SIGKILL).unwrap();
    let mut report = Value::Null;
    wait_for("repair to remove the record", || {
        let out = sim.vgpu(&["doctor", "--repair", "--json"]).output().unwrap();
        report = serde_json::from_slice(&out.stdout).unwrap_or_default();
        out.status.success()
    });
    assert_eq!(report["removed"][0]["path"], record_name.as_str(), "{report}");
    assert_eq!(report["left"], serde_json::json!([]), "{report}");
    assert!(!record.exists());
    assert!(!sim.path(&format!("run/vgpus/{id}")).exists());
    assert!(!cgroup_dir_exists(&id));
    sim.vgpu(&["doctor", "--repair"]).assert().success().stdout(predicates::str::contains("no damaged state files"));
    sim.vgpu(&["run", "--gpu", "0", "--mem", "12G", "--", "true"]).assert().success();
}

/// A host whose pool is one declared 10-TFLOPS NPU (the simulated GPU is worth no block).
fn npu_pool() -> Sim {
    let sim = Sim::new(&[("NVIDIA L4", "24GiB")]);
    sim.write_vgpu_config("[pool.tflops]\n\"NVIDIA L4\" = 0.5\n\n[[pool.device]]\nkind = \"npu\"\nname = \"sim-npu\"\ntflops = 10\n");
    sim
}

#[test]
fn a_damaged_pool_file_blocks_only_pool_operations() {
    let sim = npu_pool();
    let mut holder = sim.spawn(&["run", "--tflops", "2", "--kind", "npu", "--name", "holder", "--", "sleep", "300"]);
    wait_for("holder to run", || ps(&sim).iter().any(|w| w["name"] == "holder" && w["state"] == "running" && w["pids"].as_array().is_some_and(|p| !p.is_empty())));
    let pool_file = sim.path("run/pool.json");
    std::fs::write(&pool_file, "{ damaged").unwrap();
    let pool_name = pool_file.display().to_string();

    // Everything but the pool works.
    sim.vgpu(&["run", "--mem", "1G", "--", "true"]).assert().success();
    sim.vgpu(&["ps"]).assert().success();
    // Pool operations say what is wrong and how to fix it, on one line.
    let out = sim.vgpu(&["run", "--tflops", "1", "--kind", "npu", "--", "true"]).output().unwrap();
    assert_refused_with(&out, &[&pool_name, "vgpu doctor --repair"]);
    let out = sim.vgpu(&["pool"]).output().unwrap();
    assert_refused_with(&out, &[&pool_name, "vgpu doctor --repair"]);

    // Not set aside while a workload holds blocks.
    let out = sim.vgpu(&["doctor", "--repair", "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["left"][0]["path"], pool_name.as_str(), "{report}");
    assert!(report["left"][0]["reason"].as_str().unwrap().contains("holder"), "{report}");
    assert!(pool_file.exists());

    nix::sys::signal::kill(nix::unistd::Pid::from_raw(holder.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    holder.wait().unwrap();
    let out = sim.vgpu(&["doctor", "--repair", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["removed"][0]["path"], pool_name.as_str(), "{report}");
    assert!(!pool_file.exists() && sim.path("run/pool.json.damaged").exists());
    sim.vgpu(&["run", "--tflops", "1", "--kind", "npu", "--", "true"]).assert().success();
}

/// The runtime state is not synced to the disk (issue 28): a crash of the machine can leave
/// a state directory that lives on a disk (here the test's, under /tmp) with files cut
/// short. The store's boot mark tells the first command of the next boot, which repairs
/// them before anything reads them; within one boot nothing is cut short, and a damaged
/// file is what it always was.
#[test]
fn the_first_command_of_a_later_boot_repairs_what_a_crash_cut_short() {
    let sim = Sim::new(TWO_GPUS);
    sim.vgpu(&["partition", "create", "p", "--gpu", "0", "--mem", "4G"]).assert().success();
    sim.vgpu(&["run", "--partition", "p", "--", "true"]).assert().success();
    let this_boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    assert_eq!(std::fs::read_to_string(sim.path("run/boot_id")).unwrap(), this_boot, "marked by its first reconcile");
    // As a crash may leave them: a record, an intent, the pool and a partition's usage
    // file, each empty.
    std::fs::create_dir_all(sim.path("run/intents")).unwrap();
    for cut in ["run/workloads/0badf00d.json", "run/intents/start-1-1.json", "run/pool.json", "run/vgpus/p-p/usage"] {
        std::fs::write(sim.path(cut), "").unwrap();
    }
    // In this boot they are what they are: the record holds every GPU, the partition fails.
    let refused = sim.vgpu(&["run", "--mem", "8G", "--", "true"]).output().unwrap();
    assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
    assert!(stderr(&refused).contains("0badf00d.json"), "{}", stderr(&refused));
    assert!(!sim.vgpu(&["run", "--partition", "p", "--", "true"]).output().unwrap().status.success());
    // The store was last reconciled in another boot: the next command repairs, then runs.
    std::fs::write(sim.path("run/boot_id"), "00000000-0000-0000-0000-000000000000\n").unwrap();
    let out = sim.vgpu(&["run", "--mem", "8G", "--", "true"]).output().unwrap();
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    for removed in ["0badf00d.json", "start-1-1.json", "pool.json"] {
        assert!(err.lines().any(|l| l.contains(removed) && l.contains("cut short by a crash of the machine")), "{removed}: {err}");
    }
    assert!(!sim.path("run/workloads/0badf00d.json").exists() && !sim.path("run/intents/start-1-1.json").exists());
    assert!(sim.path("run/pool.json.damaged").exists() && !sim.path("run/pool.json").exists());
    assert_eq!(std::fs::read_to_string(sim.path("run/boot_id")).unwrap(), this_boot);
    // The partition's vGPU was made again by its next workload.
    sim.vgpu(&["run", "--partition", "p", "--", "true"]).assert().success();
    assert!(ps(&sim).is_empty());
}
