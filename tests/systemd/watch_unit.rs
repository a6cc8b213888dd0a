//! `vgpu-watch.service` under a real systemd, as install.sh installs it: `systemctl enable
//! --now` reaches `active (running)` through `READY=1`; the watchdog is fed (no restart in
//! three times a short test `WatchdogSec`); inside the unit's sandbox the watch does its
//! duties — kills a workload that bypasses the shim, writes the metrics textfile and the
//! history, serves metrics, settles the store after a dead `vgpu run`, throttles a workload
//! over its compute share; `systemctl reload` applies a changed config; `systemctl stop`
//! ends it cleanly and thaws what it throttled. On both cgroup trees.

use std::time::{Duration, Instant};

use crate::systemd::container::Tree;
use crate::systemd::installed::{text, Installed, VGPU};

/// The test's `WatchdogSec=` (the unit's is 60 s): a watch that stopped pinging would be
/// killed within it.
const WATCHDOG: Duration = Duration::from_secs(2);

const TEXTFILE: &str = "/var/lib/node_exporter/textfile_collector/vgpu.prom";

fn config(interval: &str) -> String {
    format!(
        "[watch]\ninterval = \"{interval}\"\ngrace = \"200ms\"\ncontext_allowance = \"64MiB\"\ncompute = \"throttle\"\ncompute_window = \"1s\"\ntextfile = \"{TEXTFILE}\"\n\n[history]\ninterval = \"0s\"\n"
    )
}

/// The value of the metric line starting with `prefix` in the textfile, once there.
fn textfile_has(host: &Installed, needle: &str) -> bool {
    host.read(TEXTFILE).is_some_and(|t| t.lines().any(|l| l.contains(needle)))
}

fn the_watch_unit(tree: Tree) {
    let host = Installed::new(tree, &config("1s"));
    host.write("/etc/systemd/system/vgpu-watch.service.d/test.conf", &format!("[Service]\nWatchdogSec={}s\n", WATCHDOG.as_secs()));
    host.write("/var/lib/node_exporter/textfile_collector/.keep", "");
    host.systemctl(&["daemon-reload"]);
    let gpu_workload = crate::common::workload::workload_bin().display().to_string();

    // Type=notify: `systemctl start` returns once the watch said READY=1 (it fails after
    // TimeoutStartSec= otherwise), so it is active the moment the command returns.
    host.systemctl(&["enable", "--now", "vgpu-watch.service"]);
    let started = Instant::now();
    assert_eq!(host.show("vgpu-watch.service", "ActiveState"), "active", "{}", host.status("vgpu-watch.service"));
    assert_eq!(host.show("vgpu-watch.service", "SubState"), "running");
    assert_eq!(host.show("vgpu-watch.service", "UnitFileState"), "enabled");
    assert!(host.journal("vgpu-watch.service").contains("vgpu watch: ready"), "{}", host.journal("vgpu-watch.service"));
    let main_pid = host.show("vgpu-watch.service", "MainPID");
    assert_eq!(host.show("vgpu-watch.service", "WatchdogUSec"), format!("{}s", WATCHDOG.as_secs()));
    let environ = host.ct.output(&["cat", &format!("/proc/{main_pid}/environ")]).unwrap();
    assert!(environ.split('\0').any(|v| v == format!("WATCHDOG_USEC={}", WATCHDOG.as_micros())), "the watch was told its watchdog: {environ:?}");

    // Its duties, inside the sandbox. (a) A workload that bypasses the shim and holds 3 GiB
    // of its 1 GiB is killed, and vgpu run says why.
    let out = host.vgpu(&["run", "--name", "escapee", "--mem", "1G", "--", "env", "-u", "LD_PRELOAD", &gpu_workload, "idle", "60", "--alloc-mib", "3072"]);
    assert_eq!(out.status.code(), Some(137), "killed by the watch: {}\n{}", text(&out), host.journal("vgpu-watch.service"));
    assert!(text(&out).contains("vgpu watch killed pid") && text(&out).contains("over memory quota on GPU 0"), "{}", text(&out));
    let journal = host.journal("vgpu-watch.service");
    assert!(journal.contains("SIGKILL to pid") && journal.contains("of workload escapee ("), "{journal}");
    assert!(!journal.contains("Permission denied") && !journal.contains("Read-only file system"), "the sandbox refused the watch something:\n{journal}");

    // (b) The metrics: the textfile counts that kill, the endpoint serves the same, the
    // history has recorded rounds.
    host.wait_for("the textfile to count the kill", || textfile_has(&host, "vgpu_enforcements_total{") && textfile_has(&host, "name=\"escapee\""));
    let scrape = host.ct.output(&["python3", "-c", "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9400/metrics', timeout=5).read().decode())"]);
    let scrape = scrape.unwrap_or_else(|e| panic!("the metrics endpoint: {e}"));
    assert!(scrape.lines().any(|l| l.starts_with("vgpu_enforcements_total{") && l.contains("name=\"escapee\"")), "{scrape}");
    host.wait_for("the history database", || std::fs::metadata(host.ct.path("/var/lib/vgpu/history.db")).is_ok_and(|m| m.len() > 0));

    // (c) A `vgpu run` killed with SIGKILL leaves its workload behind: the watch's reconcile
    // tears it down (record, vGPU, cgroup) and settles the pool (its blocks given back)
    // without any other command.
    host.ct.service("orphan", &[], &[VGPU, "run", "--name", "orphan", "--tflops", "10", "--", "sleep", "600"]).unwrap();
    host.wait_for("the orphan to run", || host.records().iter().any(|r| r["name"] == "orphan" && r["state"] == "running"));
    assert_eq!(free_blocks(&host).0 + 10, free_blocks(&host).1, "the orphan holds 10 blocks");
    let record = host.records().into_iter().find(|r| r["name"] == "orphan").unwrap();
    let supervisor = record["supervisor"]["pid"].as_u64().unwrap().to_string();
    host.ct.output(&["kill", "-KILL", &supervisor]).unwrap();
    host.wait_for("the watch to tear the orphan down", || host.records().is_empty() && host.vgpu_dirs().is_empty());
    assert!(host.ct.output(&["pgrep", "-x", "sleep"]).is_err(), "the orphan's sleep was killed");
    let (free, total) = free_blocks(&host);
    assert_eq!(free, total, "the orphan's pool blocks were given back");

    // (d) A workload over its compute share (the shim bypassed) is throttled: frozen and
    // thawed by the watch in its sandbox.
    let hot = [VGPU, "run", "--name", "hot", "--mem", "1G", "--compute", "30", "--", "env", "-u", "LD_PRELOAD", &gpu_workload, "sync", "600", "--kernel-us", "2000", "--window-ms", "500"];
    host.ct.service("hot", &[], &hot).unwrap();
    host.wait_for("the watch to throttle hot", || host.journal("vgpu-watch.service").contains("throttling workload hot ("));

    // The watchdog: no restart and the same process over three times WatchdogSec.
    let fed_for = WATCHDOG * 3;
    if let Some(rest) = fed_for.checked_sub(started.elapsed()) {
        std::thread::sleep(rest);
    }
    assert_eq!(host.show("vgpu-watch.service", "NRestarts"), "0", "{}", host.journal("vgpu-watch.service"));
    assert_eq!(host.show("vgpu-watch.service", "MainPID"), main_pid);
    assert!(!host.journal("vgpu-watch.service").contains("Watchdog timeout"));

    // Reload: a changed config applies (systemd 252 returns from `reload` before the
    // watch's READY=1, hence the wait for its line).
    host.config(&config("2s"));
    host.systemctl(&["reload", "vgpu-watch.service"]);
    host.wait_for("the reload", || host.journal("vgpu-watch.service").contains("reloaded the config (interval 2s)"));
    host.wait_for("active after the reload", || host.show("vgpu-watch.service", "ActiveState") == "active");

    // Stop: clean (exit 0, not failed), and what it throttled is thawed and runs on.
    let hot = host.records().into_iter().find(|r| r["name"] == "hot").expect("hot's record");
    let hot_pid = hot["pid"].as_u64().expect("hot's pid").to_string();
    host.systemctl(&["stop", "vgpu-watch.service"]);
    assert_eq!(host.show("vgpu-watch.service", "ActiveState"), "inactive", "{}", host.status("vgpu-watch.service"));
    assert_eq!(host.show("vgpu-watch.service", "Result"), "success");
    assert_eq!(host.show("vgpu-watch.service", "ExecMainStatus"), "0");
    let journal = host.journal("vgpu-watch.service");
    assert!(journal.contains("vgpu watch: stopped (signal 15)"), "{journal}");
    assert!(!frozen(&host, &hot_pid), "hot is still frozen after the watch stopped:\n{journal}");
    let stat = host.ct.output(&["cat", &format!("/proc/{hot_pid}/stat")]).expect("hot runs on");
    assert!(!stat.contains(") Z "), "{stat}");
    host.systemctl(&["stop", "hot.service"]);
    host.wait_for("hot to be gone", || host.records().is_empty());
}

