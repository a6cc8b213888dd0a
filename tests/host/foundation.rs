//! `vgpu devices`, `vgpu doctor`, config handling and exit codes, through the real binary
//! and the simulated driver.

use crate::common::{files_below, Sim};
use predicates::prelude::*;

const TWO_GPUS: &[(&str, &str)] = &[("NVIDIA A100-SXM4-40GB", "40GiB"), ("NVIDIA L4", "24GiB")];

#[test]
fn devices_json_lists_the_configured_gpus() {
    let sim = Sim::new(TWO_GPUS);
    let gpus = sim.json(&["devices", "--json"])["gpus"].clone();
    let gpus = gpus.as_array().expect("a JSON array");
    assert_eq!(gpus.len(), 2);
    assert_eq!(gpus[0]["name"], "NVIDIA A100-SXM4-40GB");
    assert_eq!(gpus[0]["memory_total_bytes"], 40u64 << 30);
    assert_eq!(gpus[1]["name"], "NVIDIA L4");
    assert_eq!(gpus[1]["memory_total_bytes"], 24u64 << 30);
    assert_eq!(gpus[0]["index"], 0);
    assert!(gpus[0]["uuid"].as_str().unwrap().starts_with("GPU-"));
    assert_ne!(gpus[0]["uuid"], gpus[1]["uuid"]);
}

#[test]
fn devices_table_is_readable() {
    let sim = Sim::new(TWO_GPUS);
    sim.vgpu(&["devices"]).assert().success().stdout(predicate::str::contains("NVIDIA A100-SXM4-40GB").and(predicate::str::contains("0 B / 40 GiB")));
}

#[test]
fn without_a_driver_devices_says_so_and_succeeds() {
    let sim = Sim::new(TWO_GPUS);
    sim.vgpu_real(&["devices"]).env("LD_LIBRARY_PATH", sim.path("empty")).assert().success().stdout(predicate::str::contains("No NVIDIA driver found"));
    sim.vgpu_real(&["devices", "--json"]).assert().success().stdout("{\n  \"schema\": 1,\n  \"gpus\": []\n}\n");
}

#[test]
fn doctor_reports_this_hosts_cgroup_layout() {
    let sim = Sim::new(TWO_GPUS);
    let report = sim.json(&["doctor", "--json"]);
    let checks = report["checks"].as_array().unwrap();
    let cgroups = checks.iter().find(|c| c["name"] == "cgroups").expect("a cgroups check");
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let has_v1 = mountinfo.lines().any(|l| l.contains(" - cgroup "));
    let has_v2 = mountinfo.lines().any(|l| l.contains(" - cgroup2 "));
    let expected = match (has_v1, has_v2) {
        (true, true) => "hybrid",
        (true, false) => "legacy",
        (false, true) => "unified",
        (false, false) => unreachable!("no cgroups mounted"),
    };
    assert!(cgroups["detail"].as_str().unwrap().contains(expected), "{cgroups}");
    let gpus = checks.iter().find(|c| c["name"] == "GPUs").unwrap();
    assert_eq!(gpus["detail"], "2 GPUs");
    assert_eq!(checks.iter().find(|c| c["name"] == "NVML").unwrap()["status"], "ok");
    assert_eq!(checks.iter().find(|c| c["name"] == "CUDA driver").unwrap()["status"], "ok");
    assert!(checks.iter().any(|c| c["name"] == "GPU 0 persistence"));
}

#[test]
fn doctor_fails_without_a_driver() {
    let sim = Sim::new(TWO_GPUS);
    sim.vgpu_real(&["doctor"])
        .env("LD_LIBRARY_PATH", sim.path("empty"))
        .assert()
        .code(1)
        .stdout(predicate::str::contains("✗ NVML"));
}

#[test]
fn unknown_config_key_is_named_and_nothing_is_written() {
    let sim = Sim::new(TWO_GPUS);
    sim.write_vgpu_config("simulate = true\nstate_dirr = \"/tmp/x\"\n");
    let before = files_below(sim.dir.path());
    sim.vgpu(&["devices"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("state_dirr").and(predicate::str::contains("vgpu.toml")))
        .stderr(predicate::function(|s: &str| s.lines().count() == 1));
    assert_eq!(files_below(sim.dir.path()), before);
}

#[test]
fn bad_value_in_config_is_a_usage_error() {
    let sim = Sim::new(TWO_GPUS);
    sim.write_vgpu_config("simulate = \"yes please\"\n");
    sim.vgpu(&["devices"]).assert().code(2).stderr(predicate::str::contains("simulate"));
}

#[test]
fn explicit_missing_config_is_an_error() {
    let sim = Sim::new(TWO_GPUS);
    // A file named on the command line that cannot be read is the caller's mistake: exit 2.
    sim.vgpu(&["--config", "/nonexistent/vgpu.toml", "devices"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("cannot read config /nonexistent/vgpu.toml: No such file"));
}

#[test]
fn bad_simulated_driver_config_is_reported() {
    let sim = Sim::with_config("[[device]]\nname = \"X\"\nmemory = \"lots\"\n");
    let out = sim.vgpu(&["devices"]).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("memory") || stderr.contains("lots"), "{stderr}");
}

#[test]
fn usage_errors_exit_2() {
    let sim = Sim::new(TWO_GPUS);
    sim.vgpu(&["devices", "--no-such-flag"]).assert().code(2);
    sim.vgpu(&["completions", "tcsh"]).assert().code(2);
}

#[test]
fn simulate_env_var_is_the_flag() {
    let sim = Sim::new(TWO_GPUS);
    let mut cmd = sim.vgpu_real(&["devices", "--json"]);
    cmd.env("VGPU_SIMULATE", "1");
    let out = cmd.output().unwrap();
    assert!(out.status.success());
    let gpus: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(gpus["gpus"].as_array().unwrap().len(), 2);
}
