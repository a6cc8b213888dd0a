//! The simulated timeline: events, per-stream order in one device FIFO, every launch path's
//! duration (`FAKEGPU_KERNELS`), graphs and stream capture, NVML utilization, and the
//! `gpu_workload` example across processes. Client checks are the probes of
//! `examples/fakegpu_probe/timeline.rs`; exact values come from events and from the shared
//! state's timeline.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use crate::common::{self, field, run_ok, Fake};
use fakegpu::state::Busy;

const KERNELS: &str = "long=30ms,k=1ms";

fn probe(fake: &Fake, name: &str) -> String {
    run_ok(fake.probe(name).env("FAKEGPU_KERNELS", KERNELS))
}

#[test]
fn events_are_stamped_from_the_queue() {
    probe(&Fake::new(), "events");
}

#[test]
fn streams_keep_their_own_order() {
    probe(&Fake::new(), "streams");
}

#[test]
fn every_launch_path_takes_its_simulated_time() {
    probe(&Fake::new(), "launch_paths");
}

#[test]
fn graphs_and_stream_capture() {
    let fake = Fake::new();
    probe(&fake, "graphs");
    // Run: the two 33 ms graph launches and their two 30 ms fillers. Captured: nothing.
    assert_eq!(fake.states()[0].launches(), 2 * (3 + 1));
}

#[test]
fn bad_kernel_table_fails_cuinit_and_says_why() {
    let fake = Fake::new();
    let out = fake
        .probe("init")
        .env("FAKEGPU_KERNELS", "k=20parsecs")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr_text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        field(&stdout, "cu_init"),
        "1",
        "CUDA_ERROR_INVALID_VALUE; {stderr_text}"
    );
    assert_eq!(field(&stdout, "cu_init_again"), "1", "every time");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr
            .lines()
            .filter(|l| l.contains("FAKEGPU_KERNELS"))
            .count(),
        1,
        "{stderr}"
    );
}

/// A process busy about half the time: NVML's device and process figures agree and are
/// the real fraction, not just the last run.
#[test]
fn nvml_utilization_is_exact() {
    let fake = Fake::new();
    let out = probe(&fake, "half_busy");
    let gpu: i64 = field(&out, "gpu").parse().unwrap();
    let sm: i64 = field(&out, "sm").parse().unwrap();
    assert!((gpu - sm).abs() <= 1, "device {gpu}% vs process {sm}%");
    assert!((20..=55).contains(&sm), "5 ms on, about 5 ms off: {sm}%");
}

#[test]
fn nvml_counts_queued_work_of_a_quiet_process() {
    let fake = Fake::new();
    let out = probe(&fake, "queued_then_quiet");
    assert_eq!(field(&out, "sm"), "100");
    assert_eq!(field(&out, "gpu"), "100");
}

// ----- gpu_workload -----

/// `target/<profile>/examples/gpu_workload`, which `cargo test -p fakegpu` builds.
fn workload_program() -> PathBuf {
    let probe = common::probe_program();
    let program = probe.with_file_name("gpu_workload");
    assert!(
        program.is_file(),
        "{} is missing; build it with `cargo build -p fakegpu --example gpu_workload`",
        program.display()
    );
    program
}

fn workload(fake: &Fake, args: &[&str]) -> Child {
    fake.command(workload_program())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn gpu_workload")
}

/// The JSON line of a finished workload: (pid, kernels, gpu_ns, windows).
fn report(child: Child) -> (u32, u64, u64, Vec<u64>) {
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "gpu_workload: {}\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let number = |key: &str| -> u64 {
        let rest = stdout
            .split(&format!("\"{key}\":"))
            .nth(1)
            .unwrap_or_else(|| panic!("no {key} in {stdout}"));
        rest.split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let windows = stdout
        .split("\"windows\":[")
        .nth(1)
        .and_then(|w| w.split(']').next())
        .unwrap_or_default()
        .split(',')
        .filter(|w| !w.is_empty())
        .map(|w| w.parse().unwrap())
        .collect();
    for key in ["seconds", "kernels_per_s", "launch_ns"] {
        assert!(stdout.contains(&format!("\"{key}\":")), "{stdout}");
    }
    (pid, number("kernels"), number("gpu_ns"), windows)
}

