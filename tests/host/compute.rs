//! The compute governor end to end: `vgpu run --compute P` through the real binary, the
//! shim and the simulated driver (as root, real cgroups), measured by
//! `crates/fakegpu/examples/gpu_workload.rs`. Every launch path is held to its share, a
//! huge kernel is too, the processes of one vGPU share one budget, `vgpu update` changes
//! the share live, `ps` shows the measured share, `fair` lends idle GPU time, two strict
//! tenants split the GPU by their shares, and an unlimited vGPU runs as fast as no shim.
//!
//! Rates are compared with an unlimited run of the same shape made at the same time on a
//! simulated GPU of its own (each `Sim` is a separate driver state), so that the load of
//! the machine affects both alike; tolerances are wide (correctness, not precision).

use std::process::{Child, Command, Stdio};

use crate::common::{process, wait_for, Sim};
use crate::common::workload::workload_bin;

const GPU: &[(&str, &str)] = &[("NVIDIA H100-sim", "80GiB")];


fn w() -> &'static str {
    workload_bin().to_str().expect("UTF-8 path")
}

/// One line printed by gpu_workload.
#[derive(Debug, Clone)]
struct Report {
    kernels: u64,
    seconds: f64,
    windows: Vec<u64>,
    line: String,
}

impl Report {
    fn parse(line: &str) -> Report {
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not gpu_workload's JSON ({e}): {line}"));
        Report {
            kernels: v["kernels"].as_u64().unwrap_or_else(|| panic!("no kernels: {line}")),
            seconds: v["seconds"].as_f64().unwrap_or_else(|| panic!("no seconds: {line}")),
            windows: v["windows"].as_array().unwrap_or_else(|| panic!("no windows: {line}")).iter().map(|n| n.as_u64().unwrap()).collect(),
            line: line.to_string(),
        }
    }

    fn rate(&self) -> f64 {
        self.kernels as f64 / self.seconds
    }
}

/// Every JSON line of a finished command's stdout, which must have succeeded.
fn reports(cmd: &mut Command) -> Vec<Report> {
    let out = process::run_ok(cmd);
    out.lines().filter(|l| l.starts_with('{')).map(Report::parse).collect()
}

fn one(cmd: &mut Command) -> Report {
    let all = reports(cmd);
    assert_eq!(all.len(), 1, "expected one report from {cmd:?}: {all:?}");
    all.into_iter().next().unwrap()
}

/// `vgpu --simulate run VGPU_ARGS… -- COMMAND…` in `sim`.
fn vgpu_run(sim: &Sim, vgpu_args: &[&str], command: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vgpu"));
    cmd.arg("--simulate").arg("run").args(vgpu_args).arg("--").args(command);
    cmd.env_remove("VGPU_SIMULATE").env_remove("LD_PRELOAD").env("VGPU_LOG", "vgpu=warn");
    for (k, v) in sim.env() {
        cmd.env(k, v);
    }
    cmd.stdin(Stdio::null());
    cmd
}

/// gpu_workload SHAPE_ARGS… under `vgpu run VGPU_ARGS…`.
fn governed(sim: &Sim, vgpu_args: &[&str], shape: &[&str]) -> Command {
    let mut command = vec![w()];
    command.extend_from_slice(shape);
    vgpu_run(sim, vgpu_args, &command)
}

/// gpu_workload SHAPE_ARGS… under `vgpu run VGPU_ARGS…` but without the shim (LD_PRELOAD
/// removed): the baseline with no governor at all, in a workload cgroup like the others so
/// that a loaded machine schedules it alike (a process outside one ran at half the rate
/// under load).
fn unshimmed(sim: &Sim, vgpu_args: &[&str], shape: &[&str]) -> Command {
    let mut command = vec!["env", "-u", "LD_PRELOAD", w()];
    command.extend_from_slice(shape);
    vgpu_run(sim, vgpu_args, &command)
}

/// How one of several simultaneous runs is made.
enum Job<'a> {
    /// Under `vgpu run` with these arguments.
    Vgpu(&'a [&'a str], &'a [&'a str]),
    /// Under `vgpu run` with these arguments, without the shim.
    Unshimmed(&'a [&'a str], &'a [&'a str]),
}

