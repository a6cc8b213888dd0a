//! Services run by `vgpu watch` (issue 15), on real cgroups with the simulated driver: the
//! replicas are ordinary workloads (`vgpu ps` shows them under their service), scaled by
//! their CPU or memory load one step per decision, restarted when killed, held short when
//! the GPU has no room (and `service show` says why), stopped when the watch stops, and
//! taken over by a watch that starts while they run. Needs root.
//!
//! Each test synchronises on the watch's log lines (its decisions, starts, exits) and on
//! `vgpu ps`; the rounds are 200 ms and the services' windows and cooldowns a second or two.

use std::path::PathBuf;

use crate::common::{wait_for, watch, workload, Sim};
use crate::common::watch::Watch;

/// Short rounds; no metrics endpoint.
const FAST: &str = "[watch]\ninterval = \"200ms\"\nlisten = \"\"\n";

/// `vgpu service create ARGS…`.
fn create(sim: &Sim, args: &[&str]) {
    let mut all = vec!["service", "create"];
    all.extend_from_slice(args);
    let out = sim.vgpu(&all).output().expect("service create");
    assert!(out.status.success(), "service create {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// `vgpu service show NAME --json`.
fn show(sim: &Sim, name: &str) -> serde_json::Value {
    sim.json(&["service", "show", name, "--json"])
}

/// `vgpu ps --json` rows of the replicas of `service`.
fn replicas(sim: &Sim, service: &str) -> Vec<serde_json::Value> {
    sim.ps().into_iter().filter(|w| w["service"]["name"] == service).collect()
}

/// Replicas of `service` running with their process.
fn running(sim: &Sim, service: &str) -> usize {
    replicas(sim, service).iter().filter(|w| w["state"] == "running" && w["pids"].as_array().is_some_and(|p| !p.is_empty())).count()
}

/// The (current, desired) of a decision line `… decision: 2 → 3 (…)`.
fn decision(line: &str) -> Option<(u32, u32)> {
    let rest = line.split("decision: ").nth(1)?;
    let (from, rest) = rest.split_once(" → ")?;
    let to = rest.split_whitespace().next()?;
    Some((from.parse().ok()?, to.parse().ok()?))
}

/// Wait for the service's decision that moves it from `from` to `to`.
fn wait_decision(watch: &mut Watch, service: &str, from: u32, to: u32) -> String {
    let prefix = format!("service {service}: decision: ");
    watch.wait_line(&format!("{service}: {from} → {to}"), |l| l.contains(&prefix) && decision(l) == Some((from, to)))
}

/// Every decision of the service in the log so far moved it at most one replica.
fn one_step_each(watch: &Watch, service: &str) -> usize {
    let prefix = format!("service {service}: decision: ");
    let decisions: Vec<(u32, u32)> = watch.log.iter().filter(|l| l.contains(&prefix)).filter_map(|l| decision(l)).collect();
    for (from, to) in &decisions {
        assert!(from.abs_diff(*to) <= 1, "a decision moved {from} → {to}:\n{}", watch.log.join("\n"));
    }
    decisions.len()
}

/// On a failed test (the watch SIGKILLed by its drop, replicas left behind), SIGKILL the
/// processes of every workload left, so that their `vgpu run` clean up and end.
struct Leftovers<'a>(&'a Sim);

impl Drop for Leftovers<'_> {
    fn drop(&mut self) {
        let Ok(out) = self.0.vgpu(&["ps", "--json"]).output() else { return };
        let Ok(listing) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else { return };
        for w in listing["workloads"].as_array().into_iter().flatten() {
            for pid in w["pids"].as_array().into_iter().flatten().filter_map(|p| p.as_i64()) {
                // SAFETY: kill(2) on a process of this test's own workload.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        }
    }
}

fn stop_file(sim: &Sim) -> PathBuf {
    sim.path("stop")
}

#[test]
fn a_cpu_bound_service_scales_up_one_step_per_decision_and_back_down_after_the_cooldown() {
    let sim = Sim::new(&[("NVIDIA H100 80GB HBM3", "80GiB")]);
    let _leftovers = Leftovers(&sim);
    sim.write_vgpu_config(FAST);
    let stop = stop_file(&sim);
    // Each replica burns its 0.2 CPU until the stop file appears, then idles.
    let script = format!("while [ ! -e {} ]; do :; done; exec sleep 600", stop.display());
    create(
        &sim,
        &[
            "burn",
            "--replicas",
            "1-3",
            "--scale-on",
            "cpu=50%",
            "--window",
            "1s",
            "--cooldown",
            "2s",
            "--grace",
            "2s",
            "--cpus",
            "0.2",
            "--mem",
            "1G",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    let mut watch = Watch::start(&sim, &[]);
    wait_decision(&mut watch, "burn", 1, 2);
    wait_decision(&mut watch, "burn", 2, 3);
    wait_for("3 burning replicas", || running(&sim, "burn") == 3);
    // At MAX it holds, however loaded: wait for a few more decisions.
    for _ in 0..3 {
        watch.wait_line("a decision at 3", |l| l.contains("service burn: decision: 3 → 3"));
    }
    let names: Vec<String> = replicas(&sim, "burn").iter().map(|w| w["name"].as_str().unwrap_or("").to_string()).collect();
    assert_eq!(names.len(), 3, "{names:?}");
    for i in 0..3 {
        assert!(names.contains(&format!("burn-{i}")), "{names:?}");
    }
    let table = String::from_utf8(sim.vgpu(&["ps"]).output().expect("ps").stdout).expect("utf-8");
    assert!(table.contains("burn-2 (burn/2)"), "{table}");

    std::fs::write(&stop, b"").expect("stop the load");
    wait_decision(&mut watch, "burn", 3, 2);
    wait_decision(&mut watch, "burn", 2, 1);
    watch.wait_line("the last surplus replica stopped", |l| l.contains("service burn: replica 1 stopped"));
    wait_for("one replica left", || replicas(&sim, "burn").len() == 1);
    assert!(one_step_each(&watch, "burn") >= 4);
    let st = show(&sim, "burn");
    assert_eq!(st["desired_replicas"], 1, "{st}");
    assert!(st["decisions"].as_array().is_some_and(|d| !d.is_empty()), "{st}");
    // The watch stops: so do the replicas, gracefully.
    assert_eq!(watch.stop().code(), Some(0));
    assert!(replicas(&sim, "burn").is_empty(), "{:?}", replicas(&sim, "burn"));
}

#[test]
fn a_replica_killed_with_sigkill_is_restarted() {
    let sim = Sim::new(&[("NVIDIA H100 80GB HBM3", "80GiB")]);
    let _leftovers = Leftovers(&sim);
    sim.write_vgpu_config(FAST);
    create(&sim, &["steady", "--replicas", "1", "--mem", "1G", "--", "sleep", "600"]);
    let mut watch = Watch::start(&sim, &[]);
    wait_for("the replica to run", || running(&sim, "steady") == 1);
    let first = replicas(&sim, "steady").remove(0);
    assert_eq!(first["service"], serde_json::json!({"name": "steady", "replica": 0}), "{first}");
    let pid = first["pids"][0].as_i64().expect("pid") as i32;
    // SAFETY: kill(2) on the replica's process, found in its cgroup.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let line = watch.wait_line("the restart", |l| l.contains("service steady: replica 0 "));
    assert!(line.contains("exited with status 137: restarting in 1s"), "{line}");
    wait_for("a new replica 0", || replicas(&sim, "steady").iter().any(|w| w["id"] != first["id"] && w["state"] == "running"));
    wait_for("the restart in service show", || show(&sim, "steady")["replicas"][0]["restarts"] == 1);
    assert_eq!(show(&sim, "steady")["replicas"][0]["last_exit"], 137);
    assert_eq!(watch.stop().code(), Some(0));
    assert!(replicas(&sim, "steady").is_empty());
}

#[test]
fn a_service_larger_than_the_gpu_holds_at_what_is_admitted_and_says_why() {
    let sim = Sim::new(&[("Tesla V100-SXM2-16GB", "16GiB")]);
    let _leftovers = Leftovers(&sim);
    sim.write_vgpu_config(&FAST.replace("listen = \"\"", "listen = \"127.0.0.1:0\""));
    create(&sim, &["big", "--replicas", "8", "--mem", "4G", "--", "sleep", "600"]);
    let mut watch = Watch::start(&sim, &[]);
    let line = watch.wait_line("a replica refused", |l| l.contains("service big: replica") && l.contains("not admitted"));
    assert!(line.contains("(tried again every round)"), "{line}");
    wait_for("4 replicas", || running(&sim, "big") == 4);
    // Retried every round, never admitted: still 4 after more rounds.
    let from = watch.log.len();
    watch.wait_rounds(5);
    assert_eq!(replicas(&sim, "big").len(), 4);
    // One refused replica's `vgpu run` at a time, not all four every round.
    let mut in_round = 0;
    for line in &watch.log[from..] {
        if line.contains("service big: starting replica") {
            in_round += 1;
            assert!(in_round <= 1, "more than one retry in a round:\n{}", watch.log[from..].join("\n"));
        } else if line.contains("round ") && line.contains(" done") {
            in_round = 0;
        }
    }
    wait_for("the reason in service show", || show(&sim, "big")["short"].as_str().is_some_and(|s| s.starts_with("4 of 8 running: replica")));
    let shown = show(&sim, "big");
    assert_eq!((shown["desired_replicas"].as_u64(), shown["running_replicas"].as_u64()), (Some(8), Some(4)), "{shown}");
    let short = shown["short"].as_str().unwrap_or_default().to_string();
    assert!(short.contains("not admitted:") && short.contains("GPU 0"), "{short}");
    // The watch's metrics say so too.
    let addr = watch.log.iter().find_map(|l| l.split("metrics on http://").nth(1).map(str::to_string)).expect("metrics address");
    let text = ureq::get(&format!("http://{addr}")).call().expect("GET /metrics").into_string().expect("text");
    for (kind, n) in [("desired", 8), ("actual", 4)] {
        let series = format!("vgpu_service_replicas{{service=\"big\",kind=\"{kind}\"}} {n}\n");
        assert!(text.contains(&series), "no {series} in:\n{text}");
    }
    assert_eq!(watch.stop().code(), Some(0));
    assert!(replicas(&sim, "big").is_empty());
}

#[test]
fn a_memory_bound_service_scales_on_mem() {
    let sim = Sim::new(&[("NVIDIA H100 80GB HBM3", "80GiB")]);
    let _leftovers = Leftovers(&sim);
    sim.write_vgpu_config(FAST);
    // Each replica holds 40 MB (a shell variable; building it takes twice that for a moment)
    // of its 128 MiB limit, about 30%: above a 20% target, it scales to MAX.
    create(
        &sim,
        &[
            "hog",
            "--replicas",
            "1-2",
            "--scale-on",
            "mem=20%",
            "--window",
            "1s",
            "--cooldown",
            "60s",
            "--memory",
            "128M",
            "--mem",
            "1G",
            "--",
            "sh",
            "-c",
            "x=$(head -c 40000000 /dev/zero | tr '\\0' a); sleep 600",
        ],
    );
    let mut watch = Watch::start(&sim, &[]);
    let line = wait_decision(&mut watch, "hog", 1, 2);
    assert!(line.contains("[mem 0."), "{line}");
    wait_for("2 replicas", || running(&sim, "hog") == 2);
    assert_eq!(watch.stop().code(), Some(0));
    assert!(replicas(&sim, "hog").is_empty());
}

#[test]
fn a_watch_that_starts_takes_over_the_replicas_a_killed_watch_left() {
    let sim = Sim::new(&[("NVIDIA H100 80GB HBM3", "80GiB")]);
    let _leftovers = Leftovers(&sim);
    sim.write_vgpu_config(FAST);
    create(&sim, &["keep", "--replicas", "2", "--mem", "1G", "--", "sleep", "600"]);
    let mut killed = Watch::start(&sim, &[]);
    wait_for("2 replicas", || running(&sim, "keep") == 2);
    let before: Vec<serde_json::Value> = replicas(&sim, "keep").iter().map(|w| w["id"].clone()).collect();
    // Kept (not dropped): its log pipe, which the replicas inherited, stays read, as the
    // journal's would.
    killed.signal(libc::SIGKILL);
    // Ended (its instance lock released) before the next starts: else that one may find
    // it still running and exit.
    killed.wait_exit();
    let mut watch = Watch::start(&sim, &[]);
    // Its first round (before it said ready) took them over.
    let took = watch.log.iter().filter(|l| l.contains("service keep: replica") && l.contains("found running") && l.contains("taken over")).count();
    assert_eq!(took, 2, "{:?}", watch.log);
    watch.wait_rounds(3);
    let after: Vec<serde_json::Value> = replicas(&sim, "keep").iter().map(|w| w["id"].clone()).collect();
    assert_eq!(after, before, "the same replicas, none started twice");
    assert!(!watch.log.iter().any(|l| l.contains("service keep: starting replica")), "{:?}", watch.log);
    assert_eq!(watch.stop().code(), Some(0));
    assert!(replicas(&sim, "keep").is_empty());
    drop(killed);
}

/// `vgpu --simulate service run NAME`, its stderr read line by line.
struct Foreground {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    log: Vec<String>,
}

impl Foreground {
    fn start(sim: &Sim, name: &str) -> Foreground {
        use std::io::BufRead as _;
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_vgpu"));
        cmd.args(["--simulate", "service", "run", name]).env_remove("VGPU_SIMULATE").env("VGPU_LOG", "vgpu=debug");
        for (k, v) in sim.env() {
            cmd.env(k, v);
        }
        let mut child = cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped()).spawn().expect("spawn service run");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut fg = Foreground { child, lines, log: Vec::new() };
        fg.wait_line("ready", |l| l == "vgpu service run: ready");
        fg
    }

    fn wait_line(&mut self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        loop {
            match self.lines.recv_timeout(watch::LINE_TIMEOUT) {
                Ok(line) => {
                    self.log.push(line.clone());
                    if pred(&line) {
                        return line;
                    }
                }
                Err(e) => panic!("{e} waiting for {what}; log:\n{}", self.log.join("\n")),
            }
        }
    }
}

impl Drop for Foreground {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[test]
fn vgpu_service_run_runs_one_service_and_the_watch_leaves_it_alone_until_it_stops() {
    let sim = Sim::new(&[("NVIDIA H100 80GB HBM3", "80GiB")]);
    let _leftovers = Leftovers(&sim);
    sim.write_vgpu_config(FAST);
    // Nothing runs it yet: `service create` and `service show` say so, and how to run it.
    let out = sim.vgpu(&["service", "create", "solo", "--replicas", "2", "--mem", "1G", "--", "sleep", "600"]).output().expect("create");
    assert!(out.status.success() && String::from_utf8_lossy(&out.stderr).contains("nothing runs service solo now"), "{out:?}");
    assert_eq!(show(&sim, "solo")["runner"], serde_json::Value::Null);
    let text = sim.vgpu(&["service", "show", "solo"]).output().expect("show");
    assert!(String::from_utf8_lossy(&text.stdout).contains("vgpu-service@solo.service"), "{text:?}");
    let mut fg = Foreground::start(&sim, "solo");
    wait_for("2 replicas", || running(&sim, "solo") == 2);
    assert_eq!(show(&sim, "solo")["runner"], "service-run");
    // A second runner of the same service is refused, at once.
    let out = sim.vgpu(&["service", "run", "solo"]).output().expect("service run");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("service solo is already run by pid {}", fg.child.id())), "{err}");
    // So is the watch: it leaves the service to it, and starts nothing.
    let mut watch = Watch::start(&sim, &[]);
    assert!(watch.log.iter().any(|l| l.contains(&format!("service solo: run by pid {} (vgpu service run): left to it", fg.child.id()))), "{:?}", watch.log);
    watch.wait_rounds(3);
    assert_eq!(replicas(&sim, "solo").len(), 2);
    assert!(!watch.log.iter().any(|l| l.contains("service solo: starting replica")), "{:?}", watch.log);
    // SIGTERM: the runner stops its replicas and ends; the watch takes the service over.
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(fg.child.id() as i32, libc::SIGTERM) }, 0);
    fg.wait_line("the replicas stopped", |l| l.starts_with("vgpu service run: stopped"));
    assert_eq!(fg.child.wait().expect("wait").code(), Some(0));
    assert!(fg.log.iter().filter(|l| l.contains("service solo: replica") && l.contains(" stopped (")).count() == 2, "{:?}", fg.log);
    watch.wait_line("the watch takes it", |l| l.contains("service solo: running it"));
    wait_for("2 replicas again", || running(&sim, "solo") == 2);
    assert_eq!(show(&sim, "solo")["runner"], "watch");
    assert_eq!(watch.stop().code(), Some(0));
    assert!(replicas(&sim, "solo").is_empty());
}

