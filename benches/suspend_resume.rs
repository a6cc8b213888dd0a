//! Time to suspend and resume a workload holding 1, 8 and 32 GiB of device memory, on the
//! simulated driver (issue 12), through `vgpu suspend` and `vgpu resume` as a user runs
//! them (each a whole command: start, reconcile, the store lock, the driver, the record).
//!
//! Two configurations in one run: with the checkpoint API (the processes' memory is
//! copied to host memory and back; the simulated driver models the copy as taking
//! bytes ÷ `checkpoint_gbps`, default 25 GB/s — PCIe Gen4 x16's practical rate; H100 on
//! Gen5 is about twice that), and freezer-only (`[suspend] checkpoint = false`: the memory
//! stays, as with a driver older than 570). The difference is the copy and the driver
//! calls; the freezer-only figure is vgpu's own cost. The real driver also drains the
//! process's work (lock) and re-maps memory, which the simulation does not charge for.
//! Needs root (cgroups).
//!
//!     cargo bench --bench suspend_resume [-- TRIALS]          (default 3)

#[path = "support/workload.rs"]
mod workload;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

fn fail(message: impl std::fmt::Display) -> ! {
    eprintln!("suspend_resume: {message}");
    std::process::exit(1)
}

fn main() {
    let mut trials = 3usize;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--bench" => {}
            n => trials = n.parse().unwrap_or_else(|_| fail(format!("usage: cargo bench --bench suspend_resume [-- TRIALS], not `{n}`"))),
        }
    }
    let workload = workload::build("suspend_resume");
    println!("GiB  mode        suspend mean (max)    resume mean (max)    modelled copy");
    for gib in [1u64, 8, 32] {
        for checkpoint in [true, false] {
            let (suspend, resume) = measure(&workload, gib, checkpoint, trials);
            let copy = if checkpoint { format!("{:.3} s", (gib << 30) as f64 / 25e9) } else { "-".into() };
            println!(
                "{gib:>3}  {:<10}  {:>8.3} s ({:.3} s)  {:>8.3} s ({:.3} s)  {copy}",
                if checkpoint { "checkpoint" } else { "freezer" },
                mean(&suspend).as_secs_f64(),
                max(&suspend).as_secs_f64(),
                mean(&resume).as_secs_f64(),
                max(&resume).as_secs_f64(),
            );
        }
    }
}

/// `trials` suspend/resume pairs of one workload holding `gib` GiB.
fn measure(workload: &Path, gib: u64, checkpoint: bool, trials: usize) -> (Vec<Duration>, Vec<Duration>) {
    let host = workload::Host::new("suspend_resume", &format!("[suspend]\ncheckpoint = {checkpoint}\n"));
    let p = |rel: &str| host.path(rel);
    let command = |args: &[&str]| host.command(args);
    let (ready, stop) = (p("ready"), p("stop"));
    let mem = format!("{}G", gib + 1);
    let mut run = command(&["run", "--name", "held", "--mem", &mem, "--"])
        .arg(workload)
        .args(["idle", "3600", "--alloc-mib", &(gib * 1024).to_string(), "--ready"])
        .arg(&ready)
        .arg("--stop")
        .arg(&stop)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| fail(e));
    wait_file(&ready);
    let timed = |args: &[&str]| -> Duration {
        let start = Instant::now();
        let out = command(args).output().unwrap_or_else(|e| fail(e));
        if !out.status.success() {
            fail(format!("vgpu {args:?}: {}", String::from_utf8_lossy(&out.stderr)));
        }
        start.elapsed()
    };
    let (mut suspend, mut resume) = (Vec::new(), Vec::new());
    for _ in 0..trials {
        suspend.push(timed(&["suspend", "held"]));
        resume.push(timed(&["resume", "held"]));
    }
    std::fs::write(&stop, "").unwrap_or_else(|e| fail(e));
    match run.wait() {
        Ok(s) if s.success() => {}
        other => fail(format!("the workload did not end cleanly after its last resume: {other:?}")),
    }
    (suspend, resume)
}

fn mean(v: &[Duration]) -> Duration {
    v.iter().sum::<Duration>() / v.len().max(1) as u32
}

fn max(v: &[Duration]) -> Duration {
    v.iter().max().copied().unwrap_or_default()
}

/// Poll for `path` every millisecond.
fn wait_file(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !path.exists() {
        if Instant::now() > deadline {
            fail(format!("{} never appeared", path.display()));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}