/// Run every job at the same time, each on a simulated GPU of its own; their reports in order.
fn at_once(jobs: &[Job]) -> Vec<Report> {
    workload_bin();
    let sims: Vec<Sim> = jobs.iter().map(|_| Sim::new(GPU)).collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .iter()
            .zip(&sims)
            .map(|(job, sim)| {
                s.spawn(move || match job {
                    Job::Vgpu(args, shape) => one(&mut governed(sim, args, shape)),
                    Job::Unshimmed(args, shape) => one(&mut unshimmed(sim, args, shape)),
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a run failed")).collect()
    })
}

const LIMIT_30: &[&str] = &["--mem", "10G", "--compute", "30"];
const UNLIMITED: &[&str] = &["--mem", "10G"];
const SYNC_2S: &[&str] = &["sync", "2", "--kernel-us", "1000"];

fn assert_between(what: &str, ratio: f64, low: f64, high: f64, detail: &str) {
    assert!((low..=high).contains(&ratio), "{what}: {ratio:.3} of the baseline, expected {low}–{high}\n{detail}");
}

/// A workload kept in the background, its stdout collected.
struct Background(Child);

impl Background {
    fn start(mut cmd: Command) -> Background {
        Background(cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn vgpu run"))
    }

    fn finish(self) -> Vec<Report> {
        let out = self.0.wait_with_output().expect("wait for vgpu run");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "vgpu run failed with {}\n--- stdout\n{stdout}\n--- stderr\n{}", out.status, String::from_utf8_lossy(&out.stderr));
        stdout.lines().filter(|l| l.starts_with('{')).map(Report::parse).collect()
    }
}

fn ps_row(sim: &Sim, name: &str) -> Option<serde_json::Value> {
    sim.json(&["ps", "--json"])["workloads"].as_array()?.iter().find(|w| w["name"] == name).cloned()
}

#[test]
fn compute_30_limits_every_launch_path() {
    // (shape, arguments): 1 ms kernels, the graph 10 × 100 µs (captured under the limit).
    let shapes: [(&str, &[&str]); 6] = [
        ("sync", &["sync", "2", "--kernel-us", "1000"]),
        ("ex", &["ex", "2", "--kernel-us", "1000"]),
        ("coop", &["coop", "2", "--kernel-us", "1000"]),
        ("legacy", &["legacy", "2", "--kernel-us", "1000"]),
        ("multi", &["multi", "2", "--kernel-us", "1000"]),
        ("graph", &["graph", "2", "--kernel-us", "100", "--batch", "10"]),
    ];
    let jobs: Vec<Job> = shapes.iter().flat_map(|(_, args)| [Job::Vgpu(UNLIMITED, args), Job::Vgpu(LIMIT_30, args)]).collect();
    let reports = at_once(&jobs);
    let mut table = String::new();
    let mut bad = Vec::new();
    for (i, (name, _)) in shapes.iter().enumerate() {
        let (free, held) = (&reports[2 * i], &reports[2 * i + 1]);
        let ratio = held.rate() / free.rate();
        table += &format!("{name}: {ratio:.3}\n  unlimited {}\n  --compute 30 {}\n", free.line, held.line);
        if !(0.20..=0.40).contains(&ratio) {
            bad.push(*name);
        }
    }
    assert!(bad.is_empty(), "shapes outside 20–40 % of unlimited at --compute 30: {bad:?}\n{table}");
}

#[test]
fn a_huge_kernel_with_synchronize_is_held_too() {
    let sim = Sim::new(GPU);
    workload_bin();
    // 200 ms kernels for 3 s at 25 %: 0.75 s of GPU time, about 4 kernels (ungoverned: 15).
    let r = one(&mut governed(&sim, &["--mem", "10G", "--compute", "25"], &["sync", "3", "--kernel-us", "200000"]));
    let most = (r.seconds * 0.25 / 0.2).floor() as u64 + 2;
    assert!(r.kernels >= 1, "nothing ran: {}", r.line);
    assert!(r.kernels <= most, "{} kernels of 200 ms in {:.2} s at --compute 25, at most {most} allowed: {}", r.kernels, r.seconds, r.line);
}

#[test]
fn two_processes_of_one_vgpu_share_its_budget() {
    workload_bin();
    let (limited, free) = (Sim::new(GPU), Sim::new(GPU));
    let script = format!("{w} sync 2 --kernel-us 1000 & {w} sync 2 --kernel-us 1000; wait", w = w());
    let (pair, alone) = std::thread::scope(|s| {
        let pair = s.spawn(|| reports(&mut vgpu_run(&limited, LIMIT_30, &["sh", "-c", &script])));
        let alone = s.spawn(|| one(&mut governed(&free, UNLIMITED, SYNC_2S)));
        (pair.join().unwrap(), alone.join().unwrap())
    });
    assert_eq!(pair.len(), 2, "two reports expected: {pair:?}");
    assert!(pair.iter().all(|r| r.kernels > 0), "each process ran: {pair:?}");
    let ratio = pair.iter().map(Report::rate).sum::<f64>() / alone.rate();
    assert_between("two processes at --compute 30, summed", ratio, 0.20, 0.40, &format!("{pair:#?}\nunlimited {}", alone.line));
}

#[test]
fn update_raises_a_running_workloads_share_live() {
    let sim = Sim::new(GPU);
    workload_bin();
    let ready = sim.path("live.ready");
    let run = Background::start(governed(
        &sim,
        &["--name", "live", "--mem", "10G", "--compute", "20"],
        &["sync", "6", "--kernel-us", "1000", "--ready", ready.to_str().unwrap()],
    ));
    wait_for("the workload to be ready", || ready.exists());
    // Past 1.25 s at 20 %: the first one-second window ran entirely at the old share.
    wait_for("250 ms of GPU time charged", || ps_row(&sim, "live").is_some_and(|r| r["gpu_time_ns"].as_u64().unwrap_or(0) >= 250_000_000));
    let id = ps_row(&sim, "live").unwrap()["id"].as_str().unwrap().to_string();
    sim.vgpu(&["update", &id, "--compute", "80"]).assert().success();
    let r = run.finish();
    assert_eq!(r.len(), 1, "{r:?}");
    let windows = &r[0].windows;
    assert!(windows.len() >= 6, "six windows of a 6 s run: {}", r[0].line);
    let (first, last) = (windows[0], windows[windows.len() - 2]);
    assert!(first < 350, "the first window was held at 20 %: {}", r[0].line);
    assert!(last as f64 > 2.5 * first as f64, "the rate rose after update --compute 80: {}", r[0].line);
}

#[test]
fn ps_shows_the_measured_share_while_running() {
    let sim = Sim::new(GPU);
    workload_bin();
    let ready = sim.path("ps.ready");
    let run = Background::start(governed(
        &sim,
        &["--name", "measured", "--mem", "10G", "--compute", "30"],
        &["sync", "4", "--kernel-us", "1000", "--ready", ready.to_str().unwrap()],
    ));
    wait_for("the workload to be ready", || ready.exists());
    // 450 ms of GPU time at 30 %: at least 1.5 s into the run.
    wait_for("450 ms of GPU time charged and a measured share", || {
        ps_row(&sim, "measured").is_some_and(|r| r["gpu_time_ns"].as_u64().unwrap_or(0) >= 450_000_000 && r["compute_measured_pct"].is_number())
    });
    let row = ps_row(&sim, "measured").unwrap();
    let measured = row["compute_measured_pct"].as_f64().unwrap();
    assert!((20.0..=40.0).contains(&measured), "measured {measured} % at --compute 30: {row:#}");
    let gpu = &row["gpus"][0];
    let gpu_measured = gpu["compute_measured_pct"].as_f64().unwrap_or(-1.0);
    assert!((20.0..=40.0).contains(&gpu_measured), "the GPU's measured share {gpu_measured}: {row:#}");
    assert!(gpu["gpu_time_ns"].as_u64().unwrap_or(0) > 0, "{row:#}");
    assert!(gpu["throttled_ns"].as_u64().unwrap_or(0) > 0, "launches waited for the budget: {row:#}");
    assert_eq!(row["compute_pct"], 30);
    let r = run.finish();
    assert_eq!(r.len(), 1, "{r:?}");
}

#[test]
fn fair_lends_idle_gpu_time_and_strict_does_not() {
    let fair: &[&str] = &["--mem", "10G", "--compute", "30", "--compute-policy", "fair"];
    let strict: &[&str] = &["--mem", "10G", "--compute", "30", "--compute-policy", "strict"];
    let r = at_once(&[Job::Vgpu(UNLIMITED, SYNC_2S), Job::Vgpu(fair, SYNC_2S), Job::Vgpu(strict, SYNC_2S)]);
    let detail = format!("unlimited {}\nfair 30 {}\nstrict 30 {}", r[0].line, r[1].line, r[2].line);
    assert_between("fair 30 alone", r[1].rate() / r[0].rate(), 0.80, 1.10, &detail);
    assert_between("strict 30 alone", r[2].rate() / r[0].rate(), 0.20, 0.40, &detail);
}

#[test]
fn two_strict_tenants_split_the_gpu_by_their_shares() {
    workload_bin();
    let (shared, free) = (Sim::new(GPU), Sim::new(GPU));
    let (a, b, alone) = std::thread::scope(|s| {
        let a = s.spawn(|| one(&mut governed(&shared, &["--mem", "10G", "--compute", "30"], SYNC_2S)));
        let b = s.spawn(|| one(&mut governed(&shared, &["--mem", "10G", "--compute", "70"], SYNC_2S)));
        let alone = s.spawn(|| one(&mut governed(&free, UNLIMITED, SYNC_2S)));
        (a.join().unwrap(), b.join().unwrap(), alone.join().unwrap())
    });
    let detail = format!("30: {}\n70: {}\nunlimited: {}", a.line, b.line, alone.line);
    assert_between("tenant at 30", a.rate() / alone.rate(), 0.20, 0.40, &detail);
    assert_between("tenant at 70", b.rate() / alone.rate(), 0.60, 0.80, &detail);
}

#[test]
fn an_unlimited_vgpu_is_not_throttled() {
    let hundred: &[&str] = &["--mem", "10G", "--compute", "100"];
    let r = at_once(&[Job::Unshimmed(UNLIMITED, SYNC_2S), Job::Vgpu(hundred, SYNC_2S), Job::Vgpu(UNLIMITED, SYNC_2S)]);
    let detail = format!("no shim {}\n--compute 100 {}\nno --compute {}", r[0].line, r[1].line, r[2].line);
    assert_between("--compute 100", r[1].rate() / r[0].rate(), 0.90, 1.10, &detail);
    assert_between("no --compute", r[2].rate() / r[0].rate(), 0.90, 1.10, &detail);
}
