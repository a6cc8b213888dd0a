//! Time from an allocation that escapes the shim to `vgpu watch`'s kill (issue 11's goal:
//! at most 2 s at the default interval). Each trial runs, in a 1 GiB vGPU, a process that
//! clears `LD_PRELOAD` and allocates 3 GiB (`gpu_workload idle --alloc-mib 3072 --ready F`);
//! the clock starts when F appears (the allocation returned) and stops when the watch logs
//! the SIGKILL (the workload's first offence: frozen, SIGKILL, thawed; it was a SIGTERM,
//! then SIGKILL after `kill_after`, before issue 24), and again when the process is gone. Each trial starts after a random delay
//! (0–1 s, seeded), so the allocation falls at a random moment of the watch's round. The
//! watch runs with the default `[watch]` settings (interval 1 s, grace 500 ms): the expected
//! time is up to one interval to see the allocation plus the grace. Needs root (cgroups).
//!
//!     cargo bench --bench watch_kill [-- TRIALS]            (default 10)

#[path = "support/workload.rs"]
mod workload;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[path = "support/rng.rs"]
mod rng;

fn fail(message: impl std::fmt::Display) -> ! {
    eprintln!("watch_kill: {message}");
    std::process::exit(1)
}

fn main() {
    let mut trials = 10usize;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--bench" => {}
            n => trials = n.parse().unwrap_or_else(|_| fail(format!("usage: cargo bench --bench watch_kill [-- TRIALS], not `{n}`"))),
        }
    }
    let workload = workload::build("watch_kill");
    let host = workload::Host::new("watch_kill", "[watch]\nlisten = \"\"\n");
    let p = |rel: &str| host.path(rel);
    let command = |args: &[&str]| host.command(args);

    let mut watch = command(&["watch"]).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap_or_else(|e| fail(e));
    let (tx, lines) = mpsc::channel::<(Instant, String)>();
    let stderr = watch.stderr.take().unwrap_or_else(|| fail("no stderr"));
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send((Instant::now(), line)).is_err() {
                break;
            }
        }
    });
    let wait_line = |what: &str, pred: &dyn Fn(&str) -> bool| -> Instant {
        loop {
            match lines.recv_timeout(Duration::from_secs(30)) {
                Ok((at, line)) if pred(&line) => return at,
                Ok(_) => {}
                Err(e) => fail(format!("no {what} from the watch: {e}")),
            }
        }
    };
    wait_line("readiness", &|l| l == "vgpu watch: ready");

    println!("trial  allocated→SIGKILL  allocated→gone");
    let (mut to_term, mut to_gone) = (Vec::new(), Vec::new());
    let mut rng = rng::Rng(0x5eed_0011);
    for trial in 0..trials {
        std::thread::sleep(Duration::from_millis(rng.below(1000)));
        let ready = p(&format!("ready-{trial}"));
        let mut run = command(&["run", "--mem", "1G", "--", "env", "-u", "LD_PRELOAD"])
            .arg(&workload)
            .args(["idle", "60", "--alloc-mib", "3072", "--ready"])
            .arg(&ready)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| fail(e));
        let allocated = wait_file(&ready);
        let term = wait_line("SIGKILL", &|l| l.contains("SIGKILL to pid"));
        let _ = run.wait();
        let gone = Instant::now();
        let (a, b) = (term.saturating_duration_since(allocated), gone.saturating_duration_since(allocated));
        println!("{trial:>5}  {:>16.3} s  {:>13.3} s", a.as_secs_f64(), b.as_secs_f64());
        to_term.push(a);
        to_gone.push(b);
    }
    let _ = Command::new("kill").arg(watch.id().to_string()).status();
    let _ = watch.wait();
    for (what, mut v) in [("allocated→SIGKILL", to_term), ("allocated→gone", to_gone)] {
        v.sort();
        let mean = v.iter().sum::<Duration>() / v.len().max(1) as u32;
        println!(
            "{what}: mean {:.3} s, median {:.3} s, max {:.3} s over {} trials (interval 1 s, grace 500 ms)",
            mean.as_secs_f64(),
            v[v.len() / 2].as_secs_f64(),
            v[v.len() - 1].as_secs_f64(),
            v.len()
        );
    }
}

/// Poll for `path` every millisecond; when it appeared.
fn wait_file(path: &Path) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !path.exists() {
        if Instant::now() > deadline {
            fail(format!("{} never appeared", path.display()));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Instant::now()
}
