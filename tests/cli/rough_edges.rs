//! What got in a newcomer's way on a first try (issue 29's rough edges), each as they typed
//! it: bare numbers for `--mem`, `--compute 30%`, a stray word before `--`, commands that
//! need root refused up front the same way, `doctor`'s advice for the library directory,
//! and help texts that say what a command changes.

use std::path::PathBuf;

use crate::common::{files_below, Sim};
use predicates::prelude::*;

const ONE: &[(&str, &str)] = &[("NVIDIA A100-SXM4-40GB", "40GiB")];

/// Every file below the simulation's state and library directories with its bytes (None
/// for a directory): "nothing changed" is this, equal before and after.
fn snapshot(sim: &Sim) -> Vec<(PathBuf, Option<Vec<u8>>)> {
    ["run", "lib"]
        .iter()
        .flat_map(|d| files_below(&sim.path(d)))
        .map(|p| {
            let bytes = if p.is_file() { std::fs::read(&p).ok() } else { None };
            (p, bytes)
        })
        .collect()
}

/// `vgpu --simulate ARGS…` as user nobody (uid 65534), in this simulation.
fn as_nobody(sim: &Sim, args: &[&str]) -> std::process::Output {
    let mut cmd = std::process::Command::new("setpriv");
    cmd.args(["--reuid", "65534", "--regid", "65534", "--clear-groups", env!("CARGO_BIN_EXE_vgpu"), "--simulate"]);
    cmd.args(args).envs(sim.env()).env("VGPU_LOG", "vgpu=warn").current_dir("/");
    cmd.output().expect("run vgpu as nobody (setpriv)")
}

#[test]
fn a_bare_number_for_mem_is_refused_with_the_sizes_it_may_mean() {
    let sim = Sim::new(ONE);
    let before = files_below(sim.dir.path());
    let cases: &[(&[&str], &str)] = &[
        (&["run", "--mem", "4096", "--", "true"], "--mem: \"4096\" has no unit: did you mean 4096M or 4G?"),
        (&["run", "--mem", "4", "--", "true"], "--mem: \"4\" has no unit: did you mean 4G or 4M?"),
        // A floor, as --memory has: a vGPU of a few KiB is a typo, never a slice.
        (&["run", "--mem", "4K", "--", "true"], "below the smallest vGPU, 16 MiB"),
        (&["partition", "create", "p", "--gpu", "0", "--mem", "2048"], "did you mean 2048M or 2G?"),
        (&["update", "x", "--mem", "512"], "did you mean 512G or 512M?"),
    ];
    for (args, needle) in cases {
        let out = sim.vgpu(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle) && stderr.trim().lines().count() == 1, "{args:?}: {stderr}");
    }
    assert_eq!(files_below(sim.dir.path()), before, "a refused command left files behind");
    // With a unit, and at the floor, it runs.
    sim.vgpu(&["run", "--mem", "16M", "--", "true"]).assert().success();
}

#[test]
fn compute_takes_a_percent_sign_as_mem_does() {
    let sim = Sim::new(ONE);
    sim.vgpu(&["run", "--compute", "30%", "--", "sh", "-c", "echo ran"]).assert().success().stdout("ran\n");
    sim.vgpu(&["partition", "create", "p", "--gpu", "0", "--mem", "1G", "--compute", "30%"]).assert().success();
    let list = sim.json(&["partition", "list", "--json"]);
    assert_eq!(list["partitions"][0]["compute_pct"], 30, "{list}");
    sim.vgpu(&["partition", "update", "p", "--compute", "45 %"]).assert().success();
    assert_eq!(sim.json(&["partition", "list", "--json"])["partitions"][0]["compute_pct"], 45);
    for bad in ["0%", "101%", "30%%", "3x", "%"] {
        sim.vgpu(&["run", "--compute", bad, "--", "true"])
            .assert()
            .code(2)
            .stderr(predicate::str::contains(format!("invalid value '{bad}' for '--compute <PCT>'")));
    }
}

