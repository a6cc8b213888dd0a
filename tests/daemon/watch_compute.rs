//! `vgpu watch`'s compute audit end to end: the real binary, the shim and the simulated
//! driver (whose per-process NVML utilization is exact, from its timeline), as root with
//! real cgroups. A workload whose process clears `LD_PRELOAD` escapes the shim's compute
//! governor; the watch sees its NVML share above its share while the shim's ledger sees
//! nothing, and throttles it with the freezer to its share (while a shim-governed workload
//! within its share is left alone), kills it (SIGKILL, its workload's first offence) under
//! `compute = "kill"` or when throttling cannot bring it down, and undoes its throttling when it stops — or, after it was
//! SIGKILLed, the next command's reconcile does.
//!
//! Each test synchronises on the watch's log lines and the workloads' files. The workloads
//! run 2 ms kernels in `sync` (one launch, one synchronize): the GPU share a window of
//! gpu_workload's report shows is its kernels × 2 ms ÷ the window, which is what the
//! throttle must hold to the share, whatever the load of the machine. The tests run one at
//! a time (each keeps a simulated GPU busy for seconds; together they would starve the
//! workloads of CPU on a small machine and change what they measure).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use crate::common::{serial, wait_for, Sim};
use serde_json::Value;
use vgpu_cgroups::Cgroup;
use vgpu_cgroups::FreezerState;
use vgpu_cgroups::Layout;
use crate::common::watch::Watch;
use crate::common::workload::workload_bin;

const TWO_GPUS: &[(&str, &str)] = &[("NVIDIA H100-sim", "80GiB"), ("NVIDIA H100-sim", "80GiB")];
const KERNEL_MS: f64 = 2.0;
const WINDOW_MS: f64 = 500.0;

// One test at a time, ahead of the harness's other tests on the CPU: `serial()` (see the
// module's documentation).

/// Short rounds and window; the metrics in a textfile (no endpoint).
fn config(sim: &Sim, policy: &str) -> String {
    format!(
        "[watch]\ninterval = \"200ms\"\ncompute_window = \"1s\"\ncompute = \"{policy}\"\nkill_after = \"2s\"\nlisten = \"\"\ntextfile = \"{}\"\n",
        sim.path("vgpu.prom").display()
    )
}

/// Wait until the metrics textfile counts `action` by the compute audit on workload `name`.
fn wait_counted(sim: &Sim, action: &str, name: &str) {
    let wanted = |l: &str| {
        l.starts_with("vgpu_enforcements_total{")
            && [format!("action=\"{action}\""), "reason=\"compute\"".to_string(), format!("name=\"{name}\"")].iter().all(|p| l.contains(p.as_str()))
            && l.ends_with(" 1")
    };
    wait_for(&format!("vgpu_enforcements_total to count the {action} of {name}"), || {
        std::fs::read_to_string(sim.path("vgpu.prom")).is_ok_and(|t| t.lines().any(wanted))
    });
}

/// The watch's figures while throttling (the driver's share, the time let run).
fn figures(watch: &mut Watch) -> Vec<String> {
    watch.drain().iter().filter_map(|l| l.find("throttling vGPU").map(|at| l[at..].to_string())).collect()
}

/// The first line containing `needle` from now on.
fn line(watch: &mut Watch, needle: &str) -> String {
    watch.wait_line(needle, |l| l.contains(needle))
}

fn logged(watch: &mut Watch, needle: &str) -> bool {
    watch.drain().iter().any(|l| l.contains(needle))
}

/// `vgpu --simulate run ARGS… -- COMMAND…` in the background, stdout collected.
fn run(sim: &Sim, args: &[&str], command: &[&str]) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vgpu"));
    cmd.args(["--simulate", "run"]).args(args).arg("--").args(command);
    cmd.env_remove("VGPU_SIMULATE").env_remove("LD_PRELOAD").env("VGPU_LOG", "vgpu=warn");
    for (k, v) in sim.env() {
        cmd.env(k, v);
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn vgpu run")
}

