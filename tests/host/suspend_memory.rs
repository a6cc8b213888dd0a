//! Suspension that releases device memory (the CUDA checkpoint API of the simulated
//! driver): `vgpu suspend`/`resume`, pool preemption, the fallback to the freezer, and
//! recovery when vgpu is killed half-way.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::Duration;

use crate::common::{wait_for, workload, Sim};

const GIB: u64 = 1 << 30;

/// One 24 GiB L4 worth 10 TFLOPS of pool blocks, with or without the checkpoint API.
fn l4(checkpoint: bool) -> Sim {
    l4_copying(checkpoint, 25.0)
}

/// [`l4`] whose driver copies checkpointed memory at `gbps` GB/s.
fn l4_copying(checkpoint: bool, gbps: f64) -> Sim {
    let sim = Sim::with_config(&format!("checkpoint = {checkpoint}\ncheckpoint_gbps = {gbps}\n\n[[device]]\nname = \"NVIDIA L4\"\nmemory = \"24GiB\"\n"));
    sim.write_vgpu_config("[pool.tflops]\n\"NVIDIA L4\" = 10\n");
    sim
}

/// A `vgpu run` of the GPU workload program, killed with its workload when dropped.
struct Workload<'s> {
    sim: &'s Sim,
    name: String,
    child: Option<Child>,
    progress: PathBuf,
    stop: PathBuf,
    /// Its `vgpu run`'s stderr so far (a thread reads it as it comes).
    said: std::sync::Arc<std::sync::Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl<'s> Workload<'s> {
    /// `vgpu run RUN_ARGS --name NAME -- gpu_workload SHAPE 600 WORKLOAD_ARGS`, once it
    /// has allocated its memory and made `steps` steps (it writes its progress after each).
    fn start(sim: &'s Sim, name: &str, run_args: &[&str], shape: &str, workload_args: &[&str], steps: u64) -> Workload<'s> {
        let bin = workload::workload_bin().display().to_string();
        let (progress, stop, ready) = (sim.path(&format!("{name}.progress")), sim.path(&format!("{name}.stop")), sim.path(&format!("{name}.ready")));
        let mut args = vec!["run", "--name", name];
        args.extend_from_slice(run_args);
        let (progress_arg, stop_arg, ready_arg) = (progress.display().to_string(), stop.display().to_string(), ready.display().to_string());
        args.extend_from_slice(&["--", &bin, shape, "600", "--progress", &progress_arg, "--stop", &stop_arg, "--ready", &ready_arg]);
        args.extend_from_slice(workload_args);
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_vgpu"));
        cmd.arg("--simulate").args(&args).stdout(Stdio::null()).stderr(Stdio::piped());
        for (k, v) in sim.env() {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn vgpu run");
        let said = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let (pipe, into) = (child.stderr.take().expect("stderr"), said.clone());
        let reader = std::thread::spawn(move || {
            for line in std::io::BufRead::lines(std::io::BufReader::new(pipe)).map_while(Result::ok) {
                let mut said = into.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                said.push_str(&line);
                said.push('\n');
            }
        });
        let w = Workload { sim, name: name.to_string(), child: Some(child), progress, stop, said, reader: Some(reader) };
        wait_for(&format!("{name} to allocate its memory"), || ready.exists());
        wait_for(&format!("{name} to make {steps} steps"), || w.steps() >= steps);
        w
    }

    fn steps(&self) -> u64 {
        std::fs::read_to_string(&self.progress).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
    }

    /// Wait until it makes `more` steps beyond what it has made now.
    fn wait_progress(&self, more: u64) {
        let at = self.steps();
        wait_for(&format!("{} to make progress", self.name), || self.steps() >= at + more);
    }

    /// Make no step for a while (frozen or locked). An absence has no event to wait on: a
    /// workload that runs makes a step every 100 µs, so 300 ms is thousands of chances.
    fn assert_stopped(&self) {
        let at = self.steps();
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(self.steps(), at, "{} kept running", self.name);
    }

    /// Wait until its `vgpu run` has said `what` (on its stderr).
    fn wait_said(&self, what: &str) {
        wait_for(&format!("{}'s vgpu run to say {what:?}", self.name), || self.said.lock().unwrap_or_else(std::sync::PoisonError::into_inner).contains(what));
    }

    /// Ask it to end, and return its `vgpu run`'s exit code and stderr.
    fn finish(mut self) -> (Option<i32>, String) {
        std::fs::write(&self.stop, "").expect("stop file");
        let mut child = self.child.take().expect("running");
        let status = child.wait().expect("wait");
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        let said = self.said.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        (status.code(), said)
    }

    fn row(&self) -> serde_json::Value {
        self.sim.row(&self.name)
    }
}

impl Drop for Workload<'_> {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = self.sim.vgpu(&["kill", "--signal", "KILL", &self.name]).output();
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Device memory in use on GPU 0, as NVML says.
fn used(sim: &Sim) -> u64 {
    sim.json(&["devices", "--json"])["gpus"][0]["memory_used_bytes"].as_u64().expect("memory_used_bytes")
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The measured case: `low` (priority 1, 8 of 10 TFLOPS, so 80 % of the memory)
/// holds 16 GiB; `high` (priority 5, 5 TFLOPS, 50 %) needs 10 GiB. With the checkpoint
/// API, low's memory leaves the GPU, high runs to completion, and low resumes with its
/// allocation intact (it frees it at the end: a lost one fails its run).
#[test]
fn preemption_moves_the_victims_memory_to_the_host_and_back() {
    let sim = l4(true);
    let low = Workload::start(&sim, "low", &["--tflops", "8", "--priority", "1"], "sync", &["--alloc-mib", "16384"], 50);
    assert_eq!(low.row()["gpus"][0]["memory_quota_bytes"].as_u64(), Some(24 * GIB * 8 / 10));
    assert_eq!(used(&sim), 16 * GIB);

    let high = Workload::start(&sim, "high", &["--tflops", "5", "--priority", "5"], "idle", &["--alloc-mib", "10240"], 1);
    let row = low.row();
    assert_eq!(
        (row["state"].as_str(), row["suspended_reason"].as_str(), row["suspended_by"]["name"].as_str(), row["suspended_memory"].as_str()),
        (Some("suspended"), Some("preempted"), Some("high"), Some("host")),
        "{row}"
    );
    assert_eq!(used(&sim), 10 * GIB, "only high's memory is on the GPU");
    low.assert_stopped();
    let table = String::from_utf8_lossy(&sim.vgpu(&["ps"]).output().expect("ps").stdout).into_owned();
    assert!(table.contains("preempted by high; memory on host"), "{table}");

    low.wait_said(") is suspended: ");
    let (code, err) = high.finish();
    assert_eq!(code, Some(0), "high ran to completion: {err}");
    wait_for("low to resume", || low.row()["state"] == "running");
    low.wait_progress(50);
    assert_eq!(low.row()["suspended_memory"], serde_json::Value::Null);
    assert_eq!(used(&sim), 16 * GIB, "low's memory is back on the GPU");
    let (code, err) = low.finish();
    assert_eq!(code, Some(0), "low's allocation came back intact: {err}");
    // The victim's own terminal was told, with why and by whom, and when it ran again
    // (issue 29: it used to be told nothing, the preemptor's terminal everything).
    let id = err.split(" (").nth(1).and_then(|s| s.split(')').next()).unwrap_or("?").to_string();
    assert!(
        err.contains(&format!("vgpu: low ({id}) is suspended: preempted by high, which has a higher priority in the compute pool; it resumes when there is room")),
        "{err}"
    );
    assert!(err.contains(&format!("vgpu: low ({id}) is resumed after ")) && err.contains(" s: it runs again"), "{err}");
    assert!(err.find("is suspended") < err.find("is resumed"), "{err}");
}

/// Without the API (a driver older than 570), a frozen victim keeps its memory: high is
/// refused before anyone is frozen, and says why.
#[test]
fn without_the_api_the_request_is_refused_before_anyone_is_frozen() {
    let sim = l4(false);
    let low = Workload::start(&sim, "low", &["--tflops", "8", "--priority", "1"], "sync", &["--alloc-mib", "16384"], 50);
    let bin = workload::workload_bin().display().to_string();
    let out = sim
        .vgpu(&["run", "--tflops", "5", "--priority", "5", "--name", "high", "--", &bin, "idle", "1", "--alloc-mib", "10240"])
        .env("VGPU_TEST_STOP_AT", "preempt:frozen")
        .output()
        .expect("run high");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "refused, not killed at the stop point: {err}");
    assert!(err.contains("but not the memory (a suspended workload keeps its GPU memory here: the driver has no checkpoint API") && err.contains("nobody was suspended"), "{err}");
    assert_eq!(low.row()["state"], "running");
    low.wait_progress(50);
    assert_eq!(used(&sim), 16 * GIB);
}

/// `vgpu suspend` of a workload allocating and freeing in a loop: its memory leaves the
/// GPU, it stops, and after `vgpu resume` it goes on allocating.
#[test]
fn suspend_while_allocating_in_a_loop() {
    let sim = l4(true);
    let w = Workload::start(&sim, "churn", &["--mem", "8G"], "churn", &["--churn-mib", "1024", "--alloc-mib", "2048"], 20);
    let out = sim.vgpu(&["suspend", "churn"]).output().expect("suspend");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("its device memory is in host memory"), "{}", stdout(&out));
    assert_eq!(w.row()["suspended_memory"], "host");
    assert_eq!(used(&sim), 0, "nothing of it is left on the GPU");
    w.assert_stopped();
    // Its own vgpu run looks at its record every 250 ms: told before it is resumed.
    w.wait_said(") is suspended: ");
    let out = sim.vgpu(&["resume", "churn"]).output().expect("resume");
    assert!(out.status.success(), "{}", stderr(&out));
    w.wait_progress(20);
    assert!(used(&sim) >= 2 * GIB);
    let (code, err) = w.finish();
    assert_eq!(code, Some(0), "{err}");
    // Its own vgpu run said both, and who suspended it.
    assert!(err.contains(") is suspended: by root with vgpu suspend (`vgpu resume ") && err.contains(") is resumed after "), "{err}");
}

/// A workload with no CUDA context had no device memory to move: `vgpu suspend` says it
/// froze it, not that its memory went to host memory (issue 29, edge 13).
#[test]
fn suspending_a_workload_with_no_cuda_context_says_so() {
    let sim = l4(true);
    let mut run = sim.spawn_running("plain", &["--mem", "1G"], "exec sleep 600");
    let out = sim.vgpu(&["suspend", "plain"]).output().expect("suspend");
    assert!(out.status.success(), "{}", stderr(&out));
    let said = stdout(&out);
    assert!(said.contains(": frozen; it has no CUDA context, so no device memory to move"), "{said}");
    assert!(!said.contains("host memory"), "{said}");
    sim.vgpu(&["kill", "--signal", "KILL", "plain"]).assert().success();
    run.wait().expect("wait");
}

/// While suspended, its memory is free for others; `vgpu resume` refuses until it fits
/// back, and `--wait` waits for that.
#[test]
fn resume_waits_until_the_memory_fits_back() {
    let sim = l4(true);
    let first = Workload::start(&sim, "first", &["--mem", "16G"], "idle", &["--alloc-mib", "12288"], 1);
    assert!(sim.vgpu(&["suspend", "first"]).output().expect("suspend").status.success());
    // 16 GiB of 24 are first's, but on the host: 12 GiB more fit.
    let second = Workload::start(&sim, "second", &["--mem", "12G"], "idle", &["--alloc-mib", "8192"], 1);
    let out = sim.vgpu(&["resume", "first"]).output().expect("resume");
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("do not fit back yet") && err.contains("held by workload second") && err.contains("--wait"), "{err}");
    assert_eq!(first.row()["state"], "suspended");

    let mut waiting = std::process::Command::new(env!("CARGO_BIN_EXE_vgpu"));
    waiting.args(["--simulate", "resume", "--wait", "first"]).envs(sim.env()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut waiting = waiting.spawn().expect("resume --wait");
    // Its first line says it waits (and why); only then does second end.
    let mut lines = BufReader::new(waiting.stderr.take().expect("stderr")).lines();
    let line = lines.next().expect("a line").expect("read");
    assert!(line.contains("waiting to resume first") && line.contains("held by workload second"), "{line}");
    let (code, err) = second.finish();
    assert_eq!(code, Some(0), "{err}");
    let status = waiting.wait().expect("wait");
    assert!(status.success(), "{:?}", lines.map_while(Result::ok).collect::<Vec<_>>());
    assert_eq!(first.row()["state"], "running");
    assert_eq!(used(&sim), 12 * GIB);
    let (code, err) = first.finish();
    assert_eq!(code, Some(0), "{err}");
}

/// Where the driver refuses (here: a lock that times out on a long kernel) or lacks the
/// API, the workload is frozen with its memory held, and `ps` says so and why.
#[test]
fn falls_back_to_the_freezer_and_says_why() {
    let sim = l4(true);
    sim.write_vgpu_config("[suspend]\nlock_timeout = \"100ms\"\n");
    // Two steps of 0.5 s kernels: from then on a kernel is (all but always) queued.
    let w = Workload::start(&sim, "long", &["--mem", "4G"], "sync", &["--alloc-mib", "1024", "--kernel-us", "500000"], 2);
    let out = sim.vgpu(&["suspend", "long"]).output().expect("suspend");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("frozen, its device memory held on the GPU (cuCheckpointProcessLock"), "{}", stdout(&out));
    let row = w.row();
    assert_eq!(row["suspended_memory"], "device", "{row}");
    assert!(row["suspended_memory_why"].as_str().unwrap_or("").contains("CUDA_ERROR_NOT_READY"), "{row}");
    assert_eq!(used(&sim), GIB, "its memory stayed");
    assert!(sim.vgpu(&["resume", "long"]).output().expect("resume").status.success());
    drop(w);

    let old = l4(false);
    let w = Workload::start(&old, "old", &["--mem", "4G"], "idle", &["--alloc-mib", "1024"], 1);
    let out = old.vgpu(&["suspend", "old"]).output().expect("suspend");
    assert!(stdout(&out).contains("the driver has no checkpoint API"), "{}", stdout(&out));
    assert_eq!(w.row()["suspended_memory"], "device");
    assert_eq!(used(&old), GIB);
}