#[test]
fn a_stray_word_before_the_double_dash_is_refused_not_run() {
    let sim = Sim::new(ONE);
    let marker = sim.path("ran");
    let marker_arg = marker.display().to_string();
    // `--mem 4 GiB`: "GiB" used to become the command (exit 127), the intended one its argument.
    sim.vgpu(&["run", "--mem", "4", "GiB", "--", "touch", &marker_arg])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("vgpu: error: `GiB` before `--` is no option's value"));
    sim.vgpu(&["run", "--name", "a", "b", "c", "--", "touch", &marker_arg]).assert().code(2).stderr(predicate::str::contains("`b c` before `--`"));
    assert!(!marker.exists(), "the command ran");
    // A `--` inside the command, after vgpu's own, is the command's.
    sim.vgpu(&["run", "--", "sh", "-c", "echo \"$@\"", "x", "--", "y"]).assert().success().stdout("-- y\n");
    sim.vgpu(&["run", "--mem", "1G", "--", "touch", &marker_arg]).assert().success();
    assert!(marker.exists());
}

#[test]
fn every_command_that_needs_root_says_so_up_front_and_touches_nothing() {
    let sim = Sim::new(ONE);
    let mut holder = sim.spawn_running("w", &["--mem", "1G"], "exec sleep 600");
    sim.vgpu(&["partition", "create", "p", "--gpu", "0", "--mem", "1G"]).assert().success();
    let before = snapshot(&sim);
    let commands: &[(&str, &[&str])] = &[
        ("run", &["run", "--mem", "1G", "--", "true"]),
        ("kill", &["kill", "w"]),
        ("suspend", &["suspend", "w"]),
        ("resume", &["resume", "w"]),
        ("update", &["update", "w", "--compute", "50"]),
        ("partition create", &["partition", "create", "q", "--gpu", "0", "--mem", "1G"]),
        ("partition update", &["partition", "update", "p", "--compute", "50"]),
        ("partition remove", &["partition", "remove", "p"]),
        ("pool compact", &["pool", "compact"]),
        ("carbon apply", &["carbon", "apply", "--intensity", "100", "--budget", "10"]),
        ("carbon reset", &["carbon", "reset"]),
        ("carbon profile", &["carbon", "profile"]),
        ("service create", &["service", "create", "s", "--replicas", "1", "--", "true"]),
        ("service scale", &["service", "scale", "s", "2"]),
        ("service remove", &["service", "remove", "s"]),
        ("doctor --repair", &["doctor", "--repair"]),
        ("watch", &["watch"]),
    ];
    for (what, args) in commands {
        let out = as_nobody(&sim, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: one line, up front: {stderr}");
        assert!(stderr.starts_with(&format!("vgpu: error: vgpu {what} must run as root")), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}: {}", String::from_utf8_lossy(&out.stdout));
    }
    assert_eq!(snapshot(&sim), before, "a refused command changed the state");
    assert_eq!(sim.row("w")["state"], "running");
    // What every user may do still works for them.
    assert!(as_nobody(&sim, &["ps", "--json"]).status.success());
    assert!(as_nobody(&sim, &["partition", "list"]).status.success());
    sim.vgpu(&["kill", "--signal", "KILL", "w"]).assert().success();
    holder.wait().unwrap();
}

#[test]
fn doctor_names_the_option_that_picks_each_directory() {
    let sim = Sim::new(ONE);
    // nobody can reach the directories (they exist, root's, 0755) but not write them.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(sim.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = as_nobody(&sim, &["doctor"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let line = |name: &str| text.lines().find(|l| l.contains(name)).unwrap_or_else(|| panic!("no {name} line in\n{text}")).to_string();
    let (state, lib) = (line("state directory:"), line("library directory:"));
    assert!(state.contains("is not writable") && state.ends_with("pick --state-dir"), "{state}");
    assert!(lib.contains("is not writable") && lib.ends_with("pick --lib-dir"), "{lib}");
}

#[test]
fn help_says_everything_update_changes() {
    for args in [&["--help"][..], &["update", "--help"]] {
        let out = assert_cmd::Command::cargo_bin("vgpu").unwrap().args(args).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let about = if args.len() == 1 { text.lines().find(|l| l.trim_start().starts_with("update")).unwrap().to_string() } else { text.lines().next().unwrap().to_string() };
        for what in ["memory", "compute", "TFLOPS", "priority"] {
            assert!(about.contains(what), "{args:?}: {about:?} lacks {what}");
        }
    }
    // `--compute`'s help says it takes a percent sign.
    let out = assert_cmd::Command::cargo_bin("vgpu").unwrap().args(["run", "--help"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("30 or 30%"));
}
