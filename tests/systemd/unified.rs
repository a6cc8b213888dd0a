//! vgpu on a real cgroup v2 tree (the container's, whose systemd manages it) that offers
//! no controller: this host binds memory, cpu and pids to v1, as a container on such a host
//! or a v2 host that does not enable them would. What v2 gives every cgroup works through
//! the real files: `run`, `suspend`/`resume` (`cgroup.freeze`, `cgroup.events`), the
//! watch's end of a workload (`cgroup.kill`) and teardown. A host limit that needs a
//! missing controller (`--memory`, `--cpus`, `--pids`) is said once and clearly not to be
//! enforced, and the workload runs without it, neither failing nor pretending: `vgpu
//! doctor` warns rather than fails, and a killed workload is not explained as an OOM kill.
//!
//! The OOM explanation itself (`memory.events`' `oom_kill`) cannot be exercised here: with
//! no memory controller in the tree there is no memory limit to reach and no
//! `memory.events` file (tests/host/cgroup_real.rs exercises it on the v1 controllers).

use std::time::{Duration, Instant};

use crate::systemd::container::Tree;
use crate::systemd::installed::{text, Installed, VGPU};

const WATCH: &str = "[watch]\ninterval = \"200ms\"\ngrace = \"200ms\"\ncontext_allowance = \"64MiB\"\n";

/// The workload's cgroup directory (systemd manager: in its scope), inside the container.
fn cgroup_dir(record: &serde_json::Value) -> String {
    let id = record["id"].as_str().expect("an id");
    let home = record["cgroup_home"]["unified"].as_str().expect("a v2 home");
    format!("/sys/fs/cgroup{home}/vgpu/{id}")
}

#[test]
fn a_v2_tree_without_controllers() {
    let host = Installed::new(Tree::Unified, WATCH);
    assert_eq!(host.read("/sys/fs/cgroup/cgroup.controllers").map(|c| c.trim().to_string()), Some(String::new()), "this test is about a tree with no controller");

    // doctor: the layout, and the missing controllers as warnings (vgpu run works).
    let out = host.vgpu(&["doctor"]);
    let said = text(&out);
    assert!(out.status.success(), "vgpu doctor: {said}");
    assert!(said.contains("✓ cgroups: cgroup v2 (unified)"), "{said}");
    for (controller, option) in [("cpu", "--cpus"), ("memory", "--memory"), ("pids", "--pids")] {
        assert!(said.contains(&format!("! cgroup {controller}: controller not available: {option} cannot be enforced")), "{said}");
    }
    assert!(said.contains("✓ cgroup freezer: usable at /sys/fs/cgroup"), "{said}");

    // Limits that need the missing controllers: each said once, and the workload runs.
    let out = host.vgpu(&["run", "--name", "limited", "--memory", "64M", "--pids", "50", "--cpus", "1.5", "--", "sh", "-c", "echo ran"]);
    let said = text(&out);
    assert!(out.status.success(), "vgpu run with limits it cannot enforce: {said}");
    assert!(said.contains("ran"), "{said}");
    for (option, controller) in [("--memory 64 MiB", "memory"), ("--pids 50", "pids"), ("--cpus 1.5", "cpu")] {
        let line = format!("vgpu: warning: {option} is not enforced: this host's cgroups have no {controller} controller at /sys/fs/cgroup/");
        assert_eq!(said.matches(&line).count(), 1, "{line:?} once in:\n{said}");
    }
    assert!(said.contains("runs without that limit"), "{said}");

    // No pretending: a workload killed by SIGKILL with a --memory that was not enforced is
    // not said to be the OOM killer's.
    let out = host.vgpu(&["run", "--memory", "32M", "--", "sh", "-c", "kill -KILL $$"]);
    assert_eq!(out.status.code(), Some(137), "{}", text(&out));
    assert!(!text(&out).contains("OOM"), "{}", text(&out));

    // suspend/resume: cgroup.freeze, and the kernel's word in cgroup.events.
    let ticker = "while :; do date +%s%N > /run/tick; sleep 0.02; done";
    host.ct.service("ticker", &[], &[VGPU, "run", "--name", "ticker", "--", "sh", "-c", ticker]).unwrap();
    host.wait_for("ticker to run", || host.records().iter().any(|r| r["name"] == "ticker" && r["state"] == "running"));
    let record = host.records().into_iter().find(|r| r["name"] == "ticker").unwrap();
    let dir = cgroup_dir(&record);
    assert!(host.exists(&format!("{dir}/cgroup.freeze")), "{dir}");
    let out = host.vgpu(&["suspend", "ticker"]);
    assert!(out.status.success(), "vgpu suspend: {}", text(&out));
    assert_eq!(host.read(&format!("{dir}/cgroup.freeze")).unwrap().trim(), "1");
    assert!(host.read(&format!("{dir}/cgroup.events")).unwrap().lines().any(|l| l == "frozen 1"));
    assert_eq!(host.records().into_iter().find(|r| r["name"] == "ticker").unwrap()["state"], "suspended");
    let out = host.vgpu(&["resume", "ticker"]);
    assert!(out.status.success(), "vgpu resume: {}", text(&out));
    assert_eq!(host.read(&format!("{dir}/cgroup.freeze")).unwrap().trim(), "0");
    assert!(host.read(&format!("{dir}/cgroup.events")).unwrap().lines().any(|l| l == "frozen 0"));
    let tick = host.read("/run/tick");
    host.wait_for("ticker to tick again", || host.read("/run/tick") != tick);

    // kill (SIGTERM, relayed to vgpu run's workload) and teardown: cgroup, scope, record.
    let scope = record["cgroup_home"]["unit"].as_str().unwrap().to_string();
    let out = host.vgpu(&["kill", "ticker"]);
    assert!(out.status.success(), "vgpu kill: {}", text(&out));
    host.wait_for("ticker's teardown", || host.records().is_empty() && host.vgpu_dirs().is_empty() && !host.exists(&dir));
    host.wait_for("its scope to go", || host.show(&scope, "ActiveState") != "active");

    // The watch ends a workload at its second offence: frozen, then every process killed
    // through cgroup.kill.
    host.systemctl(&["start", "vgpu-watch.service"]);
    let gw = crate::common::workload::workload_bin().display().to_string();
    let escape = format!("env -u LD_PRELOAD {gw} idle 60 --alloc-mib 3072");
    let started = Instant::now();
    let out = host.vgpu(&["run", "--name", "twice", "--mem", "1G", "--", "sh", "-c", &format!("{escape}; {escape}; sleep 600")]);
    assert_eq!(out.status.code(), Some(137), "{}\n{}", text(&out), host.journal("vgpu-watch.service"));
    assert!(started.elapsed() < Duration::from_secs(300), "the sleep was killed");
    // The journal may take a moment to show the watch's last lines.
    host.wait_for("the watch's journal to say it ended twice", || {
        let journal = host.journal("vgpu-watch.service");
        journal.contains("ended workload twice (") && journal.contains("process(es) of workload twice (")
    });
    let journal = host.journal("vgpu-watch.service");
    assert!(!journal.contains("cannot kill every process"), "{journal}");
    host.wait_for("twice's teardown", || host.records().is_empty() && host.vgpu_dirs().is_empty());
}
