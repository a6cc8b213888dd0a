//! How `vgpu watch` holds a workload that escapes the shim (its process clears
//! `LD_PRELOAD`) to its compute share with the freezer duty cycle, on the simulated driver
//! (`vgpu --simulate`). Needs root (cgroups are real).
//!
//!     cargo bench --bench watch_throttle [-- --quick]
//!
//! For each target share, one `vgpu run --compute P -- env -u LD_PRELOAD gpu_workload sync`
//! (1 ms kernels) under a `vgpu watch` with the default `[watch]` settings (interval 1 s,
//! compute_window 5 s; `--quick`: 200 ms and 1 s, shorter runs). Columns: `alone` = the GPU
//! share of its first window (kernels × kernel time ÷ window, before the audit acted);
//! `acted` = when the watch logged that it throttles it (s after the workload started);
//! `held` = the mean GPU share of the windows from `acted` + 2 windows of the audit to the
//! end; `p95 err` = the 95th percentile of |share − target| over those windows; `watch` =
//! the driver's share the watch measured, mean over the same rounds.
//!
//! It builds what it runs in its own profile (the shim, the simulated driver and the
//! workload beside the `vgpu` cargo built for it). It prints; it judges nothing, and fails
//! only when a run fails.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const KERNEL_US: u64 = 1000;
const WINDOW_MS: u64 = 500;

fn fail(msg: impl std::fmt::Display) -> ! {
    eprintln!("watch_throttle: {msg}");
    std::process::exit(1);
}

struct Row {
    target: u32,
    alone: f64,
    acted: Option<f64>,
    held: f64,
    p95: f64,
    watch: Option<f64>,
}

fn share(kernels: u64) -> f64 {
    kernels as f64 * KERNEL_US as f64 / (WINDOW_MS as f64 * 1000.0) * 100.0
}

