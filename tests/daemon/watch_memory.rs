//! `vgpu watch` enforces memory quotas outside the shim (issue 11): a process that escapes
//! the shim (LD_PRELOAD cleared, or glibc's own dlsym) and holds more than its vGPU's quota is
//! killed (SIGKILL with its workload frozen: issue 24) with the reason in its record, `vgpu ps`
//! and the logs; processes in no vGPU are
//! reported (and killed under `unmanaged = "kill"`); a dead supervisor is cleaned up within an
//! interval without any other command. Needs root (cgroups) and the simulated driver.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{wait_for, workload, Sim};
use crate::common::watch::Watch;

const H100: (&str, &str) = ("NVIDIA H100 80GB HBM3", "80GiB");

/// Short rounds, so the tests are quick; a small context allowance (the simulated driver
/// charges no context memory).
const FAST: &str = "[watch]\ninterval = \"200ms\"\ngrace = \"200ms\"\nkill_after = \"3s\"\ncontext_allowance = \"64MiB\"\nlisten = \"\"\n";

/// `vgpu --simulate run ARGS…` in the background, stderr captured.
fn spawn_run(sim: &Sim, args: &[&str]) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vgpu"));
    cmd.arg("--simulate").arg("run").args(args).env_remove("VGPU_SIMULATE");
    for (k, v) in sim.env() {
        cmd.env(k, v);
    }
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn vgpu run")
}

fn finish(mut child: Child) -> (i32, String) {
    let status = child.wait().expect("wait");
    let mut err = String::new();
    child.stderr.take().expect("stderr").read_to_string(&mut err).expect("read stderr");
    (status.code().unwrap_or(-1), err)
}

fn wait_file(path: &Path) {
    wait_for(&format!("{} to exist", path.display()), || path.exists());
}

/// The one workload's `vgpu ps --json` row.
fn ps_row(sim: &Sim) -> serde_json::Value {
    let rows = sim.json(&["ps", "--json"])["workloads"].clone();
    assert_eq!(rows.as_array().map(Vec::len), Some(1), "{rows}");
    rows[0].clone()
}

/// A workload whose shell starts `escape` (a gpu_workload that escapes the shim and holds
/// 3 GiB on a 1 GiB vGPU), writes its exit status to `status`, and then waits for `go`
/// before it ends, so the test can look at `vgpu ps` while the workload still runs.
fn escaped_workload(sim: &Sim, escape: &str, flag: &str) -> (Child, PathBuf, PathBuf, PathBuf) {
    let dir = sim.path("");
    let (ready, status, go) = (dir.join("ready"), dir.join("status"), dir.join("go"));
    let bin = workload::workload_bin().display().to_string();
    let script = format!(
        "{escape} {bin} idle 60 --alloc-mib 3072 {flag} --ready {r}; echo $? > {s}.tmp && mv {s}.tmp {s}; while [ ! -e {g} ]; do sleep 0.05; done",
        r = ready.display(),
        s = status.display(),
        g = go.display()
    );
    let run = spawn_run(sim, &["--name", "escapee", "--mem", "1G", "--", "sh", "-c", &script]);
    (run, ready, status, go)
}

/// The escaped process is killed (its workload's first offence: SIGKILL, the workload
/// frozen meanwhile), with the reason in the log, the record (`ps`) and `vgpu run`'s last
/// words.
fn escaped_process_is_killed(escape: &str, flag: &str) {
    let sim = Sim::new(&[H100]);
    sim.write_vgpu_config(FAST);
    let mut watch = Watch::start(&sim, &[]);
    let (run, ready, status, go) = escaped_workload(&sim, escape, flag);
    wait_file(&ready); // the 3 GiB are held: the shim did not stop it
    let line = watch.wait_line("the SIGKILL", |l| l.contains("SIGKILL to pid"));
    assert!(
        line.contains("of workload escapee (") && line.contains("over memory quota on GPU 0: 3 GiB of 1 GiB, 3 GiB not counted by the shim"),
        "{line}"
    );
    wait_file(&status);
    let code = std::fs::read_to_string(&status).expect("status");
    assert_eq!(code.trim(), "137", "killed by SIGKILL (128 + 9)");
    let row = ps_row(&sim);
    assert_eq!(row["enforcement"]["action"], "killed", "{row}");
    assert!(row["enforcement"]["reason"].as_str().unwrap_or("").starts_with("over memory quota on GPU 0: 3 GiB of 1 GiB"), "{row}");
    let table = String::from_utf8(sim.vgpu(&["ps"]).output().expect("ps").stdout).expect("utf-8");
    assert!(table.contains("killed: over memory quota"), "{table}");
    std::fs::write(&go, b"").expect("go");
    let (code, err) = finish(run);
    assert_eq!(code, 0, "the workload's shell itself ended normally: {err}");
    assert!(err.contains("vgpu: vgpu watch killed pid") && err.contains("over memory quota on GPU 0"), "{err}");
    assert_eq!(watch.stop().code(), Some(0));
}

