//! The scripting contract besides the JSON fields (`tests/cli/json_schema.rs`): `-q` and `-v`
//! govern every message, several IDs for `kill`/`suspend`/`resume` (all found before any is
//! touched), and every documented exit status (`vgpu_store::error::EXIT_STATUS_DOC`) happens.

use std::io::Read as _;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Stdio};

use crate::common::{wait_for, Sim};
use predicates::prelude::*;

/// One GPU and a pool with a 10-block NPU.
fn pool_sim() -> Sim {
    let sim = Sim::new(&[("NVIDIA L4", "24GiB")]);
    sim.write_vgpu_config(
        "[pool.tflops]\n\"NVIDIA L4\" = 0.5\n\n[[pool.device]]\nkind = \"npu\"\nname = \"sim-npu\"\ntflops = 10\nenv = \"SIM_NPU_VISIBLE\"\n",
    );
    sim
}

/// `vgpu --simulate ARGS` with stderr piped and no `VGPU_LOG` (only the flags decide).
fn vgpu_piped(sim: &Sim, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_vgpu"))
        .arg("--simulate")
        .args(args)
        .envs(sim.env())
        .env_remove("VGPU_LOG")
        .env_remove("VGPU_SIMULATE")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn vgpu")
}

fn state_of(sim: &Sim, name: &str) -> Option<String> {
    sim.ps().iter().find(|w| w["name"] == name).and_then(|w| w["state"].as_str()).map(str::to_string)
}

/// `run --wait` waits for pool blocks: with -q it says nothing on stderr; without, it says
/// that it waits.
#[test]
fn quiet_silences_run_waits_messages() {
    let sim = pool_sim();
    for quiet in [true, false] {
        let mut holder = sim.spawn_running("holder", &["--tflops", "10", "--kind", "npu"], "sleep 120");
        let mut args = vec!["run", "--tflops", "4", "--kind", "npu", "--wait", "--name", "waiter", "--", "true"];
        if quiet {
            args.insert(0, "-q");
        }
        let mut waiter = vgpu_piped(&sim, &args);
        wait_for("the waiter to queue", || state_of(&sim, "waiter").as_deref() == Some("waiting"));
        sim.vgpu(&["kill", "--signal", "KILL", "holder"]).assert().success();
        holder.wait().unwrap();
        let status = waiter.wait().unwrap();
        let mut err = String::new();
        waiter.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        assert!(status.success(), "{err}");
        if quiet {
            assert_eq!(err, "", "-q: nothing on stderr");
        } else {
            assert!(err.contains("vgpu: waiting for 4 TFLOPS from the pool"), "{err}");
        }
    }
}