fn one(vgpu: &Path, workload: &Path, target: u32, quick: bool) -> Row {
    let dir = tempfile::tempdir().unwrap_or_else(|e| fail(format!("tempdir: {e}")));
    let p = |rel: &str| dir.path().join(rel);
    for sub in ["run", "lib", "fakegpu"] {
        std::fs::create_dir_all(p(sub)).unwrap_or_else(|e| fail(e));
    }
    std::fs::write(p("fakegpu.toml"), "[[device]]\nname = \"NVIDIA H100-sim\"\nmemory = \"80GiB\"\n").unwrap_or_else(|e| fail(e));
    let (interval, window) = if quick { ("200ms", Duration::from_secs(1)) } else { ("1s", Duration::from_secs(5)) };
    let config = format!("[watch]\ninterval = \"{interval}\"\ncompute_window = \"{}\"\nlisten = \"\"\n", humantime::format_duration(window));
    std::fs::write(p("vgpu.toml"), config).unwrap_or_else(|e| fail(e));
    let env = [
        ("FAKEGPU_CONFIG", p("fakegpu.toml")),
        ("FAKEGPU_STATE", p("fakegpu")),
        ("VGPU_STATE_DIR", p("run")),
        ("VGPU_LIB_DIR", p("lib")),
        ("VGPU_CONFIG", p("vgpu.toml")),
    ];
    let command = |args: &[&str]| {
        let mut cmd = Command::new(vgpu);
        cmd.arg("--simulate").args(args).env_remove("LD_PRELOAD").env_remove("VGPU_SIMULATE");
        for (k, v) in &env {
            cmd.env(k, v);
        }
        cmd
    };
    let log = p("watch.log");
    let mut watch = command(&["watch"])
        .env("VGPU_LOG", "vgpu=debug")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap_or_else(|e| fail(e)))
        .spawn()
        .unwrap_or_else(|e| fail(format!("vgpu watch: {e}")));
    let text = || std::fs::read_to_string(&log).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !text().contains("vgpu watch: ready") {
        if Instant::now() > deadline {
            fail(format!("vgpu watch did not start:\n{}", text()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let seconds = if quick { "8" } else { "30" };
    let (kernel_us, window_ms) = (KERNEL_US.to_string(), WINDOW_MS.to_string());
    let ready = p("ready");
    let workload = workload.display().to_string();
    let args = ["run", "--mem", "1G", "--compute", &target.to_string(), "--", "env", "-u", "LD_PRELOAD", &workload, "sync", seconds];
    let mut run = command(&args);
    run.args(["--kernel-us", &kernel_us, "--window-ms", &window_ms, "--ready", &ready.display().to_string()]).stdout(Stdio::piped()).stderr(Stdio::inherit());
    let child = run.spawn().unwrap_or_else(|e| fail(format!("vgpu run: {e}")));
    while !ready.exists() {
        std::thread::sleep(Duration::from_millis(5));
    }
    let started = Instant::now();
    let mut acted = None;
    let out = std::thread::scope(|s| {
        let waiting = s.spawn(move || child.wait_with_output());
        while !waiting.is_finished() {
            if acted.is_none() && text().contains("vgpu watch: throttling workload") {
                acted = Some(started.elapsed().as_secs_f64());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        waiting.join().unwrap_or_else(|_| fail("waiting for vgpu run panicked"))
    })
    .unwrap_or_else(|e| fail(format!("vgpu run: {e}")));
    let _ = watch.kill();
    let _ = watch.wait();
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        fail(format!("vgpu run failed ({}): {stdout}", out.status));
    }
    let line = stdout.lines().find(|l| l.starts_with('{')).unwrap_or_else(|| fail(format!("no report: {stdout}")));
    let report: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| fail(e));
    let windows: Vec<u64> = report["windows"].as_array().map(|a| a.iter().filter_map(|w| w.as_u64()).collect()).unwrap_or_default();
    // From two audit windows after it acted (the control settles) to the last full window.
    let per_window = WINDOW_MS as f64 / 1000.0;
    let from = acted.map(|a| ((a + 2.0 * window.as_secs_f64()) / per_window).ceil() as usize).unwrap_or(windows.len());
    let steady: Vec<f64> = windows.iter().take(windows.len().saturating_sub(1)).skip(from).map(|&k| share(k)).collect();
    let held = if steady.is_empty() { f64::NAN } else { steady.iter().sum::<f64>() / steady.len() as f64 };
    let mut errs: Vec<f64> = steady.iter().map(|s| (s - f64::from(target)).abs()).collect();
    errs.sort_by(f64::total_cmp);
    let p95 = errs.get(((errs.len() as f64 * 0.95).ceil() as usize).saturating_sub(1)).copied().unwrap_or(f64::NAN);
    let figures: Vec<f64> = text()
        .lines()
        .filter(|l| l.contains("throttling vGPU"))
        .filter_map(|l| l.split(" at ").nth(1)?.split('%').next()?.parse().ok())
        .collect();
    let settled = figures.len() / 2;
    let watch = (figures.len() > settled).then(|| figures[settled..].iter().sum::<f64>() / (figures.len() - settled) as f64);
    Row { target, alone: windows.first().map(|&k| share(k)).unwrap_or(f64::NAN), acted, held, p95, watch }
}

fn main() {
    let mut quick = false;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--quick" => quick = true,
            "--bench" => {}
            other => fail(format!("unknown argument `{other}` (usage: cargo bench --bench watch_throttle [-- --quick])")),
        }
    }
    let vgpu = PathBuf::from(env!("CARGO_BIN_EXE_vgpu"));
    let bin_dir = vgpu.parent().unwrap_or_else(|| fail("CARGO_BIN_EXE_vgpu has no directory")).to_path_buf();
    let profile = match bin_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev".to_string(),
        Some(other) => other.to_string(),
    };
    if let Some(cargo) = std::env::var_os("CARGO") {
        let build = ["build", "--quiet", "-p", "vgpu-shim", "-p", "fakegpu", "--lib", "--example", "gpu_workload", "--profile", &profile];
        let status = Command::new(cargo).args(build).current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).status();
        if !matches!(status, Ok(s) if s.success()) {
            fail(format!("`cargo {}` failed ({status:?})", build.join(" ")));
        }
    }
    let workload = bin_dir.join("examples/gpu_workload");
    for need in [&workload, &bin_dir.join("libvgpu.so"), &bin_dir.join("libfakegpu.so")] {
        if !need.is_file() {
            fail(format!("{} is missing", need.display()));
        }
    }
    let settings = if quick { "interval 200ms, compute_window 1s, 8 s runs" } else { "interval 1s, compute_window 5s (the defaults), 30 s runs" };
    println!("vgpu watch holding `env -u LD_PRELOAD gpu_workload sync` (1 ms kernels) to --compute P ({settings}; profile {profile})");
    println!("{:>6} {:>7} {:>7} {:>7} {:>8} {:>7}", "target", "alone", "acted", "held", "p95 err", "watch");
    for target in [10, 30, 60] {
        let r = one(&vgpu, &workload, target, quick);
        let acted = r.acted.map(|a| format!("{a:.1}s")).unwrap_or_else(|| "never".into());
        let watch = r.watch.map(|w| format!("{w:.1}%")).unwrap_or_else(|| "-".into());
        println!("{:>5}% {:>6.1}% {:>7} {:>6.1}% {:>7.1}pt {:>7}", r.target, r.alone, acted, r.held, r.p95, watch);
    }
}
