//! The smaller defects of issue #10 (item 9), end to end as root with the simulated driver:
//! a terminating signal ends a suspended workload, an OOM kill is explained, and every bad
//! value — on the command line or in the config, for every command — is one line and exit 2.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::common::{files_below, wait_for, Sim};

const GPU16: &[(&str, &str)] = &[("NVIDIA A16-sim", "16GiB")];

fn ps(sim: &Sim) -> Vec<serde_json::Value> {
    sim.json(&["ps", "--json"])["workloads"].as_array().cloned().unwrap_or_default()
}

/// Wait up to `limit` for `child` to exit; None if it did not.
fn wait_bounded(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

#[test]
fn a_terminating_signal_ends_a_suspended_workload() {
    let sim = Sim::new(GPU16);
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_vgpu"));
    cmd.args(["--simulate", "run", "--mem", "1G", "--name", "frozen", "--", "sleep", "300"]);
    for (k, v) in sim.env() {
        cmd.env(k, v);
    }
    let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    wait_for("the workload to run", || ps(&sim).iter().any(|w| w["state"] == "running" && w["pids"].as_array().is_some_and(|p| !p.is_empty())));
    sim.vgpu(&["suspend", "frozen"]).assert().success();
    assert_eq!(ps(&sim)[0]["state"], "suspended");

    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let Some(status) = wait_bounded(&mut child, Duration::from_secs(20)) else {
        // The old behaviour: the signal waits for a resume. Clean up, then fail.
        let _ = sim.vgpu(&["resume", "frozen"]).output();
        let _ = child.kill();
        let _ = child.wait();
        panic!("SIGTERM to `vgpu run` did not end its suspended workload within 20 s");
    };
    assert_eq!(status.code(), Some(143));
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(stderr.contains("was suspended: resumed so that it acts on signal 15"), "{stderr}");
    assert!(ps(&sim).is_empty(), "state left behind");

    // `vgpu kill` (SIGTERM by default) does the same.
    let mut child = sim.spawn(&["run", "--mem", "1G", "--name", "frozen2", "--", "sleep", "300"]);
    wait_for("the second workload to run", || ps(&sim).iter().any(|w| w["state"] == "running" && w["pids"].as_array().is_some_and(|p| !p.is_empty())));
    sim.vgpu(&["suspend", "frozen2"]).assert().success();
    sim.vgpu(&["kill", "frozen2"]).assert().success().stdout(predicates::str::contains("was suspended: resumed so that it acts on SIGTERM"));
    let Some(status) = wait_bounded(&mut child, Duration::from_secs(20)) else {
        let _ = sim.vgpu(&["resume", "frozen2"]).output();
        let _ = child.kill();
        let _ = child.wait();
        panic!("vgpu kill did not end a suspended workload within 20 s");
    };
    assert_eq!(status.code(), Some(143));
    assert!(ps(&sim).is_empty(), "state left behind");
}

#[test]
fn an_oom_killed_workload_is_explained_in_one_line() {
    let sim = Sim::new(GPU16);
    // `tail` keeps a "line" of /dev/zero in memory until the cgroup's limit stops it.
    let out = sim.vgpu(&["run", "--mem", "1G", "--memory", "32M", "--", "tail", "/dev/zero"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(137), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("OOM")).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains("--memory 32 MiB") && lines[0].contains("killed 1 process"), "{stderr}");
    assert!(ps(&sim).is_empty());
    // A workload that was not OOM-killed gets no such line.
    let out = sim.vgpu(&["run", "--mem", "1G", "--memory", "32M", "--", "sh", "-c", "kill -9 $$"]).output().unwrap();
    assert_eq!(out.status.code(), Some(137));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("OOM"), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Exit 2, one line on stderr naming `needle`, nothing written, the command never ran.
fn assert_one_line_usage_error(sim: &Sim, args: &[&str], needle: &str) {
    let marker = sim.path("ran");
    let before = files_below(sim.dir.path());
    let out = sim.vgpu(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: not one line: {stderr}");
    assert!(stderr.starts_with("vgpu: error: ") && stderr.contains(needle), "{args:?}: {needle:?} not named: {stderr}");
    assert!(!marker.exists(), "{args:?}: the workload ran");
    assert_eq!(files_below(sim.dir.path()), before, "{args:?}: files were written");
}

#[test]
fn every_bad_value_is_one_line_and_exit_2() {
    let sim = Sim::new(GPU16);
    // The store and the simulated driver's directory exist before the snapshots.
    sim.vgpu(&["ps"]).assert().success();
    sim.vgpu(&["devices"]).assert().success();
    let marker = sim.path("ran");
    let touch = marker.to_str().unwrap();
    for (args, needle) in [
        (&["run", "--memory", "1", "--", "touch", touch][..], "--memory 1 is too small"),
        (&["run", "--memory", "4M", "--", "touch", touch][..], "at least 16 MiB"),
        (&["run", "--memory", "-1G", "--", "touch", touch][..], "--memory"),
        (&["run", "--mem", "-1G", "--", "touch", touch][..], "--mem"),
        (&["run", "--gpu", "", "--", "touch", touch][..], "--gpu"),
        (&["run", "--gpu", " ", "--", "touch", touch][..], "--gpu"),
        (&["run", "--compute", "0", "--", "touch", touch][..], "--compute"),
        (&["run", "--compute", "-5", "--", "touch", touch][..], "--compute"),
        (&["run", "--pids", "-1", "--", "touch", touch][..], "--pids"),
        (&["run", "--cpus", "x", "--", "touch", touch][..], "--cpus"),
        (&["run", "--bogus", "--", "touch", touch][..], "--bogus"),
        (&["update", "x", "--compute", "-1"][..], "--compute"),
        (&["carbon", "plan", "--intensity", "1e308", "--budget", "100"][..], "--intensity"),
        (&["carbon", "plan", "--intensity", "-1", "--budget", "100"][..], "--intensity"),
        (&["carbon", "intensity", "--intensity", "inf"][..], "--intensity"),
    ] {
        assert_one_line_usage_error(&sim, args, needle);
    }
}

#[test]
fn every_command_validates_the_whole_config() {
    let sim = Sim::new(GPU16);
    sim.vgpu(&["ps"]).assert().success();
    for (config, needle) in [
        ("[carbon]\ngamma = nan\n", "[carbon] gamma"),
        ("[carbon]\nfallback = 1e308\n", "[carbon] fallback"),
        ("[carbon]\nsource = \"static\"\n", "[carbon] value"),
        ("[pool]\nblock_tflops = 1e-300\n", "[pool] block_tflops"),
    ] {
        sim.write_vgpu_config(config);
        let touch = sim.path("ran");
        for args in [
            &["ps"][..],
            &["run", "--mem", "1G", "--", "touch", touch.to_str().unwrap()][..],
            &["carbon", "plan", "--intensity", "100", "--budget", "100"][..],
            &["pool"][..],
            &["devices"][..],
        ] {
            let out = sim.vgpu(args).output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{config:?} {args:?}: {stderr}");
            assert_eq!(stderr.trim_end().lines().count(), 1, "{config:?} {args:?}: {stderr}");
            assert!(stderr.contains(needle) && stderr.contains("vgpu.toml"), "{config:?} {args:?}: {stderr}");
            assert!(!touch.exists());
        }
    }
}

#[test]
fn a_command_that_cannot_run_exits_127_or_126() {
    let sim = Sim::new(&[("NVIDIA H100 80GB HBM3", "80GiB")]);
    let out = sim.vgpu(&["run", "--mem", "1G", "--", "/nonexistent/program"]).output().unwrap();
    assert_eq!(out.status.code(), Some(127), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stderr).trim(), "vgpu: error: /nonexistent/program: command not found");
    let script = sim.path("not-executable.sh");
    std::fs::write(&script, "#!/bin/sh\ntrue\n").unwrap();
    let out = sim.vgpu(&["run", "--mem", "1G", "--", script.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(126), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not executable"));
    assert!(ps(&sim).is_empty(), "nothing is left of either");
}

/// A listing whose reader is gone (`vgpu ps --json | head -0`) ends by SIGPIPE, quietly, as
/// coreutils do: no panic, no backtrace.
#[test]
fn a_listing_into_a_closed_pipe_ends_quietly() {
    use std::os::fd::OwnedFd;
    use std::os::unix::process::ExitStatusExt;
    let sim = Sim::new(&[("NVIDIA H100 80GB HBM3", "80GiB")]);
    for args in [&["devices", "--json"][..], &["ps", "--json"], &["pool", "--json"], &["doctor", "--json"], &["partition", "list", "--json"]] {
        // The read end is closed before vgpu starts: its first write gets EPIPE.
        let (read, write): (OwnedFd, OwnedFd) = nix::unistd::pipe().unwrap();
        drop(read);
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_vgpu"));
        cmd.arg("--simulate").args(args).envs(sim.env()).stdout(std::process::Stdio::from(write)).stderr(std::process::Stdio::piped());
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{args:?}: {:?} {err}", out.status);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// `vgpu run` whose stderr is a closed pipe (a supervisor that went away) still relays a
/// SIGTERM to its workload and ends with it: no message it cannot write (`-vv` logs the
/// relay) may take the relaying thread down.
/// A signal sent to `vgpu run` right after its workload started (here: while it is paused
/// at `run:spawned`, before it records the workload's pid) is relayed, not fatal: the
/// relay catches it from before the spawn. Before, it killed `vgpu run` by its default
/// action and left the workload without its supervisor.
#[test]
fn a_signal_just_after_the_spawn_is_relayed() {
    let sim = Sim::new(&[("NVIDIA H100 80GB HBM3", "80GiB")]);
    let mut run = std::process::Command::new(env!("CARGO_BIN_EXE_vgpu"))
        .args(["--simulate", "run", "--mem", "1G", "--name", "early", "--", "sleep", "600"])
        .envs(sim.env())
        .env("VGPU_TEST_PAUSE_AT", "run:spawned")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(sim.path("early.err")).unwrap())
        .spawn()
        .unwrap();
    let pid = run.id();
    let stopped = || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('T')));
    wait_for("vgpu run to pause at run:spawned", stopped);
    // SAFETY: kill(2) on our own child: the SIGTERM waits while it is stopped, and arrives
    // once it is continued, at that point.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGCONT) }, 0);
    // Not its output's end: a workload left without its supervisor would hold that open.
    let status = run.wait().unwrap();
    let stderr = std::fs::read_to_string(sim.path("early.err")).unwrap_or_default();
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status:?}: {stderr}");
    assert!(sim.ps().iter().all(|w| w["name"] != "early"), "torn down");
}

#[test]
fn run_relays_a_signal_even_when_its_stderr_is_a_closed_pipe() {
    use std::os::fd::OwnedFd;
    let sim = Sim::new(&[("NVIDIA H100 80GB HBM3", "80GiB")]);
    let (read, write): (OwnedFd, OwnedFd) = nix::unistd::pipe().unwrap();
    drop(read);
    let mut run = std::process::Command::new(env!("CARGO_BIN_EXE_vgpu"))
        .args(["--simulate", "-vv", "run", "--mem", "1G", "--name", "orphan", "--", "sleep", "600"])
        .envs(sim.env())
        .stdout(Stdio::null())
        .stderr(Stdio::from(write))
        .spawn()
        .unwrap();
    wait_for("the workload to run", || sim.ps().iter().any(|w| w["name"] == "orphan" && w["pids"].as_array().is_some_and(|p| !p.is_empty())));
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(run.id() as i32, libc::SIGTERM) }, 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = run.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = run.kill();
            panic!("vgpu run did not end 30 s after SIGTERM: the relay is gone");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status:?}");
    assert!(sim.ps().iter().all(|w| w["name"] != "orphan"), "torn down");
}