#[test]
fn a_process_that_clears_ld_preload_and_passes_its_quota_is_killed() {
    escaped_process_is_killed("env -u LD_PRELOAD", "");
}

#[test]
fn a_process_that_calls_glibcs_own_dlsym_and_passes_its_quota_is_killed() {
    escaped_process_is_killed("", "--real-dlsym");
}

#[test]
fn without_the_escape_the_shim_refuses_and_the_watch_has_nothing_to_do() {
    // The control case of the two above: the same allocation through the shim is refused,
    // so what the watch kills there is exactly what escaped.
    let sim = Sim::new(&[H100]);
    sim.write_vgpu_config(FAST);
    let mut watch = Watch::start(&sim, &[]);
    let bin = workload::workload_bin().display().to_string();
    let out = sim.vgpu(&["run", "--mem", "1G", "--", &bin, "idle", "1", "--alloc-mib", "3072"]).output().expect("run");
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cuMemAlloc failed: 2 (CUDA_ERROR_OUT_OF_MEMORY)"), "{err}");
    watch.drain();
    assert!(!watch.log.iter().any(|l| l.contains("SIGTERM") || l.contains("SIGKILL")), "{:?}", watch.log);
}

/// The simulated driver's library directory (made by the watch's `--simulate`), for a
/// process started without vgpu.
fn driver_env(sim: &Sim, cmd: &mut Command) {
    for (k, v) in sim.env() {
        cmd.env(k, v);
    }
    cmd.env("LD_LIBRARY_PATH", sim.path("run/simulate")).env_remove("LD_PRELOAD");
}

#[test]
fn processes_in_no_vgpu_are_reported_then_killed_under_the_kill_policy() {
    let sim = Sim::new(&[H100, H100]);
    let config = sim.write_vgpu_config(FAST);
    let mut watch = Watch::start(&sim, &[]);
    let bin = workload::workload_bin().display().to_string();
    // A vGPU on GPU 0 only.
    let held = sim.path("held");
    let run = spawn_run(&sim, &["--gpu", "0", "--mem", "1G", "--", &bin, "idle", "60", "--alloc-mib", "100", "--ready", &held.display().to_string()]);
    wait_file(&held);
    // Outside vgpu: one process on GPU 0 (which hosts a vGPU), one on GPU 1 (which does not).
    let start_outside = |device: &str, ready: &Path| {
        let mut cmd = Command::new(&bin);
        cmd.args(["idle", "60", "--alloc-mib", "200", "--device", device, "--ready", &ready.display().to_string()]);
        driver_env(&sim, &mut cmd);
        let child = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("spawn");
        wait_file(ready);
        child
    };
    let mut on_0 = start_outside("0", &sim.path("outside0"));
    let mut on_1 = start_outside("1", &sim.path("outside1"));
    let line = watch.wait_line("the unmanaged report", |l| l.contains("unmanaged process"));
    assert!(line.contains(&format!("pid {} (", on_0.id())) && line.contains("uses GPU 0 outside every vGPU, holding 200 MiB"), "{line}");
    // Reported once, and not killed under "report"; the one on GPU 1 is none of its business.
    watch.wait_rounds(3);
    let reports: Vec<&String> = watch.log.iter().filter(|l| l.contains("unmanaged process")).collect();
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert!(on_0.try_wait().expect("try_wait").is_none(), "not killed under report");
    // Under "kill", after a SIGHUP.
    std::fs::write(&config, format!("{FAST}unmanaged = \"kill\"\n")).expect("config");
    watch.signal(libc::SIGHUP);
    watch.wait_line("the reload", |l| l.contains("reloaded the config"));
    let line = watch.wait_line("the SIGTERM", |l| l.contains(&format!("SIGTERM to pid {} of no vGPU", on_0.id())));
    assert!(line.contains("in no vGPU on GPU 0, which hosts vGPUs"), "{line}");
    let status = on_0.wait().expect("wait");
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGTERM));
    watch.wait_rounds(2);
    assert!(on_1.try_wait().expect("try_wait").is_none(), "GPU 1 hosts no vGPU: left alone");
    assert!(!watch.log.iter().any(|l| l.contains(&format!("pid {} ", on_1.id()))), "{:?}", watch.log);
    on_1.kill().expect("kill");
    on_1.wait().expect("wait");
    sim.vgpu(&["kill", "--signal", "KILL", &first_id(&sim)]).assert().success();
    let (code, err) = finish(run);
    assert_eq!(code, 137, "{err}");
}