#[test]
fn a_service_removed_with_force_has_its_replicas_stopped_and_then_its_state_removed() {
    let sim = Sim::new(&[("NVIDIA H100 80GB HBM3", "80GiB")]);
    let _leftovers = Leftovers(&sim);
    sim.write_vgpu_config(FAST);
    create(&sim, &["gone", "--replicas", "1", "--mem", "1G", "--", "sleep", "600"]);
    let mut fg = Foreground::start(&sim, "gone");
    wait_for("the replica", || running(&sim, "gone") == 1);
    let out = sim.vgpu(&["service", "remove", "gone", "--force"]).output().expect("remove");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    fg.wait_line("the runner to end", |l| l == "vgpu service run: service gone was removed: nothing left to run");
    assert_eq!(fg.child.wait().expect("wait").code(), Some(0));
    assert!(fg.log.iter().any(|l| l.contains("service gone: replica 0 stopped (")), "{:?}", fg.log);
    assert!(replicas(&sim, "gone").is_empty());
    assert!(!sim.path("lib/services/gone.state.json").exists());
}

#[test]
fn a_service_removed_beside_a_damaged_one_whose_name_ends_with_its_own_is_stopped() {
    let sim = Sim::new(&[("NVIDIA H100 80GB HBM3", "80GiB")]);
    let _leftovers = Leftovers(&sim);
    sim.write_vgpu_config(FAST);
    create(&sim, &["b", "--replicas", "1", "--mem", "1G", "--", "sleep", "600"]);
    // `ab.toml` is damaged: its error names `…/ab.toml`, which contains `b.toml`.
    std::fs::write(sim.path("lib/services/ab.toml"), "replicas = 1\nmems = \"1G\"\ncommand = [\"true\"]\n").expect("write ab.toml");
    let mut watch = Watch::start(&sim, &[]);
    wait_for("the replica", || running(&sim, "b") == 1);
    let out = sim.vgpu(&["service", "remove", "b", "--force"]).output().expect("remove");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    watch.wait_line("b's replicas to be stopped", |l| l.contains("service b: definition removed: stopping its replicas"));
    watch.wait_line("b to be removed", |l| l.contains("service b: removed, its replicas stopped"));
    assert!(replicas(&sim, "b").is_empty());
    assert_eq!(watch.stop().code(), Some(0));
}