/// The pool's (free, total) blocks, `vgpu pool --json`.
fn free_blocks(host: &Installed) -> (u64, u64) {
    let out = host.vgpu(&["pool", "--json"]);
    assert!(out.status.success(), "vgpu pool: {}", text(&out));
    let pool: serde_json::Value = serde_json::from_slice(&out.stdout).expect("vgpu pool --json");
    let devices = pool["devices"].as_array().expect("the pool's devices");
    let sum = |key: &str| devices.iter().filter_map(|d| d[key].as_u64()).sum::<u64>();
    (sum("free_blocks"), sum("blocks"))
}

/// Whether the cgroup of process `pid` (in the container) is frozen: v1 `freezer.state`,
/// v2 `cgroup.events`.
fn frozen(host: &Installed, pid: &str) -> bool {
    let cgroups = host.ct.output(&["cat", &format!("/proc/{pid}/cgroup")]).expect("the process's cgroups");
    for line in cgroups.lines() {
        let mut fields = line.splitn(3, ':');
        let (_, names, path) = (fields.next().unwrap_or(""), fields.next().unwrap_or(""), fields.next().unwrap_or(""));
        match (host.ct.tree, names) {
            (Tree::Hybrid, "freezer") => {
                let state = host.read(&format!("/sys/fs/cgroup/freezer{path}/freezer.state")).expect("freezer.state");
                return state.trim() != "THAWED";
            }
            (Tree::Unified, "") => {
                let events = host.read(&format!("/sys/fs/cgroup{path}/cgroup.events")).expect("cgroup.events");
                return events.lines().any(|l| l == "frozen 1");
            }
            _ => {}
        }
    }
    panic!("no freezer cgroup for pid {pid}: {cgroups}");
}

#[test]
fn the_watch_unit_on_the_hybrid_tree() {
    the_watch_unit(Tree::Hybrid);
}

#[test]
fn the_watch_unit_on_the_unified_tree() {
    the_watch_unit(Tree::Unified);
}
