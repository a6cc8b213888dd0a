//! `vgpu watch`'s compute audit end to end: the real binary, the shim and the simulated
//! driver (whose per-process NVML utilization is exact, from its timeline), as root with
//! real cgroups. A workload whose process clears `LD_PRELOAD` escapes the shim's compute
//! governor; the watch sees its NVML share above its share while the shim's ledger sees
//! nothing, and throttles it with the freezer to its share (while a shim-governed workload
//! within its share is left alone), kills it under `compute = "kill"` or when throttling
//! cannot bring it down, and undoes its throttling when it stops — or, after it was
//! SIGKILLed, the next command's reconcile does.
//!
//! Each test synchronises on the watch's log lines and the workloads' files. The workloads
//! run 2 ms kernels in `sync` (one launch, one synchronize): the GPU share a window of
//! gpu_workload's report shows is its kernels × 2 ms ÷ the window, which is what the
//! throttle must hold to the share, whatever the load of the machine. The tests run one at
//! a time (each keeps a simulated GPU busy for seconds; together they would starve the
//! workloads of CPU on a small machine and change what they measure).

mod common;
#[path = "support/process.rs"]
mod process;
#[path = "support/workload.rs"]
mod workload;

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use common::{wait_for, Sim};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;
use vgpu::cgroup::{Cgroup, FreezerState, Layout};
use workload::workload_bin;

const TWO_GPUS: &[(&str, &str)] = &[("NVIDIA H100-sim", "80GiB"), ("NVIDIA H100-sim", "80GiB")];
const KERNEL_MS: f64 = 2.0;
const WINDOW_MS: f64 = 500.0;

/// One test at a time (see the module's documentation).
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn config(policy: &str) -> String {
    format!("[watch]\ninterval = \"200ms\"\ncompute_window = \"1s\"\ncompute = \"{policy}\"\nkill_after = \"2s\"\nlisten = \"\"\n")
}

/// `vgpu watch` in the background, its log (stderr, with the debug lines) in a file.
struct Watch {
    child: Child,
    log: PathBuf,
}

impl Watch {
    fn start(sim: &Sim, name: &str) -> Watch {
        let log = sim.path(&format!("{name}.log"));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vgpu"));
        cmd.args(["--simulate", "watch"]).env_remove("VGPU_SIMULATE").env("VGPU_LOG", "vgpu=debug");
        for (k, v) in sim.env() {
            cmd.env(k, v);
        }
        let child = cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(File::create(&log).unwrap()).spawn().expect("spawn vgpu watch");
        let watch = Watch { child, log };
        watch.wait_line("vgpu watch: ready");
        watch
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The first log line containing `needle`, once there is one.
    fn wait_line(&self, needle: &str) -> String {
        let mut found = None;
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while found.is_none() && std::time::Instant::now() < deadline {
            found = self.text().lines().find(|l| l.contains(needle)).map(str::to_string);
            std::thread::sleep(Duration::from_millis(50));
        }
        found.unwrap_or_else(|| panic!("the watch never logged {needle:?}:\n{}", self.text()))
    }

    /// The figures it logged while throttling (NVML's share, the time let run).
    fn figures(&self) -> Vec<String> {
        self.text().lines().filter_map(|l| l.find("throttling vGPU").map(|at| l[at..].to_string())).collect()
    }

    fn signal(&mut self, signal: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), signal).unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.code().is_some() || signal == Signal::SIGKILL, "vgpu watch ended by {status}: {}", self.text());
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
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

fn ps(sim: &Sim) -> Vec<Value> {
    sim.json(&["ps", "--json"]).as_array().cloned().unwrap_or_default()
}

fn row(sim: &Sim, name: &str) -> Value {
    ps(sim).into_iter().find(|w| w["name"] == name).unwrap_or_else(|| panic!("no workload {name} in ps"))
}

/// The workload's record as it is on disk (read without running vgpu, whose reconcile
/// would change it).
fn record(sim: &Sim, id: &str) -> Value {
    serde_json::from_slice(&std::fs::read(sim.path(&format!("run/workloads/{id}.json"))).unwrap()).unwrap()
}