/// gpu_workload's per-window kernel counts from a finished `vgpu run`, which must have succeeded.
fn windows(child: Child) -> Vec<u64> {
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "vgpu run failed with {}\n{stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    let line = stdout.lines().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no report: {stdout}"));
    let v: Value = serde_json::from_str(line).unwrap();
    v["windows"].as_array().unwrap().iter().map(|n| n.as_u64().unwrap()).collect()
}

/// The GPU share, percent, of `kernels` 2 ms kernels in one window.
fn share(kernels: u64) -> f64 {
    kernels as f64 * KERNEL_MS / WINDOW_MS * 100.0
}

/// The workload's record as it is on disk (read without running vgpu, whose reconcile
/// would change it).
fn record(sim: &Sim, id: &str) -> Value {
    serde_json::from_slice(&std::fs::read(sim.path(&format!("run/workloads/{id}.json"))).unwrap()).unwrap()
}

fn id_of(sim: &Sim, name: &str) -> String {
    let mut id = String::new();
    wait_for(&format!("workload {name} to be recorded running"), || {
        let rows = sim.ps();
        match rows.iter().find(|w| w["name"] == name && w["state"] == "running") {
            Some(w) => {
                id = w["id"].as_str().unwrap().to_string();
                true
            }
            None => false,
        }
    });
    id
}

/// Whether the workload's cgroup is frozen, read from the kernel.
fn frozen(id: &str) -> bool {
    let layout = Layout::detect().expect("a cgroup filesystem");
    Cgroup::open(&layout, id).expect("the workload's cgroup").state().expect("its freezer state") != FreezerState::Thawed
}

fn w() -> &'static str {
    workload_bin().to_str().unwrap()
}

/// A shell that runs gpu_workload without the shim, writes its exit status, then waits for
/// `done` (so that the workload and its record outlive a terminated gpu_workload).
fn bypassing(sim: &Sim, seconds: &str, kernel_us: &str) -> (String, PathBuf, PathBuf) {
    let (status, done) = (sim.path("status"), sim.path("done"));
    let script = format!(
        "env -u LD_PRELOAD {w} sync {seconds} --kernel-us {kernel_us} >/dev/null; echo $? > {s}.tmp && mv {s}.tmp {s}; i=0; while [ ! -e {d} ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done",
        w = w(),
        s = status.display(),
        d = done.display()
    );
    (script, status, done)
}

fn wait_status(path: &PathBuf) -> i32 {
    wait_for("gpu_workload to end", || std::fs::read_to_string(path).is_ok_and(|s| s.ends_with('\n')));
    std::fs::read_to_string(path).unwrap().trim().parse().unwrap()
}

