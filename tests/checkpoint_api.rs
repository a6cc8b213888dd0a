//! vgpu's use of the CUDA checkpoint API (`vgpu_gpu::checkpoint`), against the simulated
//! driver's: a workload's device memory leaves the GPU and comes back; `vgpu doctor` says
//! whether the driver has the API (an older one has not).
//!
//! A test executable of its own, not a module of a harness: one of its tests loads the
//! driver into the test process and sets the process environment to its simulation's
//! (FAKEGPU_CONFIG, VGPU_STATE_DIR, …). In a shared executable every process another test
//! starts would inherit those paths, and that simulation's kill guard (`Sim`'s `Drop`)
//! would take them for its own.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{artefact, wait_for, workload, Sim};
use vgpu_gpu::checkpoint::Checkpointer;
use vgpu_gpu::checkpoint::ProcessState;

const H100: (&str, &str) = ("NVIDIA H100 80GB HBM3", "80GiB");
const GIB: u64 = 1 << 30;

fn doctor_check(sim: &Sim) -> serde_json::Value {
    let out = sim.vgpu(&["doctor", "--json"]).output().expect("doctor");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("doctor JSON");
    report["checks"].as_array().expect("checks").iter().find(|c| c["name"] == "checkpoint API").expect("a checkpoint API check").clone()
}

#[test]
fn doctor_says_whether_the_driver_has_the_checkpoint_api() {
    let sim = Sim::new(&[H100]);
    let c = doctor_check(&sim);
    assert_eq!(c["status"], "ok", "{c}");
    let old = Sim::with_config("checkpoint = false\n\n[[device]]\nname = \"NVIDIA H100 80GB HBM3\"\nmemory = \"80GiB\"\n");
    let c = doctor_check(&old);
    assert_eq!(c["status"], "warn", "{c}");
    assert!(c["detail"].as_str().unwrap_or("").contains("keeps its device memory"), "{c}");
    assert!(c["fix"].as_str().unwrap_or("").contains("570"), "{c}");
}

/// The one test of this binary that loads the driver into the test process itself (its
/// config is read once per process, from the environment).
#[test]
fn a_workloads_memory_leaves_the_device_and_comes_back() {
    let sim = Sim::new(&[H100]);
    for (k, v) in sim.env() {
        std::env::set_var(k, v);
    }
    let links = sim.path("driver");
    std::fs::create_dir(&links).expect("mkdir");
    std::os::unix::fs::symlink(artefact("libfakegpu.so"), links.join("libcuda.so.1")).expect("link");
    std::os::unix::fs::symlink(artefact("libfakegpu.so"), links.join("libnvidia-ml.so.1")).expect("link");
    let ready = sim.path("ready");
    let mut holder = Command::new(workload::workload_bin())
        .args(["idle", "60", "--alloc-mib", "1024", "--ready"])
        .arg(&ready)
        .env("LD_LIBRARY_PATH", &links)
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn the holder");
    wait_for("the holder's allocation", || ready.exists());
    let used = || sim.json(&["devices", "--json"])["gpus"][0]["memory_used_bytes"].as_u64().expect("memory_used_bytes");
    assert_eq!(used(), GIB);

    let ckpt = Checkpointer::open(Some(&links.join("libcuda.so.1"))).expect("load").expect("the simulated driver has the API");
    let pid = holder.id();
    assert_eq!(ckpt.state(pid).expect("state"), ProcessState::Running);
    ckpt.suspend(pid, Duration::from_secs(5)).expect("suspend");
    assert_eq!(ckpt.state(pid).expect("state"), ProcessState::Checkpointed);
    assert_eq!(used(), 0, "its memory left the device");
    // An illegal step is the driver's error, named, on one line.
    let err = ckpt.checkpoint(pid).expect_err("checkpointed twice").to_string();
    assert_eq!(err, format!("cuCheckpointProcessCheckpoint(pid {pid}) failed: CUDA_ERROR_ILLEGAL_STATE (401)"));
    ckpt.resume(pid).expect("resume");
    assert_eq!(ckpt.state(pid).expect("state"), ProcessState::Running);
    assert_eq!(used(), GIB, "and came back");
    // The driver works through a thread of the target: a process stopped by a signal (as a
    // job scheduler suspends a job) cannot be locked; its lock gives up at its timeout and
    // leaves it running; once it runs again it can. (The restore thread's id is the one
    // a controller lets run, as CRIU's CUDA plugin does.)
    assert_eq!(ckpt.restore_thread_id(pid).expect("the restore thread"), Some(pid), "the thread that started CUDA (its main thread)");
    // SAFETY: kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0);
    wait_for("the holder to stop", || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('T'))));
    let err = ckpt.lock(pid, Duration::from_millis(200)).expect_err("a stopped process cannot be locked");
    assert_eq!(err.code(), Some(600), "CUDA_ERROR_NOT_READY: {err}");
    assert_eq!(ckpt.state(pid).expect("state"), ProcessState::Running);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGCONT) }, 0);
    ckpt.suspend(pid, Duration::from_secs(5)).expect("suspend once it runs");
    ckpt.resume(pid).expect("resume");
    // A process without CUDA is not the driver's to checkpoint.
    let err = ckpt.state(std::process::id()).expect_err("no CUDA here");
    assert_eq!(err.code(), Some(1), "CUDA_ERROR_INVALID_VALUE: {err}");
    holder.kill().expect("kill");
    holder.wait().expect("wait");
}