fn id_of(sim: &Sim, name: &str) -> String {
    let mut id = String::new();
    wait_for(&format!("workload {name} to be recorded running"), || {
        let rows = ps(sim);
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
        "env -u LD_PRELOAD {w} sync {seconds} --kernel-us {kernel_us} >/dev/null; echo $? > {s}; i=0; while [ ! -e {d} ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done",
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
    sim.write_vgpu_config(&config("throttle"));
    let watch = Watch::start(&sim, "watch");
    let shape = ["sync", "8", "--kernel-us", "2000", "--window-ms", "500"];
    let mut bypass_cmd = vec!["env", "-u", "LD_PRELOAD", w()];
    bypass_cmd.extend_from_slice(&shape);
    let mut governed_cmd = vec![w()];
    governed_cmd.extend_from_slice(&shape);
    let bypass = run(&sim, &["--name", "bypass", "--gpu", "0", "--mem", "1G", "--compute", "30"], &bypass_cmd);
    let governed = run(&sim, &["--name", "governed", "--gpu", "1", "--mem", "1G", "--compute", "30"], &governed_cmd);

    // (a) The watch throttles it, says why, and the record shows it.
    let line = watch.wait_line("throttling workload bypass (");
    assert!(line.contains("GPU 0 at ") && line.contains("% by the driver, share 30%, the shim sees 0%"), "{line}");
    let r = row(&sim, "bypass");
    assert_eq!(r["enforcement"]["action"], "throttled", "{r:#}");
    assert_eq!(r["enforcement"]["by"]["pid"], watch.pid(), "{r:#}");
    assert!(r["enforcement"]["reason"].as_str().unwrap().contains("share 30%"), "{r:#}");
    let table = String::from_utf8(sim.vgpu(&["ps"]).output().unwrap().stdout).unwrap();
    assert!(table.contains("throttled: GPU 0 at"), "{table}");

    // (c) The shim holds the other to its share: the watch leaves it alone.
    let g = row(&sim, "governed");
    assert!(g["enforcement"].is_null(), "{g:#}");

    let (bypass, governed) = (windows(bypass), windows(governed));
    assert!(!watch.text().contains("workload governed ("), "the governed workload was acted on:\n{}", watch.text());

    // (b) Its later windows hold its share; the first (before the audit's window ended)
    // did not.
    let later = &bypass[8..bypass.len() - 1];
    let held = later.iter().map(|&k| share(k)).sum::<f64>() / later.len() as f64;
    let first = share(bypass[0]);
    eprintln!("bypassing workload, GPU share per 500 ms window (kernels × 2 ms): {:?}", bypass.iter().map(|&k| share(k).round()).collect::<Vec<_>>());
    eprintln!("governed workload at --compute 30, the same: {:?}", governed.iter().map(|&k| share(k).round()).collect::<Vec<_>>());
    eprintln!("bypassing: first window {first:.0}%, windows 8–{}: {held:.1}% ({:.2} of the first)", bypass.len() - 2, held / first);
    eprintln!("the watch's figures while throttling:\n  {}", watch.figures().join("\n  "));
    assert!(first > 45.0, "unthrottled at first: {first:.0}% ({bypass:?})");
    assert!((20.0..=40.0).contains(&held), "throttled to {held:.1}% of the GPU, share 30 ± 10 ({bypass:?})");
    assert!(held < 0.75 * first, "the rate fell: {held:.1}% vs {first:.1}% at first ({bypass:?})");
}

#[test]
fn under_compute_kill_the_bypassing_process_is_terminated_and_the_reason_recorded() {
    let _serial = serial();
    workload_bin();
    let sim = Sim::new(TWO_GPUS);
    sim.write_vgpu_config(&config("kill"));
    let watch = Watch::start(&sim, "watch");
    let (script, status, done) = bypassing(&sim, "20", "2000");
    let child = run(&sim, &["--name", "killme", "--mem", "1G", "--compute", "30"], &["sh", "-c", &script]);
    let line = watch.wait_line("SIGTERM to pid");
    assert!(line.contains("of workload killme (") && line.contains("over its compute share unseen by the shim: GPU 0 at "), "{line}");
    let pid: u64 = line.split("SIGTERM to pid ").nth(1).and_then(|s| s.split(' ').next()).and_then(|s| s.parse().ok()).unwrap();
    assert_eq!(wait_status(&status), 128 + 15, "gpu_workload died of SIGTERM");
    let r = row(&sim, "killme");
    assert_eq!(r["enforcement"]["action"], "killed", "{r:#}");
    assert!(r["enforcement"]["reason"].as_str().unwrap().starts_with("over its compute share unseen by the shim"), "{r:#}");
    assert_eq!(r["enforcement"]["pids"], serde_json::json!([pid]), "{r:#}");
    assert!(!watch.text().contains("throttling workload"), "kill, not throttle:\n{}", watch.text());
    std::fs::write(done, b"").unwrap();
    assert!(child.wait_with_output().unwrap().status.success());
}

#[test]
fn throttling_that_cannot_hold_long_kernels_escalates_to_a_kill() {
    let _serial = serial();
    workload_bin();
    let sim = Sim::new(TWO_GPUS);
    sim.write_vgpu_config(&config("throttle"));
    let watch = Watch::start(&sim, "watch");
    // 2 s kernels: the GPU runs what was queued before each freeze, so freezing cannot
    // bring the share down.
    let (script, status, done) = bypassing(&sim, "30", "2000000");
    let child = run(&sim, &["--name", "long", "--mem", "1G", "--compute", "30"], &["sh", "-c", &script]);
    watch.wait_line("throttling workload long (");
    let line = watch.wait_line("throttling did not bring it down");
    assert!(line.contains("workload long (") && line.contains("terminating what the shim does not see"), "{line}");
    let term = watch.wait_line("SIGTERM to pid");
    assert!(term.contains("throttling did not bring it down: GPU 0 at "), "{term}");
    watch.wait_line("stopped throttling workload long (");
    assert_eq!(wait_status(&status), 128 + 15, "gpu_workload died of SIGTERM (thawed to act on it)");
    let r = row(&sim, "long");
    assert_eq!(r["enforcement"]["action"], "killed", "{r:#}");
    assert!(r["enforcement"]["reason"].as_str().unwrap().starts_with("throttling did not bring it down"), "{r:#}");
    assert!(!frozen(r["id"].as_str().unwrap()), "thawed");
    eprintln!("the watch's figures while throttling:\n  {}", watch.figures().join("\n  "));
    std::fs::write(done, b"").unwrap();
    assert!(child.wait_with_output().unwrap().status.success());
}

#[test]
fn a_stopped_watch_thaws_and_clears_and_after_a_crashed_one_reconcile_does() {
    let _serial = serial();
    workload_bin();
    let sim = Sim::new(TWO_GPUS);
    sim.write_vgpu_config(&config("throttle"));
    let (script, _status, done) = bypassing(&sim, "40", "2000");
    let child = run(&sim, &["--name", "cycled", "--mem", "1G", "--compute", "30"], &["sh", "-c", &script]);
    let id = id_of(&sim, "cycled");

    // SIGTERM: the watch thaws it and clears its record itself.
    let mut watch = Watch::start(&sim, "first");
    watch.wait_line("throttling workload cycled (");
    wait_for("the watch to freeze it", || frozen(&id));
    watch.signal(Signal::SIGTERM);
    assert!(watch.text().contains(&format!("stopped throttling workload cycled ({id}): vgpu watch is stopping")), "{}", watch.text());
    assert!(!frozen(&id), "left frozen by a stopped watch");
    assert!(record(&sim, &id)["enforcement"].is_null(), "{:#}", record(&sim, &id));

    // SIGKILL, caught while the cgroup is frozen: nothing cleaned up ...
    let mut watch = Watch::start(&sim, "second");
    watch.wait_line("throttling workload cycled (");
    let pid = Pid::from_raw(watch.pid() as i32);
    wait_for("the watch to be stopped with the cgroup frozen", || {
        if !frozen(&id) {
            return false;
        }
        kill(pid, Signal::SIGSTOP).unwrap();
        if frozen(&id) {
            return true;
        }
        kill(pid, Signal::SIGCONT).unwrap();
        false
    });
    watch.signal(Signal::SIGKILL);
    assert!(frozen(&id));
    assert_eq!(record(&sim, &id)["enforcement"]["action"], "throttled");
    // ... until the next command reconciles: thawed and no longer recorded throttled.
    let out = sim.vgpu(&["ps", "--json"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("is no longer throttled: the vgpu watch that throttled it is gone"), "{stderr}");
    let rows: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let r = rows.iter().find(|w| w["id"] == id.as_str()).unwrap();
    assert!(r["enforcement"].is_null() && r["state"] == "running", "{r:#}");
    assert!(!frozen(&id), "reconcile left it frozen");
    assert!(record(&sim, &id)["enforcement"].is_null());

    std::fs::write(done, b"").unwrap();
    sim.vgpu(&["kill", &id]).assert().success();
    let _ = child.wait_with_output();
}