#[test]
fn the_watch_stops_what_is_left_of_a_service_removed_while_no_runner_ran_it() {
    let sim = Sim::new(&[("NVIDIA H100 80GB HBM3", "80GiB")]);
    let _leftovers = Leftovers(&sim);
    sim.write_vgpu_config(FAST);
    create(&sim, &["left", "--replicas", "2", "--mem", "1G", "--", "sleep", "600"]);
    // Its runner is killed: the replicas go on (its stderr, which they share, stays read).
    let fg = Foreground::start(&sim, "left");
    wait_for("2 replicas in service show", || show(&sim, "left")["running_replicas"] == 2);
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(fg.child.id() as i32, libc::SIGKILL) }, 0);
    let out = sim.vgpu(&["service", "remove", "left", "--force"]).output().expect("remove");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(running(&sim, "left"), 2);
    let mut watch = Watch::start(&sim, &[]);
    watch.wait_line("the service forgotten", |l| l.contains("service left: removed, its replicas stopped"));
    assert!(replicas(&sim, "left").is_empty());
    assert!(!sim.path("lib/services/left.state.json").exists());
    assert_eq!(watch.stop().code(), Some(0));
    drop(fg);
}

#[test]
fn a_gpu_bound_service_scales_on_gpu() {
    let sim = Sim::new(&[("NVIDIA H100 80GB HBM3", "80GiB")]);
    let _leftovers = Leftovers(&sim);
    sim.write_vgpu_config(FAST);
    // Each replica launches 2 ms kernels back to back on a strict 20% share: it uses all of
    // its share, twice a 50% target.
    let bin = workload::workload_bin().display().to_string();
    create(
        &sim,
        &[
            "gpuload",
            "--replicas",
            "1-2",
            "--scale-on",
            "gpu=50%",
            "--window",
            "1s",
            "--compute",
            "20",
            "--mem",
            "1G",
            "--",
            &bin,
            "sync",
            "600",
            "--kernel-us",
            "2000",
        ],
    );
    let mut watch = Watch::start(&sim, &[]);
    let line = wait_decision(&mut watch, "gpuload", 1, 2);
    assert!(line.contains("[gpu "), "{line}");
    wait_for("2 replicas", || running(&sim, "gpuload") == 2);
    assert_eq!(watch.stop().code(), Some(0));
    assert!(replicas(&sim, "gpuload").is_empty());
}