#[test]
fn a_workload_bypassing_the_shim_is_throttled_to_its_share_and_one_within_it_is_not() {
    let _serial = serial();
    workload_bin();
    let sim = Sim::new(TWO_GPUS);
    sim.write_vgpu_config(&config(&sim, "throttle"));
    let mut watch = Watch::start(&sim, &[]);
    let shape = ["sync", "8", "--kernel-us", "2000", "--window-ms", "500"];
    let mut bypass_cmd = vec!["env", "-u", "LD_PRELOAD", w()];
    bypass_cmd.extend_from_slice(&shape);
    let mut governed_cmd = vec![w()];
    governed_cmd.extend_from_slice(&shape);
    let bypass = run(&sim, &["--name", "bypass", "--gpu", "0", "--mem", "1G", "--compute", "30"], &bypass_cmd);
    let governed = run(&sim, &["--name", "governed", "--gpu", "1", "--mem", "1G", "--compute", "30"], &governed_cmd);

    // (a) The watch throttles it, says why, and the record shows it.
    let throttling = line(&mut watch, "throttling workload bypass (");
    assert!(throttling.contains("GPU 0 at ") && throttling.contains("% by the driver, share 30%, the shim sees 0%"), "{throttling}");
    let r = sim.row("bypass");
    assert_eq!(r["enforcement"]["action"], "throttled", "{r:#}");
    assert_eq!(r["enforcement"]["by"]["pid"], watch.pid(), "{r:#}");
    assert!(r["enforcement"]["reason"].as_str().unwrap().contains("share 30%"), "{r:#}");
    let table = String::from_utf8(sim.vgpu(&["ps"]).output().unwrap().stdout).unwrap();
    assert!(table.contains("throttled: GPU 0 at"), "{table}");
    wait_counted(&sim, "throttle", "bypass");

    // (c) The shim holds the other to its share: the watch leaves it alone.
    let g = sim.row("governed");
    assert!(g["enforcement"].is_null(), "{g:#}");

    let (bypass, governed) = (windows(bypass), windows(governed));
    assert!(!logged(&mut watch, "workload governed ("), "the governed workload was acted on:\n{}", watch.log.join("\n"));

    // (b) Its later windows hold its share; the first (before the audit's window ended)
    // did not.
    let later = &bypass[8..bypass.len() - 1];
    let held = later.iter().map(|&k| share(k)).sum::<f64>() / later.len() as f64;
    let first = share(bypass[0]);
    eprintln!("bypassing workload, GPU share per 500 ms window (kernels × 2 ms): {:?}", bypass.iter().map(|&k| share(k).round()).collect::<Vec<_>>());
    eprintln!("governed workload at --compute 30, the same: {:?}", governed.iter().map(|&k| share(k).round()).collect::<Vec<_>>());
    eprintln!("bypassing: first window {first:.0}%, windows 8–{}: {held:.1}% ({:.2} of the first)", bypass.len() - 2, held / first);
    eprintln!("the watch's figures while throttling:\n  {}", figures(&mut watch).join("\n  "));
    assert!(first > 45.0, "unthrottled at first: {first:.0}% ({bypass:?})");
    assert!((20.0..=40.0).contains(&held), "throttled to {held:.1}% of the GPU, share 30 ± 10 ({bypass:?})");
    assert!(held < 0.75 * first, "the rate fell: {held:.1}% vs {first:.1}% at first ({bypass:?})");
}

#[test]
fn under_compute_kill_the_bypassing_process_is_terminated_and_the_reason_recorded() {
    let _serial = serial();
    workload_bin();
    let sim = Sim::new(TWO_GPUS);
    sim.write_vgpu_config(&config(&sim, "kill"));
    let mut watch = Watch::start(&sim, &[]);
    let (script, status, done) = bypassing(&sim, "20", "2000");
    let child = run(&sim, &["--name", "killme", "--mem", "1G", "--compute", "30"], &["sh", "-c", &script]);
    let term = line(&mut watch, "SIGKILL to pid");
    assert!(term.contains("of workload killme (") && term.contains("over its compute share unseen by the shim: GPU 0 at "), "{term}");
    let pid: u64 = term.split("SIGKILL to pid ").nth(1).and_then(|s| s.split(' ').next()).and_then(|s| s.parse().ok()).unwrap();
    assert_eq!(wait_status(&status), 128 + 9, "gpu_workload died of SIGKILL (its workload's first offence)");
    let r = sim.row("killme");
    assert_eq!(r["enforcement"]["action"], "killed", "{r:#}");
    assert!(r["enforcement"]["reason"].as_str().unwrap().starts_with("over its compute share unseen by the shim"), "{r:#}");
    assert_eq!(r["enforcement"]["pids"], serde_json::json!([pid]), "{r:#}");
    wait_counted(&sim, "kill", "killme");
    assert!(!logged(&mut watch, "throttling workload"), "kill, not throttle:\n{}", watch.log.join("\n"));
    std::fs::write(done, b"").unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("vgpu watch killed pid {pid} of killme (")) && stderr.contains("over its compute share unseen by the shim"), "{stderr}");
}