/// `vgpu suspend` killed at each step: the next command's reconcile finds its intent and
/// undoes the suspension — the processes restored and unlocked, the cgroup thawed.
#[test]
fn a_suspend_killed_at_any_step_is_undone() {
    let sim = l4(true);
    let w = Workload::start(&sim, "victim", &["--mem", "4G"], "sync", &["--alloc-mib", "2048"], 20);
    for stop in ["suspend:locked", "suspend:checkpointed", "suspend:frozen"] {
        let out = sim.vgpu(&["suspend", "victim"]).env("VGPU_TEST_STOP_AT", stop).output().expect("suspend");
        assert_eq!(out.status.code(), None, "killed at {stop}: {}", stderr(&out));
        // `ps` as root reconciles first.
        let row = w.row();
        assert_eq!(row["state"], "running", "after {stop}: {row}");
        w.wait_progress(20);
        assert_eq!(used(&sim), 2 * GIB, "after {stop}: its memory is back");
    }
    let (code, err) = w.finish();
    assert_eq!(code, Some(0), "{err}");
}

/// A preemption whose `vgpu run` is killed after suspending the victim: the victim is
/// restored and runs again.
#[test]
fn a_preemption_killed_half_way_restores_the_victim() {
    let sim = l4(true);
    let low = Workload::start(&sim, "low", &["--tflops", "8", "--priority", "1"], "sync", &["--alloc-mib", "16384"], 20);
    let bin = workload::workload_bin().display().to_string();
    let out = sim
        .vgpu(&["run", "--tflops", "5", "--priority", "5", "--name", "high", "--", &bin, "idle", "1"])
        .env("VGPU_TEST_STOP_AT", "preempt:frozen")
        .output()
        .expect("run high");
    assert_eq!(out.status.code(), None, "killed at the stop point: {}", stderr(&out));
    assert_eq!(low.row()["state"], "running");
    low.wait_progress(20);
    assert_eq!(used(&sim), 16 * GIB);
    let (code, err) = low.finish();
    assert_eq!(code, Some(0), "{err}");
}