/// `service remove` without `--force` counts the replicas by their workload records, not by
/// the runner's state: a replica admitted before any runner wrote the state (here, started
/// by hand as a runner starts it) keeps the service from being removed.
#[test]
fn remove_without_force_is_refused_while_a_replica_runs_that_the_state_does_not_list_yet() {
    let sim = Sim::new(&[("NVIDIA H100 80GB HBM3", "80GiB")]);
    let _leftovers = Leftovers(&sim);
    create(&sim, &["early", "--replicas", "1", "--mem", "1G", "--", "sleep", "600"]);
    let mut replica = sim.spawn(&["run", "--service", "early", "--replica", "0", "--mem", "1G", "--name", "early-0", "--", "sleep", "600"]);
    wait_for("the replica", || running(&sim, "early") == 1);
    let listed = show(&sim, "early");
    assert!(listed["replicas"].as_array().is_none_or(|r| r.iter().all(|r| r["workload_id"].is_null())), "no runner listed it: {listed}");
    let out = sim.vgpu(&["service", "remove", "early"]).output().expect("remove");
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("1 running replica(s)"), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(sim.path("lib/services/early.toml").exists(), "the definition is kept");
    // SAFETY: kill(2) on our own child (vgpu run relays SIGTERM and tears down).
    assert_eq!(unsafe { libc::kill(replica.id() as i32, libc::SIGTERM) }, 0);
    replica.wait().expect("wait for the replica's vgpu run");
}

