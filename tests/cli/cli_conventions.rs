//! Command-line conventions of `vgpu run` (issue 14): `--gpus all`, `--gpu 0,1` and repeated
//! `--gpu`, each validated with an error that names the culprit; and refusals that give the
//! real reason (a host with too few GPUs, GPUs held by named workloads).

use crate::common::{files_below, Sim};
use predicates::prelude::*;

const THREE: &[(&str, &str)] = &[("NVIDIA A100-SXM4-40GB", "40GiB"), ("NVIDIA A100-SXM4-40GB", "40GiB"), ("NVIDIA A100-SXM4-40GB", "40GiB")];

/// The UUIDs the simulated driver gives GPUs 0, 1, 2, from `vgpu devices`.
fn uuids(sim: &Sim) -> Vec<String> {
    let devices = sim.json(&["devices", "--json"]);
    let list = devices["gpus"].as_array().cloned().expect("a GPU list");
    list.iter().map(|d| d["uuid"].as_str().expect("uuid").to_string()).collect()
}

/// The GPUs (UUIDs, in order) a workload started with `run_args` sees in CUDA_VISIBLE_DEVICES.
fn visible(sim: &Sim, run_args: &[&str]) -> Vec<String> {
    let mut args = vec!["run"];
    args.extend_from_slice(run_args);
    args.extend_from_slice(&["--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES"]);
    let out = sim.vgpu(&args).output().unwrap();
    assert!(out.status.success(), "vgpu {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().split(',').filter(|s| !s.is_empty()).map(str::to_string).collect()
}

#[test]
fn gpus_all_and_comma_lists_select_those_gpus() {
    let sim = Sim::new(THREE);
    let u = uuids(&sim);
    assert_eq!(u.len(), 3);
    assert_eq!(visible(&sim, &["--gpus", "all"]), u, "--gpus all: every GPU");
    assert_eq!(visible(&sim, &["--gpus", "ALL"]), u);
    assert_eq!(visible(&sim, &["--gpu", "0,2"]), vec![u[0].clone(), u[2].clone()]);
    assert_eq!(visible(&sim, &["--gpu", "2", "--gpu", "1"]), vec![u[2].clone(), u[1].clone()], "repeated --gpu");
    assert_eq!(visible(&sim, &["--gpu", &format!("1,{}", u[2])]), vec![u[1].clone(), u[2].clone()], "index and UUID mixed");
    // Slices of each GPU, as with one --gpu.
    assert_eq!(visible(&sim, &["--gpus", "all", "--mem", "1G"]).len(), 3);
}

#[test]
fn bad_gpu_lists_are_refused_naming_the_culprit_and_leave_nothing_behind() {
    let sim = Sim::new(THREE);
    let u = uuids(&sim);
    // The store's directories and lock exist from here on, as after any run.
    visible(&sim, &["--gpu", "0"]);
    let before = files_below(sim.dir.path());
    let alias = format!("1,{}", u[1]);
    let cases: &[(&[&str], &str)] = &[
        (&["--gpu", "0,7"], "--gpu 7: no GPU with index 7 (this host has 3 GPU(s)"),
        (&["--gpu", "0,GPU-nope"], "--gpu GPU-nope: no GPU with UUID"),
        (&["--gpu", "0,0"], "GPU 0 is given twice"),
        (&["--gpu", "1", "--gpu", "1"], "GPU 1 is given twice"),
        (&["--gpu", &alias], "is already selected"),
        (&["--gpu", "0,,1"], "an empty entry"),
        (&["--gpu", "all"], "--gpus all"),
        (&["--gpus", "none"], "expected `all`"),
        (&["--gpus", "all", "--gpu", "0"], "cannot be used with"),
        (&["--gpus", "4"], "--gpus 4: this host has 3 GPU(s)"),
        (&["--gpus", "4-5"], "--gpus 4-5: this host has 3 GPU(s)"),
    ];
    for (run_args, needle) in cases {
        let mut args = vec!["run"];
        args.extend_from_slice(run_args);
        args.extend_from_slice(&["--", "true"]);
        sim.vgpu(&args).assert().code(2).stderr(predicate::str::contains(*needle));
    }
    assert_eq!(files_below(sim.dir.path()), before, "a refused run left files behind");
}

#[test]
fn too_few_free_gpus_names_the_workloads_that_hold_them() {
    let sim = Sim::new(&THREE[..2]);
    let mut holder = sim.spawn_running("holder", &["--gpu", "1"], "exec sleep 600");
    // Two GPUs, one held: the refusal says so and names the holder, not "only 1 GPU(s)".
    sim.vgpu(&["run", "--gpus", "2", "--", "true"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("--gpus 2: this host has 2 GPU(s) and 1 of them are held by other workloads: holder on GPU 1"));
    // On a one-GPU host the reason is the host.
    let one = Sim::new(&THREE[..1]);
    one.vgpu(&["run", "--gpus", "2", "--", "true"]).assert().code(2).stderr(predicate::str::contains("this host has 1 GPU(s)"));
    sim.vgpu(&["kill", "holder", "--signal", "KILL"]).assert().success();
    holder.wait().unwrap();
}