fn first_id(sim: &Sim) -> String {
    ps_row(sim)["id"].as_str().expect("id").to_string()
}

#[test]
fn a_dead_supervisor_is_cleaned_up_within_an_interval_without_any_command() {
    let sim = Sim::new(&[H100]);
    sim.write_vgpu_config(FAST);
    let mut watch = Watch::start(&sim, &[]);
    let ready = sim.path("ready");
    let bin = workload::workload_bin().display().to_string();
    let mut run = spawn_run(&sim, &["--name", "orphan", "--mem", "1G", "--", &bin, "idle", "600", "--alloc-mib", "64", "--ready", &ready.display().to_string()]);
    wait_file(&ready);
    let id = first_id(&sim);
    let record = sim.path(&format!("run/workloads/{id}.json"));
    assert!(record.exists());
    // The supervisor dies; no vgpu command runs from here on.
    run.kill().expect("SIGKILL vgpu run");
    run.wait().expect("wait");
    let killed = Instant::now();
    let line = watch.wait_line("the clean-up", |l| l.contains("cleaned up workload orphan"));
    let took = killed.elapsed();
    eprintln!("cleaned up {took:?} after the supervisor died (interval 200ms)");
    assert!(line.contains("its supervisor") && line.contains("died"), "{line}");
    assert!(!record.exists(), "record removed");
    assert!(!sim.path(&format!("run/vgpus/{id}")).exists(), "vGPU removed");
    // Its process went with its cgroup, and the driver got its memory back.
    let devices = sim.json(&["devices", "--json"])["gpus"].clone();
    assert_eq!(devices[0]["memory_used_bytes"], 0, "{devices}");
    assert!(took < Duration::from_secs(5), "took {took:?}: more than 25 rounds");
}

/// The tenant owns its usage file: a workload that zeroes the shim's shared counter gets
/// past its quota through the shim itself. The driver's figures still say what it holds.
#[test]
fn a_tampered_usage_file_does_not_hide_memory_from_the_watch() {
    let sim = Sim::new(&[H100]);
    sim.write_vgpu_config(FAST);
    let mut watch = Watch::start(&sim, &[]);
    let bin = workload::workload_bin().display().to_string();
    let (a, b, tampered) = (sim.path("a"), sim.path("b"), sim.path("tampered"));
    let script = format!(
        "{bin} idle 60 --alloc-mib 800 --ready {a} & while [ ! -e {t} ]; do sleep 0.05; done; {bin} idle 60 --alloc-mib 800 --ready {b} & wait",
        a = a.display(),
        b = b.display(),
        t = tampered.display()
    );
    let run = spawn_run(&sim, &["--name", "forger", "--mem", "1G", "--", "sh", "-c", &script]);
    wait_file(&a);
    watch.wait_rounds(2);
    assert!(!watch.log.iter().any(|l| l.contains("SIGKILL")), "800 MiB of 1 GiB is within: {:?}", watch.log);
    // What the tenant can do to its own file: zero the shared counter of device 0.
    let id = first_id(&sim);
    let usage = sim.path(&format!("run/vgpus/{id}/usage"));
    let offset = std::mem::size_of::<vgpu_abi::layout::UsageHeader>() + std::mem::offset_of!(vgpu_abi::layout::DeviceRecord, used_bytes);
    let file = std::fs::OpenOptions::new().write(true).open(&usage).expect("open usage");
    std::os::unix::fs::FileExt::write_all_at(&file, &0u64.to_ne_bytes(), offset as u64).expect("zero the counter");
    std::fs::write(&tampered, b"").expect("tampered");
    wait_file(&b); // the shim let the second 800 MiB through: it believed 0 B were used
    let first = watch.wait_line("a SIGKILL", |l| l.contains("SIGKILL to pid"));
    assert!(first.contains("over memory quota on GPU 0: 1.56 GiB of 1 GiB") && first.contains("(its counter was changed?)"), "{first}");
    let second = watch.wait_line("the second SIGKILL", |l| l.contains("SIGKILL to pid"));
    assert_ne!(first, second, "both holders: neither escaped the shim, so neither is the one to blame");
    let (code, err) = finish(run);
    assert_eq!(code, 0, "the shell's `wait` returned once both were killed: {err}");
    assert!(err.contains("vgpu: vgpu watch killed pid"), "{err}");
}