#[test]
fn throttling_that_cannot_hold_long_kernels_escalates_to_a_kill() {
    let _serial = serial();
    workload_bin();
    let sim = Sim::new(TWO_GPUS);
    sim.write_vgpu_config(&config(&sim, "throttle"));
    let mut watch = Watch::start(&sim, &[]);
    // 2 s kernels: the GPU runs what was queued before each freeze, so freezing cannot
    // bring the share down.
    let (script, status, done) = bypassing(&sim, "30", "2000000");
    let child = run(&sim, &["--name", "long", "--mem", "1G", "--compute", "30"], &["sh", "-c", &script]);
    line(&mut watch, "throttling workload long (");
    let escalation = line(&mut watch, "throttling did not bring it down");
    assert!(escalation.contains("workload long (") && escalation.contains("killing what the shim does not see"), "{escalation}");
    let term = line(&mut watch, "SIGKILL to pid");
    assert!(term.contains("throttling did not bring it down: GPU 0 at "), "{term}");
    // Said in the round that condemned it, before the offence is acted on.
    assert!(logged(&mut watch, "stopped throttling workload long ("), "{}", watch.log.join("\n"));
    assert_eq!(wait_status(&status), 128 + 9, "gpu_workload died of SIGKILL (the offence's freeze undone once it was sent)");
    let r = sim.row("long");
    assert_eq!(r["enforcement"]["action"], "killed", "{r:#}");
    assert!(r["enforcement"]["reason"].as_str().unwrap().starts_with("throttling did not bring it down"), "{r:#}");
    assert!(!frozen(r["id"].as_str().unwrap()), "thawed");
    eprintln!("the watch's figures while throttling:\n  {}", figures(&mut watch).join("\n  "));
    std::fs::write(done, b"").unwrap();
    assert!(child.wait_with_output().unwrap().status.success());
}

#[test]
fn a_stopped_watch_thaws_and_clears_and_after_a_crashed_one_reconcile_does() {
    let _serial = serial();
    workload_bin();
    let sim = Sim::new(TWO_GPUS);
    sim.write_vgpu_config(&config(&sim, "throttle"));
    let (script, _status, done) = bypassing(&sim, "40", "2000");
    let child = run(&sim, &["--name", "cycled", "--mem", "1G", "--compute", "30"], &["sh", "-c", &script]);
    let id = id_of(&sim, "cycled");

    // SIGTERM: the watch thaws it and clears its record itself.
    let mut watch = Watch::start(&sim, &[]);
    line(&mut watch, "throttling workload cycled (");
    wait_for("the watch to freeze it", || frozen(&id));
    watch.signal(libc::SIGTERM);
    line(&mut watch, &format!("stopped throttling workload cycled ({id}): vgpu watch is stopping"));
    line(&mut watch, "vgpu watch: stopped");
    drop(watch);
    assert!(!frozen(&id), "left frozen by a stopped watch");
    assert!(record(&sim, &id)["enforcement"].is_null(), "{:#}", record(&sim, &id));

    // SIGKILL, caught while the cgroup is frozen: nothing cleaned up ...
    let mut watch = Watch::start(&sim, &[]);
    line(&mut watch, "throttling workload cycled (");
    wait_for("the watch to be stopped with the cgroup frozen", || {
        if !frozen(&id) {
            return false;
        }
        watch.signal(libc::SIGSTOP);
        if frozen(&id) {
            return true;
        }
        watch.signal(libc::SIGCONT);
        false
    });
    watch.signal(libc::SIGKILL);
    drop(watch);
    assert!(frozen(&id));
    assert_eq!(record(&sim, &id)["enforcement"]["action"], "throttled");
    // ... until the next command reconciles: thawed and no longer recorded throttled.
    let out = sim.vgpu(&["ps", "--json"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("is no longer throttled: the vgpu watch that throttled it is gone"), "{stderr}");
    let rows: Vec<Value> = serde_json::from_slice::<Value>(&out.stdout).unwrap()["workloads"].as_array().unwrap().clone();
    let r = rows.iter().find(|w| w["id"] == id.as_str()).unwrap();
    assert!(r["enforcement"].is_null() && r["state"] == "running", "{r:#}");
    assert!(!frozen(&id), "reconcile left it frozen");
    assert!(record(&sim, &id)["enforcement"].is_null());

    std::fs::write(done, b"").unwrap();
    sim.vgpu(&["kill", &id]).assert().success();
    let _ = child.wait_with_output();
}