/// `vgpu -v ARGS` killed (SIGKILL) once it logs a line containing `at`: here, inside the
/// driver's copy of a checkpoint or a restore, which lasts about 2 s.
fn kill_when(sim: &Sim, args: &[&str], at: &str) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_vgpu"));
    cmd.args(["--simulate", "-v"]).args(args).envs(sim.env()).stdout(Stdio::null()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn vgpu");
    let lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let mut seen = Vec::new();
    for line in lines.map_while(Result::ok) {
        if line.contains(at) {
            child.kill().expect("SIGKILL");
            let _ = child.wait();
            return;
        }
        seen.push(line);
    }
    let status = child.wait().expect("wait");
    panic!("vgpu {args:?} ended ({status}) without logging {at:?}: {seen:?}");
}

/// SIGKILL of vgpu inside the driver's checkpoint copy, then inside its restore copy: the
/// driver finishes (or undoes) its own copy, and the next command's reconcile, from the
/// intent, restores and unlocks the workload (a suspend is undone, a resume finished).
#[test]
fn vgpu_killed_during_the_drivers_copy() {
    let sim = l4_copying(true, 2.0);
    let w = Workload::start(&sim, "big", &["--mem", "8G"], "sync", &["--alloc-mib", "4096"], 20);
    kill_when(&sim, &["suspend", "big"], "checkpointing process");
    let row = w.row();
    assert_eq!((row["state"].as_str(), &row["suspended_memory"]), (Some("running"), &serde_json::Value::Null), "{row}");
    w.wait_progress(20);
    assert_eq!(used(&sim), 4 * GIB, "its memory is back on the GPU");

    let out = sim.vgpu(&["suspend", "big"]).output().expect("suspend");
    assert!(stdout(&out).contains("in host memory"), "{}", stderr(&out));
    assert_eq!(used(&sim), 0);
    kill_when(&sim, &["resume", "big"], "restoring process");
    let row = w.row();
    assert_eq!(row["state"], "running", "the resume is finished: {row}");
    w.wait_progress(20);
    assert_eq!(used(&sim), 4 * GIB);
    let (code, err) = w.finish();
    assert_eq!(code, Some(0), "its allocation survived both: {err}");
}