/// Each of the three runs its own shape; none of their kernels overlap on the device, and
/// each process's busy time in the shared timeline is exactly the kernels it reports.
#[test]
fn workloads_share_one_fifo_and_account_exactly() {
    let fake = Fake::new();
    let ready = |n: usize| fake.dir.path().join(format!("ready{n}"));
    let shapes: [&[&str]; 7] = [
        &["sync", "0.6", "--kernel-us", "200"],
        &["storm", "0.6", "--kernel-us", "50", "--batch", "100"],
        &["graph", "0.6", "--kernel-us", "30", "--batch", "7"],
        &["ex", "0.6", "--kernel-us", "150"],
        &["coop", "0.6", "--kernel-us", "120"],
        &["legacy", "0.6", "--kernel-us", "80"],
        &["multi", "0.6", "--kernel-us", "90"],
    ];
    let children: Vec<Child> = shapes
        .iter()
        .enumerate()
        .map(|(i, args)| {
            let path = ready(i);
            let mut args = args.to_vec();
            let path_str = path.to_str().unwrap().to_string();
            args.extend(["--ready", &path_str]);
            workload(&fake, &args)
        })
        .collect();
    let reports: Vec<_> = children.into_iter().map(report).collect();
    for i in 0..shapes.len() {
        assert!(Path::new(&ready(i)).exists(), "--ready file {i}");
    }
    let state = &fake.states()[0];
    let mut timeline: Vec<Busy> = state.timeline_since(0);
    timeline.sort_by_key(|b| b.start_ns);
    for pair in timeline.windows(2) {
        assert!(
            pair[1].start_ns >= pair[0].end_ns,
            "overlapping kernels on one device: {:?}",
            pair
        );
    }
    let total: u64 = reports.iter().map(|r| r.1).sum();
    assert_eq!(state.launches(), total);
    for (args, (pid, kernels, gpu_ns, windows)) in shapes.iter().zip(&reports) {
        assert!(*kernels > 0, "{args:?} ran nothing");
        assert_eq!(windows.iter().sum::<u64>(), *kernels, "{args:?}");
        let busy: u64 = timeline
            .iter()
            .filter(|b| b.pid == *pid)
            .map(|b| b.busy_ns)
            .sum();
        assert_eq!(busy, *gpu_ns, "{args:?}: device time of pid {pid}");
    }
}