/// A workload that took a replica's name (`web-0`) before the service existed keeps that
/// replica out while it runs (names are unique among running workloads); `service create`
/// says so, and the runner names the holder, workload and user, in its log and in `service
/// show` every time it tries. Once the holder ends, the replica starts.
#[test]
fn a_replica_name_taken_before_the_service_existed_is_named_until_it_is_free() {
    let sim = Sim::new(&[("NVIDIA H100 80GB HBM3", "80GiB")]);
    std::fs::set_permissions(sim.dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let _leftovers = Leftovers(&sim);
    sim.write_vgpu_config(FAST);
    // `nobody`, through sudo, takes web-0 first.
    let nobody = nix::unistd::User::from_name("nobody").expect("passwd").expect("user nobody");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_vgpu"));
    cmd.args(["--simulate", "run", "--name", "web-0", "--mem", "1G", "--", "sleep", "600"]).envs(sim.env());
    cmd.env("SUDO_UID", nobody.uid.to_string()).env("SUDO_GID", nobody.gid.to_string()).env("SUDO_USER", "nobody");
    let mut squatter = Squatter(cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().expect("vgpu run"));
    wait_for("web-0 to run", || sim.ps().iter().any(|w| w["name"] == "web-0" && w["state"] == "running"));
    let id = sim.row("web-0")["id"].as_str().expect("id").to_string();
    let held = format!("held by workload {id} of user nobody");

    let out = sim.vgpu(&["service", "create", "web", "--replicas", "2", "--mem", "1G", "--", "sleep", "600"]).output().expect("create");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && err.contains(&format!("replica 0's name web-0 is {held}")), "{err}");
    let mut watch = Watch::start(&sim, &[]);
    let line = watch.wait_line("replica 0 refused", |l| l.contains("service web: replica 0 not admitted"));
    assert!(line.contains(&held) && line.contains("no replica of the service"), "{line}");
    // Tried again every round (said once while the reason stays); `service show` has it.
    watch.wait_line("replica 0 tried again", |l| l.contains("service web: starting replica 0"));
    wait_for("the holder in service show", || show(&sim, "web")["short"].as_str().is_some_and(|s| s.contains(&held)));

    // The holder ends: the replica starts.
    sim.vgpu(&["kill", "web-0"]).assert().success();
    assert_eq!(squatter.0.wait().expect("wait").code(), Some(143));
    watch.wait_line("replica 0 admitted", |l| l.contains("service web: replica 0 admitted"));
    wait_for("2 replicas", || running(&sim, "web") == 2);
    assert_eq!(watch.stop().code(), Some(0));
}

/// A `vgpu run` child ended (SIGTERM, relayed to its workload) and reaped when the test ends.
struct Squatter(std::process::Child);

impl Drop for Squatter {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            // SAFETY: kill(2) on our own child, not reaped yet.
            unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
            let _ = self.0.wait();
        }
    }
}