/// Preempted work comes back when the blocks free up, with the watch alone: the preemptor's
/// supervisor dies, and no command runs afterwards.
#[test]
fn preempted_work_resumes_when_its_preemptor_dies_without_any_command() {
    let sim = Sim::new(&[("NVIDIA L4", "24GiB")]);
    sim.write_vgpu_config(&format!(
        "[pool.tflops]\n\"NVIDIA L4\" = 0.5\n\n[[pool.device]]\nkind = \"npu\"\nname = \"sim-npu\"\ntflops = 10\n\n{FAST}"
    ));
    let mut watch = Watch::start(&sim, &[]);
    let counter = sim.path("counter");
    let script = format!("i=0; while :; do i=$((i+1)); echo $i > {}; done", counter.display());
    let mut low = spawn_run(&sim, &["--tflops", "8", "--kind", "npu", "--priority", "10", "--name", "low", "--", "sh", "-c", &script]);
    let read = || std::fs::read_to_string(&counter).ok().and_then(|s| s.trim().parse::<u64>().ok()).unwrap_or(0);
    wait_for("low to make progress", || read() > 100);
    let marker = sim.path("high-running");
    let touch = format!("touch {}; sleep 600", marker.display());
    let mut high = spawn_run(&sim, &["--tflops", "5", "--kind", "npu", "--priority", "90", "--name", "high", "--", "sh", "-c", &touch]);
    wait_file(&marker);
    let rows = sim.json(&["ps", "--json"])["workloads"].clone();
    assert!(rows.as_array().expect("rows").iter().any(|w| w["name"] == "low" && w["state"] == "suspended"), "{rows}");
    // From here on, no vgpu command: the preemptor's supervisor dies.
    high.kill().expect("SIGKILL high's vgpu run");
    high.wait().expect("wait");
    watch.wait_line("the clean-up of high", |l| l.contains("cleaned up workload high"));
    assert!(watch.log.iter().any(|l| l.contains("resumed low")), "the blocks went back to low: {:?}", watch.log);
    let at = read();
    wait_for("low to make progress again", || read() > at + 100);
    low.kill().expect("SIGKILL low's vgpu run");
    low.wait().expect("wait");
    watch.wait_line("the clean-up of low", |l| l.contains("cleaned up workload low"));
}

/// `vgpu doctor` says whether a watch runs for the state directory (quotas are otherwise
/// only the shim's).
#[test]
fn doctor_says_whether_the_watch_runs() {
    let sim = Sim::new(&[H100]);
    sim.write_vgpu_config(FAST);
    let check = || -> serde_json::Value {
        let out = sim.vgpu(&["doctor", "--json"]).output().expect("doctor");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("doctor JSON");
        report["checks"].as_array().expect("checks").iter().find(|c| c["name"] == "vgpu watch").expect("a vgpu watch check").clone()
    };
    assert_eq!(check()["status"], "warn");
    let watch = Watch::start(&sim, &[]);
    let c = check();
    assert_eq!(c["status"], "ok", "{c}");
    assert_eq!(c["detail"], format!("running (pid {})", watch.pid()), "{c}");
    assert_eq!(watch.stop().code(), Some(0));
    let c = check();
    assert_eq!(c["status"], "warn", "{c}");
    assert!(c["fix"].as_str().unwrap_or("").contains("vgpu-watch.service"), "{c}");
}