/// Issue 24 (item 8): four processes launch 100 µs kernels as fast as they can without
/// synchronising (`storm` with batches of 200 000): far more queued kernels than the
/// timeline's ring of 65 536 entries, owners alternating. The ring used to be overwritten
/// with future kernels and NVML then said 0 %: a launch storm was invisible (on this 2-core
/// machine after about 40 s of storm, when the ring held 65 536 intervals all ahead of
/// now). The test storms until the ring is full of intervals still wanted and 2 s of
/// kernels went to the spill spans beside it: 20 000 intervals of 100 µs at least, more
/// than the 11 000 that can end within the last 1.1 s, so the old ring (the newest 65 536)
/// would hold none of the window. NVML must say the device is busy, and each process is.
#[test]
fn a_launch_storm_keeps_nvml_right() {
    // Switching free: the storms alternate, and this is about the ring, not time-slicing.
    let fake = Fake::with_config(
        "[[device]]\nname = \"NVIDIA H100 80GB HBM3\"\nmemory = \"80GiB\"\ncontext_switch = 0\n",
    );
    let ready = |n: usize| fake.dir.path().join(format!("storm{n}"));
    const STORMS: usize = 4;
    let storms: Vec<Killed> = (0..STORMS)
        .map(|n| {
            Killed(
                fake.command(workload_program())
                    .args(["storm", "60", "--kernel-us", "100", "--batch", "200000", "--ready"])
                    .arg(ready(n))
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("spawn gpu_workload"),
            )
        })
        .collect();
    let state = &fake.states()[0];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    // All launching, until 2 s of kernels did not fit in the ring, and the device has been
    // busy for the whole of NVML's last second (the storm began over 1.1 s ago).
    let overflowed = || {
        let timeline = state.timeline_since(0);
        let ahead = timeline.iter().filter(|b| b.is_solid() && b.start_ns > now_ns()).count();
        let spilled: u64 = timeline.iter().filter(|b| !b.is_solid()).map(|b| b.busy_ns).sum();
        let since = timeline.iter().map(|b| b.start_ns).min().unwrap_or(u64::MAX);
        (ahead, spilled, since)
    };
    loop {
        let (ahead, spilled, since) = overflowed();
        if (0..STORMS).all(|n| ready(n).exists()) && spilled >= 2_000_000_000 && since + 1_100_000_000 <= now_ns() {
            eprintln!("{} launches: {ahead} intervals of the ring ahead of now, {} ms of kernels spilled", state.launches(), spilled / 1_000_000);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the storms did not overflow the ring: {} launches, {ahead} intervals ahead", state.launches());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = run_ok(&mut fake.probe("utilization"));
    let gpu: u32 = field(&out, "gpu").parse().unwrap();
    let sm = |pid: u32| -> u32 {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("pid={pid} sm=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let each: Vec<u32> = storms.iter().map(|s| sm(s.0.id())).collect();
    eprintln!("after {} launches: device {gpu}%, processes {each:?}%", state.launches());
    assert!(gpu >= 95, "device utilization {gpu}%\n{out}");
    assert!(each.iter().all(|&p| p > 0), "each storm is seen: {each:?}\n{out}");
    assert!(each.iter().sum::<u32>() >= 90, "together they keep it busy: {each:?}\n{out}");
}

/// A child SIGKILLed and reaped when the test ends, pass or fail.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

#[test]
fn workload_reports_driver_errors() {
    let fake = Fake::new();
    let out = fake
        .command(workload_program())
        .args(["sync", "0.1", "--device", "3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cuDeviceGet") && stderr.contains("CUDA_ERROR_INVALID_DEVICE"),
        "{stderr}"
    );
    let usage = fake
        .command(workload_program())
        .arg("spin")
        .output()
        .unwrap();
    assert_eq!(usage.status.code(), Some(2));
}

/// The time-slicing model (issue 27): two processes of back-to-back work on one device pay
/// `context_switch` at every change of context, as configured, and it is nobody's busy time;
/// one process alone pays nothing. Without the model (switches free) the first assertion
/// fails: every gap between the two is then 0.
#[test]
fn two_contexts_lose_what_the_config_says_and_one_alone_nothing() {
    const SWITCH_NS: u64 = 100_000;
    let fake = Fake::with_config(
        "[[device]]\nname = \"NVIDIA H100 80GB HBM3\"\nmemory = \"80GiB\"\n\
         timeslice = \"1ms\"\ncontext_switch = \"100us\"\n",
    );
    let path = |name: &str| fake.dir.path().join(name).to_str().unwrap().to_string();
    let (go, ready) = (path("go"), [path("ready0"), path("ready1")]);
    let pair: Vec<Child> = ready
        .iter()
        .map(|r| workload(&fake, &["sync", "0.4", "--kernel-us", "1000", "--ready", r, "--go", &go]))
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !ready.iter().all(|r| Path::new(r).exists()) {
        assert!(std::time::Instant::now() < deadline, "the workloads never got ready");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    std::fs::write(&go, "").unwrap();
    let reports: Vec<_> = pair.into_iter().map(report).collect();
    let state = &fake.states()[0];
    let mut timeline = state.timeline_since(0);
    timeline.sort_by_key(|b| b.start_ns);
    // Changes of context where the second was queued behind the first (it starts less than
    // a kernel after): each exactly one switch later.
    let changes: Vec<u64> = timeline
        .windows(2)
        .filter(|p| p[0].pid != p[1].pid && p[1].start_ns < p[0].end_ns + 1_000_000)
        .map(|p| p[1].start_ns - p[0].end_ns)
        .collect();
    let exact = changes.iter().filter(|&&gap| gap == SWITCH_NS).count();
    let kernels: u64 = reports.iter().map(|r| r.1).sum();
    eprintln!("{kernels} kernels, {} changes of context queued behind the other, {exact} paid exactly one switch", changes.len());
    assert!(exact * 10 >= changes.len() * 9, "switch gaps: {changes:?}");
    assert!(changes.len() as u64 * 10 >= kernels * 7, "they alternate: {} changes for {kernels} kernels", changes.len());
    for (pid, _, gpu_ns, _) in &reports {
        let busy: u64 = timeline.iter().filter(|b| b.pid == *pid).map(|b| b.busy_ns).sum();
        assert_eq!(busy, *gpu_ns, "the switches are not pid {pid}'s busy time");
    }

    // Alone: batches of 20 kernels queued back to back. Gaps come only from the program
    // being late to launch, never a switch's exact length.
    let alone = Fake::with_config(
        "[[device]]\nname = \"NVIDIA H100 80GB HBM3\"\nmemory = \"80GiB\"\n\
         timeslice = \"1ms\"\ncontext_switch = \"100us\"\n",
    );
    let (pid, kernels, gpu_ns, _) = report(workload(&alone, &["storm", "0.3", "--kernel-us", "1000", "--batch", "20"]));
    let mut own: Vec<Busy> = alone.states()[0].timeline_since(0).into_iter().filter(|b| b.pid == pid).collect();
    own.sort_by_key(|b| b.start_ns);
    assert!(kernels >= 20);
    assert_eq!(own.iter().map(|b| b.busy_ns).sum::<u64>(), gpu_ns);
    let gaps: Vec<u64> = own.windows(2).map(|p| p[1].start_ns - p[0].end_ns).collect();
    assert!(!gaps.contains(&SWITCH_NS), "alone, no switch: gaps {gaps:?}");
}