/// `run` logs what it does with -v (info) and -vv (debug), nothing without; on the command
/// line the flags win over `VGPU_LOG`.
#[test]
fn verbose_makes_run_log() {
    let sim = Sim::new(&[("NVIDIA L4", "24GiB")]);
    let stderr_of = |args: &[&str], env_log: Option<&str>| {
        let mut cmd = sim.vgpu(args);
        match env_log {
            Some(v) => cmd.env("VGPU_LOG", v),
            None => cmd.env_remove("VGPU_LOG"),
        };
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let run = ["run", "--mem", "1G", "--name", "job", "--", "true"];
    assert_eq!(stderr_of(&run, None), "", "no -v: nothing");
    let v = stderr_of(&[&["-v"][..], &run].concat(), None);
    assert!(v.contains("vgpu: admitted job") && v.contains("vgpu: started") && v.contains("ended with exit status 0"), "{v}");
    assert!(!v.contains("debug:"), "-v is info only: {v}");
    let vv = stderr_of(&[&["-vv"][..], &run].concat(), None);
    assert!(vv.contains("vgpu: admitted job") && vv.contains("vgpu: debug: "), "{vv}");
    let v_over_env = stderr_of(&[&["-v"][..], &run].concat(), Some("vgpu=warn"));
    assert!(v_over_env.contains("vgpu: admitted job"), "-v wins over VGPU_LOG: {v_over_env}");
    assert_eq!(stderr_of(&[&["-q"][..], &run].concat(), Some("vgpu=debug")), "", "-q wins over VGPU_LOG");
}

/// `suspend`, `resume`, `kill` take several IDs; an unknown one changes nothing. (Names
/// that cannot be a prefix of a hex id: a name and an id prefix would both match.)
#[test]
fn several_ids_are_all_found_before_any_is_touched() {
    let sim = Sim::new(&[("NVIDIA L4", "24GiB")]);
    let mut x = sim.spawn_running("job-x", &["--mem", "1G"], "sleep 120");
    let mut y = sim.spawn_running("job-y", &["--mem", "1G"], "sleep 120");

    sim.vgpu(&["suspend", "job-x", "nosuch", "job-y"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("no workload \"nosuch\"").and(predicate::str::contains("nothing was changed")));
    assert_eq!((state_of(&sim, "job-x").as_deref(), state_of(&sim, "job-y").as_deref()), (Some("running"), Some("running")));
    sim.vgpu(&["kill", "--signal", "KILL", "job-x", "nosuch"]).assert().code(2);
    assert_eq!(state_of(&sim, "job-x").as_deref(), Some("running"), "an unknown ID: nobody signalled");

    let out = sim.vgpu(&["suspend", "job-x", "job-y"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().filter(|l| l.starts_with("suspended ")).count(), 2, "a line each: {text}");
    assert_eq!((state_of(&sim, "job-x").as_deref(), state_of(&sim, "job-y").as_deref()), (Some("suspended"), Some("suspended")));

    let resumed = sim.json(&["resume", "--json", "job-x", "job-y", "job-x"]);
    let results: Vec<(&str, &str)> =
        resumed["workloads"].as_array().unwrap().iter().map(|w| (w["name"].as_str().unwrap(), w["result"].as_str().unwrap())).collect();
    assert_eq!(results, [("job-x", "resumed"), ("job-y", "resumed")], "each once, in order: {resumed}");
    assert_eq!((state_of(&sim, "job-x").as_deref(), state_of(&sim, "job-y").as_deref()), (Some("running"), Some("running")));

    let killed = sim.json(&["kill", "--json", "--signal", "KILL", "job-x", "job-y"]);
    assert!(killed["workloads"].as_array().unwrap().iter().all(|w| w["result"] == "signalled" && w["process_count"].as_u64() >= Some(1)), "{killed}");
    assert!(!x.wait().unwrap().success() && !y.wait().unwrap().success());
}

/// Every status `vgpu_store::error::EXIT_STATUS_DOC` documents happens where it says.
#[test]
fn every_documented_exit_status_happens() {
    let sim = Sim::new(&[("NVIDIA L4", "24GiB")]);
    let not_executable = sim.path("not-executable");
    std::fs::write(&not_executable, "#!/bin/sh\n").unwrap();
    let code = |args: &[&str]| sim.vgpu(args).output().unwrap().status.code();
    for (status, meaning, _) in vgpu_store::error::EXIT_STATUS_DOC {
        match *status {
            "0" => assert_eq!(code(&["devices"]), Some(0)),
            "1" => assert_eq!(code(&["run", "--mem", "100G", "--", "true"]), Some(1), "no room: {meaning}"),
            "2" => assert_eq!(code(&["kill", "nosuch"]), Some(2)),
            "126" => assert_eq!(code(&["run", "--mem", "1G", "--", not_executable.to_str().unwrap()]), Some(126)),
            "127" => assert_eq!(code(&["run", "--mem", "1G", "--", "/nonexistent/program"]), Some(127)),
            "N" => assert_eq!(code(&["run", "--mem", "1G", "--", "sh", "-c", "exit 42"]), Some(42)),
            "128+N" => assert_eq!(code(&["run", "--mem", "1G", "--", "sh", "-c", "kill -TERM $$"]), Some(128 + 15)),
            "141" => {
                // The reader is gone before vgpu writes: SIGPIPE, which a shell reports as 141.
                let (read, write) = nix::unistd::pipe().unwrap();
                drop(read);
                let out = Command::new(env!("CARGO_BIN_EXE_vgpu"))
                    .args(["--simulate", "devices", "--json"])
                    .envs(sim.env())
                    .stdout(Stdio::from(write))
                    .stderr(Stdio::piped())
                    .output()
                    .unwrap();
                assert_eq!(out.status.signal().map(|s| 128 + s), Some(141), "{:?}", out.status);
                assert!(out.stderr.is_empty(), "quietly: {}", String::from_utf8_lossy(&out.stderr));
            }
            other => {
                panic!("exit status {other} is documented but this test does not make it happen")
            }
        }
    }
}
